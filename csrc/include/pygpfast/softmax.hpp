// The softmax (multi-class) likelihood p(y = c | f) = exp(f_c) / sum_d exp(f_d) of C >= 2
// classes, and its expectations under independent Gaussian marginals f_c ~ N(mu_c, var_c):
// the C latent functions of a multi-class SVGP share Z and the kernel but have independent
// q(u_c) (seed 000), so q(f_n) is N(mu_n, diag var_n).
//
// Method. E[log softmax_y(f)] = mu_y - E[lse(f)], lse(f) = log S, S = sum_c exp(f_c). Frullani's
// integral log S = int_0^inf (e^-t - e^-tS) dt / t turns the C-dimensional expectation into
// one-dimensional ones, because the f_c are independent:
//   E[log S] = int_0^inf (e^-t - P(t)) dt / t,   P(t) = E[e^-tS] = prod_c L_c(t),
//   L_c(t) = E[exp(-t e^{f_c})]   (a one-dimensional Gaussian expectation per class).
// Each L_c is taken by the n_gh-point Gauss-Hermite rule; the outer integral, in u = log t, by
// the trapezoidal rule with step h = 1/2 on a fixed grid (spectrally accurate: the integrand is
// analytic in the strip |Im u| < pi/2). A control variate removes most of the outer error and
// makes var -> 0 exact: with A = sum_c E_gh[e^{f_c}],
//   E[log S] = log A + int (e^{-tA} - P(t)) du,
// whose integrand vanishes identically at var = 0 and is O(t^2) as t -> 0; the grid's lower
// tail is summed in closed form from the rule's second and third cumulants of S, and the grid
// stops above once every integrand is below 1e-12. The same sums give E[softmax_c(f)] =
// int t E[e^{f_c} e^{-t e^{f_c}}] prod_{d != c} L_d(t) du (with the control variate
// t E[e^{f_c}] e^{-tA}). Cost per point: C n_gh exps once, then C n_gh exps per grid node,
// about 25 to 60 nodes for latent variances up to 10 (where this rule is used; see below).
// Accuracy (tests and bench/README.md): the outer rule's floor is about 1e-8 in values and
// 1e-7 in gradients and probabilities; above it the inner Gauss-Hermite rule's error, set by
// n_gh and the variances, dominates (with n_gh = 20: 4e-8 at the variances of a model fitted
// to USPS, up to 12; 2e-5 at those of one fitted to glass, up to 9). It grows with the
// variance, because exp(-t e^f) is a step of width ~1 in f that the rule's nodes, ~sqrt(var)
// apart, do not resolve: against Monte Carlo (C = 3, mu = (0, 5, -5), equal variances) the
// errors in d/dmu and the class probabilities were 1e-4 at var = 10, 2.5e-3 at 30 and
// 3.6e-2 at 1000. A point with a class of variance above 10 (softmax.cpp, kWideVariance)
// therefore takes that class's L_c(t) in its Gumbel form, P(W - f_c > log t) =
// E_W[Phi((W - log t - m_c) / s_c)] with W standard Gumbel-min, smooth in W on the scale s_c
// and integrated by a 20-point Gauss rule for W's density (1e-13 from s_c = 3 on), the other
// classes by Gauss-Hermite as before, on a grid that reaches 8.5 s_c beyond every class and
// has no lower-tail formula. Its errors are at the outer rule's floor at any variance (Monte
// Carlo agrees within its standard error from var = 10 to 10^4); the switch at 10 moves the
// value by ~2e-5 and d/dmu by ~1e-4, the Gauss-Hermite rule's own error there. When every
// class of the point is wide, e^-t is traded for Phi(-log t / s_min) (their integrals differ
// by Euler's constant) and the grid's step grows to s_min / 2: such a point costs about 5
// times one below 10 whatever its variances (C = 3 at 10^6: 85 us against 70 ms on the fine
// grid), unless they are more than ~2e8 apart (the step s_min / 2 across the widest class's
// reach then needs more than 2^18 nodes, and the point is refused too). With a class of
// variance <= 10 the grid keeps the fine step, and grows with the widest class's sqrt(var)
// (150 times the cost at var = 1000); a point that would need more than 2^18 nodes
// (variances ~1e7 beside a narrow class) is refused with an error.
// The derivatives are those of the computed value (reparameterisation through the same nodes;
// Price's form E[g'']/2 for the variance derivative of a class with var < 1e-10), so
// optimisers see one deterministic objective, smooth apart from the switch at var = 10.
#pragma once

#include "pygpfast/view.hpp"

namespace pygpfast::softmax {

// For i < n, with mu, var, dmu, dvar [n, C] row-major, var >= 0 and finite, mu finite,
// y[i] in {0, ..., C - 1} (not checked here; see likelihoods::variational_expectations):
//   value[i] = E[log softmax_{y_i}(f)], f_c ~ N(mu[i, c], var[i, c]) independent,
// and its derivatives dmu[i, c], dvar[i, c] with respect to mu[i, c] and var[i, c].
void variational_expectations(int num_classes, int n_gh, const double* y, const double* mu,
                              const double* var, index_t n, double* value, double* dmu, double* dvar);

// At points with a class of variance above 10, a class probability below ~1e-8 comes out of
// the wide grid's sums with few digits (it rests on the Gumbel rule's tails: -228.6 where the
// answer is -93.6), and below e^-708 as exp's floor; it can be recomputed exactly in log space
// by tilting (softmax.cpp, log_tilted_probability), at ~0.3 ms a class for C = 10. Tails says
// for which: none (class probabilities, where the difference is below 1e-8 absolute), every
// class (log probabilities), or only class labels[i] of point i (log densities).
enum class Tails { Skip, All, Label };

// log_prob[i, c] = log E[softmax_c(f)] under the same marginals ([n, C] row-major), computed
// in log space (no underflow for classes far below the others) and normalised so that every
// row's probabilities sum to 1. `labels` [n] is read with Tails::Label only.
void log_class_probabilities(int num_classes, int n_gh, const double* mu, const double* var,
                             index_t n, double* log_prob, Tails tails = Tails::Skip,
                             const double* labels = nullptr);

}  // namespace pygpfast::softmax
