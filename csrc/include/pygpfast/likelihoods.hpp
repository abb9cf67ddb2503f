// Likelihoods p(y | f) and their Gaussian expectations, the per-point building block of
// variational ELBOs (seed 000, eqs. 21-22):
//   E_{N(f | mu, var)}[log p(y | f)]  and its derivatives with respect to mu and var,
// for one latent function per point (Gaussian, Bernoulli, Poisson) or C of them (softmax, with
// independent marginals f_c ~ N(mu_c, var_c); see softmax.hpp for its method; robust-max).
// Loops over points use OpenMP (per-point outputs, so results do not depend on the
// thread count).
#pragma once

#include "pygpfast/view.hpp"

namespace pygpfast::likelihoods {

enum class LikelihoodType : int {
  Gaussian = 0,         // p(y|f) = N(y | f, variance); closed form
  BernoulliProbit = 1,  // y in {0, 1}, p(y=1|f) = Phi(f), or with label noise; Gauss-Hermite
  BernoulliLogit = 2,   // y in {0, 1}, p(y=1|f) = sigmoid(f), or with label noise; Gauss-Hermite
  Poisson = 3,          // y >= 0 (counts; real y by the same formula), rate exp(f); closed form
                        // (log rates mu + var/2 beyond ~709.78 overflow: -inf values, +inf moments)
  Softmax = 4,          // y in {0, ..., C - 1}, p(y=c|f) = softmax_c(f), C = num_classes >= 2
  RobustMax = 5,        // y in {0, ..., C - 1}, p(y=c|f) = 1 - epsilon if c = argmax f, else
                        // epsilon / (C - 1), epsilon = label_noise in (0, 1 - 1/C) (Hernandez-Lobato
                        // et al. 2011); one-dimensional Gauss-Hermite
};

struct Likelihood {
  LikelihoodType type = LikelihoodType::Gaussian;
  double variance = 1.0;     // Gaussian noise variance (ignored by the others)
  double label_noise = 0.0;  // Bernoulli: epsilon in [0, 1/2), p(y|f) = epsilon + (1 - 2 epsilon) p0(y|f)
                             // with p0 the link's (Kim & Ghahramani 2008); 0: the plain link.
                             // Robust-max: epsilon in (0, 1 - 1/C), the probability of a label
                             // other than the latent argmax
  int n_gh = 20;          // Gauss-Hermite points for the non-closed-form expectations (for the
                          // softmax: per class, inside softmax.hpp's one-dimensional integral)
  int num_classes = 0;    // number of classes C of multi-class likelihoods (softmax, robust-max;
                          // 0 for the others)
};

// Number of latent functions per data point: 1 for the scalar likelihoods above, C for
// multi-class ones. Per-point latent arrays (mu, var, dmu, dvar) are [n, latent_dim] row-major.
index_t latent_dim(const Likelihood& lik);

// Validates a likelihood description (throws std::invalid_argument).
void validate(const Likelihood& lik);

// Throws std::invalid_argument naming the first label of y [n] outside the likelihood's support
// (the check of variational_expectations and predict_log_density).
void check_labels(const Likelihood& lik, const double* y, index_t n);

// For i < n: f[i] = E[log p(y_i|f)], dmu[i] = d f[i]/d mu_i, dvar[i] = d f[i]/d var_i under
// f ~ N(mu_i, var_i), var_i >= 0. When dparam is not null, dparam[i] = d f[i]/d variance for the
// Gaussian likelihood, d f[i]/d label_noise for a Bernoulli one with label_noise > 0 and for
// robust-max, and 0 for the others. Throws std::invalid_argument on labels outside
// the likelihood's support, non-finite means or negative variances.
// With D = latent_dim(lik), mu, var, dmu and dvar are [n, D] row-major (f, dparam and y: [n]).
void variational_expectations(const Likelihood& lik, const double* y, const double* mu,
                              const double* var, index_t n, double* f, double* dmu, double* dvar,
                              double* dparam);

// Predictive mean and variance of y at f ~ N(mu, var) ([n] each). For the softmax (mu, var
// [n, C]): mean[i, c] = P(y_i = c) = E[softmax_c(f)] and variance[i, c] = mean (1 - mean), the
// variance of the one-hot indicator of class c ([n, C] each; rows of mean sum to 1). For
// robust-max: P(y_i = c) = (1 - epsilon) A_c + epsilon / (C - 1) (1 - A_c), A_c the probability
// that f_c is the largest (the quadrature's A_c rescaled to sum to 1).
void predict_mean_and_var(const Likelihood& lik, const double* mu, const double* var, index_t n,
                          double* mean, double* variance);

// out[i] = log \int p(y_i|f) N(f | mu_i, var_i) df (log predictive density; mu, var [n, D]).
void predict_log_density(const Likelihood& lik, const double* y, const double* mu,
                         const double* var, index_t n, double* out);

// The log class probabilities log P(y_i = c) [n, C] of the multi-class likelihoods: for the
// softmax log E[softmax_c(f)], in log space (finite however far class c lies below the others);
// for robust-max the log of predict_mean_and_var's mean (at least log(epsilon / (C - 1))).
void predict_log_class_probabilities(const Likelihood& lik, const double* mu, const double* var, index_t n,
                                     double* out);

}  // namespace pygpfast::likelihoods
