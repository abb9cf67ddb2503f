// Joint multi-class informative vector machine (Seeger & Jordan 2004, seed 002; the formulas
// and their checks are in notes/ivm-math.md section 2).
//
// Model: C independent zero-mean GP priors u^(c) with kernels K^(c) (one per class, or one
// shared), the softmax likelihood P(y | u) = softmax(u + beta)_y with intercepts beta [C].
// The approximate posterior Q(u) ~ N(u | 0, K) prod_{i in I} exp(b_i^T u_i - u_i^T Pi_i u_i / 2)
// keeps sites only on the active set I (d points, in inclusion order), with the constrained
// precisions Pi_i = diag(pi_i) - pi_i pi_i^T / (1^T pi_i), pi_i > 0 (seed eq. 3).
//
// Layouts (row-major): X [n, D], y [n] (class labels 0..C-1 as float64), beta [C], the active
// set `active` [d] (indices into X), pi [d, C], b [d, C]; marginal means h [n, C] and
// covariances A [n, C, C]. Classes are the fast index of per-point arrays.
//
// Representation (note 2.2): per class a binary IVM (L^(c), stubs M^(c) [d, n]) for the diagonal
// part of Pi, coupled by the rank-d term through R R^T = Gamma = sum_c W^(c) and the stubs
// Q^(c) = R^{-1} W^(c) K^(c)_{I,.} [d, n]; then A_j = diag_c(K^(c)_jj - |M^(c)_j|^2) + Q_j^T Q_j
// with Q_j = [Q^(1)_j .. Q^(C)_j] [d, C]. Storage 2 n C d for the stubs, O(C d^2) for the rest.
//
// Errors: std::invalid_argument for bad input (shapes, labels, options); LinAlgError when a
// Cholesky factor fails. No exception leaves an OpenMP region.
#pragma once

#include <cstdint>
#include <vector>

#include "pygpfast/ivm/cubature.hpp"
#include "pygpfast/kernels.hpp"
#include "pygpfast/view.hpp"

namespace pygpfast::ivm {

// One kernel shared by all classes (size 1) or one per class (size C). Not owned.
using ClassKernels = std::vector<const kernels::Kernel*>;

// ---- Constrained ADF projection (note 2.4) ----
struct ProjectionResult {
  std::vector<double> pi;  // [C] site parameters pi_i > 0
  std::vector<double> b;   // [C] b_i = g + Pi_i h_hat (1^T b = 0)
  std::vector<double> g;   // [C] g = A^{-1} (h_hat - h), the mean step of the inclusion
  double objective = 0.0;  // f(pi) = [-log|A^{-1} + Pi| + tr(Pi A_hat)] / 2 at the result
  int iterations = 0;      // Newton (or majoriser) steps taken
  int majoriser_steps = 0; // of which fell back to the convex majoriser's Hessian
  bool converged = false;
};

// Projects the tilted moments (h_hat, A_hat) of point i with cavity N(h, A) (all [C] / [C, C])
// onto a site of the constrained form: b matches the mean exactly, pi minimises
// f(pi) by the safeguarded Newton method (full Hessian when positive definite, else the convex
// majoriser's; Armijo backtracking; pi clipped to [1e-10, 1e10]; stop when the decrement
// |grad^T step| < 1e-13 max(1, |f|), or a step gaining < 1e-12 max(1, |f|) with the decrement
// < 1e-9 max(1, |f|), e.g. when the infimum lies at pi_k -> infinity). pi0 [C] >= 0 is the start,
// clipped to [1e-10, 1e10] like every iterate (the driver uses (e_y + E[softmax]) / 2, whose
// entries underflow to 0 at far-out cavities). Throws std::invalid_argument for non-finite input
// or a negative pi0, LinAlgError for A or A_hat not positive definite.
ProjectionResult project_constrained_site(int C, const double* h, const double* A, const double* h_hat,
                                          const double* A_hat, const double* pi0, int max_iterations = 50);

// f(pi), its gradient [C] and full Hessian [C, C] (Hessian may be null) for the projection
// problem above (for tests).
double projection_objective(int C, const double* A, const double* A_hat, const double* pi, double* grad,
                            double* hessian);

// ---- Greedy selection (seed Algorithm 1, note section 3) ----
struct MulticlassSelectOptions {
  int num_classes = 0;
  index_t active_size = 0;      // d, 1 <= d <= n
  index_t n_random = 2;         // first inclusions picked at random (>= 1 recommended)
  std::uint64_t seed = 0;       // seeds the xoshiro256** generator
  CubatureRule rule = CubatureRule::GaussHermite3;
  double keep_fraction = 0.5;   // fraction of J's top scorers kept for the next round, [0, 1]
  index_t selection_size = 0;   // |J|; 0 means ceil(n / C)
  int max_newton = 50;          // iteration cap of the projection
  bool record_marginals = false;  // keep (h, A) of all n points after every inclusion
};

struct Selection {
  index_t n = 0, d = 0;
  int C = 0;
  std::vector<index_t> active;      // [d]
  std::vector<double> pi, b;        // [d, C]
  std::vector<double> h;            // [n, C] final marginal means
  std::vector<double> A;            // [n, C, C] final marginal covariances
  std::vector<double> scores;       // [d] information gain of the included point (NaN for random picks)
  std::vector<double> log_Z;        // [d] log E[P(y_i | u_i)] under the cavity at inclusion
  std::vector<int> newton_iterations;  // [d]
  std::vector<int> newton_converged;   // [d] 0/1
  std::vector<double> score_seconds;   // [d] time scoring J before the inclusion
  std::vector<double> update_seconds;  // [d] time of the representation and stub update
  // Tilted moments of a candidate (one per candidate and round) or of a random pick that the rule
  // could not give (softmax_tilted_moments false: Stroud5 from C = 5 on) and GaussHermite3 gave
  // in their place; and those no rule gave (Stroud5 above kMaxGaussHermite3Dim classes, where
  // GaussHermite3 is not offered): such a candidate is not scored that round, such a random
  // pick is skipped for the rest of the selection and the draw repeated.
  index_t quadrature_fallbacks = 0;
  index_t invalid_moments = 0;
  std::vector<double> history_h;       // [d, n, C] with record_marginals
  std::vector<double> history_A;       // [d, n, C, C] with record_marginals
};

// Selects d active points of (X, y) and their sites. Cost per inclusion: O(|J| (C^2 d + N_q C^2))
// for scoring, O(n C d) for the gemv's, O(n C^2 d) for the coupled stub refresh (a fused pass),
// O(C d^2) for the small representation, plus n C kernel values.
Selection multiclass_select(const ClassKernels& kernels, ConstMatrixView X, const double* y, const double* beta,
                            const MulticlassSelectOptions& options);

// ---- Prediction (note 2.7): O(C d^2 + C^2 d) per test point after an O(C d^3) set-up ----
// mean [T, C], cov [T, C, C] (may be null), prob [T, C] = E[softmax(u + beta)] by the rule
// (may be null; where Stroud5's negative weights put a probability outside (0, 1), that point's
// by GaussHermite3, up to kMaxGaussHermite3Dim classes).
void multiclass_predict(const ClassKernels& kernels, int num_classes, ConstMatrixView X_active, const double* pi,
                        const double* b, const double* beta, ConstMatrixView Xnew, CubatureRule rule, double* mean,
                        double* cov, double* prob);

// ---- Seed section-4 bound with I and the sites (b_I, pi_I) fixed (note 2.8) ----
struct MulticlassBoundResult {
  double value = 0.0;          // expected_nll + kl >= -log P(y | theta)
  double expected_nll = 0.0;   // sum_j E_{N(h_j, A_j)}[-log P(y_j | u)] over all n points, by the rule
  double kl = 0.0;             // D[Q(u_I) || P(u_I)]
};

// d_kernel: null, or one pointer per kernel in `kernels` to num_params() doubles (overwritten);
// d_beta [C] (null or overwritten). Gradients are those of the rule's formula (exact for it).
// distances: null, or the squared distances [d, n] of X[active] and X with their max_norm, as
// kernels::SquaredDistances(X[active], X) gives them (values(), max_norm()): a search that
// evaluates the bound many times with one active set computes them once.
// Cost: O(n C d^2 + n C^2 d + n N_q C^2) plus kernel values and vjps.
MulticlassBoundResult multiclass_bound(const ClassKernels& kernels, int num_classes, ConstMatrixView X, const double* y,
                             const index_t* active, index_t d, const double* pi, const double* b,
                             const double* beta, CubatureRule rule, const std::vector<double*>* d_kernel,
                             double* d_beta, const double* distances = nullptr, double distances_max_norm = 0.0);

}  // namespace pygpfast::ivm
