// Concave variational inference (seed 004) against closed forms and a dense reference, with a
// linked system BLAS.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <random>
#include <vector>

#include "check.hpp"
#include "pygpfast/blas.hpp"
#include "pygpfast/cvi/cvi.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/linalg.hpp"
#include "pygpfast/piecewise.hpp"

using namespace pygpfast;

namespace {

// A three-piece upper bound on llp(x) = log(1 + e^x): the constant llp(-2) up to -2, the chord
// of llp on [-2, 2], then x + llp(-2) (so B >= llp, convex between the knots).
piecewise::Bound small_bound() {
  const double l2 = std::log1p(std::exp(-2.0));
  piecewise::Bound b;
  const double inf = std::numeric_limits<double>::infinity();
  b.knots = {-inf, -2.0, 2.0, inf};
  b.a = {0.0, 0.0, 0.0};
  b.b = {0.0, 0.5, 1.0};
  b.c = {l2, l2 + 1.0, l2};
  return b;
}

struct Problem {
  index_t N;
  std::vector<double> Sigma, y;
};

// An RBF kernel matrix (variance 2, lengthscale 1) plus 1e-3 I on random 2-D inputs.
Problem problem(index_t N, unsigned seed, bool counts) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> g;
  std::uniform_real_distribution<double> u;
  std::vector<double> X(2 * N);
  for (auto& x : X) x = g(rng);
  Problem p{N, std::vector<double>(N * N), std::vector<double>(N)};
  for (index_t i = 0; i < N; ++i) {
    for (index_t j = 0; j < N; ++j) {
      const double dx = X[2 * i] - X[2 * j], dy = X[2 * i + 1] - X[2 * j + 1];
      p.Sigma[i * N + j] = 2.0 * std::exp(-0.5 * (dx * dx + dy * dy)) + (i == j ? 1e-3 : 0.0);
    }
    const double f = std::sin(2.0 * X[2 * i]) + X[2 * i + 1];
    p.y[i] = counts ? std::floor(std::exp(0.5 + f) * u(rng) * 2.0) : (u(rng) < 1.0 / (1.0 + std::exp(-2.0 * f)) ? 1.0 : 0.0);
  }
  return p;
}

cvi::LocalBound logit() {
  cvi::LocalBound lb;
  lb.type = cvi::LocalBoundType::BernoulliLogit;
  lb.llp = small_bound();
  return lb;
}

// Sigma - Sigma S B^-1 S Sigma with B = I + S Sigma S, S = diag(sqrt(lambda)): the dense
// (Omega + Lambda)^-1.
std::vector<double> dense_V(const Problem& p, const double* lambda) {
  const index_t N = p.N;
  std::vector<double> B(N * N), A(N * N), V(p.Sigma);
  for (index_t i = 0; i < N; ++i)
    for (index_t j = 0; j < N; ++j) {
      B[i * N + j] = std::sqrt(lambda[i]) * p.Sigma[i * N + j] * std::sqrt(lambda[j]) + (i == j);
      A[i * N + j] = std::sqrt(lambda[i]) * p.Sigma[i * N + j];
    }
  linalg::cholesky_jitter(MatrixView(B.data(), N, N), 0.0, 0.0);
  linalg::solve_lower(ConstMatrixView(B.data(), N, N), MatrixView(A.data(), N, N), false);
  blas::syrk(blas::Uplo::Lower, blas::Trans::Yes, -1.0, ConstMatrixView(A.data(), N, N), 1.0,
             MatrixView(V.data(), N, N));
  for (index_t i = 0; i < N; ++i)
    for (index_t j = i + 1; j < N; ++j) V[i * N + j] = V[j * N + i];
  return V;
}

}  // namespace

PYGPFAST_TEST(poisson_and_logit_local_bounds_are_their_closed_forms) {
  cvi::LocalBound pois;
  pois.type = cvi::LocalBoundType::Poisson;
  const double y[3] = {3.0, 0.0, 2.5}, m[3] = {0.4, -1.0, 0.7}, v[3] = {0.5, 2.0, 0.1};
  double f[3], dm[3], dv[3], d2m[3];
  cvi::check_labels(pois, y, 3);
  cvi::local_bounds(pois, y, 3, m, v, f, dm, dv, d2m, nullptr);
  for (int i = 0; i < 3; ++i) {  // (y = 2.5: a non-integer by the same formula)
    const double rate = std::exp(m[i] + 0.5 * v[i]);
    CHECK_NEAR(f[i], y[i] * m[i] - rate - std::lgamma(y[i] + 1.0), 1e-14);
    CHECK_NEAR(dm[i], y[i] - rate, 1e-14);
    CHECK_NEAR(dv[i], -0.5 * rate, 1e-14);
    CHECK_NEAR(d2m[i], -rate, 1e-14);
  }
  for (double bad : {-0.5, std::nan(""), HUGE_VAL}) {
    const double yb[2] = {1.0, bad};
    CHECK_THROWS(cvi::check_labels(pois, yb, 2), std::invalid_argument);
  }
  const auto lb = logit();
  const double yl[2] = {1.0, 0.0};
  cvi::local_bounds(lb, yl, 2, m, v, f, dm, dv, d2m, nullptr);
  for (int i = 0; i < 2; ++i) {
    const auto e = piecewise::expected_bound_at(lb.llp, m[i], v[i]);
    CHECK_NEAR(f[i], yl[i] * m[i] - e.value, 1e-14);
    CHECK_NEAR(dv[i], -e.dv, 1e-14);
    const auto s = cvi::site_bound(lb, yl[i], m + i, v + i, 2, 0, v[i]);
    CHECK_NEAR(s.lambda, -2.0 * dv[i], 1e-14);
  }
  // dm, dv and d2m against central differences of the values
  const double h = 1e-5;
  for (int i = 0; i < 2; ++i) {
    double mp[2] = {m[0], m[1]}, mm[2] = {m[0], m[1]}, vp[2] = {v[0], v[1]}, vm[2] = {v[0], v[1]};
    mp[i] += h;
    mm[i] -= h;
    vp[i] += h;
    vm[i] -= h;
    double fp[2], fm[2], fvp[2], fvm[2];
    cvi::local_bounds(lb, yl, 2, mp, v, fp, nullptr, nullptr, nullptr, nullptr);
    cvi::local_bounds(lb, yl, 2, mm, v, fm, nullptr, nullptr, nullptr, nullptr);
    cvi::local_bounds(lb, yl, 2, m, vp, fvp, nullptr, nullptr, nullptr, nullptr);
    cvi::local_bounds(lb, yl, 2, m, vm, fvm, nullptr, nullptr, nullptr, nullptr);
    const double fd_m = (fp[i] - fm[i]) / (2.0 * h), fd_v = (fvp[i] - fvm[i]) / (2.0 * h);
    CHECK_NEAR(dm[i], fd_m, 1e-7);
    CHECK_NEAR(dv[i], fd_v, 1e-7);
    CHECK_NEAR(d2m[i], (fp[i] - 2.0 * f[i] + fm[i]) / (h * h), 1e-3);
  }
}

PYGPFAST_TEST(multinomial_site_bound_gives_the_softmax_site_precision) {
  cvi::LocalBound lb;
  lb.type = cvi::LocalBoundType::Multinomial;
  lb.num_classes = 3;
  const index_t N = 2;
  const double y[N] = {2.0, 0.0};
  const double m[3 * N] = {0.5, -1.0, 0.0, 2.0, -0.3, 0.1};  // [L, N]
  const double v[3 * N] = {0.4, 1.5, 0.2, 0.3, 1.0, 0.05};
  double f[N], dm[3 * N], dv[3 * N], d2m[3 * N];
  cvi::local_bounds(lb, y, N, m, v, f, dm, dv, d2m, nullptr);
  for (index_t n = 0; n < N; ++n)
    for (index_t l = 0; l < 3; ++l) {
      const auto s = cvi::site_bound(lb, y[n], m + n, v + n, N, l, v[l * N + n]);
      CHECK_NEAR(s.value, f[n], 1e-14);
      CHECK_NEAR(s.lambda, -2.0 * dv[l * N + n], 1e-14);
    }
}

PYGPFAST_TEST(blocked_and_literal_algorithm_1_agree_and_solve_eqs_7_8) {
  const auto p = problem(48, 5, false);
  const auto lb = logit();
  const index_t N = p.N;
  const double mean = 0.0;
  std::vector<std::vector<double>> V(2, std::vector<double>(N * N));
  std::vector<std::vector<double>> lam(2, std::vector<double>(N, 0.0)), alpha(lam);
  cvi::Result res[2];
  const index_t blocks[2] = {1, 16};
  for (int k = 0; k < 2; ++k) {
    cvi::Options opt;
    opt.block_size = blocks[k];
    opt.tol = 0.0;
    res[k] = cvi::infer(lb, p.y.data(), ConstMatrixView(p.Sigma.data(), N, N), &mean,
                        alpha[k].data(), lam[k].data(), opt, V[k].data());
  }
  CHECK(res[0].converged && res[1].converged);
  CHECK_NEAR(res[0].bound, res[1].bound, 1e-11 * std::fabs(res[0].bound));
  // With tol = 0 both run until the bound stops rising in its last digits, which rounding
  // (the BLAS, its thread count) can put a few iterations apart (measured: 11 and 10 records
  // with two BLAS threads, 14 and 12 with one): the iterates agree up to the shorter run's
  // end, and the longer run's extra records move the bound by rounding only.
  const std::size_t n0 = res[0].history.size(), n1 = res[1].history.size();
  CHECK(n0 >= 3 && n1 >= 3);
  const auto& longer = n0 > n1 ? res[0].history : res[1].history;
  const std::size_t common = std::min(n0, n1);
  for (std::size_t i = common; i < longer.size(); ++i)
    CHECK_NEAR(longer[i].bound, longer[common - 1].bound, 1e-12 * std::fabs(res[0].bound));
  for (std::size_t i = 0; i < res[0].history.size() && i < res[1].history.size(); ++i)
    CHECK_NEAR(res[0].history[i].bound, res[1].history[i].bound, 1e-10);
  for (std::size_t i = 1; i < res[1].history.size(); ++i)
    CHECK(res[1].history[i].bound >= res[1].history[i - 1].bound - 1e-12);
  CHECK(res[1].max_residual_alpha < 1e-7);
  CHECK(res[1].max_residual_lambda < 1e-7);
  const auto ref = dense_V(p, lam[1].data());
  double err = 0.0;
  for (index_t i = 0; i < N * N; ++i) err = std::max(err, std::fabs(ref[i] - V[1][i]));
  CHECK(err < 1e-12);
  // The Opper-Archambeau objective at the solution is the same bound and is stationary.
  std::vector<double> da(N), dl(N);
  const double oa = cvi::oa_objective(lb, p.y.data(), ConstMatrixView(p.Sigma.data(), N, N),
                                      &mean, alpha[1].data(), lam[1].data(), da.data(), dl.data(),
                                      nullptr, nullptr);
  CHECK_NEAR(oa, res[1].bound, 1e-10 * std::fabs(oa));
  double g = 0.0;
  for (index_t i = 0; i < N; ++i) g = std::max(g, std::max(std::fabs(da[i]), std::fabs(dl[i])));
  CHECK(g < 1e-6);
}

PYGPFAST_TEST(poisson_warm_start_and_bad_start) {
  const auto p = problem(40, 9, true);
  cvi::LocalBound lb;
  lb.type = cvi::LocalBoundType::Poisson;
  const index_t N = p.N;
  const double mean = 0.5;
  std::vector<double> alpha(N, 0.0), lam(N, 0.0);
  cvi::Options opt;
  opt.tol = 1e-13;
  const auto cold = cvi::infer(lb, p.y.data(), ConstMatrixView(p.Sigma.data(), N, N), &mean,
                               alpha.data(), lam.data(), opt, nullptr);
  for (auto& l : lam) l *= 1.3;
  const auto warm = cvi::infer(lb, p.y.data(), ConstMatrixView(p.Sigma.data(), N, N), &mean,
                               alpha.data(), lam.data(), opt, nullptr);
  CHECK_NEAR(warm.bound, cold.bound, 1e-10 * std::fabs(cold.bound));
  CHECK(warm.iterations <= cold.iterations);
  std::vector<double> bad(N, -1e4), zero(N, 0.0);
  CHECK_THROWS(cvi::infer(lb, p.y.data(), ConstMatrixView(p.Sigma.data(), N, N), &mean,
                          zero.data(), bad.data(), opt, nullptr),
               LinAlgError);
  std::vector<double> y(p.y);
  y[3] = -1.0;
  CHECK_THROWS(cvi::infer(lb, y.data(), ConstMatrixView(p.Sigma.data(), N, N), &mean,
                          zero.data(), zero.data(), opt, nullptr),
               std::invalid_argument);
}

// The multinomial bound's coupled mean steps (cvi.hpp): at prior variance 100 they run, reach
// Algorithm 1's optimum in fewer iterations with the bound never falling, and leave the
// returned V_l exact and symmetric (the step keeps M_l^-1 in V_l's upper triangle meanwhile).
PYGPFAST_TEST(multinomial_coupled_steps_reach_algorithm_1s_optimum) {
  auto p = problem(40, 3, false);
  const index_t N = p.N, L = 3;
  for (auto& s : p.Sigma) s *= 50.0;
  for (index_t i = 0; i < N; ++i) p.y[i] = std::fmod(p.y[i] + static_cast<double>(i % 3), 3.0);
  cvi::LocalBound lb;
  lb.type = cvi::LocalBoundType::Multinomial;
  lb.num_classes = static_cast<int>(L);
  const double mean[3] = {0.0, 0.0, 0.0};
  cvi::Result res[2];
  std::vector<std::vector<double>> lam(2, std::vector<double>(L * N, 0.0)), alpha(lam);
  std::vector<double> V(L * N * N);
  for (int k = 0; k < 2; ++k) {
    cvi::Options opt;
    opt.tol = 1e-12;
    opt.max_iter = 2000;
    opt.coupled_means = k == 1;
    res[k] = cvi::infer(lb, p.y.data(), ConstMatrixView(p.Sigma.data(), N, N), mean,
                        alpha[k].data(), lam[k].data(), opt, k == 1 ? V.data() : nullptr);
  }
  CHECK(res[0].converged && res[1].converged);
  CHECK(res[0].coupled_steps == 0 && res[1].coupled_steps >= 2);
  CHECK(res[1].iterations < res[0].iterations);
  CHECK_NEAR(res[1].bound, res[0].bound, 1e-10 * std::fabs(res[0].bound));
  for (std::size_t i = 1; i < res[1].history.size(); ++i)
    CHECK(res[1].history[i].bound >= res[1].history[i - 1].bound - 1e-12 * std::fabs(res[1].bound));
  for (index_t l = 0; l < L; ++l) {
    const auto ref = dense_V(p, lam[1].data() + l * N);
    double err = 0.0, scale = 0.0;
    for (index_t i = 0; i < N * N; ++i) {
      err = std::max(err, std::fabs(ref[i] - V[l * N * N + i]));
      scale = std::max(scale, std::fabs(ref[i]));
    }
    CHECK(err < 1e-9 * scale);
  }
}

PYGPFAST_TEST_MAIN
