// Sparse variational GP (Hensman, Matthews & Ghahramani 2015, seed 000, the "KL" method):
// q(u) = N(m, S = L L^T) at M inducing inputs Z; for a minibatch of B rows of N,
//   ELBO = (N/B) sum_n E_{q(f_n)}[log p(y_n | f_n)] - KL[q(u) || p(u)]          (eq. 21)
// with q(f_n) the marginals of eq. (19). Whitened: u = Lz v with Kzz = Lz Lz^T and q(v) =
// N(m, L L^T) against p(v) = N(0, I); unwhitened: q(u) = N(m, L L^T) against N(0, Kzz). The
// unwhitened case is evaluated as the whitened one at (Lz^-1 m, Lz^-1 L), since the KL is
// invariant under that change of variables, so both share one code path.
//
// Cost per evaluation with gradients: 8 B M^2 flops in BLAS level 3 (two TRSM, two TRMM, two
// GEMM of 2 B M^2), O(M^3) for the Cholesky and its reverse mode, O(B M D) for the kernel,
// and the per-point expectations.
#pragma once

#include "pygpfast/kernels.hpp"
#include "pygpfast/likelihoods.hpp"
#include "pygpfast/view.hpp"

namespace pygpfast::svgp {

struct Variational {
  ConstMatrixView Z;       // [M, D] inducing inputs
  const double* q_mu;      // [M]
  ConstMatrixView q_sqrt;  // [M, M], lower triangle read (the upper is ignored)
  bool whiten = true;
};

struct Batch {
  ConstMatrixView X;    // [B, D]
  const double* y;      // [B]
  double scale = 1.0;   // N / B: the minibatch estimate of the full-data sum
};

// Caller-allocated outputs (overwritten). Gradients of the ELBO (to be maximised).
struct Gradients {
  double* q_mu = nullptr;   // [M]
  MatrixView q_sqrt;        // [M, M]: lower triangle, strict upper set to 0
  MatrixView Z;             // [M, D]
  double* kernel = nullptr; // [P] w.r.t. the kernel's positive parameters
  double* likelihood_variance = nullptr;  // scalar; Gaussian noise variance (0 for others)
};

struct Result {
  double elbo = 0.0;
  double expected_log_lik = 0.0;  // scaled by N/B
  double kl = 0.0;
  double jitter = 0.0;            // extra jitter the Cholesky of Kzz needed beyond `jitter`
};

// Evaluate the ELBO, and its gradients when `grads` is not null. `jitter` is added to the
// diagonal of Kzz (absolute, as in GPflow's default 1e-6).
Result elbo(const kernels::Kernel& kernel, const likelihoods::Likelihood& lik, const Variational& q,
            const Batch& batch, double jitter, Gradients* grads);

// Marginals of q(f) at new inputs: mean [T], var [T] (var includes no likelihood noise).
// Returns the extra jitter the Cholesky of Kzz needed.
double predict_f(const kernels::Kernel& kernel, const Variational& q, ConstMatrixView Xnew,
                 double jitter, double* mean, double* var);

}  // namespace pygpfast::svgp
