// Sparse mean-field GP classification (Hensman, Matthews & Ghahramani 2015, seed 000, section
// 3.1, the "MF" method; probit link only).
//
// The probit model is augmented with g = f + eps, eps ~ N(0, I), and y_n = 1 exactly when
// g_n > 0 (eq. 9). Titsias' bound on p(g) (eq. 6 with g for y) and a factorising q(g) give the
// bound of eq. (12), whose optimal factors are truncated Gaussians
//   q(g_n) ∝ 1[s_n g_n > 0] N(g_n | a_n, sigma_n^2),  s_n = 2 y_n - 1,  sigma_n^-2 = [C^-1]_nn,
// with C = Q + I, Q = Kxz Kzz^-1 Kzx (eq. 11). With z_n = s_n a_n / sigma_n and the inverse
// Mills ratio lambda_n = phi(z_n) / Phi(z_n), the terms of eq. (12) cancel to
//   L(a) = sum_n [log Phi(z_n) + lambda_n^2 / 2] - (1/2) sum_n log [C^-1]_nn - (1/2) log|C|
//          - (1/2) E[g]^T C^-1 E[g] - (1/2) tr(Kxx - Q),      E[g_n] = a_n + s_n sigma_n lambda_n.
// (The variance terms of tr(C^-1 E[g g^T]) and of E[(a_n - g_n)^2] / sigma_n^2 combine to
// lambda_n^2 / 2.) Everything is O(N M^2) through A = Lz^-1 Kzx [M, N] and
// Bm = I + A A^T = Lb Lb^T [M, M]: log|C| = log|Bm| and C^-1 = I - W^T W with W = Lb^-1 A, so
// no N x N matrix is formed.
//
// Optimal a (stationarity of L in a) is the mean-field fixed point
//   a_n = E[g_n] - (C^-1 E[g])_n / [C^-1]_nn,
// which depends on the other points only through r = W E[g] in R^M. For fixed r each a_n is
// the root of a scalar increasing function; the fixed point r = W E[g](r) has the symmetric
// positive-definite Jacobian I - W diag(rho) W^T (>= Bm^-1), so a damped Newton iteration in r
// finds the unique optimum in a few O(N M^2) steps.
//
// Prediction (the paper's Gaussian approximation, "Predictions" paragraph): with E[g] under
// q, u ~ N(Sigma Kzz^-1 Kzx E[g], Sigma), Sigma = Kzz - Kzx C^-1 Kxz. In whitened form
// v = Lz^-1 u ~ N(Bm^-1 A E[g], Bm^-1), so predictions at new inputs are those of an SVGP
// with that q(v) (svgp::predict_f, O(M^2) per test point).
#pragma once

#include "pygpfast/kernels.hpp"
#include "pygpfast/view.hpp"

namespace pygpfast::svgp_mf {

struct Data {
  ConstMatrixView X;  // [N, D]
  const double* y;    // [N], labels in {0, 1}
};

// Caller-allocated gradients of the bound (to be maximised), overwritten.
struct Gradients {
  double* a = nullptr;       // [N]
  MatrixView Z;              // [M, D]
  double* kernel = nullptr;  // [P] w.r.t. the kernel's positive parameters
};

// Newton iteration for the optimal a (see above).
struct InnerSolve {
  int max_iter = 100;
  double tol = 1e-10;  // stop when |r - W E[g]| <= tol (1 + |r|)
};

struct Result {
  double bound = 0.0;
  double jitter = 0.0;          // extra jitter the Cholesky of Kzz needed beyond `jitter`
  int inner_iterations = 0;     // Newton steps taken (0 without an inner solve)
  double inner_residual = 0.0;  // final |r - W E[g]| (0 without an inner solve)
  bool inner_converged = true;
};

// The bound of eq. (12) at (Z, a) and, when `grads` is not null, its gradients with respect to
// a, Z and the kernel parameters. When `solve` is not null, `a` is first replaced in place by
// the optimal a (the input a is the starting point), and the bound and gradients are those at
// the optimum. `jitter` x mean(diag Kzz) is added to the diagonal of Kzz.
Result bound(const kernels::Kernel& kernel, ConstMatrixView Z, const Data& data, double* a,
             double jitter, const InnerSolve* solve, Gradients* grads);

// The Gaussian approximation of the posterior at the inducing points, whitened:
// q(v) = N(q_mu, q_sqrt q_sqrt^T) with q_mu = Bm^-1 A E[g] [M] and q_sqrt [M, M] the lower
// Cholesky factor of Bm^-1. Returns the extra jitter the Cholesky of Kzz needed.
double posterior(const kernels::Kernel& kernel, ConstMatrixView Z, const Data& data,
                 const double* a, double jitter, double* q_mu, MatrixView q_sqrt);

}  // namespace pygpfast::svgp_mf
