// The vectorisable elementary functions (vmath.hpp) against the C library.
#include <algorithm>
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

namespace {

// log Phi(g), lambda = phi(g) / Phi(g) and Q(|g|) e^{g^2/2} in long double (64-bit significand):
// from erfcl for g >= -38 (through log1p(-Q) above 0), from Laplace's continued fraction of the
// Mills ratio below (200 terms; at x = 38 it converges within 20).
struct NormalReference {
  long double log_cdf, lambda, tail_scaled;
};

NormalReference normal_reference(double g) {
  const long double x = g, x2 = 0.5L * x * x;
  constexpr long double kLogSqrt2Pi = 0.918938533204672741780329736406L;
  const long double kSqrt2 = std::sqrt(2.0L);
  NormalReference r;
  if (g >= -38.0) {
    const long double Q = 0.5L * std::erfc(std::fabs(x) / kSqrt2);  // Q(|g|)
    const long double Phi = g > 0.0 ? 1.0L - Q : Q;
    r.log_cdf = g > 0.0 ? std::log1p(-Q) : std::log(Q);
    r.lambda = std::exp(-x2 - kLogSqrt2Pi) / Phi;
    r.tail_scaled = Q * std::exp(x2);
  } else {
    long double T = 0.0L;
    for (int k = 200; k >= 1; --k) T = k / (-x + T);
    r.lambda = -x + T;  // Phi(g) = phi(g) / lambda
    r.log_cdf = -x2 - kLogSqrt2Pi - std::log(r.lambda);
    r.tail_scaled = std::exp(-kLogSqrt2Pi) / r.lambda;
  }
  return r;
}

// |value - ref| / |ref|; where |ref| < 1e-300 (the result underflows) 0 if |value - ref| <=
// 1e-300, else inf; inf for NaN.
double relative_error(double value, long double ref) {
  const double inf = std::numeric_limits<double>::infinity();
  if (std::isnan(value)) return inf;
  const long double err = std::fabs(static_cast<long double>(value) - ref);
  if (std::fabs(ref) < 1e-300L) return err <= 1e-300L ? 0.0 : inf;
  return static_cast<double>(err / std::fabs(ref));
}

// The array form as the core compiles it (one clone per instruction set, the machine's picked).
PYGPFAST_SIMD_CLONES void log_normal_cdf_cloned(const double* g, double* log_cdf, double* lambda, long n) {
  vmath::log_normal_cdf(g, log_cdf, lambda, n);
}

// Test points: a dense grid on [-40, 40], the lower tail log-spaced to -1e8 and random draws.
std::vector<double> normal_test_points() {
  std::vector<double> g;
  for (int i = -40000; i <= 40000; ++i) g.push_back(1e-3 * i);
  for (int i = 0; i <= 2000; ++i) g.push_back(-std::pow(10.0, 1.6 + 6.4 * i / 2000.0));
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0.0, 5.0);
  std::uniform_real_distribution<double> decades(0.0, 8.0);
  for (int i = 0; i < 20000; ++i) g.push_back(normal(rng));
  for (int i = 0; i < 2000; ++i) g.push_back(-std::pow(10.0, decades(rng)));
  for (double v : {0.0, -0.0, 1e-300, -1e-300, 1e-10, -1e-10, 37.5, 38.5, 39.9}) g.push_back(v);
  return g;
}

}  // namespace

PYGPFAST_TEST(log_normal_cdf_and_mills_ratio_within_4e_15) {
  // Measured: 1.1e-15 (log Phi, near g = 0.17) and 7.7e-16 (lambda), with and without FMA; the
  // evaluation this replaced, 5.8e-14 in the upper tail (where it rounded g^2 / 2) and 4e-15 elsewhere.
  const std::vector<double> g = normal_test_points();
  const long n = static_cast<long>(g.size());
  std::vector<double> log_cdf(n), lambda(n), log_cdf_cloned(n), lambda_cloned(n);
  vmath::log_normal_cdf(g.data(), log_cdf.data(), lambda.data(), n);
  log_normal_cdf_cloned(g.data(), log_cdf_cloned.data(), lambda_cloned.data(), n);
  double worst_log_cdf = 0.0, worst_lambda = 0.0;  // of the plain, cloned and scalar forms
  for (long i = 0; i < n; ++i) {
    const NormalReference ref = normal_reference(g[i]);
    double value, lam;
    vmath::log_normal_cdf(g[i], value, lam);
    for (double v : {log_cdf[i], log_cdf_cloned[i], value})
      worst_log_cdf = std::max(worst_log_cdf, relative_error(v, ref.log_cdf));
    for (double v : {lambda[i], lambda_cloned[i], lam})
      worst_lambda = std::max(worst_lambda, relative_error(v, ref.lambda));
  }
  CHECK(worst_log_cdf <= 4e-15);
  CHECK(worst_lambda <= 4e-15);
}

PYGPFAST_TEST(normal_tail_scaled_within_2e_15) {  // (measured 6.8e-16)
  double worst = 0.0;
  for (double g : normal_test_points())
    worst = std::max(worst, relative_error(vmath::normal_tail_scaled(g), normal_reference(g).tail_scaled));
  CHECK(worst <= 2e-15);
}

PYGPFAST_TEST(log_normal_cdf_limits) {
  const double inf = std::numeric_limits<double>::infinity();
  const double g[] = {-inf, inf, std::numeric_limits<double>::quiet_NaN(), -1e200, 40.0, 1e300};
  double value[6], lambda[6];
  vmath::log_normal_cdf(g, value, lambda, 6);
  CHECK(value[0] == -inf && lambda[0] == inf);
  CHECK(value[1] == 0.0 && lambda[1] == 0.0);
  CHECK(std::isnan(value[2]) && std::isnan(lambda[2]));
  CHECK(value[3] == -inf);  // -g^2 / 2 overflows
  CHECK(std::fabs(lambda[3] / 1e200 - 1.0) < 1e-15);
  CHECK(value[4] <= 0.0 && value[4] > -1e-300 && lambda[4] >= 0.0 && lambda[4] < 1e-300);
  CHECK(value[5] == 0.0 && lambda[5] == 0.0);
  for (int i = 0; i < 6; ++i) {
    double v, l;
    vmath::log_normal_cdf(g[i], v, l);
    CHECK((v == value[i] || (std::isnan(v) && std::isnan(value[i]))) &&
          (l == lambda[i] || (std::isnan(l) && std::isnan(lambda[i]))));
  }
}

PYGPFAST_TEST_MAIN
