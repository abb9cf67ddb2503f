// The vectorisable exp against the C library's correctly rounded-in-practice exp.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "check.hpp"
#include "pygpfast/vmath.hpp"

using namespace pygpfast;

namespace {

// |a - b| in units of b's last place.
double ulps(double a, double b) {
  const double ulp = std::nextafter(b, std::numeric_limits<double>::infinity()) - b;
  return std::fabs(a - b) / ulp;
}

}  // namespace

PYGPFAST_TEST(exp_within_one_ulp_on_its_range) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> wide(-708.0, 709.0), narrow(-1.0, 1.0);
  double worst = 0.0;
  for (int i = 0; i < 200000; ++i) {
    const double x = i % 2 ? wide(rng) : narrow(rng);
    worst = std::max(worst, ulps(vmath::exp(x), std::exp(x)));
  }
  CHECK(worst <= 1.0);
  // Exact where exp is exact, and at the reduction's boundaries n ln2 +- ln2/2.
  CHECK(vmath::exp(0.0) == 1.0);
  for (int n = -20; n <= 20; ++n)
    for (double off : {-0.5, -1e-9, 0.0, 1e-9, 0.5}) {
      const double x = (n + off) * 0.69314718055994530942;
      CHECK(ulps(vmath::exp(x), std::exp(x)) <= 1.0);
    }
}

PYGPFAST_TEST(exp_limits) {
  CHECK(vmath::exp(-708.0) > 0.0);
  CHECK(vmath::exp(-708.5) == 0.0);
  CHECK(vmath::exp(-1e300) == 0.0);
  CHECK(std::isinf(vmath::exp(709.5)));
  CHECK(std::isinf(vmath::exp(std::numeric_limits<double>::infinity())));
  CHECK(vmath::exp(-std::numeric_limits<double>::infinity()) == 0.0);
  CHECK(std::isnan(vmath::exp(std::numeric_limits<double>::quiet_NaN())));
}

PYGPFAST_TEST(exp_in_a_loop_matches_scalar_calls) {
  // At -O3 the compiler vectorises this loop; its results must equal the scalar calls'.
  std::vector<double> x(1003), out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = -50.0 + 0.1 * static_cast<double>(i);
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = vmath::exp(x[i]);
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(out[i] == vmath::exp(x[i]));
}

PYGPFAST_TEST_MAIN
