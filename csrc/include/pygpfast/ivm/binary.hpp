// Binary Informative Vector Machine (Lawrence, Seeger & Herbrich 2003; the base of seed 002's
// multi-class IVM). Notation of shared/notes/ivm-math.md, section 1.
//
// Model. A GP prior u ~ N(0, K) over n training points X [n, D] with labels y [n] and a
// likelihood P(y | u) (probit or Gaussian, BinaryLikelihood). The posterior is approximated by
// Q(u) ∝ N(u | 0, K) prod_{i in I} t_i(u_i) with Gaussian sites t_i(u) = exp(b_i u - pi_i u^2 / 2)
// on an active set I = (i_1, ..., i_d) chosen greedily, each site fixed by assumed density
// filtering (ADF) when its point is included.
//
// Representation (all row-major):
//   B = I + Pi^1/2 K_I Pi^1/2 = L L^T              L [d, d] lower triangular
//   M = L^-1 Pi^1/2 K_{I,.}                        M [d, n], the "stubs" (columns)
//   beta = L^-1 Pi^-1/2 b_I                        [d]
//   xi = Pi^1/2 L^-T beta  (= (Pi^-1 + K_I)^-1 Pi^-1 b_I)
// The posterior marginals of all n points are h = M^T beta (means) and a = diag K - colsum(M o M)
// (variances); they are kept current after every inclusion in O(n d): one kernel row K(x_i, X),
// one GEMV with the stubs (s = K_{.,i} - M^T M_{.,i}, column i of the posterior covariance), and
// one new row of L and of M (note, section 1.3). The full n x n kernel matrix is never formed.
//
// Selection. The first `n_random` points are drawn at random, then each inclusion takes the
// candidate whose ADF update carries the most information: by default the entropy reduction of
// its marginal -1/2 log(a_new / a_old) = -1/2 log(1 - a nu) (Criterion::Entropy), or the KL
// divergence from the old marginal to the updated one (Criterion::KL). (Seed 002's Algorithm 1
// writes argmax of minus the divergence; read literally that picks the least informative point.)
// Exact ties go to the seeded random generator, so a seed fixes the selection on every platform
// and thread count; a run of size d begins with the d' inclusions of a run of size d' < d.
//
// Threads. Per-point loops run on OpenMP threads (static schedule, per-point outputs) only when
// each thread gets enough of them; the stub GEMVs and the triangular solves run on BLAS threads
// with no OpenMP region around them. Results do not depend on the OpenMP thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "pygpfast/kernels.hpp"
#include "pygpfast/view.hpp"
#include "pygpfast/workspace.hpp"

namespace pygpfast::ivm {

enum class BinaryLikelihoodKind : int {
  Probit = 0,    // P(y | u) = Phi(y (u + bias) / sqrt(noise_variance)), y in {-1, +1}
  Gaussian = 1,  // P(y | u) = N(y | u + bias, noise_variance), y real
};

struct BinaryLikelihood {
  BinaryLikelihoodKind kind = BinaryLikelihoodKind::Probit;
  double bias = 0.0;            // beta_0, added to the latent function
  double noise_variance = 1.0;  // Gaussian: sigma^2; probit: the variance of the probit's noise
                                // (1 for the standard probit Phi(y (u + bias)))
  int n_gh = 32;                // Gauss-Hermite nodes for the bound's expectations (probit)
  double label_noise = 0.0;     // probit: epsilon in [0, 1/2), P(y | u) = epsilon + (1 - 2 epsilon)
                                // Phi(...) (Kim & Ghahramani 2008); 0 for the Gaussian
};

// Throws std::invalid_argument for a non-finite bias, a non-positive or non-finite noise
// variance, n_gh outside [1, 100], or a label noise outside [0, 1/2) (0 for the Gaussian).
void validate(const BinaryLikelihood& lik);

// Throws std::invalid_argument naming the first label outside the likelihood's support
// ({-1, +1} for the probit, finite values for the Gaussian).
void check_labels(const BinaryLikelihood& lik, const double* y, index_t n);

// The ADF update of one point with cavity (= current marginal) N(h, a), a >= 0 (note, 1.2):
//   log_z = log E_{N(u | h, a)}[P(y | u)], alpha = d log_z / dh, nu = -d^2 log_z / dh^2;
// the tilted moments are h + a alpha and a (1 - a nu); the site that reproduces them is
//   site_pi = nu / (1 - a nu), site_b = (alpha + h nu) / (1 - a nu).
// Probit terms are computed in log space (no underflow or cancellation in either tail).
struct AdfUpdate {
  double log_z = 0.0;
  double alpha = 0.0;
  double nu = 0.0;
  double site_b = 0.0;
  double site_pi = 0.0;
};
AdfUpdate adf_update(const BinaryLikelihood& lik, double y, double h, double a);

enum class Criterion : int {
  Entropy = 0,  // -1/2 log(1 - a nu): entropy reduction of the point's marginal
  KL = 1,       // D[N(h + a alpha, a (1 - a nu)) || N(h, a)]
};

// The selection score of a candidate with marginal variance a and ADF update u (>= 0; larger is
// more informative).
double selection_score(Criterion criterion, const AdfUpdate& u, double a);

// Seconds spent in the phases of the inclusions so far, and the flops of the stub GEMVs.
struct BinaryStats {
  double kernel_seconds = 0.0;  // kernel rows K(x_i, X)
  double stub_seconds = 0.0;    // s = K_{.,i} - M^T M_{.,i} (GEMV, 2 n d flops)
  double update_seconds = 0.0;  // new rows of L and M, h and a
  double score_seconds = 0.0;   // ADF updates and scores of all candidates
  double stub_flops = 0.0;
  index_t inclusions = 0;
};

// The incremental representation of section 1.3. Holds references to the kernel, X and y,
// which must outlive it. Capacity: the largest active set it will hold (its buffers are
// allocated once: M takes capacity x n doubles).
class BinaryIVM {
 public:
  BinaryIVM(const kernels::Kernel& kernel, ConstMatrixView X, const double* y,
            const BinaryLikelihood& lik, index_t capacity);

  index_t num_points() const { return n_; }
  index_t active_size() const { return d_; }
  index_t capacity() const { return capacity_; }

  const double* mean() const { return h_.data(); }      // h [n]
  const double* variance() const { return a_.data(); }  // a [n]
  ConstMatrixView L() const { return ConstMatrixView(L_.data(), d_, d_, capacity_); }
  ConstMatrixView M() const { return ConstMatrixView(M_.data(), d_, n_, n_); }
  const double* beta() const { return beta_.data(); }
  const std::vector<index_t>& active() const { return active_; }
  const std::vector<double>& site_b() const { return site_b_; }
  const std::vector<double>& site_pi() const { return site_pi_; }
  const std::vector<double>& log_z() const { return log_z_; }    // ADF log normalisers
  const std::vector<double>& scores() const { return scores_; }  // score of each inclusion
  bool is_active(index_t j) const { return in_active_[static_cast<std::size_t>(j)] != 0; }
  const BinaryStats& stats() const { return stats_; }

  // The ADF update of point j from its current marginal.
  AdfUpdate adf(index_t j) const { return adf_update(lik_, y_[j], h_[j], a_[j]); }

  // out[j] = selection score of every point j [n]; -inf for active points.
  void scores(Criterion criterion, double* out) const;

  // Include point j with its ADF site (from its current marginal); returns the site.
  AdfUpdate include(index_t j, Criterion criterion = Criterion::Entropy);

  // Include point j with a given site (b, pi), pi >= 0 (pi = 0 only with b = 0: a site that
  // carries nothing). For replaying an active set with fixed sites.
  void include_site(index_t j, double b, double pi);

  // xi = Pi^1/2 L^-T beta [d] (prediction weights: h = K_{.,I} xi).
  void xi(double* out) const;

 private:
  void grow(index_t j, double b, double pi, double log_z, double score);

  const kernels::Kernel& kernel_;
  ConstMatrixView X_;
  const double* y_;
  BinaryLikelihood lik_;
  index_t n_, capacity_, d_ = 0;
  workspace::Buffer M_, L_, h_, a_, kdiag_, s_, m_i_;
  std::vector<double> beta_, site_b_, site_pi_, log_z_, scores_;
  std::vector<index_t> active_;
  std::vector<unsigned char> in_active_;
  mutable BinaryStats stats_;  // (scores() adds its time)
};

struct SelectOptions {
  index_t active_size = 0;  // d, 1 <= d <= n
  index_t n_random = 2;     // the first min(n_random, d) inclusions are drawn at random
  std::uint64_t seed = 0;   // seeds the random picks and the tie breaks
  Criterion criterion = Criterion::Entropy;
};

// Greedy selection: includes points into `ivm` until it holds options.active_size of them
// (options.active_size <= ivm.capacity()). Points already active stay (the first inclusions
// of a fresh `ivm` are the random ones).
void select(BinaryIVM& ivm, const SelectOptions& options);

// A small, portable random generator (splitmix64): the same stream on every platform.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  // Uniform in [0, bound), bound >= 1 (rejection, no modulo bias).
  std::uint64_t below(std::uint64_t bound);

 private:
  std::uint64_t state_;
};

// Latent predictions at Xnew [T, D] from the representation: with k_* = K(X_active, x_*),
// v = L^-1 Pi^1/2 k_*, mean = v^T beta (= k_*^T xi), var = K(x_*, x_*) - v^T v (clamped at 0).
// X_active [d, D], site_pi [d], L [d, d] lower, beta [d]; mean, var [T]. O(T d^2) in blocks of
// test points.
void predict(const kernels::Kernel& kernel, ConstMatrixView X_active, const double* site_pi,
             ConstMatrixView L, const double* beta, ConstMatrixView Xnew, double* mean, double* var);

// P(y = +1 | x_*) = eps + (1 - 2 eps) Phi((mean + bias) / sqrt(noise_variance + var)) for the
// probit [T] (eps = label_noise).
void probit_probability(const BinaryLikelihood& lik, const double* mean, const double* var, index_t T,
                        double* out);

// The negative log marginal-likelihood bound of seed 002, section 4 (note, 1.6), with the active
// set and the sites (b_I, pi_I) fixed:
//   F = sum_j E_{N(h_j, a_j)}[-log P(y_j | u)] + KL,
//   KL = 1/2 [tr B^-1 + xi^T K_I xi - d + log|B|] = D[Q(u_I) || P(u_I)]  >=  -log P(y | theta),
// the sum over all n points, h and a rebuilt from scratch at the kernel's parameters
// (O(n d^2), BLAS 3). Probit expectations by Gauss-Hermite (lik.n_gh nodes), Gaussian ones in
// closed form.
struct BoundResult {
  double value = 0.0;
  double expected_neg_log_lik = 0.0;
  double kl = 0.0;
};

// Gradients of F: kernel [P] (written, in the kernel's parameter layout), bias, noise_variance.
struct BoundGradients {
  double* kernel = nullptr;
  double bias = 0.0;
  double noise_variance = 0.0;
};

// active [d] distinct indices into X; site_b, site_pi [d] with pi >= 0 (and b = 0 where pi = 0).
// When not null, mean and var [n] receive the marginals h, a at these parameters. grad (or null)
// receives the gradients: O(n d^2) once, then one kernel vjp on K(X_I, X) and one on K(X_I, X_I).
// distances: null, or the squared distances [d, n] of X[active] and X with their max_norm
// (kernels::SquaredDistances' values() and max_norm()), which K(X_I, X) and its vjp read for
// isotropic leaves: a search computes them once per active set.
BoundResult bound(const kernels::Kernel& kernel, const BinaryLikelihood& lik, ConstMatrixView X,
                  const double* y, const index_t* active, index_t d, const double* site_b,
                  const double* site_pi, BoundGradients* grad, double* mean = nullptr,
                  double* var = nullptr, const double* distances = nullptr, double distances_max_norm = 0.0);

}  // namespace pygpfast::ivm
