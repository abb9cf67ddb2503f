#include "pygpfast/likelihoods.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "pygpfast/errors.hpp"
#include "pygpfast/quadrature.hpp"
#include "pygpfast/softmax.hpp"
#include "pygpfast/threads.hpp"
#include "pygpfast/vmath.hpp"

namespace pygpfast::likelihoods {
namespace {

constexpr double kLogSqrt2Pi = 0.91893853320467274178;  // log(sqrt(2 pi))
constexpr double kLog2Pi = 1.83787706640934548356;      // log(2 pi)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
constexpr double kInvSqrt2 = 0.70710678118654752440;    // 1 / sqrt(2)
constexpr double kInvSqrtPi = 0.56418958354775628695;   // 1 / sqrt(pi)

// A loop over points is split across threads only when each thread gets at least this many
// likelihood evaluations (a quadrature point costs n_gh of them).
constexpr index_t kMinEvaluationsPerThread = 4096;

template <class Body>
void for_each_point(index_t n, index_t evaluations_per_point, const Body& body) {
  parallel_for(n, std::max<index_t>(1, kMinEvaluationsPerThread / evaluations_per_point), body);
}

// log Phi(g), accurate for every finite g (vmath::log_normal_cdf: no log(0) in the lower tail).
[[gnu::always_inline]] inline double log_normal_cdf(double g) {
  double value, lambda;
  vmath::log_normal_cdf(g, value, lambda);
  return value;
}

// d2 log Phi(g) / dg2 = -lambda (lambda + g) given lambda = phi(g) / Phi(g). Below g = -4 both
// factors come from the continued fraction (vmath::mills_fraction_tails): the difference
// lambda + g, computed directly, would lose about log10(g^2) digits (all of them by g = -1e8).
double log_normal_cdf_curvature(double g, double lambda) {
  if (g >= -vmath::kMillsFractionFrom) return -lambda * (lambda + g);
  double T1, T2;
  vmath::mills_fraction_tails(-g, T1, T2);
  return -(T1 - g) * T1;
}

// Bernoulli-probit: log Phi(s f) with s = 2y - 1.
[[gnu::always_inline]] inline double probit_log_density(double y, double f) {
  return log_normal_cdf(y > 0.5 ? f : -f);
}

// sigmoid(z), sigmoid(-z) and log sigmoid(z), without overflow.
struct SigmoidPair {
  double of_z;
  double of_minus_z;
  double log_of_z;
};

[[gnu::always_inline]] inline SigmoidPair sigmoid_pair(double z) {
  const double e = vmath::exp(-std::fabs(z));
  const double big = 1.0 / (1.0 + e);  // sigmoid(|z|)
  const double small = e * big;        // sigmoid(-|z|)
  const double log1p_e = vmath::log1p(e);
  const bool positive = z >= 0.0;
  return {positive ? big : small, positive ? small : big, (positive ? 0.0 : z) - log1p_e};
}

// Bernoulli-logit: log sigmoid(s f) with s = 2y - 1.
[[gnu::always_inline]] inline double logit_log_density(double y, double f) {
  return sigmoid_pair(y > 0.5 ? f : -f).log_of_z;
}

// lgamma(y + 1) for y >= 0: log y! for counts, and the Poisson log-likelihood's constant for
// non-integer y by the same formula. glibc's lgamma writes the global signgam, a data race in
// an OpenMP loop; lgamma_r does not.
double log_gamma_plus_one(double y) {
#if defined(__GLIBC__)
  int sign;
  return ::lgamma_r(y + 1.0, &sign);
#else
  return std::lgamma(y + 1.0);
#endif
}

// A Gauss-Hermite rule for expectations under N(f | mu, var): f_k = mu + sqrt(2 var) x_k with
// weights w_k / sqrt(pi) (summing to 1) and their logarithms.
struct NormalQuadrature {
  const std::vector<double>& x;
  std::vector<double> w;
  std::vector<double> log_w;

  explicit NormalQuadrature(int n_gh) : NormalQuadrature(quadrature::gauss_hermite(n_gh)) {}
  int size() const { return static_cast<int>(x.size()); }

 private:
  explicit NormalQuadrature(const quadrature::GaussHermiteRule& rule) : x(rule.x) {
    for (double wk : rule.w) {
      w.push_back(wk * kInvSqrtPi);
      log_w.push_back(std::log(w.back()));
    }
  }
};

// Label noise on a Bernoulli link p0 (Kim & Ghahramani 2008): with probability 2 epsilon the
// label is drawn at random, p(y | f) = epsilon + (1 - 2 epsilon) p0(y | f), epsilon in [0, 1/2).
// In log space, log p = logaddexp(log(1 - 2 epsilon) + log p0, log epsilon), finite however small
// p0 is. With the responsibility r = (1 - 2 epsilon) p0 / p in [0, 1] and z = s f:
//   d log p / dz = r d log p0 / dz,
//   d2 log p / dz2 = r d2 log p0 / dz2 + r (1 - r) (d log p0 / dz)^2,
//   d log p / d epsilon = (1 - 2 p0) / p = 1 / p - 2 r / (1 - 2 epsilon)  (at most 1 / epsilon).
// epsilon = 0 is the plain link (active() false: the callers skip every step of it).
struct LabelNoise {
  double epsilon, log_epsilon, log_keep;

  explicit LabelNoise(double eps)
      : epsilon(eps), log_epsilon(std::log(eps)), log_keep(vmath::log1p(-2.0 * eps)) {}
  bool active() const { return epsilon > 0.0; }

  // (log p0, d log p0 / dz) in place to (log p, d log p / dz), and r.
  void mix(double& log_p, double& d1, double& r) const {
    const double a = log_keep + log_p;
    log_p = log_density(log_p);
    r = std::exp(a - log_p);
    d1 *= r;
  }
  double d_epsilon(double log_p, double r) const { return std::exp(-log_p) - 2.0 * r / (1.0 - 2.0 * epsilon); }
  // log p given log p0 (predictions).
  double log_density(double log_p0) const {
    if (!active()) return log_p0;
    const double a = log_keep + log_p0;
    const double hi = std::max(a, log_epsilon), lo = std::min(a, log_epsilon);
    return hi + vmath::log1p(std::exp(lo - hi));
  }
  // p given p0 (predictions).
  double density(double p0) const { return epsilon + (1.0 - 2.0 * epsilon) * p0; }
};

// Where the var-derivative takes Price's form (see bernoulli_block): variances below
// kPriceVariance, and node spacings sqrt(2 var) below kPriceRelativeSpacing |mu|.
constexpr double kPriceVariance = 1e-10;
constexpr double kPriceRelativeSpacing = 1e-4;

// For each point, the quadrature approximation V(mu, var) = sum_k w_k log p(y | mu + sqrt(2 var) x_k)
// of E[log p(y|f)] under N(f | mu, var), and its exact derivatives: dV/dmu = sum_k w_k d1(f_k)
// and dV/dvar = sum_k w_k x_k d1(f_k) / sqrt(2 var). These are the gradients of the value that is
// returned, so optimisers see a consistent objective (Price's E[d2]/2 differs from them by the
// quadrature error). Where that sum loses its digits, dV/dvar takes Price's form
// sum_k w_k d2(f_k) / 2 instead, equal to it to O(var): for var < kPriceVariance, where the
// division amplifies rounding, and where the nodes lie close together against |mu|: probit's
// d1(f) ~ -f in the lower tail, so the x-weighted sum cancels about |mu| / sqrt(2 var) times the
// rounding of f (at mu = -1e16, var = 1 it returned -0.75 for -0.5). Only those points evaluate d2.
//
// With s = 2y - 1 the Bernoulli log densities are log Phi(s f) (probit) and log sigmoid(s f)
// (logit). A block of points has all its nodes' log densities evaluated as one array, so that
// the long per-value chains of operations overlap (vmath::log_normal_cdf's array form). The
// array is node-major (node k of point p at k * count + p), so that the sums over the nodes run
// as vector adds across the block's points. (Summed per point, they ended in three horizontal
// sums each: the block without its log densities took 1.1 ns per node, now 0.6; the probit
// block 4.2 ns, now 3.7; 20 nodes, AVX-512, Zen 4.)
constexpr index_t kPointsPerBlock = 16;

PYGPFAST_SIMD_CLONES void bernoulli_block(bool probit, const LabelNoise& noise, const double* x, const double* w,
                                          int n_gh, const double* y, const double* mu, const double* var,
                                          index_t count, double* value, double* dmu, double* dvar,
                                          double* dparam) {
  double z[kPointsPerBlock * quadrature::kMaxGaussHermitePoints];
  double v0[kPointsPerBlock * quadrature::kMaxGaussHermitePoints];  // log p
  double v1[kPointsPerBlock * quadrature::kMaxGaussHermitePoints];  // d log p / d(s f)
  // With label noise: the link's own d log p0 / d(s f) and the responsibility r (see LabelNoise).
  double link_v1[kPointsPerBlock * quadrature::kMaxGaussHermitePoints];
  double resp[kPointsPerBlock * quadrature::kMaxGaussHermitePoints];
  double sign[kPointsPerBlock], scale[kPointsPerBlock];
  const index_t n = count * n_gh;
  for (index_t p = 0; p < count; ++p) {
    sign[p] = y[p] > 0.5 ? 1.0 : -1.0;
    scale[p] = std::sqrt(2.0 * var[p]);
  }
  for (int k = 0; k < n_gh; ++k) {
#pragma omp simd
    for (index_t p = 0; p < count; ++p) z[k * count + p] = sign[p] * (mu[p] + scale[p] * x[k]);
  }
  if (probit) {
    vmath::log_normal_cdf(z, v0, v1, n);
  } else {
#pragma omp simd
    for (index_t i = 0; i < n; ++i) {
      const SigmoidPair sp = sigmoid_pair(z[i]);
      v0[i] = sp.log_of_z;
      v1[i] = sp.of_minus_z;
    }
  }
  if (noise.active()) {
    for (index_t i = 0; i < n; ++i) {
      link_v1[i] = v1[i];
      noise.mix(v0[i], v1[i], resp[i]);
    }
  }
  double e[kPointsPerBlock] = {}, g[kPointsPerBlock] = {}, gx[kPointsPerBlock] = {};
  for (int k = 0; k < n_gh; ++k) {
    const double* a0 = v0 + k * count;
    const double* a1 = v1 + k * count;
    const double wk = w[k], wxk = w[k] * x[k];
#pragma omp simd
    for (index_t p = 0; p < count; ++p) {
      e[p] += wk * a0[p];
      g[p] += wk * a1[p];
      gx[p] += wxk * a1[p];
    }
  }
  for (index_t p = 0; p < count; ++p) {
    value[p] = e[p];
    dmu[p] = sign[p] * g[p];
    if (var[p] >= kPriceVariance && scale[p] >= kPriceRelativeSpacing * std::fabs(mu[p])) {
      dvar[p] = sign[p] * gx[p] / scale[p];
    } else {
      double h = 0.0;  // sum_k w_k d2(f_k)
      for (int k = 0; k < n_gh; ++k) {
        const index_t i = k * count + p;
        const double zk = z[i], a1 = noise.active() ? link_v1[i] : v1[i];
        const double d2 = probit ? log_normal_cdf_curvature(zk, a1) : -sigmoid_pair(zk).of_z * a1;
        h += w[k] * (noise.active() ? resp[i] * d2 + resp[i] * (1.0 - resp[i]) * a1 * a1 : d2);
      }
      dvar[p] = 0.5 * h;
    }
  }
  if (dparam == nullptr) return;
  for (index_t p = 0; p < count; ++p) {
    double d = 0.0;  // sum_k w_k d log p(f_k) / d epsilon
    if (noise.active())
      for (int k = 0; k < n_gh; ++k) d += w[k] * noise.d_epsilon(v0[k * count + p], resp[k * count + p]);
    dparam[p] = d;
  }
}

void bernoulli_expectations(const Likelihood& lik, const double* y, const double* mu, const double* var,
                            index_t n, double* value, double* dmu, double* dvar, double* dparam) {
  const NormalQuadrature q(lik.n_gh);
  const bool probit = lik.type == LikelihoodType::BernoulliProbit;
  const LabelNoise noise(lik.label_noise);
  const index_t blocks = (n + kPointsPerBlock - 1) / kPointsPerBlock;
  for_each_point(blocks, kPointsPerBlock * q.size(), [&](index_t b) {
    const index_t first = b * kPointsPerBlock, count = std::min(kPointsPerBlock, n - first);
    bernoulli_block(probit, noise, q.x.data(), q.w.data(), q.size(), y + first, mu + first, var + first,
                    count, value + first, dmu + first, dvar + first,
                    dparam != nullptr ? dparam + first : nullptr);
  });
}

// log E[p(y | f)] under N(f | mu, var): a log-sum-exp over the nodes, so that tiny densities
// do not underflow. The running maximum makes it one pass.
template <class LogDensityOfF>
double log_expected_density(const NormalQuadrature& q, double mu, double var,
                            const LogDensityOfF& log_density) {
  const double scale = std::sqrt(2.0 * var);
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0.0;
  for (int k = 0; k < q.size(); ++k) {
    const double a = q.log_w[k] + log_density(mu + scale * q.x[k]);
    if (a == -std::numeric_limits<double>::infinity()) continue;  // (a density of 0 adds 0)
    if (a <= max) {
      sum += std::exp(a - max);
    } else {
      sum = sum * std::exp(max - a) + 1.0;
      max = a;
    }
  }
  // Every node's density 0 (a rate exp(f) that overflows): log 0, not log(0 / 0).
  if (max == -std::numeric_limits<double>::infinity()) return max;
  return max + std::log(sum);
}

// Robust-max (Hernandez-Lobato, Hernandez-Lobato & Dupont 2011): the label is the argmax of the
// latent values with probability 1 - epsilon and any other class with epsilon / (C - 1), so
//   E[log p(y | f)] = log(epsilon / (C - 1)) + A_y (log(1 - epsilon) - log(epsilon / (C - 1)))
// with A_y = P(f_y > f_c for all c != y) under the independent marginals. A_y is one-dimensional:
//   A_y = E_{f_y}[prod_{c != y} Phi((f_y - mu_c) / sd_c)],
// taken by the n_gh-point Gauss-Hermite rule over f_y (GPflow's RobustMax uses the same rule).
struct RobustMax {
  int C;
  double epsilon, log_right, log_wrong, right, wrong;

  explicit RobustMax(const Likelihood& lik)
      : C(lik.num_classes),
        epsilon(lik.label_noise),
        log_right(vmath::log1p(-lik.label_noise)),
        log_wrong(std::log(lik.label_noise / (lik.num_classes - 1))),
        right(1.0 - lik.label_noise),
        wrong(lik.label_noise / (lik.num_classes - 1)) {}
};

// A_y by the rule: A = sum_k w_k Pi_k, Pi_k = prod_{c != y} Phi(z_kc), z_kc = (f_k - mu_c) / sd_c at
// the nodes f_k = mu_y + sqrt(2 var_y) x_k. A class with var_c = 0 is a step at mu_c (1/2 on it).
// scratch: [3 C]. With dmu, dvar [C] not null, also the exact derivatives of that sum: for c != y
//   dA/dmu_c = -sum_k w_k Pi_k lambda_kc / sd_c,   dA/dvar_c = -sum_k w_k Pi_k lambda_kc z_kc / (2 var_c)
// (lambda = phi / Phi, finite in both tails; Pi_k lambda_kc is 0, not 0 * inf, where the factors
// underflow; a step, var_c = 0, contributes 0: its derivative is a point mass), dA/dmu_y =
// -sum_{c != y} dA/dmu_c (A depends on the differences of the means only), and
//   dA/dvar_y = sum_k w_k x_k Pi_k G_k / sqrt(2 var_y),   G_k = d log Pi / df = sum_c lambda_kc / sd_c,
// or, where the nodes lie too close together for that x-weighted sum (var_y < kPriceVariance, or
// node spacing below kPriceRelativeSpacing times the narrowest other class), Price's form
// sum_k w_k Pi_k (G_k^2 + sum_c kappa_kc / var_c) / 2, kappa the curvature of log Phi.
double argmax_probability(const NormalQuadrature& q, int C, int y, const double* mu, const double* var,
                          double* scratch, double* dmu, double* dvar) {
  double* sd = scratch;
  double* z = scratch + C;
  double* lambda = scratch + 2 * C;
  const double scale = std::sqrt(2.0 * var[y]);
  double narrowest = std::numeric_limits<double>::infinity();
  for (int c = 0; c < C; ++c) {
    sd[c] = std::sqrt(var[c]);
    if (c != y && sd[c] > 0.0) narrowest = std::min(narrowest, sd[c]);
  }
  const bool grads = dmu != nullptr;
  const bool price = var[y] < kPriceVariance || scale < kPriceRelativeSpacing * narrowest;
  if (grads) {
    std::fill(dmu, dmu + C, 0.0);
    std::fill(dvar, dvar + C, 0.0);
  }
  double A = 0.0, g_y = 0.0;
  for (int k = 0; k < q.size(); ++k) {
    const double f = mu[y] + scale * q.x[k];
    double log_pi = 0.0;
    for (int c = 0; c < C; ++c) {
      if (c == y) continue;
      double log_cdf;
      if (sd[c] > 0.0) {
        z[c] = (f - mu[c]) / sd[c];
        vmath::log_normal_cdf(z[c], log_cdf, lambda[c]);
      } else {
        const double a = f - mu[c];
        log_cdf = a > 0.0 ? 0.0 : a == 0.0 ? -std::log(2.0) : -std::numeric_limits<double>::infinity();
        lambda[c] = 0.0;
      }
      log_pi += log_cdf;
    }
    const double pi = std::exp(log_pi);
    A += q.w[k] * pi;
    if (!grads || pi == 0.0) continue;
    double G = 0.0, curvature = 0.0;
    for (int c = 0; c < C; ++c) {
      if (c == y || lambda[c] == 0.0) continue;
      const double t = q.w[k] * pi * lambda[c];
      dmu[c] -= t / sd[c];
      dvar[c] -= 0.5 * (t * z[c] / sd[c]) / sd[c];
      G += lambda[c] / sd[c];
      if (price) curvature += log_normal_cdf_curvature(z[c], lambda[c]) / var[c];
    }
    g_y += q.w[k] * pi * (price ? G * G + curvature : q.x[k] * G);
  }
  if (grads) {
    double sum = 0.0;
    for (int c = 0; c < C; ++c) sum += c == y ? 0.0 : dmu[c];
    dmu[y] = -sum;
    dvar[y] = price ? 0.5 * g_y : g_y / scale;
  }
  return A;
}

void robustmax_expectations(const Likelihood& lik, const double* y, const double* mu, const double* var,
                            index_t n, double* value, double* dmu, double* dvar, double* dparam) {
  const NormalQuadrature q(lik.n_gh);
  const RobustMax rm(lik);
  const index_t C = rm.C;
  for_each_point(n, q.size() * C, [&](index_t i) {
    std::vector<double> scratch(static_cast<std::size_t>(3 * C));
    const double A = argmax_probability(q, rm.C, static_cast<int>(y[i]), mu + i * C, var + i * C,
                                        scratch.data(), dmu + i * C, dvar + i * C);
    const double delta = rm.log_right - rm.log_wrong;
    value[i] = rm.log_wrong + delta * A;
    for (index_t c = 0; c < C; ++c) {
      dmu[i * C + c] *= delta;
      dvar[i * C + c] *= delta;
    }
    if (dparam != nullptr) dparam[i] = (1.0 - A) / rm.epsilon - A / rm.right;
  });
}

// Class probabilities P(y = c) = wrong + (right - wrong) A_c [n, C], with the quadrature's A_c
// rescaled to sum to 1 over the classes (they do exactly, the rule to its error).
void robustmax_probabilities(const Likelihood& lik, const double* mu, const double* var, index_t n,
                             double* out) {
  const NormalQuadrature q(lik.n_gh);
  const RobustMax rm(lik);
  const index_t C = rm.C;
  for_each_point(n, q.size() * C * C, [&](index_t i) {
    std::vector<double> scratch(static_cast<std::size_t>(3 * C));
    double* p = out + i * C;
    double sum = 0.0;
    for (int c = 0; c < rm.C; ++c) {
      p[c] = argmax_probability(q, rm.C, c, mu + i * C, var + i * C, scratch.data(), nullptr, nullptr);
      sum += p[c];
    }
    for (index_t c = 0; c < C; ++c) p[c] = rm.wrong + (rm.right - rm.wrong) * (p[c] / sum);
  });
}

const char* name_of(LikelihoodType type) {
  switch (type) {
    case LikelihoodType::Gaussian:
      return "Gaussian";
    case LikelihoodType::BernoulliProbit:
      return "Bernoulli-probit";
    case LikelihoodType::BernoulliLogit:
      return "Bernoulli-logit";
    case LikelihoodType::Poisson:
      return "Poisson";
    case LikelihoodType::Softmax:
      return "softmax";
    case LikelihoodType::RobustMax:
      return "robust-max";
  }
  return "unknown";
}

bool is_bernoulli(LikelihoodType type) {
  return type == LikelihoodType::BernoulliProbit || type == LikelihoodType::BernoulliLogit;
}

bool is_multiclass(LikelihoodType type) {
  return type == LikelihoodType::Softmax || type == LikelihoodType::RobustMax;
}

// The name of entry k of an [n, D] array: "x[i]" when D = 1, "x[i, c]" otherwise.
std::string entry_name(const char* x, index_t k, index_t D) {
  return std::string(x) + "[" + std::to_string(k / D) +
         (D > 1 ? ", " + std::to_string(k % D) : std::string()) + "]";
}

// Means must be finite and variances finite and >= 0 (count entries of [n, D] arrays).
void check_marginals(const double* mu, const double* var, index_t count, index_t D) {
  for (index_t k = 0; k < count; ++k) {
    if (!std::isfinite(mu[k]))
      throw std::invalid_argument(entry_name("mu", k, D) + " = " + format_value(mu[k]) +
                                  ": marginal means must be finite");
    if (!(var[k] >= 0.0 && std::isfinite(var[k])))
      throw std::invalid_argument(entry_name("var", k, D) + " = " + format_value(var[k]) +
                                  ": marginal variances must be finite and >= 0");
  }
}

}  // namespace

void validate(const Likelihood& lik) {
  const int code = static_cast<int>(lik.type);
  require(code >= static_cast<int>(LikelihoodType::Gaussian) &&
              code <= static_cast<int>(LikelihoodType::RobustMax),
          "unknown likelihood type ", code,
          " (0 Gaussian, 1 Bernoulli-probit, 2 Bernoulli-logit, 3 Poisson, 4 softmax, 5 robust-max)");
  require(lik.type != LikelihoodType::Gaussian || (lik.variance > 0.0 && std::isfinite(lik.variance)),
          "the Gaussian likelihood variance must be positive and finite, got ", lik.variance);
  if (is_multiclass(lik.type))
    require(lik.num_classes >= 2, "the ", name_of(lik.type), " likelihood needs num_classes >= 2, got ",
            lik.num_classes);
  else
    require(lik.num_classes == 0,
            "the ", name_of(lik.type), " likelihood has one latent function: num_classes must be 0, got ",
            lik.num_classes);
  if (lik.type == LikelihoodType::RobustMax)
    require(lik.label_noise > 0.0 && lik.label_noise < 1.0 - 1.0 / lik.num_classes,
            "the robust-max label-noise probability must be in (0, 1 - 1/C) = (0, ",
            1.0 - 1.0 / lik.num_classes, "), got ", lik.label_noise);
  else
    require(lik.label_noise >= 0.0 && lik.label_noise < 0.5 && (lik.label_noise == 0.0 || is_bernoulli(lik.type)),
            "the label-noise probability must be in [0, 0.5), and 0 for the ", name_of(lik.type),
            " likelihood; got ", lik.label_noise);
  require(lik.n_gh >= 1 && lik.n_gh <= quadrature::kMaxGaussHermitePoints,
          "n_gh (Gauss-Hermite points) must be between 1 and ", quadrature::kMaxGaussHermitePoints, ", got ",
          lik.n_gh);
}

void check_labels(const Likelihood& lik, const double* y, index_t n) {
  for (index_t i = 0; i < n; ++i) {
    bool ok = false;
    const char* support = "";
    switch (lik.type) {
      case LikelihoodType::Gaussian:
        ok = std::isfinite(y[i]);
        support = "finite";
        break;
      case LikelihoodType::BernoulliProbit:
      case LikelihoodType::BernoulliLogit:
        ok = y[i] == 0.0 || y[i] == 1.0;
        support = "0 or 1";
        break;
      case LikelihoodType::Poisson:
        ok = y[i] >= 0.0 && std::isfinite(y[i]);
        support = "finite and >= 0";
        break;
      case LikelihoodType::Softmax:
      case LikelihoodType::RobustMax:
        ok = y[i] >= 0.0 && y[i] < lik.num_classes && y[i] == std::floor(y[i]);
        support = "class indices 0, 1, ..., num_classes - 1";
        break;
    }
    if (!ok)  // (the message is built only on failure: this loop runs over every point)
      throw std::invalid_argument(std::string("y[") + std::to_string(i) + "] = " +
                                  format_value(y[i]) + " is outside the support of the " +
                                  name_of(lik.type) + " likelihood" +
                                  (lik.num_classes > 0 ? " with " + std::to_string(lik.num_classes) +
                                                             " classes"
                                                       : std::string()) +
                                  ": labels must be " + support);
  }
}

index_t latent_dim(const Likelihood& lik) {
  return lik.num_classes > 0 ? static_cast<index_t>(lik.num_classes) : 1;
}

void variational_expectations(const Likelihood& lik, const double* y, const double* mu,
                              const double* var, index_t n, double* f, double* dmu, double* dvar,
                              double* dparam) {
  validate(lik);
  check_labels(lik, y, n);
  check_marginals(mu, var, n * latent_dim(lik), latent_dim(lik));
  if (dparam != nullptr && lik.type != LikelihoodType::Gaussian) std::fill(dparam, dparam + n, 0.0);

  switch (lik.type) {
    case LikelihoodType::Gaussian: {
      const double s2 = lik.variance;
      const double log_norm = -0.5 * (kLog2Pi + std::log(s2));
      for_each_point(n, 1, [&](index_t i) {
        const double r = y[i] - mu[i];
        const double expected_sq = r * r + var[i];  // E[(y - f)^2]
        f[i] = log_norm - 0.5 * expected_sq / s2;
        dmu[i] = r / s2;
        dvar[i] = -0.5 / s2;
        if (dparam != nullptr) dparam[i] = 0.5 * (expected_sq / s2 - 1.0) / s2;
      });
      return;
    }
    case LikelihoodType::Poisson:
      for_each_point(n, 1, [&](index_t i) {
        const double expected_rate = std::exp(mu[i] + 0.5 * var[i]);  // E[exp(f)]
        f[i] = y[i] * mu[i] - expected_rate - log_gamma_plus_one(y[i]);
        dmu[i] = y[i] - expected_rate;
        dvar[i] = -0.5 * expected_rate;
      });
      return;
    case LikelihoodType::BernoulliProbit:
    case LikelihoodType::BernoulliLogit:
      bernoulli_expectations(lik, y, mu, var, n, f, dmu, dvar, dparam);
      return;
    case LikelihoodType::Softmax:
      softmax::variational_expectations(lik.num_classes, lik.n_gh, y, mu, var, n, f, dmu, dvar);
      return;
    case LikelihoodType::RobustMax:
      robustmax_expectations(lik, y, mu, var, n, f, dmu, dvar, dparam);
      return;
  }
}

void predict_mean_and_var(const Likelihood& lik, const double* mu, const double* var, index_t n,
                          double* mean, double* variance) {
  validate(lik);
  check_marginals(mu, var, n * latent_dim(lik), latent_dim(lik));
  switch (lik.type) {
    case LikelihoodType::Gaussian:
      for_each_point(n, 1, [&](index_t i) {
        mean[i] = mu[i];
        variance[i] = var[i] + lik.variance;
      });
      return;
    case LikelihoodType::BernoulliProbit: {
      // p = Phi(mu / sqrt(1 + var)); p (1 - p) as Phi(g) Phi(-g) keeps digits near 0 and 1.
      const LabelNoise noise(lik.label_noise);
      for_each_point(n, 1, [&](index_t i) {
        const double g = mu[i] / std::sqrt(1.0 + var[i]);
        const double p = 0.5 * std::erfc(-g * kInvSqrt2), q = 0.5 * std::erfc(g * kInvSqrt2);
        mean[i] = noise.active() ? noise.density(p) : p;
        variance[i] = noise.active() ? mean[i] * noise.density(q) : p * q;
      });
      return;
    }
    case LikelihoodType::BernoulliLogit: {
      const NormalQuadrature q(lik.n_gh);
      const LabelNoise noise(lik.label_noise);
      for_each_point(n, q.size(), [&](index_t i) {
        const double scale = std::sqrt(2.0 * var[i]);
        double p = 0.0, one_minus_p = 0.0;
        for (int k = 0; k < q.size(); ++k) {
          const SigmoidPair s = sigmoid_pair(mu[i] + scale * q.x[k]);
          p += q.w[k] * s.of_z;
          one_minus_p += q.w[k] * s.of_minus_z;
        }
        if (noise.active()) {
          p = noise.density(p);
          one_minus_p = noise.density(one_minus_p);
        }
        mean[i] = p;
        variance[i] = p * one_minus_p;
      });
      return;
    }
    case LikelihoodType::Poisson:
      // E[y] = E[exp(f)]; Var[y] = E[exp(f)] + Var[exp(f)] (log-normal rate), the second term
      // exp(2 mu + var) (e^var - 1) taken in log space: as the product expm1(var) m^2 it was
      // 0 * inf = NaN where m underflows and expm1(var) overflows (mu = -1e5, var = 1e3).
      for_each_point(n, 1, [&](index_t i) {
        const double v = var[i];
        const double m = std::exp(mu[i] + 0.5 * v);
        mean[i] = m;
        if (v > 0.0) {
          const double log_expm1 = v > 1.0 ? v + std::log1p(-std::exp(-v)) : std::log(std::expm1(v));
          variance[i] = m + std::exp(2.0 * mu[i] + v + log_expm1);
        } else {
          variance[i] = m;
        }
      });
      return;
    case LikelihoodType::Softmax: {
      const index_t count = n * lik.num_classes;
      softmax::log_class_probabilities(lik.num_classes, lik.n_gh, mu, var, n, mean);
      for (index_t k = 0; k < count; ++k) {
        mean[k] = std::exp(mean[k]);
        variance[k] = mean[k] * (1.0 - mean[k]);
      }
      return;
    }
    case LikelihoodType::RobustMax: {
      robustmax_probabilities(lik, mu, var, n, mean);
      for (index_t k = 0; k < n * lik.num_classes; ++k) variance[k] = mean[k] * (1.0 - mean[k]);
      return;
    }
  }
}

void predict_log_class_probabilities(const Likelihood& lik, const double* mu, const double* var, index_t n,
                                     double* out) {
  validate(lik);
  require(is_multiclass(lik.type),
          "log class probabilities are defined for the multi-class likelihoods (softmax, robust-max)");
  check_marginals(mu, var, n * lik.num_classes, lik.num_classes);
  if (lik.type == LikelihoodType::RobustMax) {
    robustmax_probabilities(lik, mu, var, n, out);
    for (index_t k = 0; k < n * lik.num_classes; ++k) out[k] = std::log(out[k]);
    return;
  }
  softmax::log_class_probabilities(lik.num_classes, lik.n_gh, mu, var, n, out, softmax::Tails::All);
}

void predict_log_density(const Likelihood& lik, const double* y, const double* mu,
                         const double* var, index_t n, double* out) {
  validate(lik);
  check_labels(lik, y, n);
  check_marginals(mu, var, n * latent_dim(lik), latent_dim(lik));
  switch (lik.type) {
    case LikelihoodType::Gaussian:
      for_each_point(n, 1, [&](index_t i) {
        const double s = var[i] + lik.variance;
        const double r = y[i] - mu[i];
        out[i] = -0.5 * (kLog2Pi + std::log(s) + r * r / s);
      });
      return;
    case LikelihoodType::BernoulliProbit: {
      const LabelNoise noise(lik.label_noise);  // (log E[p] = log(epsilon + (1 - 2 epsilon) E[p0]))
      for_each_point(n, 1, [&](index_t i) {
        out[i] = noise.log_density(probit_log_density(y[i], mu[i] / std::sqrt(1.0 + var[i])));
      });
      return;
    }
    case LikelihoodType::BernoulliLogit: {
      const NormalQuadrature q(lik.n_gh);
      const LabelNoise noise(lik.label_noise);
      for_each_point(n, q.size(), [&](index_t i) {
        out[i] = noise.log_density(log_expected_density(
            q, mu[i], var[i], [&](double fk) { return logit_log_density(y[i], fk); }));
      });
      return;
    }
    case LikelihoodType::Poisson: {
      const NormalQuadrature q(lik.n_gh);
      for_each_point(n, q.size(), [&](index_t i) {
        out[i] = log_expected_density(q, mu[i], var[i],
                                      [&](double fk) { return y[i] * fk - std::exp(fk); }) -
                 log_gamma_plus_one(y[i]);
      });
      return;
    }
    case LikelihoodType::Softmax: {
      const index_t C = lik.num_classes;
      std::vector<double> log_prob(static_cast<std::size_t>(n * C));
      softmax::log_class_probabilities(lik.num_classes, lik.n_gh, mu, var, n, log_prob.data(),
                                       softmax::Tails::Label, y);
      for (index_t i = 0; i < n; ++i) out[i] = log_prob[i * C + static_cast<index_t>(y[i])];
      return;
    }
    case LikelihoodType::RobustMax: {
      const index_t C = lik.num_classes;
      std::vector<double> prob(static_cast<std::size_t>(n * C));
      robustmax_probabilities(lik, mu, var, n, prob.data());
      for (index_t i = 0; i < n; ++i) out[i] = std::log(prob[i * C + static_cast<index_t>(y[i])]);
      return;
    }
  }
}

}  // namespace pygpfast::likelihoods
