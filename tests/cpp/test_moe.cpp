// IS-MOE experts (moe/experts.hpp) and the bounded L-BFGS (optimize.hpp) against small dense
// references, and the batched fits' independence of the thread count.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/moe/experts.hpp"
#include "pygpfast/optimize.hpp"
#include "pygpfast/threads.hpp"

using namespace pygpfast;

namespace {

const std::int32_t kRbfIso[2] = {0, 2};  // RBF with [variance, lengthscale]

double rbf(const double* a, const double* b, index_t D, double v, double l) {
  double r2 = 0.0;
  for (index_t d = 0; d < D; ++d) r2 += (a[d] - b[d]) * (a[d] - b[d]);
  return v * std::exp(-0.5 * r2 / (l * l));
}

// log N(y | m, C) by an unblocked Cholesky written out here.
double dense_logpdf(std::vector<double> C, const std::vector<double>& r, index_t n) {
  for (index_t j = 0; j < n; ++j) {
    for (index_t k = 0; k < j; ++k) C[j * n + j] -= C[j * n + k] * C[j * n + k];
    C[j * n + j] = std::sqrt(C[j * n + j]);
    for (index_t i = j + 1; i < n; ++i) {
      for (index_t k = 0; k < j; ++k) C[i * n + j] -= C[i * n + k] * C[j * n + k];
      C[i * n + j] /= C[j * n + j];
    }
  }
  std::vector<double> z(r);
  double quad = 0.0, logdet = 0.0;
  for (index_t i = 0; i < n; ++i) {
    for (index_t k = 0; k < i; ++k) z[i] -= C[i * n + k] * z[k];
    z[i] /= C[i * n + i];
    quad += z[i] * z[i];
    logdet += std::log(C[i * n + i]);
  }
  return -0.5 * quad - logdet - 0.5 * n * std::log(2 * M_PI);
}

struct Data {
  index_t N, D;
  std::vector<double> X, y;
};

Data make_data(index_t N, index_t D, unsigned seed, bool labels) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> g;
  Data d{N, D, std::vector<double>(N * D), std::vector<double>(N)};
  for (auto& x : d.X) x = g(rng);
  for (index_t i = 0; i < N; ++i) {
    const double f = std::sin(2.0 * d.X[i * D]) + 0.1 * g(rng);
    d.y[i] = labels ? (f > 0 ? 1.0 : 0.0) : f;
  }
  return d;
}

}  // namespace

PYGPFAST_TEST(gaussian_evidence_matches_dense_reference) {
  const Data d = make_data(9, 2, 3, false);
  const index_t n = d.N, D = d.D;
  const double params[2] = {1.4, 0.8}, noise = 0.07, mean = 0.2;
  std::vector<double> C(n * n), r(n);
  for (index_t i = 0; i < n; ++i) {
    for (index_t j = 0; j < n; ++j) C[i * n + j] = rbf(&d.X[i * D], &d.X[j * D], D, params[0], params[1]);
    C[i * n + i] += noise;
    r[i] = d.y[i] - mean;
  }
  const double ref = dense_logpdf(C, r, n);
  moe::KernelSpec spec{kRbfIso, 2, 2};
  moe::BlockWorkspace ws;
  double dp[2], dn, dm;
  const auto res = moe::gaussian_evidence(spec, params, ConstMatrixView(d.X.data(), n, D), d.y.data(), noise, mean,
                                          {}, ws, dp, &dn, &dm);
  CHECK_NEAR(res.log_evidence, ref, 1e-11 * std::fabs(ref));
  // d/d noise by central differences of the reference.
  const double h = 1e-6;
  auto Cp = C, Cm = C;
  for (index_t i = 0; i < n; ++i) {
    Cp[i * n + i] += h;
    Cm[i * n + i] -= h;
  }
  CHECK_NEAR(dn, (dense_logpdf(Cp, r, n) - dense_logpdf(Cm, r, n)) / (2 * h), 1e-6 * std::fabs(dn) + 1e-8);
}

PYGPFAST_TEST(laplace_mode_is_a_fixed_point) {
  const Data d = make_data(20, 2, 5, true);
  const index_t n = d.N, D = d.D;
  const double params[2] = {2.0, 0.9};
  moe::KernelSpec spec{kRbfIso, 2, 2};
  for (auto lik : {moe::Likelihood::Probit, moe::Likelihood::Logit}) {
    moe::BlockWorkspace ws;
    moe::laplace_evidence(spec, params, ConstMatrixView(d.X.data(), n, D), d.y.data(), lik, {}, {}, ws, nullptr);
    // f = K grad log p(y | f) at the mode.
    double err = 0.0;
    for (index_t i = 0; i < n; ++i) {
      double s = 0.0;
      for (index_t j = 0; j < n; ++j) s += rbf(&d.X[i * D], &d.X[j * D], D, params[0], params[1]) * ws.alpha[j];
      err = std::max(err, std::fabs(s - ws.f[i]));
    }
    CHECK(err < 1e-9);
  }
}

PYGPFAST_TEST(lbfgs_minimises_a_bounded_rosenbrock) {
  auto rosen = [](const double* x, double* g) {
    const double a = 1.0 - x[0], b = x[1] - x[0] * x[0];
    g[0] = -2.0 * a - 400.0 * x[0] * b;
    g[1] = 200.0 * b;
    return a * a + 100.0 * b * b;
  };
  double x[2] = {-1.2, 1.0};
  optimize::LbfgsOptions o;
  o.gtol = 1e-10;
  o.ftol = 0.0;
  o.max_iter = 500;
  auto r = optimize::minimize_lbfgs(rosen, x, 2, nullptr, nullptr, o);
  CHECK(r.converged());
  CHECK_NEAR(x[0], 1.0, 1e-7);
  CHECK_NEAR(x[1], 1.0, 1e-7);
  // With x[0] <= 0.5 the minimum is on the bound: x = (0.5, 0.25).
  double y[2] = {-1.2, 1.0};
  const double lo[2] = {-2.0, -2.0}, hi[2] = {0.5, 2.0};
  r = optimize::minimize_lbfgs(rosen, y, 2, lo, hi, o);
  CHECK(r.converged());
  CHECK(y[0] == 0.5);
  CHECK_NEAR(y[1], 0.25, 1e-8);
}

PYGPFAST_TEST(batched_fits_do_not_depend_on_the_thread_count) {
  for (auto lik : {moe::Likelihood::Gaussian, moe::Likelihood::Logit}) {
    const Data d = make_data(200, 2, 7, lik != moe::Likelihood::Gaussian);
    // 12 blocks of 5..38 rows drawn from the 200.
    std::mt19937 rng(11);
    std::vector<index_t> offsets{0}, rows;
    for (int p = 0; p < 12; ++p) {
      const index_t n = 5 + 3 * p;
      for (index_t i = 0; i < n; ++i) rows.push_back(static_cast<index_t>(rng() % 200));
      offsets.push_back(static_cast<index_t>(rows.size()));
    }
    // (duplicate rows within a block are possible: the noise keeps the factor definite)
    const index_t P = 12, total = offsets.back();
    index_t fsize = 0;
    for (index_t p = 0; p < P; ++p) fsize += (offsets[p + 1] - offsets[p]) * (offsets[p + 1] - offsets[p]);
    const double params[2] = {1.0, 1.0}, noise = 0.1, mean = 0.0;
    moe::KernelSpec spec{kRbfIso, 2, 2};
    moe::Start start{params, 0, &noise, 0, &mean, 0};
    moe::FitOptions o;
    o.likelihood = lik;
    o.lbfgs.max_iter = 40;
    std::vector<double> out_params[2], logev[2], alpha[2], factor[2], mu[2], var[2];
    for (int t = 0; t < 2; ++t) {
      set_num_threads(t + 1);
      out_params[t].resize(P * 2);
      logev[t].resize(P);
      alpha[t].resize(total);
      factor[t].resize(fsize);
      std::vector<double> fn(P), W(total);
      moe::FitOutputs out;
      out.params = out_params[t].data();
      out.noise_variance = fn.data();
      out.log_evidence = logev[t].data();
      out.alpha = alpha[t].data();
      out.factor = factor[t].data();
      out.W = W.data();
      moe::fit_blocks(spec, start, ConstMatrixView(d.X.data(), d.N, d.D), d.y.data(), offsets.data(), rows.data(), P,
                      o, out);
      const index_t T = 7;
      mu[t].resize(T * P);
      var[t].resize(T * P);
      moe::Start fitted{out_params[t].data(), 2, fn.data(), 1, &mean, 0};
      moe::PredictOutputs po;
      po.mean = mu[t].data();
      po.var = var[t].data();
      moe::predict_blocks(spec, fitted, ConstMatrixView(d.X.data(), d.N, d.D), offsets.data(), rows.data(), P, lik,
                          alpha[t].data(), factor[t].data(), W.data(), ConstMatrixView(d.X.data(), T, d.D), po);
    }
    set_num_threads(0);
    auto same = [](const std::vector<double>& a, const std::vector<double>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
    };
    CHECK(same(out_params[0], out_params[1]));
    CHECK(same(logev[0], logev[1]));
    CHECK(same(alpha[0], alpha[1]));
    CHECK(same(factor[0], factor[1]));
    CHECK(same(mu[0], mu[1]));
    CHECK(same(var[0], var[1]));
    for (double v : logev[0]) CHECK(std::isfinite(v));
  }
}

PYGPFAST_TEST(a_failed_block_is_one_error_after_the_region_naming_the_lowest_numbered) {
  // Newton's method stopped after one step fails in every block. Blocks run largest first, so
  // block 0, the smallest, is the last a thread takes; the error names it on 1 and 2 threads.
  const Data d = make_data(60, 2, 5, true);
  std::vector<index_t> offsets{0}, rows;
  for (index_t n : {8, 20, 14, 18}) {
    for (index_t i = 0; i < n; ++i) rows.push_back(static_cast<index_t>(rows.size()));
    offsets.push_back(static_cast<index_t>(rows.size()));
  }
  const double params[2] = {1.0, 1.0};
  moe::Start start{params, 0, nullptr, 0, nullptr, 0};
  moe::FitOptions o;
  o.likelihood = moe::Likelihood::Logit;
  o.laplace.max_iter = 1;
  std::vector<double> out_params(8), logev(4), alpha(60), factor(8 * 8 + 20 * 20 + 14 * 14 + 18 * 18);
  moe::FitOutputs out;
  out.params = out_params.data();
  out.log_evidence = logev.data();
  out.alpha = alpha.data();
  out.factor = factor.data();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::string message;
    try {
      moe::fit_blocks(moe::KernelSpec{kRbfIso, 2, 2}, start, ConstMatrixView(d.X.data(), d.N, d.D), d.y.data(),
                      offsets.data(), rows.data(), 4, o, out);
    } catch (const LinAlgError& e) {
      message = e.what();
    }
    CHECK(message.find("block 0 (8 rows): ") != std::string::npos);
    CHECK(message.find("did not converge") != std::string::npos);
  }
  set_num_threads(0);
}

PYGPFAST_TEST(bad_blocks_are_refused) {
  const std::vector<index_t> offsets{0, 3, 3}, rows{0, 1, 2};
  CHECK_THROWS(moe::check_blocks(offsets.data(), rows.data(), 2, 10), std::invalid_argument);
  const std::vector<index_t> offsets2{0, 3}, rows2{0, 1, 10};
  CHECK_THROWS(moe::check_blocks(offsets2.data(), rows2.data(), 1, 10), std::invalid_argument);
}

PYGPFAST_TEST_MAIN
