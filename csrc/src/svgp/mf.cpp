#include "pygpfast/svgp/mf.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "pygpfast/blas.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/linalg.hpp"
#include "pygpfast/threads.hpp"
#include "pygpfast/vmath.hpp"
#include "pygpfast/workspace.hpp"

namespace pygpfast::svgp_mf {
namespace {

using blas::Diag;
using blas::Side;
using blas::Trans;
using blas::Uplo;

using workspace::Buffer;

constexpr double kLogSqrt2Pi = 0.91893853320467274178;  // log(sqrt(2 pi))
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
constexpr double kInvSqrt2 = 0.70710678118654752440;    // 1 / sqrt(2)

// Per-point loops are split across threads only when each thread gets this many points (a
// point costs one erfc or continued fraction, a few Newton steps in the inner solve).
constexpr index_t kMinPointsPerThread = 2048;

template <class Body>
void for_each_point(index_t n, const Body& body) {
  parallel_for(n, kMinPointsPerThread, body);
}

// The standard normal truncated to (-z, inf), through which every per-point term of the bound
// is written (lambda = phi(z) / Phi(z)):
//   h = log Phi(z) + lambda^2 / 2    (the point's term of the bound)
//   c = lambda + z                   (mean of the truncated normal, in units of sigma, about -z)
//   nu = 1 - lambda c                (its variance; d c / d z; d lambda / d z = -lambda c)
//   w = 1 + z c
// For z < -4 each is a product or sum of positive continued-fraction tails, so none loses
// digits to cancellation (lambda ~ -z there, so log Phi and lambda^2 / 2 cancel to O(log z),
// and c, nu, w are differences of nearly equal numbers).
struct Truncated {
  double h, lambda, c, nu, w;
};

Truncated truncated(double z) {
  if (z < -vmath::kMillsFractionFrom) {  // (vmath::mills_fraction_tails)
    const double x = -z;
    double c, d;  // T1 = lambda - x, T2
    vmath::mills_fraction_tails(x, c, d);
    const double lambda = x + c;
    // log Phi = -x^2/2 - log sqrt(2 pi) - log lambda;  x c = 1 - d c.
    const double h = -kLogSqrt2Pi - std::log(lambda) + (1.0 - d * c) + 0.5 * c * c;
    return {h, lambda, c, c * (d - c), d * c};
  }
  const double phi = kInvSqrt2Pi * std::exp(-0.5 * z * z);
  double cdf, log_cdf;
  if (z < 0.0) {
    cdf = 0.5 * std::erfc(-z * kInvSqrt2);
    log_cdf = std::log(cdf);
  } else {
    const double upper = 0.5 * std::erfc(z * kInvSqrt2);
    cdf = 1.0 - upper;
    log_cdf = std::log1p(-upper);
  }
  const double lambda = phi / cdf;
  const double c = lambda + z;
  return {log_cdf + 0.5 * lambda * lambda, lambda, c, 1.0 - lambda * c, 1.0 + z * c};
}

// For fixed u = W_n . r, the point's stationarity condition beta a + (1 - beta) E[g](a) = u
// reads, in z = s a / sigma, psi(z) = c(z) - beta lambda(z) = t with t = s u / sigma. psi is
// increasing and convex (psi' = nu + beta lambda c in [beta, 1]), so Newton's method converges
// from any start: after the first step every iterate lies right of the root and decreases.
double solve_point(double t, double beta, double z) {
  for (int it = 0; it < 100; ++it) {
    const Truncated q = truncated(z);
    const double psi = q.c - beta * q.lambda;
    const double dpsi = q.nu + beta * q.lambda * q.c;
    const double step = (psi - t) / dpsi;
    z -= step;
    if (!(std::fabs(step) > 1e-15 * (1.0 + std::fabs(z)))) break;
  }
  return z;
}

void check_inputs(const kernels::Kernel& kernel, ConstMatrixView Z, const Data& data,
                  const double* a, double jitter) {
  const index_t N = data.X.rows;
  require(Z.rows >= 1, "svgp_mf: need at least one inducing point");
  require(N >= 1, "svgp_mf: need at least one data point");
  require(Z.cols == kernel.input_dim(), "svgp_mf: Z has ", Z.cols, " columns but the kernel expects ",
          kernel.input_dim());
  require(data.X.cols == Z.cols, "svgp_mf: X has ", data.X.cols, " columns but Z has ", Z.cols);
  require(jitter >= 0 && std::isfinite(jitter), "svgp_mf: jitter must be >= 0");
  for (index_t n = 0; n < N; ++n) {
    if (data.y[n] != 0.0 && data.y[n] != 1.0)
      throw std::invalid_argument("svgp_mf: labels must be 0 or 1; y[" + std::to_string(n) +
                                  "] = " + std::to_string(data.y[n]));
    if (!std::isfinite(a[n]))
      throw std::invalid_argument("svgp_mf: a[" + std::to_string(n) + "] is not finite");
  }
}

// Everything that depends on (kernel, Z, X) but not on a.
struct Factors {
  index_t M = 0, N = 0;
  Buffer Lz;    // [M, M] lower Cholesky factor of Kzz + jitter mean(diag Kzz) I
  Buffer A;     // [M, N] Lz^-1 Kzx
  Buffer Lb;    // [M, M] lower Cholesky factor of Bm = I + A A^T
  Buffer W;     // [M, N] Lb^-1 A, so that C^-1 = I - W^T W
  Buffer beta;  // [N] diag C^-1 = 1 / sigma_n^2
  double logdet_B = 0.0;   // log|Bm| = log|C|
  double trace_gap = 0.0;  // tr(Kxx - Q)
  double jitter = 0.0;     // extra jitter for Kzz

  ConstMatrixView LzV() const { return ConstMatrixView(Lz.data(), M, M); }
  ConstMatrixView AV() const { return ConstMatrixView(A.data(), M, N); }
  ConstMatrixView LbV() const { return ConstMatrixView(Lb.data(), M, M); }
  ConstMatrixView WV() const { return ConstMatrixView(W.data(), M, N); }
};

void factorise(const kernels::Kernel& kernel, ConstMatrixView Z, ConstMatrixView X, double jitter,
               Factors& f) {
  const index_t M = Z.rows, N = X.rows;
  f.M = M;
  f.N = N;
  f.Lz.assign(static_cast<std::size_t>(M * M), 0.0);
  MatrixView Lz(f.Lz.data(), M, M);
  kernel.K(Z, Z, true, Lz);
  linalg::add_relative_jitter(Lz, jitter, "K(Z, Z)", "the inducing inputs Z");
  f.jitter = linalg::cholesky_jitter(Lz).jitter;

  f.A.resize(static_cast<std::size_t>(M * N));
  MatrixView A(f.A.data(), M, N);
  kernel.K(Z, X, false, A);
  linalg::solve_lower(Lz, A, false);

  Buffer kdiag(N);
  kernel.Kdiag(X, kdiag.data());
  double trace = 0.0;
  for (index_t n = 0; n < N; ++n) trace += kdiag[n];
  for (std::size_t i = 0; i < f.A.size(); ++i) trace -= f.A[i] * f.A[i];
  f.trace_gap = trace;

  f.Lb.assign(static_cast<std::size_t>(M * M), 0.0);
  MatrixView Lb(f.Lb.data(), M, M);
  blas::syrk(Uplo::Lower, Trans::No, 1.0, A, 0.0, Lb);
  for (index_t i = 0; i < M; ++i) Lb(i, i) += 1.0;
  linalg::cholesky_jitter(Lb);  // eigenvalues >= 1: never needs jitter
  f.logdet_B = linalg::logdet_from_cholesky(Lb);

  f.W = f.A;
  MatrixView W(f.W.data(), M, N);
  linalg::solve_lower(Lb, W, false);

  // beta_n = 1 - |W_n|^2, kept >= 1 / C_nn = 1 / (1 + |A_n|^2) (which holds for any SPD C)
  // against rounding.
  Buffer wn(N, 0.0), an(N, 0.0);
  for (index_t m = 0; m < M; ++m) {
    const double* w = W.row(m);
    const double* ar = A.row(m);
    for (index_t n = 0; n < N; ++n) {
      wn[n] += w[n] * w[n];
      an[n] += ar[n] * ar[n];
    }
  }
  f.beta.resize(N);
  for (index_t n = 0; n < N; ++n) f.beta[n] = std::max(1.0 - wn[n], 1.0 / (1.0 + an[n]));
}

inline double sign_of(double y) { return y > 0.5 ? 1.0 : -1.0; }

// E[g] = s sigma c(z) at z = s a sqrt(beta), with the truncated-normal terms.
void point_terms(const Factors& f, const double* y, const double* a, std::vector<Truncated>& tq,
                 Buffer& z, Buffer& mean_g) {
  const index_t N = f.N;
  tq.resize(N);
  z.resize(N);
  mean_g.resize(N);
  for_each_point(N, [&](index_t n) {
    const double s = sign_of(y[n]);
    const double rb = std::sqrt(f.beta[n]);
    z[n] = s * a[n] * rb;
    tq[n] = truncated(z[n]);
    mean_g[n] = s * tq[n].c / rb;
  });
}

// Newton iteration in r = W E[g] for the optimal a (see the header). On return a holds the
// optimum.
void solve_a(const Factors& f, const double* y, double* a, const InnerSolve& opt, Result& res) {
  const index_t M = f.M, N = f.N;
  ConstMatrixView W = f.WV();
  Buffer z(N), mean_g(N), rho(N), r(M), u(N), G(M);
  std::vector<Truncated> tq;
  point_terms(f, y, a, tq, z, mean_g);
  blas::gemv(Trans::No, 1.0, W, mean_g.data(), 0.0, r.data());

  // Given r: every z_n, E[g_n], rho_n = d E[g_n] / d u_n, and the residual G = r - W E[g].
  auto evaluate = [&](const Buffer& r_at, Buffer& z_io, Buffer& g_out) {
    blas::gemv(Trans::Yes, 1.0, W, r_at.data(), 0.0, u.data());
    for_each_point(N, [&](index_t n) {
      const double s = sign_of(y[n]);
      const double b = f.beta[n];
      const double rb = std::sqrt(b);
      z_io[n] = solve_point(s * u[n] * rb, b, z_io[n]);
      const Truncated q = truncated(z_io[n]);
      mean_g[n] = s * q.c / rb;
      rho[n] = q.nu / (q.nu + b * q.lambda * q.c);
    });
    g_out = r_at;
    blas::gemv(Trans::No, -1.0, W, mean_g.data(), 1.0, g_out.data());
    return std::sqrt(blas::dot(M, g_out.data(), g_out.data()));
  };

  double gnorm = evaluate(r, z, G);
  Buffer J(static_cast<std::size_t>(M * M)), Ws(static_cast<std::size_t>(M * N)), d(M), r_try(M),
      z_try(N), G_try(M), sqrt_rho(N);
  MatrixView JV(J.data(), M, M), WsV(Ws.data(), M, N);
  res.inner_converged = false;
  int it = 0;
  for (;; ++it) {
    const double rnorm = std::sqrt(blas::dot(M, r.data(), r.data()));
    if (gnorm <= opt.tol * (1.0 + rnorm)) {
      res.inner_converged = true;
      break;
    }
    if (it >= opt.max_iter) break;
    // J = I - W diag(rho) W^T (symmetric positive definite, >= Bm^-1).
    for (index_t n = 0; n < N; ++n) sqrt_rho[n] = std::sqrt(rho[n]);
    for (index_t m = 0; m < M; ++m)
      for (index_t n = 0; n < N; ++n) Ws[m * N + n] = W(m, n) * sqrt_rho[n];
    blas::syrk(Uplo::Lower, Trans::No, -1.0, WsV, 0.0, JV);
    for (index_t i = 0; i < M; ++i) JV(i, i) += 1.0;
    linalg::cholesky_jitter(JV);
    for (index_t i = 0; i < M; ++i) d[i] = -G[i];
    blas::trsv(Uplo::Lower, Trans::No, Diag::NonUnit, JV, d.data());
    blas::trsv(Uplo::Lower, Trans::Yes, Diag::NonUnit, JV, d.data());
    // Backtracking on |G|: the Newton direction is a descent direction of |G|^2.
    double alpha = 1.0;
    bool accepted = false;
    for (int halvings = 0; halvings < 40; ++halvings, alpha *= 0.5) {
      for (index_t i = 0; i < M; ++i) r_try[i] = r[i] + alpha * d[i];
      z_try = z;
      const double g_try = evaluate(r_try, z_try, G_try);
      if (g_try <= (1.0 - 1e-4 * alpha) * gnorm) {
        r.swap(r_try);
        z.swap(z_try);
        G.swap(G_try);
        gnorm = g_try;
        accepted = true;
        break;
      }
    }
    if (!accepted) {
      gnorm = evaluate(r, z, G);  // restore the per-point state of the last accepted r
      break;
    }
  }
  for (index_t n = 0; n < N; ++n) a[n] = sign_of(y[n]) * z[n] / std::sqrt(f.beta[n]);
  res.inner_iterations = it;
  res.inner_residual = gnorm;
}

}  // namespace

Result bound(const kernels::Kernel& kernel, ConstMatrixView Z, const Data& data, double* a,
             double jitter, const InnerSolve* solve, Gradients* grads) {
  check_inputs(kernel, Z, data, a, jitter);
  if (solve != nullptr) {
    require(solve->max_iter >= 0, "svgp_mf: max_iter must be >= 0");
    require(solve->tol > 0, "svgp_mf: tol must be > 0");
  }
  const index_t M = Z.rows, N = data.X.rows, D = Z.cols;
  Factors f;
  factorise(kernel, Z, data.X, jitter, f);
  Result res;
  res.jitter = f.jitter;
  if (solve != nullptr) solve_a(f, data.y, a, *solve, res);

  std::vector<Truncated> tq;
  Buffer z, mean_g;
  point_terms(f, data.y, a, tq, z, mean_g);
  // p = C^-1 E[g] = E[g] - W^T (W E[g])
  ConstMatrixView W = f.WV();
  Buffer r(M), p(mean_g);
  blas::gemv(Trans::No, 1.0, W, mean_g.data(), 0.0, r.data());
  blas::gemv(Trans::Yes, -1.0, W, r.data(), 1.0, p.data());

  double sum_h = 0.0, sum_log_beta = 0.0;
  for (index_t n = 0; n < N; ++n) {
    sum_h += tq[n].h;
    sum_log_beta += std::log(f.beta[n]);
  }
  res.bound = sum_h - 0.5 * sum_log_beta - 0.5 * f.logdet_B -
              0.5 * blas::dot(N, mean_g.data(), p.data()) - 0.5 * f.trace_gap;
  if (grads == nullptr) return res;

  // d/da_n and the total adjoint of beta_n (through z_n, E[g_n] and the log beta term).
  Buffer beta_bar(N);
  for_each_point(N, [&](index_t n) {
    const Truncated& q = tq[n];
    const double s = sign_of(data.y[n]);
    const double b = f.beta[n];
    const double rb = std::sqrt(b);
    grads->a[n] = q.nu * (s * q.lambda * rb - p[n]);
    beta_bar[n] = (q.lambda * q.nu * z[n] - 1.0) / (2.0 * b) + p[n] * s * q.lambda * q.w / (2.0 * b * rb);
  });

  // The bound depends on A only through Q = A^T A. With Bm = I + A A^T, V = Bm^-1 A,
  // G = -diag(beta_bar) + E[g] E[g]^T / 2 and E = Bm^-1 A G A^T:
  //   d/dA = A - V + 2 (Bm^-1 A G - E V)
  //        = A - V - 2 V diag(beta_bar) + (V E[g]) E[g]^T - 2 E V.
  ConstMatrixView AV = f.AV();
  Buffer V(f.W), Abar(static_cast<std::size_t>(M * N));
  MatrixView VV(V.data(), M, N), AbarV(Abar.data(), M, N);
  linalg::solve_lower(f.LbV(), VV, true);
  for (index_t m = 0; m < M; ++m)
    for (index_t n = 0; n < N; ++n) Abar[m * N + n] = V[m * N + n] * beta_bar[n];  // V diag(beta_bar)
  Buffer q(M), Vm(M), E(static_cast<std::size_t>(M * M));
  MatrixView EV(E.data(), M, M);
  blas::gemv(Trans::No, 1.0, AV, mean_g.data(), 0.0, q.data());
  blas::gemv(Trans::No, 1.0, VV, mean_g.data(), 0.0, Vm.data());
  blas::gemm(Trans::No, Trans::Yes, -1.0, AbarV, AV, 0.0, EV);
  blas::ger(0.5, Vm.data(), q.data(), EV);
  for (std::size_t i = 0; i < Abar.size(); ++i) Abar[i] = f.A[i] - V[i] - 2.0 * Abar[i];
  blas::ger(1.0, Vm.data(), mean_g.data(), AbarV);
  blas::gemm(Trans::No, Trans::No, -2.0, EV, VV, 1.0, AbarV);

  // Q = Kxz Kzz^-1 Kzx with A = Lz^-1 Kzx and d/dA = 2 A Qbar:
  //   d/dKzx = Lz^-T d/dA,   d/dKzz = -Kzz^-1 Kzx Qbar Kxz Kzz^-1 = -(1/2) (d/dKzx) A^T Lz^-1.
  ConstMatrixView Lz = f.LzV();
  MatrixView& dKzx = AbarV;
  linalg::solve_lower(Lz, dKzx, true);
  Buffer dKzz(static_cast<std::size_t>(M * M));
  MatrixView dKzzV(dKzz.data(), M, M);
  blas::gemm(Trans::No, Trans::Yes, -0.5, dKzx, AV, 0.0, dKzzV);
  blas::trsm(Side::Right, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, Lz, dKzzV);
  for (index_t i = 0; i < M; ++i)
    for (index_t j = 0; j < i; ++j) {
      const double v = 0.5 * (dKzzV(i, j) + dKzzV(j, i));
      dKzzV(i, j) = v;
      dKzzV(j, i) = v;
    }
  linalg::add_relative_jitter_reverse(dKzzV, jitter);

  const index_t P = kernel.num_params();
  std::fill(grads->kernel, grads->kernel + P, 0.0);
  for (index_t i = 0; i < M; ++i)
    for (index_t k = 0; k < D; ++k) grads->Z(i, k) = 0.0;
  Buffer dZ2(static_cast<std::size_t>(M * D), 0.0);
  MatrixView dZ2V(dZ2.data(), M, D);
  kernel.K_vjp(Z, data.X, false, dKzx, grads->kernel, &grads->Z, nullptr);
  kernel.K_vjp(Z, Z, true, dKzzV, grads->kernel, &dZ2V, &dZ2V);
  for (index_t i = 0; i < M; ++i)
    for (index_t k = 0; k < D; ++k) grads->Z(i, k) += dZ2[i * D + k];
  const Buffer half(N, -0.5);  // d/d diag(Kxx) of -tr(Kxx - Q) / 2
  kernel.Kdiag_vjp(data.X, half.data(), grads->kernel);
  return res;
}

double posterior(const kernels::Kernel& kernel, ConstMatrixView Z, const Data& data,
                 const double* a, double jitter, double* q_mu, MatrixView q_sqrt) {
  check_inputs(kernel, Z, data, a, jitter);
  const index_t M = Z.rows;
  require(q_sqrt.rows == M && q_sqrt.cols == M, "svgp_mf: q_sqrt must be [M, M]");
  Factors f;
  factorise(kernel, Z, data.X, jitter, f);
  std::vector<Truncated> tq;
  Buffer z, mean_g;
  point_terms(f, data.y, a, tq, z, mean_g);
  // q_mu = Bm^-1 A E[g]
  ConstMatrixView Lb = f.LbV();
  blas::gemv(Trans::No, 1.0, f.AV(), mean_g.data(), 0.0, q_mu);
  blas::trsv(Uplo::Lower, Trans::No, Diag::NonUnit, Lb, q_mu);
  blas::trsv(Uplo::Lower, Trans::Yes, Diag::NonUnit, Lb, q_mu);
  // q_sqrt = chol(Bm^-1)
  for (index_t i = 0; i < M; ++i)
    for (index_t j = 0; j < M; ++j) q_sqrt(i, j) = j <= i ? Lb(i, j) : 0.0;
  const int info = blas::potri_lower(q_sqrt);
  if (info != 0)
    throw LinAlgError("dpotri", info, "inverting I + A A^T failed (internal error)");
  linalg::cholesky_jitter(q_sqrt);
  return f.jitter;
}

}  // namespace pygpfast::svgp_mf
