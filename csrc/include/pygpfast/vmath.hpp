// Elementwise maths that vectorises. glibc's exp is a scalar call per element (about half of
// the time of an RBF kernel matrix); the versions here have no branches and no table
// lookups, so the compiler turns loops over them into SIMD code. Hot loops are compiled
// twice (PYGPFAST_SIMD_CLONES): for x86-64-v3 (AVX2 + FMA) and for the baseline, picked at
// load time, so wheels stay portable. The core is compiled with -fno-trapping-math and
// -fopenmp-simd so that selects and `#pragma omp simd` reductions vectorise.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define PYGPFAST_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
#endif
#ifndef PYGPFAST_SIMD_CLONES
#define PYGPFAST_SIMD_CLONES
#endif

namespace pygpfast::vmath {

// exp(x): x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite split of ln2), e^r by its Taylor
// series to degree 13 (truncation below 4e-18 relative), times 2^n built in the exponent
// bits. Within 1 ulp of the correctly rounded value on [-708, 709]; 0 below -708 (no
// subnormal results, all below 3.3e-308) and +inf above 709.
inline double exp(double x) {
  constexpr double kLog2e = 1.4426950408889634;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kShift = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  constexpr std::int64_t kShiftBits = 0x4338000000000000LL;
  const double xc = x < -708.0 ? -708.0 : (x > 709.0 ? 709.0 : x);
  const double t = xc * kLog2e + kShift;
  const double n = t - kShift;
  const double r = (xc - n * kLn2Hi) - n * kLn2Lo;
  double p = 1.0 / 6227020800.0;
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  std::int64_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  // t and kShift share their exponent, so their bit patterns differ by exactly n.
  const std::int64_t e = (bits - kShiftBits + 1023) << 52;
  double scale;
  std::memcpy(&scale, &e, sizeof scale);
  const double v = p * scale;
  return x < -708.0 ? 0.0 : (x > 709.0 ? __builtin_inf() : v);
}

}  // namespace pygpfast::vmath
