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
// The marginals q(f_n) = N(mu_n, var_n) have, in whitened coordinates (m_w, S_w = L_w L_w^T),
//   mu_n = k_n^T beta,  var_n = kxx_n - |a_n|^2 + |L_w^T a_n|^2 = kxx_n + k_n^T Sigma k_n
// with k_n = K(Z, x_n), a_n = Lz^-1 k_n, beta = Lz^-T m_w and Sigma = Lz^-T (S_w - I) Lz^-1.
// Two ways to evaluate them and their reverse pass, with the same results (to rounding):
//   Path::Solve        A = Lz^-1 Kzx (TRSM) and T = L_w^T A (TRMM) per minibatch; reverse: one
//                      TRMM and the lower triangle of A diag(g) T^T per latent function, dKzx =
//                      Lz^-T dA (TRSM) and dLz = -tril(dKzx A^T). About (4 + 4 L) B M^2 flops,
//                      mostly triangular (which run at ~70% of GEMM's rate), plus O(M^3).
//   Path::Precomputed  Sigma_l = W_l W_l^T - Lz^-T Lz^-1 (W_l = Lz^-T L_w,l) in O(M^3), then per
//                      latent function C_l = Sigma_l Kzx (SYMM, 2 B M^2) gives var, and dKzx =
//                      2 C_l diag(g) + beta gmu^T needs no further product; d/dSigma_l =
//                      Kzx diag(g) Kzx^T (SYRK, B M^2). 3 L B M^2 flops at GEMM's rate plus
//                      about (2/3 + 6 L) M^3 (Sigma and its reverse): the faster path once B
//                      exceeds 2 to 2.5 M (timed at M = 64, 256 and 1024).
// Path::Auto picks the cheaper by that count. The precomputed form sums terms of the size of
// cond(Kzz) that cancel to var_n, so it loses about log10(cond(Kzz)) digits; after it, the
// variances of the two points of each column block most exposed to that (largest |k_n|^2 /
// var_n) are recomputed by triangular solves, and a block where any differs by more than 1e-8
// relative is redone by Path::Solve. Plus, on either path, M^3 / 3 for the Cholesky of Kzz and
// about 2 M^3 / 3 for its reverse mode (linalg.hpp), O(B M D) for the kernel and the per-point
// expectations.
//
// Threads: the minibatch is cut into up to 8 column blocks that the threads take dynamically and
// evaluate independently (kernel, marginals, expectations, reverse pass, kernel vjp) with
// single-threaded BLAS, in one parallel region; their partial gradients are summed in block
// order, so results do not depend on the thread count. For 128 <= M < 512 the O(M^3) work before
// and after the blocks runs in that region on one thread while the others compute the blocks'
// kernels before it and their kernel vjps after it (svgp.cpp); otherwise it runs outside the
// region, on the BLAS's threads from M = 512 on. An evaluation of under ~3e7 flops runs on one thread as one
// block (threads.hpp).
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
  // [L] constant prior mean of each latent function (f_l = mean_l + a zero-mean GP, u_l and its
  // prior taken about mean_l); null for zero.
  const double* mean = nullptr;
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
  double* likelihood_param = nullptr;  // scalar; d/d the likelihood's param (0 where it has none)
  double* mean = nullptr;   // [L] w.r.t. Variational::mean (sum_n d ELL / d mu_n,l, scaled;
                            //   0 when q.mean is null)
  // For natural-gradient steps on q: the gradients of the scaled expected log-likelihood alone
  // (the KL term excluded) with respect to the mean m_l and the covariance S_l = L_l L_l^T of
  // q, in the coordinates of q (v when whitened, u otherwise):
  //   ell_q_mu[:, l] = d ELL / d m_l,  ell_q_cov[l] = d ELL / d S_l (symmetric).
  double* ell_q_mu = nullptr;   // [M, L]
  double* ell_q_cov = nullptr;  // [L, M, M]
};

// How the marginals are evaluated (see above). Auto is the default; the others are for tests
// and benchmarks.
enum class Path { Auto = 0, Solve = 1, Precomputed = 2 };

struct Result {
  Path path = Path::Solve;        // the path that produced the result
  double elbo = 0.0;
  double expected_log_lik = 0.0;  // scaled by N/B
  double kl = 0.0;
  double jitter = 0.0;            // extra jitter the Cholesky of Kzz needed beyond `jitter`
};

// Evaluate the ELBO, and its gradients when `grads` is not null. `jitter` x mean(diag Kzz) is
// added to the diagonal of Kzz (relative, so that it means the same in any units of the
// targets; GPflow's 1e-6 is absolute, and swamps a kernel of variance 1e-8). The likelihood's
// latent_dim must equal q.num_latent().
Result elbo(const kernels::Kernel& kernel, const likelihoods::Likelihood& lik, const Variational& q,
            const Batch& batch, double jitter, Gradients* grads, Path path = Path::Auto);

// Marginals of q(f) at new inputs: mean [T, L] (q.mean included), var [T, L] (no likelihood
// noise).
// Returns the extra jitter the Cholesky of Kzz needed.
double predict_f(const kernels::Kernel& kernel, const Variational& q, ConstMatrixView Xnew,
                 double jitter, MatrixView mean, MatrixView var);

}  // namespace pygpfast::svgp
