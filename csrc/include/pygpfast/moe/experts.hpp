// The per-expert work of IS-MOE (seed 003; notes/ismoe-math.md): for one block of rows (sample j,
// expert k), the GP evidence and its gradient, hyperparameter optimisation, the Laplace
// approximation for binary classification, and the batched fits and predictions of P = J K
// blocks on OpenMP threads.
//
// Blocks. A block is a list of row indices into X [N, D], y [N]. A batch of P blocks is given in
// CSR form: offsets [P + 1] (offsets[0] = 0, non-decreasing) and rows [offsets[P]], block p being
// rows[offsets[p] .. offsets[p + 1]). Per-row outputs (alpha, f, W) follow `rows`; per-block
// factors [n_p, n_p] lie one after another (factor_offsets, the running sums of n_p^2).
//
// Hyperparameters. The kernel is declarative (kernels.hpp: codes, params with P positive
// parameters). A Gaussian expert adds the noise variance s2 > 0 and a constant mean m. The
// optimiser works in u = (log params [P], log s2, m): prior locations and scales, and bounds, are
// given in these coordinates, always with P + 2 entries (those of s2 and m are ignored by the
// Laplace experts, which have zero mean and no noise).
//
// Objective. The fitted objective of a block is
//     scale * log Z(theta) + sum_i log N(u_i | loc_i, scale_i^2)   (terms with prior scale 0 left out)
// where log Z is the plain (untempered) block evidence: exact for a Gaussian likelihood, Laplace's
// approximation otherwise. `scale` is the note's gamma (section 5, reading B: the minibatch
// evidence raised to the power N/B stands in for the full one; gamma = 1 by default, N/B as an
// option). The observation likelihood is never tempered: raising each p(y_i | f_i) to N/B makes
// the ML noise variance run to zero (the note's reading A), so the experts keep the plain noise.
// With a flat prior the fitted theta does not depend on `scale`.
//
// Threads. fit_blocks and predict_blocks run blocks on OpenMP threads, largest first (a dynamic
// schedule over blocks sorted by size), each block on one thread with the BLAS held to one thread
// (SingleThreadScope), also when only one OpenMP thread runs: every block's arithmetic is then the
// same whatever the thread count, and so are the results, to the bit. An exception in a block is
// captured and rethrown after the region (the one of the lowest-numbered failed block).
#pragma once

#include <cstdint>
#include <vector>

#include "pygpfast/optimize.hpp"
#include "pygpfast/view.hpp"

namespace pygpfast::moe {

enum class Likelihood : int {
  Gaussian = 0,  // y real, p(y | f) = N(y | f, s2)
  Probit = 1,    // y in {0, 1}, p(y = 1 | f) = Phi(f)
  Logit = 2,     // y in {0, 1}, p(y = 1 | f) = 1 / (1 + exp(-f))
};

// A kernel's expression codes (kernels.hpp) and its number of positive parameters.
struct KernelSpec {
  const std::int32_t* codes = nullptr;
  index_t n_codes = 0;
  index_t n_params = 0;
};

struct JitterOptions {
  double initial = 1e-10;  // first jitter tried, relative to the mean diagonal (linalg.hpp)
  double max = 1e-4;       // largest jitter, relative
};

struct LaplaceOptions {
  int max_iter = 100;  // Newton steps
  double tol = 1e-10;  // stop when the objective psi rises by less than tol * max(1, |psi|)
                       // and no latent value moves more than sqrt(tol)
};

// Scratch and results of one block's evaluation, reused across evaluations. After an evaluation of
// n rows:
//   Gaussian: L [n, n] lower factor of K + (s2 + jitter) I (strict upper part zero),
//             alpha [n] = (K + (s2 + jitter) I)^-1 (y - m).
//   Laplace:  L [n, n] lower factor of B = I + W^1/2 (K + jitter I) W^1/2, f [n] the mode,
//             W [n] = -d^2 log p(y | f) / df^2 at the mode, alpha [n] = d log p(y | f) / df at the
//             mode (the predictive mean is k_*^T alpha), a [n] with f = K a.
struct BlockWorkspace {
  std::vector<double> X, y, K, L, work, alpha, f, W, a, v1, v2, v3, Xt;
};

struct EvidenceResult {
  double log_evidence = 0.0;
  double jitter = 0.0;        // absolute jitter added to the diagonal of K (0 if none was needed)
  int newton_iterations = 0;  // Laplace only
};

// log N(y | m 1, K + s2 I) for the block (X [n, D], y [n]), with jitter escalation on the Cholesky.
// Gradients (when not null): d_params [P] with respect to the kernel's positive parameters,
// d_noise with respect to s2, d_mean with respect to m. The jitter, when one is needed, is held
// fixed in the gradient.
EvidenceResult gaussian_evidence(const KernelSpec& kernel, const double* params, ConstMatrixView X,
                                 const double* y, double noise_variance, double mean,
                                 const JitterOptions& jitter, BlockWorkspace& ws, double* d_params,
                                 double* d_noise, double* d_mean);

// Laplace's approximation of log \int prod_i p(y_i | f_i) N(f | 0, K) df for a probit or logit
// likelihood (y in {0, 1}): Newton's method for the mode as in Rasmussen & Williams' Algorithm 3.1
// (B = I + W^1/2 K W^1/2, with step halving when psi falls), the approximate evidence
// -a^T f / 2 + log p(y | f) - sum log diag L, and, when d_params is not null, its gradient with
// respect to the kernel's positive parameters (Algorithm 5.1, the implicit change of the mode
// included). Throws LinAlgError when Newton's method does not converge in max_iter steps.
EvidenceResult laplace_evidence(const KernelSpec& kernel, const double* params, ConstMatrixView X,
                                const double* y, Likelihood likelihood, const JitterOptions& jitter,
                                const LaplaceOptions& laplace, BlockWorkspace& ws, double* d_params);

struct FitOptions {
  Likelihood likelihood = Likelihood::Gaussian;
  bool optimize = true;    // false: evaluate at the given hyperparameters (fixed or shared)
  bool fit_noise = true;   // Gaussian: optimise s2 (else keep it)
  bool fit_mean = false;   // Gaussian: optimise m (else keep it)
  optimize::LbfgsOptions lbfgs;
  const double* prior_loc = nullptr;    // [P + 2] or null (no prior), coordinates u
  const double* prior_scale = nullptr;  // [P + 2] or null; 0 = no prior on that coordinate
  const double* lower = nullptr;        // [P + 2] or null (unbounded), coordinates u
  const double* upper = nullptr;        // [P + 2] or null
  double scale = 1.0;                   // gamma: the evidence's weight in the objective
  JitterOptions jitter;
  LaplaceOptions laplace;
};

// Starting (or fixed) hyperparameters: block p uses params + p * params_stride [P], and so on; a
// stride of 0 shares one value among all blocks.
struct Start {
  const double* params = nullptr;
  index_t params_stride = 0;
  const double* noise_variance = nullptr;  // Gaussian only (may be null otherwise)
  index_t noise_stride = 0;
  const double* mean = nullptr;  // Gaussian only (may be null otherwise)
  index_t mean_stride = 0;
};

// Caller-allocated outputs, one entry (or row) per block unless said otherwise. Null pointers are
// not written (f and W are written for Laplace fits only).
struct FitOutputs {
  double* params = nullptr;        // [blocks, P] fitted kernel parameters
  double* noise_variance = nullptr;  // [blocks]
  double* mean = nullptr;          // [blocks]
  double* log_evidence = nullptr;  // [blocks] plain log Z at the fitted hyperparameters
  double* log_prior = nullptr;     // [blocks] the prior term of the objective
  double* objective = nullptr;     // [blocks] scale * log_evidence + log_prior
  double* jitter = nullptr;        // [blocks] absolute jitter in the final factor
  std::int32_t* iterations = nullptr;   // [blocks] L-BFGS iterations (0 without optimisation)
  std::int32_t* evaluations = nullptr;  // [blocks] objective evaluations
  std::int32_t* status = nullptr;       // [blocks] optimize::Status, -1 without optimisation
  double* alpha = nullptr;         // [total rows] per row (see BlockWorkspace)
  double* factor = nullptr;        // [sum n_p^2] the blocks' L, row-major, one after another
  double* f = nullptr;             // [total rows] Laplace modes
  double* W = nullptr;             // [total rows] Laplace W at the modes
};

// Validates the CSR description (offsets [blocks + 1] from 0, non-decreasing, every block
// non-empty, rows in [0, n_rows)); throws std::invalid_argument naming the first problem.
void check_blocks(const index_t* offsets, const index_t* rows, index_t blocks, index_t n_rows);

// factor_offsets [blocks + 1]: the running sums of n_p^2 (where block p's factor starts).
void factor_offsets(const index_t* offsets, index_t blocks, index_t* out);

// Fits (or evaluates) every block: X [N, D], y [N] (labels in {0, 1} for Probit and Logit).
// Validates all input before any block runs (std::invalid_argument). See the header's comment on
// threads and errors.
void fit_blocks(const KernelSpec& kernel, const Start& start, ConstMatrixView X, const double* y,
                const index_t* offsets, const index_t* rows, index_t blocks, const FitOptions& options,
                const FitOutputs& out);

// Per block and test point: the latent mean and variance, for Gaussian experts the variance with
// noise, for Laplace experts the class probability P(y = 1). Outputs are [T, blocks] row-major
// (null: not written); mean includes the block's constant mean.
struct PredictOutputs {
  double* mean = nullptr;
  double* var = nullptr;
  double* var_y = nullptr;  // Gaussian
  double* prob = nullptr;   // Probit, Logit
};

// Which test rows each block predicts, by block (as offsets/rows for the training rows):
// block p those of rows[offsets[p]:offsets[p + 1]], each in [0, T); the entries of the pairs not
// listed are not written. A mixture needs a block only where its weight at the row is not
// negligible, which for a Gaussian-mixture partition is a few experts per sample.
struct TestRows {
  const index_t* offsets = nullptr;  // [blocks + 1]; null: every block predicts every test row
  const index_t* rows = nullptr;     // [offsets[blocks]]
};

// Inputs from fit_blocks: hyperparameters (a Start, with the fitted values), alpha [total rows],
// factor [sum n_p^2], W [total rows] (Laplace). Xnew [T, D]. Test points are taken in chunks, so
// memory per thread stays O(chunk * n_p).
void predict_blocks(const KernelSpec& kernel, const Start& fitted, ConstMatrixView X, const index_t* offsets,
                    const index_t* rows, index_t blocks, Likelihood likelihood, const double* alpha,
                    const double* factor, const double* W, ConstMatrixView Xnew, const PredictOutputs& out,
                    const TestRows& test = {});

}  // namespace pygpfast::moe
