// A minimal test harness for the C++ core tests (no external framework needed).
// Each test executable registers cases with PYGPFAST_TEST and returns non-zero on failure;
// CTest runs every executable.
#pragma once

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "blas_linked.hpp"

namespace pygpfast::test {

struct Case {
  const char* name;
  std::function<void()> fn;
};

inline std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

inline int& failures() {
  static int n = 0;
  return n;
}

struct Registrar {
  Registrar(const char* name, std::function<void()> fn) { registry().push_back({name, std::move(fn)}); }
};

inline void fail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what.c_str());
  ++failures();
}

inline int run_all() {
  blas::install_linked_blas();
  int failed_cases = 0;
  for (const auto& c : registry()) {
    const int before = failures();
    try {
      c.fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: unexpected exception: %s\n", c.name, e.what());
      ++failures();
    }
    const bool ok = failures() == before;
    failed_cases += ok ? 0 : 1;
    std::printf("[%s] %s\n", ok ? " OK " : "FAIL", c.name);
  }
  std::printf("%zu passed, %d failed\n", registry().size() - failed_cases, failed_cases);
  return failed_cases == 0 ? 0 : 1;
}

}  // namespace pygpfast::test

#define PYGPFAST_CONCAT2(a, b) a##b
#define PYGPFAST_CONCAT(a, b) PYGPFAST_CONCAT2(a, b)
#define PYGPFAST_TEST(name)                                                                    \
  static void name();                                                                          \
  static ::pygpfast::test::Registrar PYGPFAST_CONCAT(registrar_, name)(#name, name);           \
  static void name()

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) ::pygpfast::test::fail(__FILE__, __LINE__, #cond);                           \
  } while (0)

#define CHECK_NEAR(a, b, tol)                                                                  \
  do {                                                                                         \
    const double va_ = (a), vb_ = (b);                                                         \
    if (!(std::fabs(va_ - vb_) <= (tol)))                                                      \
      ::pygpfast::test::fail(__FILE__, __LINE__,                                               \
                             std::string(#a " ~ " #b ": ") + std::to_string(va_) + " vs " +    \
                                 std::to_string(vb_));                                          \
  } while (0)

#define CHECK_THROWS(expr, ExceptionType)                                                      \
  do {                                                                                         \
    bool thrown_ = false;                                                                      \
    try {                                                                                      \
      expr;                                                                                    \
    } catch (const ExceptionType&) {                                                           \
      thrown_ = true;                                                                          \
    }                                                                                          \
    if (!thrown_) ::pygpfast::test::fail(__FILE__, __LINE__, "expected " #ExceptionType);      \
  } while (0)

#define PYGPFAST_TEST_MAIN                                                                     \
  int main() { return ::pygpfast::test::run_all(); }
