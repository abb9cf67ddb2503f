// C-dimensional cubature for Gaussian expectations, and the softmax moments the joint
// multi-class IVM (seed 002, notes/ivm-math.md section 2.5) takes with it.
//
// A rule is a set of nodes z_k [N, C] and weights w_k [N] for the standard normal N(0, I_C):
// E[f(z)] ~ sum_k w_k f(z_k). For u ~ N(h, A) the nodes become u_k = h + L z_k with L L^T = A.
//   GaussHermite3: the tensor product of the 3-point rule for N(0, 1) (nodes 0, +-sqrt 3,
//                  weights 2/3, 1/6, 1/6); 3^C nodes, all weights positive, exact for every
//                  monomial whose exponents are all <= 5.
//   Stroud5:       Stroud's degree-5 rule E_n^{r^2} 5-2 rescaled to N(0, I_C); 2 C^2 + 1 nodes,
//                  exact for total degree <= 5. Its axis weights (4 - C) / (2 (C + 2)^2) are
//                  negative from C = 5 on, so at far-out cavities (large variances or means)
//                  its moments can be those of no positive measure: softmax_tilted_moments
//                  reports them invalid, and the callers fall back to GaussHermite3 for that
//                  point (multiclass.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "pygpfast/view.hpp"

namespace pygpfast::ivm {

enum class CubatureRule : std::int32_t { GaussHermite3 = 0, Stroud5 = 1 };

// Largest dimension accepted by each rule (3^12 = 531441 nodes; 2 * 64^2 + 1 nodes).
constexpr int kMaxGaussHermite3Dim = 12;
constexpr int kMaxStroud5Dim = 64;

struct Cubature {
  CubatureRule rule = CubatureRule::GaussHermite3;
  int dim = 0;
  index_t size = 0;             // number of nodes N
  std::vector<double> nodes;    // [N, dim] row-major
  std::vector<double> nodes_t;  // [dim, N]: the same, dimension-major (the routines' SIMD layout)
  std::vector<double> weights;  // [N], sum 1
  bool has_negative_weights = false;
};

// The rule for N(0, I_dim). std::invalid_argument for an unknown rule or a dimension outside
// [1, kMax...Dim].
Cubature make_cubature(CubatureRule rule, int dim);
// rule as the int of the bindings (0 or 1), validated.
CubatureRule cubature_rule_from_int(int rule);

// Lower Cholesky factor L [C, C] of a small symmetric A [C, C] (plain loops, no exceptions);
// false when A is not numerically positive definite.
bool small_cholesky(int C, const double* A, double* L);

// Scratch doubles the routines below need for a rule (per calling thread).
index_t cubature_work_size(const Cubature& rule);

// Tilted moments of the softmax with intercepts beta, P(y | u) = softmax(u + beta)_y, under
// the cavity N(h, A) (L: the lower Cholesky factor of A, [C, C] row-major):
//   log_Z = log E[P(y | u)], mean_hat = E~[u], cov_hat = Cov~[u] under the tilted density
//   N(u | h, A) P(y | u) / Z, and p_cavity = E[softmax(u + beta)] under the cavity.
// Returns false (outputs unspecified) when the moments are not those of a positive measure:
// Z not positive and finite, mean_hat not finite, cov_hat not positive definite, or, for a rule
// with negative weights, an entry of p_cavity outside (0, 1) (in practice only Stroud5 from
// C = 5 on, at far-out cavities). Never throws. work: cubature_work_size doubles.
bool softmax_tilted_moments(const Cubature& rule, int y, const double* h, const double* L,
                            const double* beta, double* mean_hat, double* cov_hat,
                            double* p_cavity, double* log_Z, double* work);

// Expected negative log-likelihood under N(h, A) by the rule:
//   value = sum_k w_k [logsumexp(u_k + beta) - u_k[y] - beta[y]],
// and its exact derivatives (of the rule's formula, through u_k = h + L z_k and the Cholesky
// factor): g_h [C] = d value / d h and G_A [C, C] (symmetric) with d value = sum_ce G_A[c, e]
// dA[c, e] for symmetric dA. Never throws. work: cubature_work_size doubles.
void softmax_expected_nll(const Cubature& rule, int y, const double* h, const double* L,
                          const double* beta, double* value, double* g_h, double* G_A,
                          double* work);

// E[softmax(u + beta)] [C] under N(h, A) by the rule. Never throws.
void softmax_expected_probabilities(const Cubature& rule, const double* h, const double* L,
                                    const double* beta, double* probabilities, double* work);

}  // namespace pygpfast::ivm
