// Sparse variational GP (Hensman, Matthews & Ghahramani 2015, seed 000, the "KL" method) with
// L latent functions that share the inducing inputs Z and the kernel (L = 1 for scalar
// likelihoods, L = C for the multi-class softmax). For latent function l,
// q(u_l) = N(m_l, S_l = L_l L_l^T) at the M inducing inputs, and for a minibatch of B rows of N,
//   ELBO = (N/B) sum_n E_{q(f_n)}[log p(y_n | f_n)] - sum_l KL[q(u_l) || p(u_l)]     (eq. 21)
// with q(f_n) the product over l of the marginals of eq. (19). Whitened: u_l = Lz v_l with
// Kzz = Lz Lz^T and q(v_l) = N(m_l, L_l L_l^T) against N(0, I); unwhitened: q(u_l) = N(m_l, L_l L_l^T)
// against N(0, Kzz). The unwhitened case is evaluated as the whitened one at (Lz^-1 m_l,
// Lz^-1 L_l), since the KL is invariant under that change of variables, so both share one path.
//
// Cost per evaluation with gradients, for L = 1: about 6.25 B M^2 flops in BLAS level 3:
//   A = Lz^-1 Kzx (TRSM, B M^2), T = L^T A (TRMM, B M^2), dA = L T diag(g) (TRMM, B M^2),
//   dKzx = Lz^-T dA (TRSM, B M^2), and the lower triangles of dL = 2 A diag(g) T^T and
//   dLz = -dKzx A^T (blocked GEMMs that skip most of the upper triangle, 2 x ~0.56 x 2 B M^2);
// each further latent function adds 3 B M^2 (its T, dA term and dL). Plus O(M^3) for the
// Cholesky and its reverse mode, O(B M D) for the kernel, and the per-point expectations.
#pragma once

#include "pygpfast/kernels.hpp"
#include "pygpfast/likelihoods.hpp"
#include "pygpfast/view.hpp"

namespace pygpfast::svgp {

struct Variational {
  ConstMatrixView Z;        // [M, D] inducing inputs
  ConstMatrixView q_mu;     // [M, L] variational means, one column per latent function
  const double* q_sqrt = nullptr;  // [L, M, M] contiguous; lower triangles read, upper ignored
  bool whiten = true;
  index_t num_latent() const { return q_mu.cols; }
};

struct Batch {
  ConstMatrixView X;    // [B, D]
  const double* y;      // [B]
  double scale = 1.0;   // N / B: the minibatch estimate of the full-data sum
};

// Caller-allocated outputs (overwritten). Gradients of the ELBO (to be maximised). Z and
// kernel are required; the others are skipped when null.
struct Gradients {
  MatrixView q_mu;          // [M, L]
  double* q_sqrt = nullptr; // [L, M, M]: lower triangles, strict upper parts set to 0
  MatrixView Z;             // [M, D]
  double* kernel = nullptr; // [P] w.r.t. the kernel's positive parameters
  double* likelihood_variance = nullptr;  // scalar; Gaussian noise variance (0 for others)
  // For natural-gradient steps on q: the gradients of the scaled expected log-likelihood alone
  // (the KL term excluded) with respect to the mean m_l and the covariance S_l = L_l L_l^T of
  // q, in the coordinates of q (v when whitened, u otherwise):
  //   ell_q_mu[:, l] = d ELL / d m_l,  ell_q_cov[l] = d ELL / d S_l (symmetric).
  double* ell_q_mu = nullptr;   // [M, L]
  double* ell_q_cov = nullptr;  // [L, M, M]
};

struct Result {
  double elbo = 0.0;
  double expected_log_lik = 0.0;  // scaled by N/B
  double kl = 0.0;
  double jitter = 0.0;            // extra jitter the Cholesky of Kzz needed beyond `jitter`
};

// Evaluate the ELBO, and its gradients when `grads` is not null. `jitter` is added to the
// diagonal of Kzz (absolute, as in GPflow's default 1e-6). The likelihood's latent_dim must
// equal q.num_latent().
Result elbo(const kernels::Kernel& kernel, const likelihoods::Likelihood& lik, const Variational& q,
            const Batch& batch, double jitter, Gradients* grads);

// Marginals of q(f) at new inputs: mean [T, L], var [T, L] (no likelihood noise).
// Returns the extra jitter the Cholesky of Kzz needed.
double predict_f(const kernels::Kernel& kernel, const Variational& q, ConstMatrixView Xnew,
                 double jitter, MatrixView mean, MatrixView var);

}  // namespace pygpfast::svgp
