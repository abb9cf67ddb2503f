#include "pygpfast/ivm/cubature.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "pygpfast/errors.hpp"
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
  return q;
}

bool small_cholesky(int C, const double* A, double* L) { return small::cholesky(C, A, L); }

index_t cubature_work_size(const Cubature& rule) {
  const index_t C = rule.dim;
  return rule.size + 4 * C * C + 4 * C;
}

namespace {

// v = h + beta + L z (the shifted node), returns logsumexp(v); p = softmax(v).
inline double node_softmax(int C, const double* h, const double* L, const double* beta, const double* z,
                           double* v, double* p) {
  double vmax = -std::numeric_limits<double>::infinity();
  for (int c = 0; c < C; ++c) {
    double s = h[c] + beta[c];
    for (int e = 0; e <= c; ++e) s += L[c * C + e] * z[e];
    v[c] = s;
    vmax = std::max(vmax, s);
  }
  double sum = 0.0;
  for (int c = 0; c < C; ++c) {
    p[c] = std::exp(v[c] - vmax);
    sum += p[c];
  }
  for (int c = 0; c < C; ++c) p[c] /= sum;
  return vmax + std::log(sum);
}

}  // namespace

bool softmax_tilted_moments(const Cubature& rule, int y, const double* h, const double* L, const double* beta,
                            double* mean_hat, double* cov_hat, double* p_cavity, double* log_Z, double* work) {
  const int C = rule.dim;
  const index_t N = rule.size;
  double* logP = work;
  double* v = work + N;
  double* p = v + C;
  double* m1 = p + C;
  double* Lh = m1 + C;  // C * C
  for (int c = 0; c < C; ++c) p_cavity[c] = 0.0;
  double lmax = -std::numeric_limits<double>::infinity();
  for (index_t k = 0; k < N; ++k) {
    const double lse = node_softmax(C, h, L, beta, rule.nodes.data() + k * C, v, p);
    logP[k] = v[y] - lse;
    lmax = std::max(lmax, logP[k]);
    const double w = rule.weights[k];
    for (int c = 0; c < C; ++c) p_cavity[c] += w * p[c];
  }
  // Moments of the offsets delta_k = L z_k around the cavity mean, weighted by w_k P_k / P_max.
  double Z = 0.0;
  for (int c = 0; c < C; ++c) m1[c] = 0.0;
  for (int i = 0; i < C * C; ++i) cov_hat[i] = 0.0;
  for (index_t k = 0; k < N; ++k) {
    const double wp = rule.weights[k] * std::exp(logP[k] - lmax);
    const double* z = rule.nodes.data() + k * C;
    for (int c = 0; c < C; ++c) {
      double s = 0.0;
      for (int e = 0; e <= c; ++e) s += L[c * C + e] * z[e];
      v[c] = s;
    }
    Z += wp;
    for (int c = 0; c < C; ++c) {
      m1[c] += wp * v[c];
      for (int e = 0; e <= c; ++e) cov_hat[c * C + e] += wp * v[c] * v[e];
    }
  }
  if (!(Z > 0.0) || !std::isfinite(Z)) return false;
  // A rule with negative weights can return moments no positive measure has: besides Z <= 0 and
  // an indefinite cov_hat (tested below), cavity class probabilities outside (0, 1).
  if (rule.has_negative_weights)
    for (int c = 0; c < C; ++c)
      if (!(p_cavity[c] > 0.0 && p_cavity[c] < 1.0)) return false;
  for (int c = 0; c < C; ++c) m1[c] /= Z;
  for (int c = 0; c < C; ++c) {
    mean_hat[c] = h[c] + m1[c];
    for (int e = 0; e <= c; ++e) {
      const double s = cov_hat[c * C + e] / Z - m1[c] * m1[e];
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
  double* v = work;
  double* p = v + C;
  double* Lbar = p + C;     // C * C
  double* tmp = Lbar + C * C;  // C * C
  double val = 0.0;
  for (int c = 0; c < C; ++c) g_h[c] = 0.0;
  for (int i = 0; i < C * C; ++i) Lbar[i] = 0.0;
  for (index_t k = 0; k < N; ++k) {
    const double* z = rule.nodes.data() + k * C;
    const double lse = node_softmax(C, h, L, beta, z, v, p);
    const double w = rule.weights[k];
    val += w * (lse - v[y]);
    p[y] -= 1.0;  // d/dv of lse(v) - v_y
    for (int c = 0; c < C; ++c) {
      const double wg = w * p[c];
      g_h[c] += wg;
      for (int e = 0; e <= c; ++e) Lbar[c * C + e] += wg * z[e];
    }
  }
  *value = val;
  small::cholesky_reverse(C, L, Lbar, G_A, tmp);
}

void softmax_expected_probabilities(const Cubature& rule, const double* h, const double* L, const double* beta,
                                    double* probabilities, double* work) {
  const int C = rule.dim;
  double* v = work;
  double* p = v + C;
  for (int c = 0; c < C; ++c) probabilities[c] = 0.0;
  for (index_t k = 0; k < rule.size; ++k) {
    node_softmax(C, h, L, beta, rule.nodes.data() + k * C, v, p);
    for (int c = 0; c < C; ++c) probabilities[c] += rule.weights[k] * p[c];
  }
}

}  // namespace pygpfast::ivm
