// (a) of Algorithm 1 (cvi.hpp): the site precisions with the means fixed. The sweeps' scalar
// solves and blocked rank-one updates of V, the residual steps that replace sweeps which lower
// the bound, and V built from given site precisions (warm starts, rebuilds).
#include <algorithm>
#include <cmath>
#include <string>

#include "inference.hpp"
#include "pygpfast/blas.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/threads.hpp"

namespace pygpfast::cvi::detail {
namespace {

using blas::Trans;
using blas::Uplo;

// The sweeps' rank-b updates of V (SiteSweep::add_lower_update): column panels of N / 8
// columns within these bounds, and threads only for updates of at least this many flops
// (b N^2: 2.6e8 at N = 2000 and b = 64).
constexpr index_t kMinUpdatePanel = 64, kMaxUpdatePanel = 256;
constexpr double kParallelUpdateFlops = 3e7;

// Options::block_size = 0: rank-32 blocks below this many points, 64 from there. A block of b
// coordinates costs an O(b^2 N) recursion before its rank-b BLAS-3 update, which at small N
// outweighs what the longer update gains (fixed-kernel inferences, the same iterations and
// bound, 2 threads, 2026-11-25: scikit-learn's digits, N = 450 and ten classes, 3.3 to 3.9 s
// with 32 against 4.1 to 5.0 s with 64, the hyperparameter search 48 to 52 s against 54 to
// 65 s; three classes at N = 1000 3.3 to 3.8 s against 3.9 to 4.1 s; logit at N = 700 and
// 2000 the same either way; 128 at N = 450 three times slower than 64).
constexpr index_t kSmallBlocksBelow = 1500;

}  // namespace

// One pass over the coordinates of latent l. For coordinate i the rule maps (i, v_old, c)
// to the new marginal variance v (c = 1/v_old - lambda_i is held); then lambda_i = 1/v - c
// and V += (v - v_old)/v_old^2 V[:, i] V[:, i]^T (eqs. 19-20). Blocked as in cvi.hpp: the
// columns u_t = V[:, j_t] at the time of their update are W0 c_t for the block's starting
// columns W0 = V[:, J], with c_t = e_t + sum_{r<t} s_r u_r[j_t] c_r, so the block's
// updates add U diag(s) U^T with U = W0 [c_0 .. c_{b-1}].
template <class Rule>
void SiteSweep::sweep(index_t l, Rule&& rule) {
  const index_t N = state_.N, block_size = state_.opt.block_size,
                b = std::min(block_size > 0 ? block_size : N < kSmallBlocksBelow ? 32 : 64, N);
  MatrixView V = state_.V_of(l);
  double* lam = state_.lambda + l * N;
  double& logdet = state_.logdet[l];
  // Applies the rule to coordinate i with current variance v_old; returns s.
  auto update = [&](index_t i, double v_old) {
    if (!(v_old > 0.0))
      throw LinAlgError("cvi", static_cast<int>(i + 1),
                        "the posterior covariance lost positive definiteness at point " +
                            std::to_string(i) + " (a variance rounded to <= 0 in the rank-one "
                            "updates of V): " +
                            not_positive_definite_hint(state_.Sigma, lam, false));
    const double c = 1.0 / v_old - lam[i];
    const double v_new = rule(i, v_old, c);
    lam[i] = 1.0 / v_new - c;
    logdet += std::log(v_old / v_new);
    max_change_ = std::max(max_change_, std::max(v_old / v_new, v_new / v_old));
    return (v_new - v_old) / (v_old * v_old);
  };
  if (b == 1) {  // the literal algorithm: one BLAS-2 rank-one update (DSYR) per coordinate
    Buffer u(static_cast<std::size_t>(N));
    for (index_t i = 0; i < N; ++i) {
      for (index_t p = 0; p < N; ++p) u[p] = p <= i ? V(i, p) : V(p, i);
      const double s = update(i, u[i]);
      if (s != 0.0) blas::syr(Uplo::Lower, s, u.data(), V);
      state_.count.add(static_cast<double>(N) * N);
    }
    state_.refresh_variances(l);
    return;
  }
  Buffer W0(static_cast<std::size_t>(b * N));
  Buffer G(static_cast<std::size_t>(b * b)), Cm(static_cast<std::size_t>(b * b));
  Buffer Ub(static_cast<std::size_t>(b * b)), s(static_cast<std::size_t>(b));
  Buffer U(static_cast<std::size_t>(b * N)), R(static_cast<std::size_t>(b * N)),
      Us(static_cast<std::size_t>(b * N));
  for (index_t J0 = 0; J0 < N; J0 += b) {
    const index_t nb = std::min(b, N - J0);
    // W0 row t = column J0 + t of V, read from the lower triangle; G = V[J, J].
    for (index_t t = 0; t < nb; ++t) {
      const index_t j = J0 + t;
      double* w = W0.data() + t * N;
      std::copy(V.row(j), V.row(j) + j + 1, w);
      for (index_t p = j + 1; p < N; ++p) w[p] = V(p, j);
    }
    for (index_t t = 0; t < nb; ++t)
      for (index_t r = 0; r < nb; ++r) G[t * nb + r] = W0[t * N + J0 + r];
    std::fill(Cm.begin(), Cm.begin() + nb * nb, 0.0);  // Cm[r * nb + t] = (c_t)_r
    for (index_t t = 0; t < nb; ++t) {
      s[t] = update(J0 + t, G[t * nb + t]);
      for (index_t r = 0; r < nb; ++r) Ub[r * nb + t] = G[r * nb + t];  // u_t on the block
      Cm[t * nb + t] = 1.0;
      for (index_t q = 0; q < t; ++q) {
        const double w = s[q] * Ub[t * nb + q];
        if (w != 0.0)
          for (index_t r = 0; r < nb; ++r) Cm[r * nb + t] += w * Cm[r * nb + q];
      }
      if (s[t] != 0.0)
        for (index_t r = 0; r < nb; ++r) {
          const double w = s[t] * Ub[r * nb + t];
          for (index_t q = 0; q < nb; ++q) G[r * nb + q] += w * Ub[q * nb + t];
        }
    }
    // U rows = c_t^T W0 (U = Cm^T W0), then V_lower += U^T diag(s) U over the rows with
    // s != 0 (moved to the front, with s u_t in Us).
    {
      const SingleThreadScope small_product(true);
      blas::gemm(Trans::Yes, Trans::No, 1.0, ConstMatrixView(Cm.data(), nb, nb),
                 ConstMatrixView(W0.data(), nb, N), 0.0, MatrixView(U.data(), nb, N));
    }
    index_t k = 0;
    for (index_t t = 0; t < nb; ++t) {
      if (s[t] == 0.0) continue;
      if (k != t) std::copy(U.data() + t * N, U.data() + (t + 1) * N, U.data() + k * N);
      s[k++] = s[t];
    }
    add_lower_update(V, U.data(), s.data(), k, R.data(), Us.data());
    state_.count.add(2.0 * static_cast<double>(nb) * nb * N +
                     4.0 * static_cast<double>(nb) * nb * nb);
  }
  state_.refresh_variances(l);
}

// V's lower triangle += U^T diag(s) U for the rows U [k, N] (row-major, leading dimension N;
// s != 0), with scratch R, W [k, N]: R's rows are sqrt(s) u (s > 0) then sqrt(-s) u (s < 0),
// so that the update is R+^T R+ - R-^T R-, and W = diag(s) U.
//  * Updates of at least kParallelUpdateFlops: column panels of N / 8 columns (within
//    [kMinUpdatePanel, kMaxUpdatePanel]), each its diagonal block by two SYRKs and the rows
//    below by one GEMM. The threads take the panels dynamically, each with single-threaded
//    BLAS: with a core taken by another process the free thread does most of them, where a
//    BLAS call split in halves waits for its descheduled half. The panels are the same on any
//    number of threads, and so is the result.
//  * Smaller ones: two SYRKs on all of V.
void SiteSweep::add_lower_update(MatrixView V, const double* U, const double* s, index_t k,
                                 double* R, double* W) {
  if (k == 0) return;
  const index_t N = V.rows;
  index_t np = 0;
  for (index_t t = 0; t < k; ++t) np += s[t] > 0.0;
  for (index_t t = 0, ip = 0, in = np; t < k; ++t) {
    const double root = std::sqrt(std::fabs(s[t]));
    double* dst = R + (s[t] > 0.0 ? ip++ : in++) * N;
    for (index_t p = 0; p < N; ++p) dst[p] = root * U[t * N + p];
  }
  state_.count.add(static_cast<double>(k) * N * N);
  // The lower triangle of V[c0:c0+w, c0:c0+w] += R+^T R+ - R-^T R- on those columns.
  auto diagonal = [&](index_t c0, index_t w) {
    const MatrixView D(V.data + c0 * N + c0, w, w, N);
    if (np > 0) blas::syrk(Uplo::Lower, Trans::Yes, 1.0, ConstMatrixView(R + c0, np, w, N), 1.0, D);
    if (np < k)
      blas::syrk(Uplo::Lower, Trans::Yes, -1.0, ConstMatrixView(R + np * N + c0, k - np, w, N),
                 1.0, D);
  };
  const index_t width = std::clamp<index_t>(N / 8, kMinUpdatePanel, kMaxUpdatePanel);
  const index_t panels = (N + width - 1) / width;
  if (static_cast<double>(k) * N * N < kParallelUpdateFlops) {
    diagonal(0, N);
    return;
  }
  for (index_t t = 0; t < k; ++t)
    for (index_t p = 0; p < N; ++p) W[t * N + p] = s[t] * U[t * N + p];
  auto panel = [&](index_t q) {
    const index_t c0 = q * width, w = std::min(width, N - c0), below = c0 + w;
    diagonal(c0, w);
    if (below < N)
      blas::gemm(Trans::Yes, Trans::No, 1.0, ConstMatrixView(U + below, k, N - below, N),
                 ConstMatrixView(W + c0, k, w, N), 1.0,
                 MatrixView(V.data + below * N + c0, N - below, w, N));
  };
  for_each_blas_task(panels, threads_for_blas_calls(panels, 1), panel);
}

// The scalar problem of coordinate (l, i) (eq. 16): maximise
//   phi(v) = log v - c v + 2 f_b(v),   v phi'(v) = g(v) = 1 - v (c + lambda(v)),
// lambda = -2 g^v. The fixed-point iteration v <- 1/(c + lambda(v)) always moves towards
// the root of g (g > 0 makes the step go up), but it converges only linearly, slowly where
// phi is flat (at large prior variances its rate is about 0.2 sqrt(v) for the logit bound),
// and it can leave (0, inf). So in u = log v: the first step is the fixed-point step, later
// ones secant steps along the same side (doubling when the secant does not point ahead),
// and once g changes sign the root is bracketed and polished by the Illinois method (with
// bisection steps where it stalls). A result with a lower phi than v_old is refused. With
// rho < 1 the site precision moves by rho times its step; with may_skip a site whose variance
// would change by at most skip_tol is left (below). Returns the new variance.
double SiteSweep::solve_site(index_t l, index_t i, double v_old, double c, double rho,
                             bool may_skip) {
  const double* mi = state_.m.data() + i;
  const double* vi = state_.v.data() + i;
  SiteBound e{};
  auto g = [&](double u) {
    const double v = std::exp(u);
    state_.count.evaluate(1.0);
    e = site_bound(state_.lb, state_.y[i], mi, vi, state_.N, l, v);
    return 1.0 - v * (c + e.lambda);
  };
  auto phi = [&](double v) { return std::log(v) - c * v + 2.0 * e.value; };
  double u0 = std::log(v_old), g0 = g(u0);
  const double phi0 = phi(v_old);
  // phi is flat at its maximum: values that differ by the rounding of its terms are equal.
  const double noise =
      1e-13 * (1.0 + std::fabs(std::log(v_old)) + std::fabs(c * v_old) + 2.0 * std::fabs(e.value));
  // Where the site's bound overflows at v_old (a Poisson site from V = Sigma with Sigma_ii
  // past ~1420: e^(v/2) = inf, and the bound -inf), the search starts from a variance at
  // which it is finite (phi0 = -inf then accepts any finite result).
  for (int k = 0; k < 64 && !std::isfinite(g0); ++k) g0 = g(u0 -= 1.0);
  constexpr double kTol = 1e-14;
  double u = u0;
  if (std::fabs(g0) > kTol) {
    const double d = c + e.lambda;
    double u1 = d > 0.0 ? -std::log(d) : u0 + 1.0;
    double g1 = g(u1);
    int k = 0;
    for (; k < 200 && std::fabs(g1) > kTol && (g1 > 0.0) == (g0 > 0.0) &&
           std::fabs(u1 - u0) > kTol * std::max(1.0, std::fabs(u1));
         ++k) {
      const double step = u1 - u0;
      double u2 = u1 - g1 * step / (g1 - g0);
      const double ahead = (u2 - u1) / step;
      if (!(ahead > 0.0 && ahead <= 8.0)) u2 = u1 + 2.0 * step;
      u0 = u1;
      g0 = g1;
      u1 = u2;
      g1 = g(u1);
    }
    u = u1;
    if (std::fabs(g1) > kTol && (g1 > 0.0) != (g0 > 0.0)) {  // bracketed: Illinois
      ++bracketed_solves_;
      double a = u0, ga = g0, b = u1, gb = g1;
      int stalled = 0;  // consecutive steps that did not halve |g|
      for (k = 0; k < 200 && std::fabs(b - a) > kTol * std::max(1.0, std::fabs(b)); ++k) {
        // Across a wide bracket g can span hundreds of orders of magnitude (a Poisson site
        // from V = Sigma: e^(v/2) with v ~ 1000 at one end, O(1) at the other). The
        // interpolated points then stay at the small end and the Illinois halvings of ga
        // would need a thousand steps to move them: after three steps that did not halve
        // |g|, bisect.
        const double t = stalled >= 3 ? 0.5 * (a + b) : b - gb * (b - a) / (gb - ga);
        const double gt = g(t);
        stalled = std::fabs(gt) > 0.5 * std::fabs(gb) ? stalled + 1 : 0;
        if ((gt > 0.0) != (gb > 0.0)) {
          a = b;
          ga = gb;
        } else {
          ga *= 0.5;
        }
        b = t;
        gb = gt;
        if (std::fabs(gb) <= kTol) break;
      }
      u = b;
    }
    g(u);  // (leaves e at the result for phi)
  }
  const double v = std::exp(u);
  if (!(phi(v) >= phi0 - noise) || !(v > 0.0) || !std::isfinite(v)) {
    ++refused_solves_;
    return v_old;
  }
  // (The multinomial bound's sites are always solved: its likelihood is flat along the shift
  // of all latents at a point, lse(m + t 1) = lse(m) + t, so the bound's curvature there is
  // the prior's alone, and the means' cheap Newton steps see sum_l lambda_l - 1 as extra
  // curvature. Skipped sites leave that sum off 1 by up to skip_tol / v: on separable
  // classes at prior variance 1e4, ~1e-3 against the prior's ~1e-6, and the steps crept.
  // Nor are the sweeps of coupled iterations, whose means' step counted on every site's
  // response: with skip_tol = 1e-4 one was undone and the run cost more than without.)
  if (may_skip && state_.lb.type != LocalBoundType::Multinomial &&
      std::fabs(v - v_old) <= state_.opt.skip_tol * v_old)
    return v_old;
  if (rho == 1.0) return v;
  const double lam_old = 1.0 / v_old - c, lam_new = 1.0 / v - c;
  return 1.0 / (c + lam_old + rho * (lam_new - lam_old));
}

// V_l = (Omega + Lambda_l)^-1 from V_l = Sigma by rank-one updates that set each lambda_i
// from 0 to its current value, and the means from alpha. Returns whether any lambda_i != 0.
bool SiteSweep::build_V() {
  const index_t N = state_.N, L = state_.L;
  const ConstMatrixView Sigma = state_.Sigma;
  const Buffer target(state_.lambda, state_.lambda + L * N);
  std::fill(state_.lambda, state_.lambda + L * N, 0.0);
  std::fill(state_.logdet.begin(), state_.logdet.end(), 0.0);
  bool any = false;
  for (index_t l = 0; l < L; ++l) {
    MatrixView V = state_.V_of(l);
    for (index_t i = 0; i < N; ++i) std::copy(Sigma.row(i), Sigma.row(i) + N, V.row(i));
    const double* t = target.data() + l * N;
    const bool nonzero = std::any_of(t, t + N, [](double x) { return x != 0.0; });
    any = any || nonzero;
    if (nonzero)
      sweep(l, [&](index_t i, double /*v_old*/, double c) {
        if (!(c + t[i] > 0.0))
          throw LinAlgError("cvi", static_cast<int>(i + 1),
                            "the starting site precisions do not give a positive-definite "
                            "posterior precision Omega + Lambda (site " +
                                std::to_string(i) + "); start from lambda = 0");
        return 1.0 / (c + t[i]);
      });
    else
      state_.refresh_variances(l);
    state_.compute_mean(l);
  }
  return any;
}

// A step of every site precision along its residual, lambda <- lambda - t r with
// r = lambda + 2 g^v from the start of the step: with m fixed the bound's gradient in lambda
// is -1/2 (V o V) r and V o V is positive definite (Schur product), so -r is an ascent
// direction and a small enough t raises the bound. Applied by the same blocked rank-one
// updates (a sweep with given targets); a site whose target would leave c + lambda <= 0
// moves half way to the bound of positivity instead.
void SiteSweep::residual_step(double t, const Buffer& r) {
  for (index_t l = 0; l < state_.L; ++l) {
    const double* rl = r.data() + l * state_.N;
    sweep(l, [&](index_t i, double v_old, double c) {
      const double lam = 1.0 / v_old - c;
      double target = lam - t * rl[i];
      if (!(c + target > 0.0)) target = 0.5 * (lam - c);
      return 1.0 / (c + target);
    });
  }
}

// One sweep of scalar solves over every latent's sites (the rule of Algorithm 1).
void SiteSweep::solve_sites(double rho, bool may_skip) {
  for (index_t l = 0; l < state_.L; ++l)
    sweep(l, [&](index_t i, double v_old, double c) {
      return solve_site(l, i, v_old, c, rho, may_skip);
    });
}

}  // namespace pygpfast::cvi::detail
