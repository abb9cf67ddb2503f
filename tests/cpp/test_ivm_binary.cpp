// Binary IVM (ivm/binary.hpp): the stub-buffer marginals after every inclusion against a dense
// recomputation from the sites, the fixed-site bound's marginals against the incremental ones,
// the ADF sites' moment matching, and invariance of the selection to the OpenMP thread count.
#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "blas_linked.hpp"
#include "check.hpp"
#include "pygpfast/blas.hpp"
#include "pygpfast/ivm/binary.hpp"
#include "pygpfast/kernels.hpp"
#include "pygpfast/threads.hpp"

using namespace pygpfast;

namespace {

struct Problem {
  index_t n, D = 2;
  std::vector<double> X, y, params{1.3, 0.7, 1.1};
  std::vector<std::int32_t> codes{static_cast<std::int32_t>(kernels::KernelType::RBF), 3};

  explicit Problem(index_t n_) : n(n_) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(n) * 131);
    std::normal_distribution<double> normal;
    X.resize(n * D);
    y.resize(n);
    for (auto& v : X) v = normal(rng);
    for (index_t i = 0; i < n; ++i) y[i] = std::sin(2.0 * X[i * D]) + 0.5 * X[i * D + 1] + 0.3 * normal(rng) > 0 ? 1.0 : -1.0;
  }
  kernels::Kernel kernel() const { return kernels::Kernel(codes.data(), 2, params.data(), 3, D); }
  ConstMatrixView Xv() const { return ConstMatrixView(X.data(), n, D); }
};

// Dense posterior marginals from the sites: A = K - K_{.,I} (Pi^-1 + K_I)^-1 K_{I,.},
// h = K_{.,I} (Pi^-1 + K_I)^-1 m_I with m = b / pi (by a Cholesky of Pi^-1 + K_I, plain loops).
void dense_marginals(const std::vector<double>& K, index_t n, const std::vector<index_t>& I,
                     const std::vector<double>& b, const std::vector<double>& pi, std::vector<double>& h,
                     std::vector<double>& a) {
  const index_t d = static_cast<index_t>(I.size());
  std::vector<double> C(d * d);
  for (index_t k = 0; k < d; ++k)
    for (index_t l = 0; l < d; ++l) C[k * d + l] = K[I[k] * n + I[l]] + (k == l ? 1.0 / pi[k] : 0.0);
  for (index_t j = 0; j < d; ++j) {  // Cholesky, lower
    for (index_t k = 0; k < j; ++k) C[j * d + j] -= C[j * d + k] * C[j * d + k];
    C[j * d + j] = std::sqrt(C[j * d + j]);
    for (index_t i = j + 1; i < d; ++i) {
      for (index_t k = 0; k < j; ++k) C[i * d + j] -= C[i * d + k] * C[j * d + k];
      C[i * d + j] /= C[j * d + j];
    }
  }
  auto solve = [&](std::vector<double>& v) {  // v <- (L L^T)^-1 v
    for (index_t i = 0; i < d; ++i) {
      for (index_t k = 0; k < i; ++k) v[i] -= C[i * d + k] * v[k];
      v[i] /= C[i * d + i];
    }
    for (index_t i = d - 1; i >= 0; --i) {
      for (index_t k = i + 1; k < d; ++k) v[i] -= C[k * d + i] * v[k];
      v[i] /= C[i * d + i];
    }
  };
  std::vector<double> w(d);
  for (index_t k = 0; k < d; ++k) w[k] = b[k] / pi[k];
  solve(w);
  h.assign(n, 0.0);
  a.assign(n, 0.0);
  std::vector<double> kj(d);
  for (index_t j = 0; j < n; ++j) {
    for (index_t k = 0; k < d; ++k) {
      kj[k] = K[j * n + I[k]];
      h[j] += kj[k] * w[k];
    }
    std::vector<double> v = kj;
    solve(v);
    double q = 0.0;
    for (index_t k = 0; k < d; ++k) q += kj[k] * v[k];
    a[j] = K[j * n + j] - q;
  }
}

double max_abs_diff(const double* x, const std::vector<double>& y) {
  double m = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

}  // namespace

PYGPFAST_TEST(stub_marginals_match_a_dense_recompute_after_every_inclusion) {
  const Problem p(60);
  const auto kernel = p.kernel();
  std::vector<double> K(p.n * p.n);
  kernel.K(p.Xv(), p.Xv(), true, MatrixView(K.data(), p.n, p.n));
  ivm::BinaryLikelihood lik;
  lik.bias = 0.2;
  const index_t d = 15;
  ivm::BinaryIVM model(kernel, p.Xv(), p.y.data(), lik, d);
  ivm::SelectOptions opt;
  opt.seed = 7;
  std::vector<double> h, a;
  for (index_t k = 1; k <= d; ++k) {
    opt.active_size = k;
    ivm::select(model, opt);
    CHECK(model.active_size() == k);
    dense_marginals(K, p.n, model.active(), model.site_b(), model.site_pi(), h, a);
    CHECK(max_abs_diff(model.mean(), h) < 1e-12);
    CHECK(max_abs_diff(model.variance(), a) < 1e-12);
  }
  // The included point's new marginal is its tilted distribution (ADF moment matching).
  ivm::BinaryIVM fresh(kernel, p.Xv(), p.y.data(), lik, 2);
  fresh.include(5);
  const auto u = fresh.adf(9);
  const double h9 = fresh.mean()[9], a9 = fresh.variance()[9];
  fresh.include(9);
  CHECK_NEAR(fresh.mean()[9], h9 + a9 * u.alpha, 1e-13);
  CHECK_NEAR(fresh.variance()[9], a9 * (1.0 - a9 * u.nu), 1e-13);

  // The bound's from-scratch marginals (BLAS 3, fixed sites) equal the incremental ones.
  std::vector<index_t> I = model.active();
  std::vector<double> hb(p.n), ab(p.n), grad(kernel.num_params());
  ivm::BoundGradients g;
  g.kernel = grad.data();
  const auto r = ivm::bound(kernel, lik, p.Xv(), p.y.data(), I.data(), d, model.site_b().data(),
                            model.site_pi().data(), &g, hb.data(), ab.data());
  CHECK(max_abs_diff(model.mean(), hb) < 1e-12);
  CHECK(max_abs_diff(model.variance(), ab) < 1e-12);
  CHECK(std::isfinite(r.value) && r.kl > 0.0);
}

PYGPFAST_TEST(selection_does_not_depend_on_the_thread_count) {
  const Problem p(3000);  // n d = 1.2e5 entries: the per-point loops may split
  const auto kernel = p.kernel();
  ivm::BinaryLikelihood lik;
  ivm::SelectOptions opt;
  opt.active_size = 40;
  opt.seed = 3;
  auto run = [&](int threads) {
    set_num_threads(threads);
    ivm::BinaryIVM model(kernel, p.Xv(), p.y.data(), lik, opt.active_size);
    ivm::select(model, opt);
    std::vector<double> out(model.mean(), model.mean() + p.n);
    out.insert(out.end(), model.variance(), model.variance() + p.n);
    for (index_t k : model.active()) out.push_back(static_cast<double>(k));
    out.insert(out.end(), model.site_b().begin(), model.site_b().end());
    // bound with gradient
    std::vector<double> grad(kernel.num_params());
    ivm::BoundGradients g;
    g.kernel = grad.data();
    const auto r = ivm::bound(kernel, lik, p.Xv(), p.y.data(), model.active().data(), opt.active_size,
                              model.site_b().data(), model.site_pi().data(), &g);
    out.push_back(r.value);
    out.insert(out.end(), grad.begin(), grad.end());
    return out;
  };
  const auto one = run(1), two = run(2), four = run(4);
  set_num_threads(0);
  CHECK(one == two);
  CHECK(one == four);
}

PYGPFAST_TEST(same_seed_same_selection_and_prefix_property) {
  const Problem p(200);
  const auto kernel = p.kernel();
  ivm::BinaryLikelihood lik;
  ivm::SelectOptions opt;
  opt.active_size = 20;
  opt.n_random = 3;
  opt.seed = 11;
  ivm::BinaryIVM a(kernel, p.Xv(), p.y.data(), lik, 20), b(kernel, p.Xv(), p.y.data(), lik, 20);
  ivm::select(a, opt);
  ivm::select(b, opt);
  CHECK(a.active() == b.active());
  opt.active_size = 12;
  ivm::BinaryIVM c(kernel, p.Xv(), p.y.data(), lik, 12);
  ivm::select(c, opt);
  CHECK(std::equal(c.active().begin(), c.active().end(), a.active().begin()));
  // Scores of greedy inclusions are non-negative and finite.
  for (std::size_t k = 3; k < a.scores().size(); ++k) CHECK(a.scores()[k] >= 0.0 && std::isfinite(a.scores()[k]));
}

PYGPFAST_TEST(bad_input_throws) {
  const Problem p(10);
  const auto kernel = p.kernel();
  ivm::BinaryLikelihood lik;
  CHECK_THROWS((ivm::BinaryIVM(kernel, p.Xv(), p.y.data(), lik, 11)), std::invalid_argument);
  std::vector<double> bad = p.y;
  bad[3] = 0.0;
  CHECK_THROWS((ivm::BinaryIVM(kernel, p.Xv(), bad.data(), lik, 3)), std::invalid_argument);
  ivm::BinaryIVM m(kernel, p.Xv(), p.y.data(), lik, 3);
  m.include(1);
  CHECK_THROWS(m.include(1), std::invalid_argument);
  CHECK_THROWS((m.include_site(2, 1.0, 0.0)), std::invalid_argument);
  lik.noise_variance = -1.0;
  CHECK_THROWS(ivm::validate(lik), std::invalid_argument);
}

PYGPFAST_TEST_MAIN
