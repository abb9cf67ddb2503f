// (b) of Algorithm 1 (cvi.hpp): the means with V fixed. Newton's steps on eq. (21) (cheap ones
// through V, with a Woodbury correction for the multinomial bound, and exact GPML-style ones),
// and the coupled mean steps that anticipate the next sweep (separable bounds by GMRES, the
// multinomial bound directly).
#include <algorithm>
#include <cmath>

#include "inference.hpp"
#include "pygpfast/blas.hpp"
#include "pygpfast/linalg.hpp"

namespace pygpfast::cvi::detail {
namespace {

using blas::Diag;
using blas::Trans;
using blas::Uplo;
using linalg::fixed_order_sum;

// Coupled mean steps: the GMRES tolerance (relative residual; 1e-6 and 1e-4 left 7 and 33
// iterations undone on the 130 problems of kCoupledRate, inference.cpp), budget of products and
// restart length, and the relative step of the central differences for F_mv and F_vv.
constexpr double kCoupledSolveTol = 1e-9;
constexpr int kCoupledMaxProducts = 300, kCoupledRestart = 50;
constexpr double kSecondDerivativeStep = 1e-4;
// The multinomial bound's trust region: no mean moves by more than this in one coupled step.
// Chosen with the 5% test of kCoupledRate (inference.cpp): on glass (9 settings, cold and warm
// at 1.1 times the variance) and six synthetic problems, 1790 iterations and 67.1 GFLOP for
// Algorithm 1; with limits 1 to 6: 819, 570, 487, 458, 540, 892 iterations (34.4, 24.4, 21.6,
// 20.5, 25.5, 34.5 GFLOP), 0 to 12 of them undone; without a limit 1429 (cold starts at large
// variance undid their first two and went on alone).
constexpr double kMultinomialStepLimit = 3.0;

// Restarted GMRES (modified Gram-Schmidt, Givens rotations) for A x = b from x = 0, with
// `apply(x, y)` computing y = A x. Returns whether |b - A x| <= tol |b| was reached within
// max_products products; `products` receives their number, and `flops` the flops of GMRES's
// own vector work (the products' are the caller's to count).
template <class Apply>
bool gmres(index_t n, const Apply& apply, const double* b, double* x, double tol, int restart,
           int max_products, int& products, double& flops) {
  products = 0;
  const auto dn = static_cast<double>(n);
  flops = 2.0 * dn;
  std::fill(x, x + n, 0.0);
  double bnorm = 0.0;
  for (index_t i = 0; i < n; ++i) bnorm += b[i] * b[i];
  bnorm = std::sqrt(bnorm);
  if (bnorm == 0.0) return true;
  const auto m = static_cast<std::size_t>(restart);
  Buffer Q((m + 1) * static_cast<std::size_t>(n)), H((m + 1) * m), cs(m), sn(m), g(m + 1), w(n);
  while (products < max_products) {
    // r = b - A x into Q's first row
    double* q0 = Q.data();
    if (products == 0) {
      std::copy(b, b + n, q0);
    } else {
      apply(x, w.data());
      ++products;
      for (index_t i = 0; i < n; ++i) q0[i] = b[i] - w[i];
      flops += dn;
    }
    flops += 3.0 * dn;  // (beta and the scaling)
    double beta = 0.0;
    for (index_t i = 0; i < n; ++i) beta += q0[i] * q0[i];
    beta = std::sqrt(beta);
    if (!std::isfinite(beta)) return false;
    if (beta <= tol * bnorm) return true;
    for (index_t i = 0; i < n; ++i) q0[i] /= beta;
    std::fill(g.begin(), g.end(), 0.0);
    g[0] = beta;
    std::size_t k = 0;
    bool done = false;
    for (; k < m && products < max_products; ++k) {
      double* qk1 = Q.data() + (k + 1) * n;
      apply(Q.data() + k * n, qk1);
      ++products;
      for (std::size_t j = 0; j <= k; ++j) {
        const double* qj = Q.data() + j * n;
        double h = 0.0;
        for (index_t i = 0; i < n; ++i) h += qj[i] * qk1[i];
        H[j * m + k] = h;
        for (index_t i = 0; i < n; ++i) qk1[i] -= h * qj[i];
      }
      double h1 = 0.0;
      for (index_t i = 0; i < n; ++i) h1 += qk1[i] * qk1[i];
      h1 = std::sqrt(h1);
      if (h1 > 0.0)
        for (index_t i = 0; i < n; ++i) qk1[i] /= h1;
      flops += 4.0 * dn * static_cast<double>(k + 1) + 3.0 * dn + 6.0 * static_cast<double>(k) + 8.0;
      for (std::size_t j = 0; j < k; ++j) {  // earlier rotations on column k
        const double a = H[j * m + k], c = H[(j + 1) * m + k];
        H[j * m + k] = cs[j] * a + sn[j] * c;
        H[(j + 1) * m + k] = -sn[j] * a + cs[j] * c;
      }
      const double a = H[k * m + k], r = std::hypot(a, h1);
      if (!(r > 0.0) || !std::isfinite(r)) return false;
      cs[k] = a / r;
      sn[k] = h1 / r;
      H[k * m + k] = r;
      g[k + 1] = -sn[k] * g[k];
      g[k] = cs[k] * g[k];
      if (std::fabs(g[k + 1]) <= tol * bnorm || h1 == 0.0) {
        ++k;
        done = true;
        break;
      }
    }
    // x += Q^T y with H[:k, :k] y = g[:k] (upper triangular)
    Buffer yk(k);
    for (std::size_t j = k; j-- > 0;) {
      double t = g[j];
      for (std::size_t i = j + 1; i < k; ++i) t -= H[j * m + i] * yk[i];
      yk[j] = t / H[j * m + j];
    }
    for (std::size_t j = 0; j < k; ++j)
      for (index_t i = 0; i < n; ++i) x[i] += yk[j] * Q[j * n + i];
    flops += static_cast<double>(k * k) + 2.0 * dn * static_cast<double>(k);
    if (done) return true;
  }
  return false;
}

}  // namespace

// Newton's method for the means (eq. 21) with V fixed, maximising
//   Psi = sum_n f_b - 1/2 sum_l alpha_l . (m_l - mean_l)
// over alpha (m_l = mean_l + Sigma alpha_l), with a backtracking (Armijo) line search. The
// Hessian in m is -(Omega + W), W = -d^2 f_b / dm^2 (block diagonal over latents except for
// the multinomial bound, whose per-point block is diag(p) - p p^T).
//  * Cheap steps, for all latents at once. For the likelihoods that are Gaussian
//    expectations W = -2 g^v, which after a sweep equals the site precisions lambda, so
//    (Omega + W)^-1 = V and the step costs SYMVs: with r = g^m - alpha, dm = V r. For the
//    multinomial bound lambda = p, so Omega + W = V^-1 - P P^T (P stacks diag(p_l)) and by
//    Woodbury dm_l = u_l + V_l (p_l z), u_l = V_l r_l, z = S^-1 sum_l p_l u_l with
//    S = I - sum_l diag(p_l) V_l diag(p_l) (one N^3/3 Cholesky for all latents). Then
//    dalpha = Omega dm = V^-1 dm - lambda dm without Omega.
//  * Exact steps, one latent at a time in turn (block coordinate), GPML-style with W_l
//    clipped at 0: with b = W (m - mean) + g^m, the Newton point is
//    alpha = b - W^1/2 B^-1 W^1/2 Sigma b, B = I + W^1/2 Sigma W^1/2 (N^3/3).
// Cheap steps are used while they are taken whole and cost less than exact ones (below).
// The multinomial bound's cheap steps go on while they converge fast and leave the rest to
// the next sweep, which brings lambda back to p (below). Returns false when the means were
// left short of their optimum for that reason.
bool MeanSteps::update_means() {
  const index_t N = state_.N, L = state_.L;
  const bool multinomial = state_.lb.type == LocalBoundType::Multinomial;
  const auto LN = static_cast<std::size_t>(L * N);
  Buffer sw(N), rhs(N), r(LN), step_a(LN), step_m(LN), try_m(LN), try_a(LN), try_f(N), z(N);
  auto psi = [&](const double* f, const double* mm, const double* aa) {
    double kl = 0.0;
    for (index_t l = 0; l < L; ++l)
      for (index_t n = 0; n < N; ++n) kl += aa[l * N + n] * (mm[l * N + n] - state_.mean[l]);
    return fixed_order_sum(f, N) - 0.5 * kl;
  };
  bool exact = false;
  index_t latent = 0;   // the latent of the next exact step
  index_t settled = 0;  // consecutive exact steps without a measurable gain
  double last_gain = 0.0;
  for (int it = 0; it < state_.opt.max_newton * L; ++it) {
    local_bounds(state_.lb, state_.y, N, state_.m.data(), state_.v.data(), state_.f.data(),
                 state_.dm.data(), state_.dv.data(), state_.d2m.data(), nullptr);
    state_.count.evaluate(static_cast<double>(N * L));
    const double psi0 = psi(state_.f.data(), state_.m.data(), state_.alpha);
    for (std::size_t i = 0; i < LN; ++i) r[i] = state_.dm[i] - state_.alpha[i];
    std::fill(step_a.begin(), step_a.end(), 0.0);
    index_t first = 0, last = L;  // latents that move
    if (!exact) {
      for (index_t l = 0; l < L; ++l)
        blas::symv(Uplo::Lower, 1.0, state_.V_of(l), r.data() + l * N, 0.0, step_m.data() + l * N);
      state_.count.add(2.0 * static_cast<double>(L) * N * N);
      if (multinomial && !woodbury_correction(step_m.data(), z.data(), step_a.data(), false) &&
          !woodbury_correction(step_m.data(), z.data(), step_a.data(), true)) {
        exact = true;
        continue;
      }
      for (std::size_t i = 0; i < LN; ++i) step_a[i] += r[i] - state_.lambda[i] * step_m[i];
    } else {
      first = latent;
      last = latent + 1;
      latent = (latent + 1) % L;
      exact_step(first, sw.data(), rhs.data(), step_a.data() + first * N);
    }
    for (index_t l = first; l < last; ++l)
      blas::symv(Uplo::Lower, 1.0, state_.Sigma, step_a.data() + l * N, 0.0, step_m.data() + l * N);
    state_.count.add(2.0 * static_cast<double>(last - first) * N * N);
    double slope = 0.0;  // d Psi / dt along the step
    for (index_t i = first * N; i < last * N; ++i) slope += step_m[i] * r[i];
    double gained = -1.0, t = 1.0;
    if (slope > 1e-15 * std::max(1.0, std::fabs(psi0))) {
      std::copy(state_.m.begin(), state_.m.end(), try_m.begin());
      std::copy(state_.alpha, state_.alpha + LN, try_a.begin());
      for (int k = 0; k < 50; ++k, t *= 0.5) {
        for (index_t i = first * N; i < last * N; ++i) {
          try_m[i] = state_.m[i] + t * step_m[i];
          try_a[i] = state_.alpha[i] + t * step_a[i];
        }
        local_bounds(state_.lb, state_.y, N, try_m.data(), state_.v.data(), try_f.data(), nullptr,
                     nullptr, nullptr, nullptr);
        state_.count.evaluate(static_cast<double>(N * L));
        const double value = psi(try_f.data(), try_m.data(), try_a.data());
        if (std::isfinite(value) && value >= psi0 + 1e-4 * t * slope) {
          gained = value - psi0;
          break;
        }
      }
    }
    const double enough = std::max(state_.opt.tol, 0.0) * std::max(1.0, std::fabs(psi0));
    const bool small = gained <= enough;
    if (gained >= 0.0) {
      std::copy(try_m.begin(), try_m.end(), state_.m.begin());
      std::copy(try_a.begin(), try_a.end(), state_.alpha);
    }
    if (!exact) {
      if (gained < 0.0) {  // the cheap step failed: go on with exact ones
        exact = true;
        continue;
      }
      // Cheap steps converge linearly, with gains shrinking by about rate = gained /
      // last_gain per step.
      const double rate = it > 0 && last_gain > 0.0 ? gained / last_gain : 0.0;
      last_gain = gained;
      if (multinomial) {
        // Its cheap step is Newton's while lambda = p, and the means moving p away from
        // lambda make it slow or cut. Exact steps, one latent at a time, converge slowly
        // too (the latents are coupled through p p^T): measured at N = 1000, L = 3, 80 to
        // 90 of them (N^3 / 3 each) in an outer iteration, against a sweep's L N^3. So
        // stop once the gains still to come (a geometric series) are within the tolerance,
        // or hand over to the sweep once a step is cut or the rate exceeds 1/2.
        if (small && rate < 1.0 && gained * rate / (1.0 - rate) <= enough) return true;
        if (t < 1.0 || rate > 0.5) return false;
        continue;
      }
      if (small) break;
      // Switch when a step was cut, or when the cheap steps still needed
      // (log(enough / gained) / log(rate)) would cost more than exact ones: an exact step
      // costs N^3/3 + 4 N^2 flops (the Cholesky of B and two SYMVs), a cheap one 4 L N^2.
      if (t < 1.0) exact = true;
      if (!exact && rate > 0.1) {
        const double cheap_cost = 4.0 * static_cast<double>(L);
        const double exact_cost = static_cast<double>(N) / 3.0 + 4.0;
        exact = rate >= 1.0 || std::log(enough / gained) / std::log(rate) * cheap_cost > exact_cost;
      }
    } else {
      settled = small ? settled + 1 : 0;
      if (settled >= L) break;
    }
  }
  return true;
}

// The coupled mean step (cvi.hpp): (dm, dv) by GMRES, then alpha += dalpha and m from alpha.
// Returns false, with alpha and m as they were, where GMRES does not converge or the step is
// not finite. Reads g^m, g^v, d2m and r = lambda + 2 g^v at the current (m, v) from the state's
// dm, dv, d2m and residual, which Inference::evaluate() left there (every iteration of
// Inference::run() ends with it).
bool MeanSteps::coupled_step() {
  if (state_.lb.type == LocalBoundType::Multinomial) return coupled_step_multinomial();
  const index_t N = state_.N, L = state_.L, LN = L * N;
  // The separable bounds' second derivatives (their latents do not interact): F_mm = d2m and
  // F_mv, F_vv by central differences of g^m and g^v in v.
  const Buffer& Fmm = state_.d2m;
  Buffer Fmv(LN), Fvv(LN);
  {
    Buffer vp(LN), vn(LN), dmp(LN), dvp(LN), dmn(LN), dvn(LN), fx(N);
    for (index_t i = 0; i < LN; ++i) {
      vp[i] = state_.v[i] * (1.0 + kSecondDerivativeStep);
      vn[i] = state_.v[i] * (1.0 - kSecondDerivativeStep);
    }
    local_bounds(state_.lb, state_.y, N, state_.m.data(), vp.data(), fx.data(), dmp.data(),
                 dvp.data(), nullptr, nullptr);
    local_bounds(state_.lb, state_.y, N, state_.m.data(), vn.data(), fx.data(), dmn.data(),
                 dvn.data(), nullptr, nullptr);
    state_.count.evaluate(2.0 * static_cast<double>(LN));
    for (index_t i = 0; i < LN; ++i) {
      const double h2 = vp[i] - vn[i];
      Fmv[i] = (dmp[i] - dmn[i]) / h2;
      Fvv[i] = (dvp[i] - dvn[i]) / h2;
    }
  }
  // The system is block diagonal over latents (separable bounds): one GMRES per latent, with
  // W_l = V_l o V_l formed in B's lower triangle (N^2 / 2 products) so that both products
  // are SYMVs.
  if (B_.empty()) B_.resize(static_cast<std::size_t>(N * N));
  const MatrixView Wl(B_.data(), N, N);
  Buffer dalpha(LN), rhs(2 * N), x(2 * N), a(N), c(N);
  const double n2 = static_cast<double>(N) * N;
  for (index_t l = 0; l < L; ++l) {
    const ConstMatrixView Vl = state_.V_of(l);
    for (index_t i = 0; i < N; ++i)
      for (index_t j = 0; j <= i; ++j) Wl(i, j) = Vl(i, j) * Vl(i, j);
    const index_t o = l * N;
    for (index_t n = 0; n < N; ++n)
      dalpha[o + n] = state_.dm[o + n] - state_.alpha[o + n];  // g^m - alpha, the step's first term
    blas::symv(Uplo::Lower, 1.0, Vl, dalpha.data() + o, 0.0, rhs.data());
    blas::symv(Uplo::Lower, 1.0, Wl, state_.residual.data() + o, 0.0, rhs.data() + N);
    // y = A x for x = (dm, dv): a = (lambda + F_mm) dm + F_mv dv, c = 2 (F_mv dm + F_vv dv),
    // y = (dm - V a, dv - W c).
    auto apply = [&](const double* xv, double* yv) {
      for (index_t n = 0; n < N; ++n) {
        a[n] = (state_.lambda[o + n] + Fmm[o + n]) * xv[n] + Fmv[o + n] * xv[N + n];
        c[n] = 2.0 * (Fmv[o + n] * xv[n] + Fvv[o + n] * xv[N + n]);
      }
      std::copy(xv, xv + 2 * N, yv);
      blas::symv(Uplo::Lower, -1.0, Vl, a.data(), 1.0, yv);
      blas::symv(Uplo::Lower, -1.0, Wl, c.data(), 1.0, yv + N);
    };
    int products = 0;
    double gmres_flops = 0.0;
    const bool solved = gmres(2 * N, apply, rhs.data(), x.data(), kCoupledSolveTol, kCoupledRestart,
                              kCoupledMaxProducts, products, gmres_flops);
    // W (N^2 / 2 squares), the right-hand side (two SYMVs) and each product (two SYMVs, a
    // and c), dalpha below, and GMRES's own work
    state_.count.add(0.5 * n2 + 4.0 * n2 * (products + 1) +
                     8.0 * static_cast<double>(N) * products + 4.0 * static_cast<double>(N) +
                     gmres_flops);
    if (!solved) return false;
    for (index_t n = 0; n < N; ++n) dalpha[o + n] += Fmm[o + n] * x[n] + Fmv[o + n] * x[N + n];
  }
  for (index_t i = 0; i < LN; ++i)
    if (!std::isfinite(dalpha[i])) return false;
  for (index_t i = 0; i < LN; ++i) state_.alpha[i] += dalpha[i];
  for (index_t l = 0; l < L; ++l) state_.compute_mean(l);
  return true;
}

// The coupled mean step for the multinomial bound (cvi.hpp). Its local terms depend on
// m + v / 2 only, so with p = softmax(m + v / 2) and H = diag(p) - p p^T per point,
// F_mm = -H, F_mv = -H / 2 and F_vv = -H / 4, and the system reduces to one in
// z = dm + dv / 2: with K_l = Sigma + W_l / 2 (block diagonal over latents),
//     (I + K H) z = c,   c_l = Sigma g_l + W_l r_l / 2,   dalpha = g - H z,
// g = g^m - alpha, r = lambda + 2 g^v. It is solved directly, as Laplace's method solves its
// Newton step for the softmax (GPML's Algorithm 3.3, with K_l for Sigma): with P_l = diag(p_l),
// M_l = I + P_l^1/2 K_l P_l^1/2, E_l = P_l^1/2 M_l^-1 P_l^1/2 and B_l = I + K_l P_l
// (B_l^-1 = I - K_l E_l), Woodbury gives
//     z = B^-1 c + B^-1 K Pi S^-1 Pi^T B^-1 c,
//     S = I - sum_l P_l (K_l^-1 + P_l)^-1 P_l = diag(1 - sum_l p_l) + sum_l E_l,
// positive definite because K^-1 + H is, and B_l^-1 K_l P_l w = K_l (p_l w - E_l K_l p_l w).
// Per latent one Cholesky of M_l and its inverse (N^3 flops); M_l^-1 waits for the second
// pass in V_l's strict upper triangle, which the iterations do not use (V is kept in the
// lower one), and a diagonal of its own; K_l is formed again where it is needed (N^2).
// Returns false, with alpha, m and V's lower triangle as they were, where a factorisation
// fails or the step is not finite.
bool MeanSteps::coupled_step_multinomial() {
  const index_t N = state_.N, L = state_.L, LN = L * N;
  const auto NN = static_cast<std::size_t>(N * N);
  const double n2 = static_cast<double>(N) * N, n3 = n2 * N;
  const double* r = state_.residual.data();  // lambda - p
  Buffer p(LN), root(LN), g(LN), bc(LN), inv_diag(LN), q(N), t(N), u(N), e(N);
  for (index_t i = 0; i < LN; ++i) {
    p[i] = -2.0 * state_.dv[i];  // softmax(m + v / 2)
    root[i] = std::sqrt(p[i]);
    g[i] = state_.dm[i] - state_.alpha[i];
  }
  if (B_.empty()) B_.resize(NN);
  scratch_K_.resize(NN);
  scratch_S_.resize(NN);
  const MatrixView K(scratch_K_.data(), N, N), M(B_.data(), N, N), S(scratch_S_.data(), N, N);
  auto form_K = [&](index_t l) {  // the lower triangle of Sigma + (V_l o V_l) / 2
    const ConstMatrixView Vl = state_.V_of(l);
    for (index_t i = 0; i < N; ++i)
      for (index_t j = 0; j <= i; ++j) K(i, j) = state_.Sigma(i, j) + 0.5 * Vl(i, j) * Vl(i, j);
    state_.count.add(1.5 * n2);
  };
  for (index_t i = 0; i < N; ++i) {
    double sum = 0.0;
    for (index_t l = 0; l < L; ++l) sum += p[l * N + i];
    std::fill(S.row(i), S.row(i) + i + 1, 0.0);
    S(i, i) = std::max(1.0 - sum, 0.0);
    q[i] = 0.0;
  }
  for (index_t l = 0; l < L; ++l) {
    const index_t o = l * N;
    const double* s = root.data() + o;
    double* c = bc.data() + o;
    form_K(l);
    for (index_t i = 0; i < N; ++i) {
      for (index_t j = 0; j <= i; ++j) M(i, j) = s[i] * K(i, j) * s[j];
      M(i, i) += 1.0;
    }
    // c_l = Sigma g_l + W_l r_l / 2 = K_l r_l + Sigma (g_l - r_l)
    for (index_t n = 0; n < N; ++n) t[n] = g[o + n] - r[o + n];
    blas::symv(Uplo::Lower, 1.0, K, r + o, 0.0, c);
    blas::symv(Uplo::Lower, 1.0, state_.Sigma, t.data(), 1.0, c);
    if (blas::potrf_lower(M) != 0 || blas::potri_lower(M) != 0) return false;
    // S += E_l; B_l^-1 c_l = c_l - K_l E_l c_l; q += p_l B_l^-1 c_l; M_l^-1 put aside
    const MatrixView Vl = state_.V_of(l);
    for (index_t i = 0; i < N; ++i) {
      for (index_t j = 0; j < i; ++j) {
        S(i, j) += s[i] * M(i, j) * s[j];
        Vl(j, i) = M(i, j);
      }
      S(i, i) += s[i] * M(i, i) * s[i];
      inv_diag[o + i] = M(i, i);
    }
    for (index_t n = 0; n < N; ++n) t[n] = s[n] * c[n];
    blas::symv(Uplo::Lower, 1.0, M, t.data(), 0.0, u.data());
    for (index_t n = 0; n < N; ++n) u[n] *= s[n];
    blas::symv(Uplo::Lower, -1.0, K, u.data(), 1.0, c);
    for (index_t n = 0; n < N; ++n) q[n] += p[o + n] * c[n];
    state_.count.add(n2 + n3 + 11.0 * n2);
  }
  if (blas::potrf_lower(S) != 0) return false;
  blas::trsv(Uplo::Lower, Trans::No, Diag::NonUnit, S, q.data());
  blas::trsv(Uplo::Lower, Trans::Yes, Diag::NonUnit, S, q.data());
  state_.count.add(n3 / 3.0 + 2.0 * n2);
  // z_l = B_l^-1 c_l + K_l (p_l w - E_l K_l p_l w), w = S^-1 q (z left in bc)
  for (index_t l = 0; l < L; ++l) {
    const index_t o = l * N;
    const double* s = root.data() + o;
    const ConstMatrixView Vl = state_.V_of(l);
    form_K(l);
    for (index_t n = 0; n < N; ++n) u[n] = p[o + n] * q[n];
    blas::symv(Uplo::Lower, 1.0, K, u.data(), 0.0, t.data());
    for (index_t n = 0; n < N; ++n) t[n] *= s[n];
    // M_l^-1 t: the upper triangle's SYMV takes V_l's diagonal, replaced by M_l^-1's
    blas::symv(Uplo::Upper, 1.0, Vl, t.data(), 0.0, e.data());
    for (index_t n = 0; n < N; ++n)
      u[n] -= s[n] * (e[n] + (inv_diag[o + n] - Vl(n, n)) * t[n]);
    blas::symv(Uplo::Lower, 1.0, K, u.data(), 1.0, bc.data() + o);
    state_.count.add(6.0 * n2);
  }
  // dalpha = g - H z, (H z)_ln = p_ln (z_ln - sum_k p_kn z_kn)
  for (index_t n = 0; n < N; ++n) {
    double pz = 0.0;
    for (index_t l = 0; l < L; ++l) pz += p[l * N + n] * bc[l * N + n];
    for (index_t l = 0; l < L; ++l) g[l * N + n] -= p[l * N + n] * (bc[l * N + n] - pz);
  }
  state_.count.add(4.0 * static_cast<double>(LN));
  for (index_t i = 0; i < LN; ++i)
    if (!std::isfinite(g[i])) return false;
  // The step is scaled so that no mean moves by more than kMultinomialStepLimit (a trust
  // region: the local terms' quadratic model holds over a few units of the logits only); m
  // moves along with alpha, as in update_means.
  Buffer step_m(LN);
  double largest = 0.0;
  for (index_t l = 0; l < L; ++l)
    blas::symv(Uplo::Lower, 1.0, state_.Sigma, g.data() + l * N, 0.0, step_m.data() + l * N);
  for (index_t i = 0; i < LN; ++i) largest = std::max(largest, std::fabs(step_m[i]));
  state_.count.add(2.0 * L * n2);
  const double scale = largest > kMultinomialStepLimit ? kMultinomialStepLimit / largest : 1.0;
  for (index_t i = 0; i < LN; ++i) {
    state_.alpha[i] += scale * g[i];
    state_.m[i] += scale * step_m[i];
  }
  return true;
}

// The multinomial correction of the cheap step (see update_means): on entry step_m holds
// u_l = V_l r_l; on exit step_m holds dm_l = u_l + V_l (p_l z) and step_a holds p_l z.
// Returns false when S is not positive definite (lambda far from p). With `clamp`, p_l is
// replaced by p'_l = min(max(p_l, 0), max(lambda_l, 0)): then V^-1 - P' P'^T is at least
// Omega + diag(p') - P' P'^T, positive definite as sum_l p'_l <= 1 at every point, so S is
// too, and the step (on a Hessian with less coupling) still ascends. It serves where lambda
// falls short of p: after the first sweep each latent's sweep has moved the others' p.
bool MeanSteps::woodbury_correction(double* step_m, double* z, double* step_a, bool clamp) {
  const index_t N = state_.N, L = state_.L;
  if (B_.empty()) B_.resize(static_cast<std::size_t>(N * N));
  Buffer p(static_cast<std::size_t>(L * N));
  for (index_t i = 0; i < L * N; ++i)
    p[i] = clamp ? std::clamp(-2.0 * state_.dv[i], 0.0, std::max(state_.lambda[i], 0.0))
                 : -2.0 * state_.dv[i];
  MatrixView S(B_.data(), N, N);
  for (index_t i = 0; i < N; ++i) {
    for (index_t j = 0; j <= i; ++j) {
      double s = 0.0;
      for (index_t l = 0; l < L; ++l) s += p[l * N + i] * state_.V_of(l)(i, j) * p[l * N + j];
      S(i, j) = -s;
    }
    S(i, i) += 1.0;
  }
  if (blas::potrf_lower(S) != 0) return false;
  std::fill(z, z + N, 0.0);
  for (index_t l = 0; l < L; ++l)
    for (index_t n = 0; n < N; ++n) z[n] += p[l * N + n] * step_m[l * N + n];
  blas::trsv(Uplo::Lower, Trans::No, Diag::NonUnit, S, z);
  blas::trsv(Uplo::Lower, Trans::Yes, Diag::NonUnit, S, z);
  Buffer pz(N);
  for (index_t l = 0; l < L; ++l) {
    for (index_t n = 0; n < N; ++n) pz[n] = step_a[l * N + n] = p[l * N + n] * z[n];
    blas::symv(Uplo::Lower, 1.0, state_.V_of(l), pz.data(), 1.0, step_m + l * N);
  }
  state_.count.add(3.0 * static_cast<double>(L) * N * N + static_cast<double>(N) * N * N / 3.0 +
                   2.0 * static_cast<double>(N) * N);
  return true;
}

// The exact Newton step of latent l alone into step_a [N] (sw, rhs: scratch [N]).
void MeanSteps::exact_step(index_t l, double* sw, double* rhs, double* step_a) {
  const index_t N = state_.N;
  if (B_.empty()) B_.resize(static_cast<std::size_t>(N * N));
  MatrixView B(B_.data(), N, N);
  const double *g = state_.dm.data() + l * N, *h = state_.d2m.data() + l * N,
               *m = state_.m.data() + l * N;
  const double* a = state_.alpha + l * N;
  for (index_t n = 0; n < N; ++n) {
    const double w = std::max(-h[n], 0.0);
    sw[n] = std::sqrt(w);
    rhs[n] = w * (m[n] - state_.mean[l]) + g[n];
  }
  factor_b(state_.Sigma, sw, B, true, state_.count);
  blas::symv(Uplo::Lower, 1.0, state_.Sigma, rhs, 0.0, step_a);
  for (index_t n = 0; n < N; ++n) step_a[n] *= sw[n];
  blas::trsv(Uplo::Lower, Trans::No, Diag::NonUnit, B, step_a);
  blas::trsv(Uplo::Lower, Trans::Yes, Diag::NonUnit, B, step_a);
  for (index_t n = 0; n < N; ++n) step_a[n] = rhs[n] - sw[n] * step_a[n] - a[n];
  state_.count.add(4.0 * static_cast<double>(N) * N);
}

}  // namespace pygpfast::cvi::detail
