// The softmax likelihood (softmax.hpp through likelihoods.hpp): the var -> 0 limit, C = 2
// against the one-dimensional Bernoulli-logit rule, finite differences, thread counts, extremes
// and bad input.
#include <cmath>
#include <stdexcept>
#include <vector>

#include "check.hpp"
#include "pygpfast/likelihoods.hpp"
#include "pygpfast/threads.hpp"

using namespace pygpfast;

namespace {

likelihoods::Likelihood softmax(int C, int n_gh = 20) {
  likelihoods::Likelihood lik;
  lik.type = likelihoods::LikelihoodType::Softmax;
  lik.num_classes = C;
  lik.n_gh = n_gh;
  return lik;
}

struct Expectations {
  std::vector<double> f, dmu, dvar;
};

Expectations expectations(const likelihoods::Likelihood& lik, const std::vector<double>& y,
                          const std::vector<double>& mu, const std::vector<double>& var) {
  const auto n = static_cast<index_t>(y.size());
  Expectations e{std::vector<double>(y.size()), std::vector<double>(mu.size()),
                 std::vector<double>(mu.size())};
  likelihoods::variational_expectations(lik, y.data(), mu.data(), var.data(), n, e.f.data(),
                                        e.dmu.data(), e.dvar.data(), nullptr);
  return e;
}

}  // namespace

PYGPFAST_TEST(point_mass_is_log_softmax) {
  const int C = 4;
  const auto lik = softmax(C);
  const std::vector<double> mu = {0.3, -2.0, 1.5, 0.0, 40.0, -5.0, 38.0, 39.5};
  const std::vector<double> var(mu.size(), 0.0), y = {2.0, 1.0};
  const Expectations e = expectations(lik, y, mu, var);
  std::vector<double> mean(mu.size()), variance(mu.size()), log_density(2);
  likelihoods::predict_mean_and_var(lik, mu.data(), var.data(), 2, mean.data(), variance.data());
  likelihoods::predict_log_density(lik, y.data(), mu.data(), var.data(), 2, log_density.data());
  for (int i = 0; i < 2; ++i) {
    const double* m = mu.data() + i * C;
    double lse = 0.0;
    for (int c = 0; c < C; ++c) lse += std::exp(m[c] - 40.0);
    lse = 40.0 + std::log(lse);
    const int label = static_cast<int>(y[i]);
    CHECK_NEAR(e.f[i], m[label] - lse, 1e-13);
    CHECK_NEAR(log_density[i], m[label] - lse, 1e-12);
    for (int c = 0; c < C; ++c) {
      const double p = std::exp(m[c] - lse);
      CHECK_NEAR(e.dmu[i * C + c], (c == label ? 1.0 : 0.0) - p, 1e-13);
      CHECK_NEAR(mean[i * C + c], p, 1e-13);
      CHECK_NEAR(variance[i * C + c], p * (1.0 - p), 1e-13);
    }
  }
}

PYGPFAST_TEST(two_classes_are_the_bernoulli_logit) {
  // softmax_1(f0, f1) = sigmoid(f1 - f0), f1 - f0 ~ N(mu1 - mu0, var0 + var1).
  const auto lik = softmax(2, 32);
  likelihoods::Likelihood logit;
  logit.type = likelihoods::LikelihoodType::BernoulliLogit;
  logit.n_gh = 100;
  const std::vector<double> mu = {0.4, -0.3, 2.0, 1.0, -1.0, 3.0}, var = {0.3, 0.2, 0.05, 0.4, 0.6, 0.1};
  const std::vector<double> y = {1.0, 0.0, 1.0};
  const Expectations e = expectations(lik, y, mu, var);
  std::vector<double> m(3), v(3);
  for (int i = 0; i < 3; ++i) {
    m[i] = mu[2 * i + 1] - mu[2 * i];
    v[i] = var[2 * i] + var[2 * i + 1];
  }
  const Expectations r = expectations(logit, y, m, v);
  for (int i = 0; i < 3; ++i) {
    CHECK_NEAR(e.f[i], r.f[i], 1e-8);  // the outer rule's error (step 1/2), not the inner rule's
    CHECK_NEAR(e.dmu[2 * i + 1], r.dmu[i], 2e-7);
    CHECK_NEAR(e.dmu[2 * i], -r.dmu[i], 2e-7);
    CHECK_NEAR(e.dvar[2 * i], r.dvar[i], 2e-7);
    CHECK_NEAR(e.dvar[2 * i + 1], r.dvar[i], 2e-7);
  }
}

PYGPFAST_TEST(derivatives_match_finite_differences) {
  const int C = 3;
  const auto lik = softmax(C);
  const std::vector<double> mu = {0.5, -1.0, 0.2}, var = {0.8, 2.5, 0.01}, y = {1.0};
  const Expectations e = expectations(lik, y, mu, var);
  for (int c = 0; c < C; ++c) {
    for (int which = 0; which < 2; ++which) {
      std::vector<double> mp = mu, mm = mu, vp = var, vm = var;
      const double eps = which == 0 ? 1e-5 : 1e-6;
      (which == 0 ? mp : vp)[c] += eps;
      (which == 0 ? mm : vm)[c] -= eps;
      const double fd = (expectations(lik, y, mp, vp).f[0] - expectations(lik, y, mm, vm).f[0]) / (2 * eps);
      const double analytic = (which == 0 ? e.dmu : e.dvar)[c];
      CHECK_NEAR(analytic, fd, 1e-5 * std::fabs(fd) + 1e-8);
    }
  }
}

PYGPFAST_TEST(thread_count_changes_nothing) {
  const int C = 5, n = 300;
  const auto lik = softmax(C);
  std::vector<double> mu(n * C), var(n * C), y(n);
  for (int i = 0; i < n * C; ++i) {
    mu[i] = 2.0 * std::sin(1.7 * i);
    var[i] = 0.5 + 0.5 * std::cos(0.3 * i);
  }
  for (int i = 0; i < n; ++i) y[i] = i % C;
  set_num_threads(1);
  const Expectations one = expectations(lik, y, mu, var);
  set_num_threads(2);
  const Expectations two = expectations(lik, y, mu, var);
  set_num_threads(0);
  CHECK(one.f == two.f && one.dmu == two.dmu && one.dvar == two.dvar);
}

PYGPFAST_TEST(extremes_stay_finite) {
  const int C = 3;
  const auto lik = softmax(C);
  // A class 800 below the others; equal classes with variance 1e4 (the grid's node cap).
  const std::vector<double> mu = {0.0, -800.0, 5.0, 0.0, 0.0, 0.0}, var = {0.5, 0.5, 0.0, 1e4, 1e4, 1e4};
  const std::vector<double> y = {1.0, 0.0};
  const Expectations e = expectations(lik, y, mu, var);
  std::vector<double> mean(6), variance(6), log_density(2);
  likelihoods::predict_mean_and_var(lik, mu.data(), var.data(), 2, mean.data(), variance.data());
  likelihoods::predict_log_density(lik, y.data(), mu.data(), var.data(), 2, log_density.data());
  for (double v : e.f) CHECK(std::isfinite(v) && v <= 0.0);
  for (double v : e.dmu) CHECK(std::isfinite(v));
  for (double v : e.dvar) CHECK(std::isfinite(v) && v <= 1e-12);
  CHECK_NEAR(log_density[0], -805.0 + 0.25, 0.01);  // -805 + var / 2, far below exp's range
  for (int c = 0; c < C; ++c) CHECK_NEAR(mean[C + c], 1.0 / 3.0, 1e-8);
}

PYGPFAST_TEST(bad_input_throws) {
  std::vector<double> f(1), dmu(3), dvar(3);
  const std::vector<double> mu = {0.0, 1.0, 2.0}, var = {1.0, 1.0, 1.0};
  for (double label : {3.0, -1.0, 0.5}) {
    const std::vector<double> y = {label};
    CHECK_THROWS(likelihoods::variational_expectations(softmax(3), y.data(), mu.data(), var.data(), 1,
                                                       f.data(), dmu.data(), dvar.data(), nullptr),
                 std::invalid_argument);
  }
  CHECK_THROWS(likelihoods::validate(softmax(1)), std::invalid_argument);
  likelihoods::Likelihood probit;
  probit.type = likelihoods::LikelihoodType::BernoulliProbit;
  probit.num_classes = 3;
  CHECK_THROWS(likelihoods::validate(probit), std::invalid_argument);
  CHECK(likelihoods::latent_dim(softmax(7)) == 7);
  const std::vector<double> y = {0.0}, bad_mu = {0.0, std::nan(""), 1.0};
  CHECK_THROWS(likelihoods::variational_expectations(softmax(3), y.data(), bad_mu.data(), var.data(), 1,
                                                     f.data(), dmu.data(), dvar.data(), nullptr),
               std::invalid_argument);
}

PYGPFAST_TEST_MAIN
