// Gauss-Hermite rules and likelihood expectations against closed forms.
#include <cmath>
#include <stdexcept>
#include <vector>

#include "check.hpp"
#include "pygpfast/likelihoods.hpp"
#include "pygpfast/quadrature.hpp"

using namespace pygpfast;

namespace {

constexpr double kPi = 3.14159265358979323846;
const double kSqrtPi = std::sqrt(kPi);

}  // namespace

PYGPFAST_TEST(rule_integrates_low_moments_exactly) {
  for (int n : {1, 2, 5, 20, 100}) {
    const auto& rule = quadrature::gauss_hermite(n);
    CHECK(static_cast<int>(rule.x.size()) == n && static_cast<int>(rule.w.size()) == n);
    double sum = 0.0, second = 0.0, odd = 0.0;
    for (int k = 0; k < n; ++k) {
      sum += rule.w[k];
      second += rule.w[k] * rule.x[k] * rule.x[k];
      odd += rule.w[k] * rule.x[k] * rule.x[k] * rule.x[k];
      if (k > 0) CHECK(rule.x[k] > rule.x[k - 1]);
    }
    CHECK_NEAR(sum, kSqrtPi, 1e-14);
    if (n >= 2) CHECK_NEAR(second, 0.5 * kSqrtPi, 1e-13);  // exact for 2 <= 2n - 1
    CHECK_NEAR(odd, 0.0, 1e-13);
  }
  CHECK(&quadrature::gauss_hermite(7) == &quadrature::gauss_hermite(7));  // cached
}

PYGPFAST_TEST(rule_refuses_bad_sizes) {
  CHECK_THROWS(quadrature::gauss_hermite(0), std::invalid_argument);
  CHECK_THROWS(quadrature::gauss_hermite(101), std::invalid_argument);
}

PYGPFAST_TEST(gaussian_expectation_closed_form) {
  likelihoods::Likelihood lik;
  lik.type = likelihoods::LikelihoodType::Gaussian;
  lik.variance = 0.3;
  const std::vector<double> y = {0.5, -1.0}, mu = {0.1, 2.0}, var = {0.2, 0.0};
  std::vector<double> f(2), dmu(2), dvar(2), dparam(2);
  likelihoods::variational_expectations(lik, y.data(), mu.data(), var.data(), 2, f.data(),
                                        dmu.data(), dvar.data(), dparam.data());
  for (int i = 0; i < 2; ++i) {
    const double sq = (y[i] - mu[i]) * (y[i] - mu[i]) + var[i];
    CHECK_NEAR(f[i], -0.5 * std::log(2 * kPi * 0.3) - sq / 0.6, 1e-14);
    CHECK_NEAR(dmu[i], (y[i] - mu[i]) / 0.3, 1e-14);
    CHECK_NEAR(dvar[i], -0.5 / 0.3, 1e-14);
    CHECK_NEAR(dparam[i], -0.5 / 0.3 + sq / (2 * 0.09), 1e-13);
  }
}

PYGPFAST_TEST(probit_point_mass_is_log_normal_cdf) {
  // With var = 0 every node sits at mu: E = log Phi(mu); here Phi(0) = 1/2 and, far in the
  // tail, log Phi(-40) = -804.6084420137539 (Mills-ratio series). The result is log Phi(mu)
  // times the rule's weight sum over sqrt(pi), which is 1 only to ~1e-14 (see above), so the
  // tolerance is relative 1e-14, not an ulp.
  likelihoods::Likelihood lik;
  lik.type = likelihoods::LikelihoodType::BernoulliProbit;
  const std::vector<double> y = {1.0, 1.0}, mu = {0.0, -40.0}, var = {0.0, 0.0};
  std::vector<double> f(2), dmu(2), dvar(2);
  likelihoods::variational_expectations(lik, y.data(), mu.data(), var.data(), 2, f.data(),
                                        dmu.data(), dvar.data(), nullptr);
  CHECK_NEAR(f[0], std::log(0.5), 1e-14);
  CHECK_NEAR(dmu[0], std::sqrt(2.0 / kPi), 1e-14);
  CHECK_NEAR(f[1], -804.6084420137539, 804.6 * 1e-14);
}

PYGPFAST_TEST(bad_labels_and_variances_throw) {
  likelihoods::Likelihood lik;
  lik.type = likelihoods::LikelihoodType::BernoulliLogit;
  const std::vector<double> mu = {0.0, 0.0}, var = {1.0, 1.0};
  std::vector<double> f(2), dmu(2), dvar(2);
  const std::vector<double> half = {1.0, 0.5};
  CHECK_THROWS(likelihoods::variational_expectations(lik, half.data(), mu.data(), var.data(), 2,
                                                     f.data(), dmu.data(), dvar.data(), nullptr),
               std::invalid_argument);
  lik.type = likelihoods::LikelihoodType::Poisson;
  const std::vector<double> negative = {3.0, -1.0};
  CHECK_THROWS(likelihoods::predict_log_density(lik, negative.data(), mu.data(), var.data(), 2,
                                                f.data()),
               std::invalid_argument);
  const std::vector<double> counts = {3.0, 1.0}, bad_var = {1.0, -1e-3};
  CHECK_THROWS(likelihoods::variational_expectations(lik, counts.data(), mu.data(), bad_var.data(),
                                                     2, f.data(), dmu.data(), dvar.data(), nullptr),
               std::invalid_argument);
}

PYGPFAST_TEST(poisson_takes_real_targets_and_refuses_non_finite_ones) {
  // Non-integer y >= 0 by the same formula: y mu - E[exp(f)] - lgamma(y + 1).
  likelihoods::Likelihood lik;
  lik.type = likelihoods::LikelihoodType::Poisson;
  const std::vector<double> y = {2.5, 0.3}, mu = {0.4, -1.0}, var = {0.5, 2.0};
  std::vector<double> f(2), dmu(2), dvar(2);
  likelihoods::variational_expectations(lik, y.data(), mu.data(), var.data(), 2, f.data(),
                                        dmu.data(), dvar.data(), nullptr);
  for (int i = 0; i < 2; ++i) {
    const double rate = std::exp(mu[i] + 0.5 * var[i]);
    CHECK_NEAR(f[i], y[i] * mu[i] - rate - std::lgamma(y[i] + 1.0), 1e-14);
    CHECK_NEAR(dmu[i], y[i] - rate, 1e-14);
    CHECK_NEAR(dvar[i], -0.5 * rate, 1e-14);
  }
  for (double bad : {-0.5, std::nan(""), HUGE_VAL}) {
    const std::vector<double> labels = {1.0, bad};
    CHECK_THROWS(likelihoods::variational_expectations(lik, labels.data(), mu.data(), var.data(), 2,
                                                       f.data(), dmu.data(), dvar.data(), nullptr),
                 std::invalid_argument);
  }
}

PYGPFAST_TEST_MAIN
