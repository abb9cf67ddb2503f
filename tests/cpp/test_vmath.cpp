// The vectorisable elementary functions (vmath.hpp) against the C library.
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

PYGPFAST_TEST(log_and_log1p_within_two_ulp) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> expo(-740.0, 709.0), unit(-1.0, 1.0);
  double worst_log = 0.0, worst_log1p = 0.0;
  for (int i = 0; i < 200000; ++i) {
    const double x = std::exp(expo(rng));
    worst_log = std::max(worst_log, ulps(vmath::log(x), std::log(x)));
    const double y = i % 2 ? unit(rng) * std::pow(10.0, -16.0 * std::fabs(unit(rng))) : std::exp(expo(rng) / 40);
    worst_log1p = std::max(worst_log1p, ulps(vmath::log1p(y), std::log1p(y)));
  }
  CHECK(worst_log <= 2.0);
  CHECK(worst_log1p <= 2.0);
  CHECK(vmath::log(1.0) == 0.0);
  CHECK(std::isinf(vmath::log(0.0)) && vmath::log(0.0) < 0);
  CHECK(std::isnan(vmath::log(-1.0)));
  CHECK(std::isinf(vmath::log(std::numeric_limits<double>::infinity())));
  CHECK(vmath::log1p(-1.0) == -std::numeric_limits<double>::infinity());
  CHECK(vmath::log1p(1e-300) == 1e-300);
}

PYGPFAST_TEST(log_normal_cdf_and_mills_ratio) {
  for (double g = -35.0; g <= 9.0; g += 0.01) {
    double value, lambda;
    vmath::log_normal_cdf(g, value, lambda);
    const double upper = 0.5 * std::erfc(g / std::sqrt(2.0));  // 1 - Phi(g)
    const double ref = g < 0 ? std::log(0.5 * std::erfc(-g / std::sqrt(2.0))) : std::log1p(-upper);
    CHECK(std::fabs(value - ref) <= 1e-14 * std::max(1.0, std::fabs(ref)));
    // The reference loses about g^2/2 ulps in its exponent.
    const double ref_lambda = std::exp(-0.5 * g * g - 0.91893853320467274178 - ref);
    CHECK(std::fabs(lambda - ref_lambda) <= (1e-13 + 4e-16 * g * g) * ref_lambda);
  }
  // Far tails: log Phi(g) ~ -g^2/2 - log(-g sqrt(2 pi)) and lambda ~ -g for g -> -inf.
  double value, lambda;
  vmath::log_normal_cdf(-1e4, value, lambda);
  CHECK(std::fabs(value - (-5e7 - std::log(1e4) - 0.91893853320467274178)) < 1e-7);
  CHECK(std::fabs(lambda / 1e4 - 1.0) < 1e-7);
  vmath::log_normal_cdf(40.0, value, lambda);
  CHECK(value == 0.0 || std::fabs(value) < 1e-300);
  CHECK(lambda >= 0.0 && lambda < 1e-300);
}

PYGPFAST_TEST_MAIN
