#include "pygpfast/ivm/cubature.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "pygpfast/errors.hpp"
#include "pygpfast/vmath.hpp"
#include "small_dense.hpp"

namespace pygpfast::ivm {

CubatureRule cubature_rule_from_int(int rule) {
  require(rule == 0 || rule == 1, "rule must be 0 (3-point Gauss-Hermite product) or 1 (Stroud 5-2), got ",
          rule);
  return static_cast<CubatureRule>(rule);
}

Cubature make_cubature(CubatureRule rule, int dim) {
  Cubature q;
  q.rule = rule;
  q.dim = dim;
  if (rule == CubatureRule::GaussHermite3) {
    require(dim >= 1 && dim <= kMaxGaussHermite3Dim, "the 3-point Gauss-Hermite product rule takes 1 <= C <= ",
            kMaxGaussHermite3Dim, " (3^C nodes), got C = ", dim, "; use Stroud5 (rule=1) for more classes");
    const double x1[3] = {-std::sqrt(3.0), 0.0, std::sqrt(3.0)};
    const double w1[3] = {1.0 / 6.0, 2.0 / 3.0, 1.0 / 6.0};
    index_t N = 1;
    for (int c = 0; c < dim; ++c) N *= 3;
    q.size = N;
    q.nodes.resize(static_cast<std::size_t>(N * dim));
    q.weights.resize(static_cast<std::size_t>(N));
    for (index_t k = 0; k < N; ++k) {
      index_t r = k;
      double w = 1.0;
      // The last coordinate varies fastest (itertools.product order).
      for (int c = dim - 1; c >= 0; --c) {
        const int digit = static_cast<int>(r % 3);
        r /= 3;
        q.nodes[k * dim + c] = x1[digit];
        w *= w1[digit];
      }
      q.weights[k] = w;
    }
  } else if (rule == CubatureRule::Stroud5) {
    require(dim >= 1 && dim <= kMaxStroud5Dim, "the Stroud 5-2 rule takes 1 <= C <= ", kMaxStroud5Dim,
            ", got C = ", dim);
    const double C = dim;
    const index_t N = 2 * static_cast<index_t>(dim) * dim + 1;
    q.size = N;
    q.nodes.assign(static_cast<std::size_t>(N * dim), 0.0);
    q.weights.resize(static_cast<std::size_t>(N));
    index_t k = 0;
    q.weights[k++] = 2.0 / (C + 2.0);
    const double r_axis = std::sqrt(C + 2.0), w_axis = (4.0 - C) / (2.0 * (C + 2.0) * (C + 2.0));
    for (int a = 0; a < dim; ++a)
      for (int s = -1; s <= 1; s += 2) {
        q.nodes[k * dim + a] = s * r_axis;
        q.weights[k++] = w_axis;
      }
    const double r_pair = std::sqrt((C + 2.0) / 2.0), w_pair = 1.0 / ((C + 2.0) * (C + 2.0));
    for (int a = 0; a < dim; ++a)
      for (int b = a + 1; b < dim; ++b)
        for (int sa = -1; sa <= 1; sa += 2)
          for (int sb = -1; sb <= 1; sb += 2) {
            q.nodes[k * dim + a] = sa * r_pair;
            q.nodes[k * dim + b] = sb * r_pair;
            q.weights[k++] = w_pair;
          }
    q.has_negative_weights = w_axis < 0.0;
  } else {
    throw std::invalid_argument("unknown cubature rule " + std::to_string(static_cast<int>(rule)));
  }
  q.nodes_t.resize(q.nodes.size());
  for (index_t k = 0; k < q.size; ++k)
    for (int c = 0; c < dim; ++c) q.nodes_t[c * q.size + k] = q.nodes[k * dim + c];
  return q;
}

bool small_cholesky(int C, const double* A, double* L) { return small::cholesky(C, A, L); }

index_t cubature_work_size(const Cubature& rule) {
  const index_t C = rule.dim;
  return (2 * C + 3) * rule.size + 4 * C * C + 4 * C;
}

namespace {

// The softmax at every node of the rule under N(h, L L^T), node-major loops that vectorise (the
// nodes are the SIMD lanes; vmath's exp and log): offsets delta [C, N] = L z_k (class-major),
// v = (h + beta) + delta, vmax [N] = max_c v, E [C, N] = exp(v - vmax), inv_sum [N] =
// 1 / sum_c E, lse [N] = logsumexp_c v.
PYGPFAST_SIMD_CLONES void evaluate_nodes(int C, index_t N, const double* zt, const double* h, const double* L,
                                         const double* beta, double* delta, double* E, double* vmax,
                                         double* inv_sum, double* lse) {
  for (index_t k = 0; k < N; ++k) vmax[k] = -std::numeric_limits<double>::infinity();
  for (int c = 0; c < C; ++c) {
    double* dc = delta + c * N;
    const double l0 = L[c * C];
#pragma omp simd
    for (index_t k = 0; k < N; ++k) dc[k] = l0 * zt[k];
    for (int e = 1; e <= c; ++e) {
      const double l = L[c * C + e];
      const double* ze = zt + e * N;
#pragma omp simd
      for (index_t k = 0; k < N; ++k) dc[k] += l * ze[k];
    }
    const double a = h[c] + beta[c];
#pragma omp simd
    for (index_t k = 0; k < N; ++k) vmax[k] = std::max(vmax[k], a + dc[k]);
  }
  for (index_t k = 0; k < N; ++k) inv_sum[k] = 0.0;
  for (int c = 0; c < C; ++c) {
    const double a = h[c] + beta[c];
    const double* dc = delta + c * N;
    double* ec = E + c * N;
#pragma omp simd
    for (index_t k = 0; k < N; ++k) {
      ec[k] = vmath::exp((a + dc[k]) - vmax[k]);
      inv_sum[k] += ec[k];
    }
  }
#pragma omp simd
  for (index_t k = 0; k < N; ++k) {
    lse[k] = vmax[k] + vmath::log(inv_sum[k]);
    inv_sum[k] = 1.0 / inv_sum[k];
  }
}

// sum_k x_k y_k over the nodes.
PYGPFAST_SIMD_CLONES double node_dot(index_t N, const double* x, const double* y) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (index_t k = 0; k < N; ++k) s += x[k] * y[k];
  return s;
}

// The tilted weights wp [N] = w_k P_k / max_k P_k (P_k = softmax(v_k)_y; logP [N] in, wp may
// alias it) and p_cavity [C] = sum_k w_k softmax(v_k); returns log max_k P_k.
PYGPFAST_SIMD_CLONES double tilted_weights(int C, index_t N, const double* w, const double* E,
                                           const double* inv_sum, double* logP, double* p_cavity,
                                           double* scratch) {
  for (int c = 0; c < C; ++c) {
    const double* ec = E + c * N;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (index_t k = 0; k < N; ++k) s += w[k] * ec[k] * inv_sum[k];
    p_cavity[c] = s;
  }
  double lmax = -std::numeric_limits<double>::infinity();
#pragma omp simd reduction(max : lmax)
  for (index_t k = 0; k < N; ++k) lmax = std::max(lmax, logP[k]);
#pragma omp simd
  for (index_t k = 0; k < N; ++k) scratch[k] = w[k] * vmath::exp(logP[k] - lmax);
  std::copy(scratch, scratch + N, logP);
  return lmax;
}

}  // namespace

bool softmax_tilted_moments(const Cubature& rule, int y, const double* h, const double* L, const double* beta,
                            double* mean_hat, double* cov_hat, double* p_cavity, double* log_Z, double* work) {
  const int C = rule.dim;
  const index_t N = rule.size;
  double* delta = work;           // [C, N]
  double* E = delta + C * N;      // [C, N]
  double* vmax = E + C * N;       // [N], then the tilted weights
  double* inv_sum = vmax + N;     // [N]
  double* lse = inv_sum + N;      // [N], then scratch
  double* m1 = lse + N;           // [C]
  double* Lh = m1 + C;            // [C, C]
  evaluate_nodes(C, N, rule.nodes_t.data(), h, L, beta, delta, E, vmax, inv_sum, lse);
  // log P_k = v_y - lse, with v_y = (h_y + beta_y) + delta_y as in evaluate_nodes.
  const double a_y = h[y] + beta[y];
  const double* dy = delta + y * N;
  double* wp = vmax;
  for (index_t k = 0; k < N; ++k) wp[k] = (a_y + dy[k]) - lse[k];
  const double lmax = tilted_weights(C, N, rule.weights.data(), E, inv_sum, wp, p_cavity, lse);
  // Moments of the offsets delta_k = L z_k around the cavity mean, weighted by w_k P_k / P_max.
  double Z = 0.0;
  for (index_t k = 0; k < N; ++k) Z += wp[k];
  if (!(Z > 0.0) || !std::isfinite(Z)) return false;
  // A rule with negative weights can return moments no positive measure has: besides Z <= 0 and
  // an indefinite cov_hat (tested below), cavity class probabilities outside (0, 1).
  if (rule.has_negative_weights)
    for (int c = 0; c < C; ++c)
      if (!(p_cavity[c] > 0.0 && p_cavity[c] < 1.0)) return false;
  for (int c = 0; c < C; ++c) m1[c] = node_dot(N, wp, delta + c * N) / Z;
  for (int c = 0; c < C; ++c) {
    mean_hat[c] = h[c] + m1[c];
    // (wp delta_c into E's first row: the products for the C - c second moments of class c)
    double* wd = E;
    const double* dc = delta + c * N;
    for (index_t k = 0; k < N; ++k) wd[k] = wp[k] * dc[k];
    for (int e = 0; e <= c; ++e) {
      const double s = node_dot(N, wd, delta + e * N) / Z - m1[c] * m1[e];
      cov_hat[c * C + e] = s;
      cov_hat[e * C + c] = s;
    }
  }
  *log_Z = lmax + std::log(Z);
  for (int c = 0; c < C; ++c)
    if (!std::isfinite(mean_hat[c])) return false;
  return small::cholesky(C, cov_hat, Lh);
}

void softmax_expected_nll(const Cubature& rule, int y, const double* h, const double* L, const double* beta,
                          double* value, double* g_h, double* G_A, double* work) {
  const int C = rule.dim;
  const index_t N = rule.size;
  double* delta = work;           // [C, N]
  double* E = delta + C * N;      // [C, N], then w_k (softmax(v_k) - e_y)
  double* vmax = E + C * N;       // [N]
  double* inv_sum = vmax + N;     // [N]
  double* lse = inv_sum + N;      // [N]
  double* Lbar = lse + N;         // [C, C]
  double* tmp = Lbar + C * C;     // [C, C]
  evaluate_nodes(C, N, rule.nodes_t.data(), h, L, beta, delta, E, vmax, inv_sum, lse);
  const double* w = rule.weights.data();
  const double a_y = h[y] + beta[y];
  const double* dy = delta + y * N;
  for (index_t k = 0; k < N; ++k) vmax[k] = lse[k] - (a_y + dy[k]);
  *value = node_dot(N, w, vmax);
  // d/dv of lse(v) - v_y at each node, times w_k; then g_h = sum_k and Lbar = sum_k (.) z_k^T.
  for (int c = 0; c < C; ++c) {
    double* ec = E + c * N;
    const double one = c == y ? 1.0 : 0.0;
    for (index_t k = 0; k < N; ++k) ec[k] = w[k] * (ec[k] * inv_sum[k] - one);
    double s = 0.0;
    for (index_t k = 0; k < N; ++k) s += ec[k];
    g_h[c] = s;
    for (int e = 0; e < C; ++e) Lbar[c * C + e] = e <= c ? node_dot(N, ec, rule.nodes_t.data() + e * N) : 0.0;
  }
  small::cholesky_reverse(C, L, Lbar, G_A, tmp);
}

void softmax_expected_probabilities(const Cubature& rule, const double* h, const double* L, const double* beta,
                                    double* probabilities, double* work) {
  const int C = rule.dim;
  const index_t N = rule.size;
  double* delta = work;
  double* E = delta + C * N;
  double* vmax = E + C * N;
  double* inv_sum = vmax + N;
  double* lse = inv_sum + N;
  evaluate_nodes(C, N, rule.nodes_t.data(), h, L, beta, delta, E, vmax, inv_sum, lse);
  for (index_t k = 0; k < N; ++k) inv_sum[k] *= rule.weights[k];
  for (int c = 0; c < C; ++c) probabilities[c] = node_dot(N, E + c * N, inv_sum);
}

}  // namespace pygpfast::ivm
