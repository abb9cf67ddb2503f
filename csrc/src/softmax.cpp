#include "pygpfast/softmax.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "pygpfast/errors.hpp"
#include "pygpfast/quadrature.hpp"
#include "pygpfast/threads.hpp"
#include "pygpfast/vmath.hpp"

namespace pygpfast::softmax {
namespace {

constexpr double kSqrt2 = 1.41421356237309504880;
constexpr double kInvSqrtPi = 0.56418958354775628695;

// The outer (u = log t) grid: nodes u_j = j h.
constexpr double kStep = 0.5;
// The grid starts at t_lo = e^{j_lo h} <= kTailScale / R4, R4 >= E_gh[S^4]^{1/4} (see
// Point::Point): the terms of order t^4 that the closed-form lower tail leaves out are below
// t^4 (E[S^4] + A^4) / 24 per node and sum to below 1e-10.
constexpr double kTailScale = 1e-2;
// The grid stops at the first node where the value's and the derivatives' integrands sum to
// less than this (they decrease double-exponentially in u from there, apart from the terms of
// Gauss-Hermite nodes whose weights are below it).
constexpr double kStop = 1e-12;
// At most this many grid nodes per point (never reached below kWideVariance).
constexpr int kMaxNodes = 1024;
// Below this variance, d/dvar takes Price's form (as in likelihoods.cpp's gh_expectation).
constexpr double kPriceVariance = 1e-10;
// Per-class scales of the prediction sums stay below e^600 (see log_probabilities_point).
constexpr double kMaxScaledExponent = 600.0;

// A loop over points is split across threads only when each thread gets at least this many
// points: one point costs tens of grid nodes of C n_gh exps each.
constexpr index_t kMinPointsPerThread = 8;

// Wide points: a class with a latent variance above kWideVariance. Its L_c(t) =
// E[exp(-t e^{f_c})] is a step of width ~1 in f_c that Gauss-Hermite nodes ~sqrt(var) apart
// do not resolve (errors of 2.5e-3 at var = 30, 4e-2 at 1000 against Monte Carlo). Written
// as L_c(t) = P(W - f_c > log t) = E_W[Phi((W - log t - m_c) / s_c)], W standard Gumbel-min
// (density exp(w - e^w): exp(-t e^f) = P(E > t e^f) for E ~ Exp(1), W = log E), it is a
// smooth function of W on the scale s_c, which a Gauss rule for W's density integrates to
// 1e-13 from s_c = 3 on (20 points, from a discretised Stieltjes procedure; checked against
// adaptive quadrature of Phi((w - c) / s) for s = 1 to 30).
constexpr double kWideVariance = 10.0;
constexpr int kGumbelPoints = 20;
constexpr double kGumbelNode[kGumbelPoints] = {
    -64.59910018086936, -53.956883770112896, -45.79368277447365, -39.02237781065269,
    -33.213291920460094, -28.140349950611437, -23.66602362758641, -19.69891890011012,
    -16.17463048779548, -13.045914367878549, -10.27721296384341, -7.841525407542659,
    -5.718739447999828, -3.8944874853426956, -2.356955070777161, -1.0884952222787427,
    -0.0561009975897593, 0.7885672579549614, 1.5012038468238675, 2.1477114460848976};
constexpr double kGumbelWeight[kGumbelPoints] = {
    1.1240006771231866e-27, 3.3608572959053924e-23, 9.536299481367391e-20, 7.048356348214849e-17,
    2.0373648300285645e-14, 2.8575315865469352e-12, 2.218549327538228e-10, 1.0407536858402676e-08,
    3.137262495539599e-07, 6.354845316195798e-06, 8.940017680879264e-05, 0.0008944339296884941,
    0.006452934830197386, 0.03348169764349892, 0.12052403626669086, 0.2749435715878238,
    0.3414531234992858, 0.1874442294637708, 0.03365329807049004, 0.001056595327909205};
// The wide grid covers u = log t from where every 1 - L_c(t) and t are below ~1e-15 to where
// every P(t) and e^-t are (kWideReach standard deviations beyond each class's mean, and
// kWideMargin more for the double-exponential terms).
constexpr double kWideReach = 8.5;
constexpr double kWideMargin = 35.0;
// When every class is wide, e^-t (a step of width ~1 at u = 0, the one feature that needs the
// fine step) is replaced by Phi(-u / s_min), s_min the smallest class standard deviation:
// int (e^-t - 1{u < 0}) du = -gamma (Euler's constant) and int (1{u < 0} - Phi(-u / s)) du = 0,
// so E[lse] = shift - gamma + int (Phi(-u / s_min) - P) du, whose integrand varies on the scale
// s_min and more slowly: the trapezoidal rule's error there is of order
// exp(-2 pi^2 s_min^2 / h^2), 1e-34 with h = s_min / 2 (the step used, and at least kStep).
// Without it, latent variances of 1e8 needed ~3e5 nodes of step 1/2, beyond the former cap of
// 2^17, and predictions came out [1, 0, 0] where Monte Carlo gives [4e-5, 2e-3, 0.998].
constexpr double kWideStepPerStd = 0.5;
constexpr double kEulerGamma = 0.57721566490153286061;
// With a class of variance <= kWideVariance the grid keeps step kStep and e^-t, on nodes at the
// multiples of kStep: there the trapezoidal sum kStep sum_j (e^{-e^{j kStep}} - 1{j < 0} -
// 1{j = 0} / 2) exceeds its integral -gamma by this much (the first aliasing term of e^{-e^u},
// about 2 |Gamma(4 pi i)|; summed in long double), which every such point's E[lse] carried.
constexpr double kTrapezoidExcess = 3.4815648524409194e-09;
// At most this many nodes on the wide grid (a point's cost is about C x 20 erfc per node): a
// point with a class of variance <= kWideVariance (so the fine step) beside classes of
// variance ~1e7 needs more, and is refused (ValueError) rather than integrated wrongly.
constexpr int kMaxWideNodes = 1 << 18;
// |zeta| beyond which Phi(zeta) is 0 or 1 and phi(zeta) 0 to within 1e-17.
constexpr double kPhiSaturates = 8.5;

// Gauss-Hermite rule for N(0, 1): E[g(z)] ~ sum_k w_k g(z_k), ascending nodes z_k.
struct NormalRule {
  std::vector<double> z, w;
  explicit NormalRule(int n) {
    const auto& rule = quadrature::gauss_hermite(n);
    for (int k = 0; k < n; ++k) {
      z.push_back(kSqrt2 * rule.x[k]);
      w.push_back(kInvSqrtPi * rule.w[k]);
    }
  }
  int size() const { return static_cast<int>(z.size()); }
};

// The per-point set-up shared by the expectations and the predictions. With e_ck = exp(mu_c +
// s_c z_k - shift), s_c = sqrt(var_c), and the shift a multiple of h chosen so that
// A = sum_c a_c lies in [1, e^h) (shifting by a multiple of h moves the grid onto itself, so
// the sums do not depend on the shift):
//   a_c = sum_k w_k e_ck,  b_c = sum_k w_k e_ck^2,  c_c = sum_k w_k e_ck^3,
//   kappa2 = sum_c (b_c - a_c^2),  kappa3 = sum_c (c_c - 3 a_c b_c + 2 a_c^3)
// (the rule's cumulants of S), and the first grid node j_lo.
struct Point {
  int C, K;
  const double* mu;
  const double* var;
  double* e;  // [C, K] the nodes' exp(f - shift)
  double shift = 0.0;
  double A = 0.0, kappa2 = 0.0, kappa3 = 0.0;
  double* a;  // [C] per-class moments a_c, b_c, c_c
  double* b;
  double* c;
  int j_lo = 0;

  [[gnu::always_inline]] inline Point(const NormalRule& rule, int num_classes, const double* mu_,
                                      const double* var_, double* work)
      : C(num_classes), K(rule.size()), mu(mu_), var(var_), e(work), a(work + C * K),
        b(a + C), c(b + C) {
    const double* z = rule.z.data();
    const double* w = rule.w.data();
    // log sum_ck w_k exp(f_ck) from the largest node value (z ascending, s >= 0).
    double f_max = -std::numeric_limits<double>::infinity();
    for (int ci = 0; ci < C; ++ci) f_max = std::max(f_max, mu[ci] + std::sqrt(var[ci]) * z[K - 1]);
    double sum = 0.0;
    for (int ci = 0; ci < C; ++ci) {
      const double m = mu[ci] - f_max, s = std::sqrt(var[ci]);
      double* ec = e + ci * K;
      double ac = 0.0;
#pragma omp simd reduction(+ : ac)
      for (int k = 0; k < K; ++k) {
        ec[k] = vmath::exp(m + s * z[k]);
        ac += w[k] * ec[k];
      }
      sum += ac;
    }
    shift = kStep * std::floor((f_max + std::log(sum)) / kStep);
    const double rescale = std::exp(f_max - shift);
    double r4 = 0.0;
    for (int ci = 0; ci < C; ++ci) {
      double* ec = e + ci * K;
      double ac = 0.0, bc = 0.0, cc = 0.0, dc = 0.0;
      const double top = ec[K - 1] * rescale;  // the largest e_ck of the class
      const double inv_top = top > 0.0 ? 1.0 / top : 0.0;
#pragma omp simd reduction(+ : ac, bc, cc, dc)
      for (int k = 0; k < K; ++k) {
        const double x = ec[k] * rescale;
        ec[k] = x;
        const double wx = w[k] * x, r = x * inv_top;
        ac += wx;
        bc += wx * x;
        cc += wx * x * x;
        dc += w[k] * (r * r) * (r * r);
      }
      a[ci] = ac;
      b[ci] = bc;
      c[ci] = cc;
      A += ac;
      kappa2 += bc - ac * ac;
      kappa3 += cc - 3.0 * ac * bc + 2.0 * ac * ac * ac;
      r4 += top * std::sqrt(std::sqrt(dc));  // E_gh[e_c^4]^{1/4}; Minkowski: sum >= E[S^4]^{1/4}
    }
    j_lo = static_cast<int>(std::ceil((std::log(kTailScale) - std::log(r4)) / kStep));
  }

  // Sums over the grid nodes j < j_lo of h t_j^p (p = 2, 3), t_j = e^{j h}.
  double tail_sum(int p) const {
    return kStep * std::exp(p * j_lo * kStep) / std::expm1(p * kStep);
  }
};

// The per-class Gauss-Hermite sums at one grid node t for class rows e, wa, wb [K]:
//   l = sum_k w_k q_k,  m = sum_k wa_k q_k,  and  n = sum_k wb_k q_k  (Price = false)
//   or  n = t sum_k wa_k q_k (t e_k - 1)  (Price = true),  with q_k = exp(-t e_k).
struct ClassSums {
  double l, m, n;
};

template <bool Price>
[[gnu::always_inline]] inline ClassSums class_sums(double t, const double* e, const double* w,
                                                   const double* wa, const double* wb, int K) {
  double l = 0.0, m = 0.0, n = 0.0;
#pragma omp simd reduction(+ : l, m, n)
  for (int k = 0; k < K; ++k) {
    const double te = t * e[k];
    const double q = vmath::exp(-te);
    l += w[k] * q;
    m += wa[k] * q;
    if constexpr (Price)
      n += wa[k] * q * (te - 1.0);
    else
      n += wb[k] * q;
  }
  if constexpr (Price) n *= t;
  return {l, m, n};
}

// ---- Wide points ----

bool is_wide(int C, const double* var) {
  for (int ci = 0; ci < C; ++ci)
    if (var[ci] > kWideVariance) return true;
  return false;
}

// A wide class's L(t), dL/dm and dL/dvar at u = log t, f ~ N(m, var), by the Gumbel rule.
struct ClassTerms {
  double l, dm, dvar;
};

[[gnu::always_inline]] inline ClassTerms gumbel_terms(double u, double m, double var) {
  constexpr double kInvSqrt2Pi = 0.39894228040143267794;
  const double s = std::sqrt(var), inv_s = 1.0 / s;
  // Phi(zeta) and w phi(zeta) per node from vmath's normal tail (no erfc or exp calls: the loop
  // vectorises in the caller's SIMD clone), then summed in node order (the same digits from
  // every clone). Phi = 1 - Q above 0, Q below, Q = Q(|zeta|) = normal_tail_scaled E.
  double phi_w[kGumbelPoints], wphi[kGumbelPoints], wphi_z[kGumbelPoints];
#pragma omp simd
  for (int j = 0; j < kGumbelPoints; ++j) {
    const double zeta = (kGumbelNode[j] - u - m) * inv_s;
    const double E = vmath::exp_minus_half_square(zeta);
    const double Q = vmath::normal_tail_scaled(zeta) * E;
    // (Phi 1 or 0 and phi 0 to within 1e-17 beyond kPhiSaturates; selects, not branches)
    double Phi = zeta > 0.0 ? 1.0 - Q : Q;
    Phi = zeta > kPhiSaturates ? 1.0 : Phi;
    Phi = zeta < -kPhiSaturates ? 0.0 : Phi;
    const double inside = __builtin_fabs(zeta) > kPhiSaturates ? 0.0 : 1.0;
    const double wp = inside * (kGumbelWeight[j] * kInvSqrt2Pi * E);
    phi_w[j] = kGumbelWeight[j] * Phi;
    wphi[j] = wp;
    wphi_z[j] = wp * zeta;
  }
  double l = 0.0, dm = 0.0, dv = 0.0;
  for (int j = 0; j < kGumbelPoints; ++j) {
    l += phi_w[j];
    dm -= wphi[j];
    dv -= wphi_z[j];
  }
  return {l, dm * inv_s, dv * 0.5 / var};
}

// Grid nodes u = log t beyond this have t = inf.
constexpr double kExpOverflows = 709.0;

// A narrow class's L(t) = sum_k w_k q_k, dL/dm and dL/dvar at u = log t on the wide grid
// (q_k = exp(-t e_k), e_k = e^{m + s z_k}), in log space: t e_k = exp(u + m + s z_k). For the
// grid nodes where t overflows (u > kExpOverflows; the wide grid reaches u ~ 8.5 sqrt(var) of
// the wide classes), where a narrow class far below the top mean has e_k = 0 and t e_k was
// inf * 0 = NaN (means (-500, 400, -300), variances (25000, 75000, 7): every output NaN).
// dL/dm = -sum_k w_k (t e_k) q_k; dL/dvar = -sum_k w_k z_k (t e_k) q_k / (2 s), or below
// kPriceVariance sum_k w_k (t e_k) q_k (t e_k - 1) / 2; a product with q_k = 0 is 0.
ClassTerms narrow_terms(const NormalRule& rule, double u, double m, double var) {
  const bool price = var < kPriceVariance;
  const double s = std::sqrt(var);
  const double* z = rule.z.data();
  const double* w = rule.w.data();
  double l = 0.0, tm = 0.0, n = 0.0;
  for (int k = 0; k < rule.size(); ++k) {
    const double log_te = u + m + s * z[k];
    const double te = vmath::exp(log_te), q = vmath::exp(-te);
    const double g = log_te > kExpOverflows ? 0.0 : te * q;  // t e_k q_k
    l += w[k] * q;
    tm += w[k] * g;
    n += price ? w[k] * (g == 0.0 ? 0.0 : g * (te - 1.0)) : w[k] * z[k] * g;
  }
  return {l, -tm, price ? 0.5 * n : -0.5 * n / s};
}

// The wide grid of a point: nodes u_j = j h for j_lo <= j <= j_hi, in units of e^shift (shift
// a multiple of kStep near max_c mu_c, so that with h = kStep the grid moves onto itself with
// it); `smooth` when every class is wide (Phi(-u / s_min) replaces e^-t, see kWideStepPerStd).
struct WideGrid {
  double shift = 0.0, h = kStep, s_min = 0.0;
  bool smooth = false;
  long long j_lo = 0, j_hi = 0;

  WideGrid(int C, const double* mu, const double* var) {
    double top = -std::numeric_limits<double>::infinity();
    smooth = true;
    s_min = std::numeric_limits<double>::infinity();
    for (int ci = 0; ci < C; ++ci) {
      top = std::max(top, mu[ci]);
      smooth = smooth && var[ci] > kWideVariance;
      s_min = std::min(s_min, std::sqrt(var[ci]));
    }
    shift = kStep * std::floor(top / kStep);
    double lo = -kWideMargin, hi = std::numeric_limits<double>::infinity();
    for (int ci = 0; ci < C; ++ci) {
      const double m = mu[ci] - shift, reach = kWideReach * std::sqrt(var[ci]);
      lo = std::min(lo, -kWideMargin - m - reach);
      hi = std::min(hi, -m + reach + 5.0);
    }
    hi = std::max(hi, 4.0);
    if (smooth) {  // Phi(-u / s_min) is 1 or 0 to within 1e-17 beyond kWideReach s_min
      h = std::max(kStep, kWideStepPerStd * s_min);
      lo = std::min(lo, -kWideReach * s_min);
      hi = std::max(hi, kWideReach * s_min);
    }
    j_lo = static_cast<long long>(std::floor(lo / h));
    j_hi = static_cast<long long>(std::ceil(hi / h));
  }

  bool too_long() const { return j_hi - j_lo > kMaxWideNodes; }
};

// E[lse(f)] = shift + int (e^{-t} - prod_c L_c(t)) du (Frullani's integral with A = 1, in
// units of e^shift), by the trapezoidal rule on the wide grid (or its smooth form, see
// kWideStepPerStd). Wide classes take L_c by gumbel_terms, the others by the Gauss-Hermite
// sums of class_sums (narrow_terms where t overflows). Also the sums of -dP/dmu_c and (when
// dvar is not null) -dP/dvar_c: dV/dmu_c (= E[softmax_c]) and dV/dvar_c. The grid must not be
// too_long() (check_wide_points).
// (Compiled per instruction set, as its callers: its Gauss-Hermite and Gumbel loops vectorise.)
PYGPFAST_SIMD_CLONES double wide_point(const NormalRule& rule, int C, const double* mu, const double* var,
                                       double* dmu, double* dvar, double* work) {
  const int K = rule.size();
  const double* z = rule.z.data();
  const double* w = rule.w.data();
  const WideGrid grid(C, mu, var);
  const double shift = grid.shift, h = grid.h;
  double* m = work;              // [C] mu_c - shift
  double* L = m + C;             // [C]
  double* dL_m = L + C;          // [C]
  double* dL_v = dL_m + C;       // [C]
  double* prefix = dL_v + C;     // [C]
  double* e = prefix + C;        // [C, K] the Gauss-Hermite classes' e^{f - shift} at the nodes
  double* we = e + C * K;        // [C, K] w e
  double* wze = we + C * K;      // [C, K] w z e
  for (int ci = 0; ci < C; ++ci) {
    m[ci] = mu[ci] - shift;
    if (var[ci] > kWideVariance) continue;
    const double s = std::sqrt(var[ci]);
    for (int k = 0; k < K; ++k) {
      e[ci * K + k] = vmath::exp(m[ci] + s * z[k]);
      we[ci * K + k] = w[k] * e[ci * K + k];
      wze[ci * K + k] = z[k] * we[ci * K + k];
    }
  }
  std::fill(dmu, dmu + C, 0.0);
  if (dvar != nullptr) std::fill(dvar, dvar + C, 0.0);
  constexpr double kInvSqrt2 = 0.70710678118654752440;
  const double control_scale = kInvSqrt2 / grid.s_min;
  double vsum = 0.0;
  for (long long j = grid.j_lo; j <= grid.j_hi; ++j) {
    const double u = static_cast<double>(j) * h, t = std::exp(u);
    double P = 1.0;
    for (int ci = 0; ci < C; ++ci) {
      if (var[ci] > kWideVariance || u > kExpOverflows) {
        const bool wide = var[ci] > kWideVariance;
        const ClassTerms c = wide ? gumbel_terms(u, m[ci], var[ci]) : narrow_terms(rule, u, m[ci], var[ci]);
        L[ci] = c.l;
        dL_m[ci] = c.dm;
        dL_v[ci] = c.dvar;
      } else if (var[ci] < kPriceVariance) {  // dL/dvar = E[d2/df2 exp(-t e^f)] / 2
        const ClassSums c = class_sums<true>(t, e + ci * K, w, we + ci * K, wze + ci * K, K);
        L[ci] = c.l;
        dL_m[ci] = -t * c.m;
        dL_v[ci] = 0.5 * c.n;
      } else {
        const ClassSums c = class_sums<false>(t, e + ci * K, w, we + ci * K, wze + ci * K, K);
        L[ci] = c.l;
        dL_m[ci] = -t * c.m;
        dL_v[ci] = -0.5 * t * c.n / std::sqrt(var[ci]);
      }
      prefix[ci] = P;
      P *= L[ci];
    }
    vsum += (grid.smooth ? 0.5 * std::erfc(u * control_scale) : std::exp(-t)) - P;
    double suffix = 1.0;
    for (int ci = C - 1; ci >= 0; --ci) {
      const double others = prefix[ci] * suffix;
      suffix *= L[ci];
      dmu[ci] -= dL_m[ci] * others;
      if (dvar != nullptr) dvar[ci] -= dL_v[ci] * others;
    }
  }
  for (int ci = 0; ci < C; ++ci) {
    dmu[ci] *= h;
    if (dvar != nullptr) dvar[ci] *= h;
  }
  return shift + (grid.smooth ? -kEulerGamma : -kTrapezoidExcess) + h * vsum;
}

// Throws std::invalid_argument for a point whose wide grid would be too_long().
void check_wide_points(int C, const double* mu, const double* var, index_t n) {
  for (index_t i = 0; i < n; ++i) {
    const double* v = var + i * C;
    if (!is_wide(C, v) || !WideGrid(C, mu + i * C, v).too_long()) continue;
    double lo = v[0], hi = v[0];
    for (int ci = 1; ci < C; ++ci) {
      lo = std::min(lo, v[ci]);
      hi = std::max(hi, v[ci]);
    }
    // (Every class wide: the grid's step follows the narrowest class over the widest one's reach.)
    const std::string why = lo > kWideVariance
                                ? "with every class wider than " + format_value(kWideVariance) +
                                      ", the grid's step follows the narrowest class across the widest "
                                      "one's range, and variances this far apart need more than "
                                : "a class of variance <= " + format_value(kWideVariance) +
                                      " beside classes this wide needs more than ";
    throw std::invalid_argument(
        "softmax: point " + std::to_string(i) + " has latent variances from " + format_value(lo) + " to " +
        format_value(hi) + ": " + why + std::to_string(kMaxWideNodes) +
        " quadrature nodes. Such variances are far beyond the data's scale: check the kernel (e.g. a "
        "Linear kernel on unscaled features) and standardise the inputs");
  }
}

// Workspace of one point (doubles).
index_t work_size(int C, int K) { return 3 * static_cast<index_t>(C) * K + 10 * static_cast<index_t>(C); }

// One point of variational_expectations.
PYGPFAST_SIMD_CLONES void expectation_point(const NormalRule& rule, int C, int y, const double* mu,
                                            const double* var, double* value, double* dmu, double* dvar,
                                            double* work) {
  if (is_wide(C, var)) {
    *value = mu[y] - wide_point(rule, C, mu, var, dmu, dvar, work);
    for (int ci = 0; ci < C; ++ci) {
      dmu[ci] = (ci == y ? 1.0 : 0.0) - dmu[ci];
      dvar[ci] = -dvar[ci];
    }
    return;
  }
  const Point p(rule, C, mu, var, work);
  const int K = p.K;
  const double* z = rule.z.data();
  const double* w = rule.w.data();
  double* we = p.c + C;     // [C, K] w_k e_ck
  double* wze = we + C * K;  // [C, K] w_k z_k e_ck
  double* L = wze + C * K;   // [C] L_c(t) at the current node
  double* prefix = L + C;    // [C] prod_{d < c} L_d(t)
  double* m_c = prefix + C;  // [C] sum_k w e q at the current node
  double* n_c = m_c + C;     // [C] the variance sums at the current node
  double* inv_2s = n_c + C;  // [C] 1 / (2 s_c), 0 where Price's form is used
  for (int ci = 0; ci < C; ++ci) {
    inv_2s[ci] = var[ci] < kPriceVariance ? 0.0 : 0.5 / std::sqrt(var[ci]);
    for (int k = 0; k < K; ++k) {
      we[ci * K + k] = w[k] * p.e[ci * K + k];
      wze[ci * K + k] = z[k] * we[ci * K + k];
    }
  }

  // The grid sums of dV/dmu_c and dV/dvar_c accumulate in dmu and dvar (V: the estimate of E[lse]).
  std::fill(dmu, dmu + C, 0.0);
  std::fill(dvar, dvar + C, 0.0);
  double vsum = 0.0, d_a = 0.0;  // sum_j (e^{-t A} - P), sum_j t e^{-t A}
  for (int node = 0, j = p.j_lo; node < kMaxNodes; ++node, ++j) {
    const double t = std::exp(j * kStep);
    double P = 1.0;
    for (int ci = 0; ci < C; ++ci) {
      const ClassSums s = var[ci] < kPriceVariance
                              ? class_sums<true>(t, p.e + ci * K, w, we + ci * K, wze + ci * K, K)
                              : class_sums<false>(t, p.e + ci * K, w, we + ci * K, wze + ci * K, K);
      L[ci] = s.l;
      m_c[ci] = s.m;
      n_c[ci] = s.n;
      prefix[ci] = P;
      P *= s.l;
    }
    const double P0 = std::exp(-t * p.A);
    vsum += P0 - P;
    d_a += t * P0;
    // -dP/dmu_c = t m_c prod_{d != c} L_d; -dP/dvar_c = -(dL_c/dvar_c) prod_{d != c} L_d with
    // dL_c/dvar_c = -t sum_k w z e q / (2 s_c), or sum_k w (t^2 e^2 - t e) q / 2 (Price).
    double suffix = 1.0, grad_mass = 0.0;
    for (int ci = C - 1; ci >= 0; --ci) {
      const double others = prefix[ci] * suffix;
      suffix *= L[ci];
      const double g = t * m_c[ci] * others;
      dmu[ci] += g;
      grad_mass += g;
      dvar[ci] += (var[ci] < kPriceVariance ? -0.5 : t * inv_2s[ci]) * n_c[ci] * others;
    }
    if (P + P0 + grad_mass < kStop) break;
  }

  // V = shift + log A + h vsum + tail, tail = -kappa2 G2 / 2 + (kappa3 / 6 + A kappa2 / 2) G3:
  // the grid's nodes below j_lo, from the expansion e^{-tA} - P(t) = -t^2 kappa2 / 2 +
  // t^3 (kappa3 / 6 + A kappa2 / 2) + O(t^4).
  const double G2 = p.tail_sum(2), G3 = p.tail_sum(3);
  const double A = p.A, k2 = p.kappa2, k3 = p.kappa3;
  const double tail = -0.5 * k2 * G2 + (k3 / 6.0 + 0.5 * A * k2) * G3;
  *value = (mu[y] - p.shift) - std::log(A) - kStep * vsum - tail;
  // The chain rule through A, kappa2 and kappa3; per class d kappa2 = db - 2a da and
  // d kappa3 = dc - 3 (b da + a db) + 6 a^2 da, with d(a, b, c)/dmu_c = (a, 2b, 3c).
  const double c1 = 1.0 / A - kStep * d_a + 0.5 * k2 * G3;
  const double c2 = -0.5 * G2 + 0.5 * A * G3;
  const double c3 = G3 / 6.0;
  for (int ci = 0; ci < C; ++ci) {
    const double ac = p.a[ci], bc = p.b[ci], cc = p.c[ci];
    double da, db, dc;  // d(a_c, b_c, c_c) / d var_c
    if (var[ci] < kPriceVariance) {
      da = 0.5 * ac;
      db = 2.0 * bc;
      dc = 4.5 * cc;
    } else {
      const double* ec = p.e + ci * K;
      double s1 = 0.0, s2 = 0.0, s3 = 0.0;
      for (int k = 0; k < K; ++k) {
        const double v = wze[ci * K + k];
        s1 += v;
        s2 += v * ec[k];
        s3 += v * ec[k] * ec[k];
      }
      da = s1 * inv_2s[ci];
      db = 2.0 * s2 * inv_2s[ci];
      dc = 3.0 * s3 * inv_2s[ci];
    }
    const double dV_mu = c1 * ac + 2.0 * c2 * (bc - ac * ac) +
                         3.0 * c3 * (cc - 3.0 * ac * bc + 2.0 * ac * ac * ac) + kStep * dmu[ci];
    const double dV_var = c1 * da + c2 * (db - 2.0 * ac * da) +
                          c3 * (dc - 3.0 * (bc * da + ac * db) + 6.0 * ac * ac * da) +
                          kStep * dvar[ci];
    dmu[ci] = (ci == y ? 1.0 : 0.0) - dV_mu;
    dvar[ci] = -dV_var;
  }
}

// ---- Log probabilities of far-below classes at wide points ----

// log L(t) = log E[exp(-t e^f)] at u = log t for f ~ N(m, var) (shifted), in log space, so that
// it stays finite where L underflows: wide classes by the Gumbel rule with log Phi
// (vmath::log_normal_cdf), the others by the Gauss-Hermite sum of exp(-e^{u + m + s z_k}).
double log_class_term(const NormalRule& rule, double u, double m, double var) {
  const double s = std::sqrt(var);
  if (var > kWideVariance) {
    // Every node's Phi is 1 to within 1e-17 (log L = 0 to that), the usual case away from
    // the class's own reach.
    if ((kGumbelNode[0] - u - m) / s > kPhiSaturates) return 0.0;
    static const auto log_weight = [] {
      std::array<double, kGumbelPoints> out{};
      for (int j = 0; j < kGumbelPoints; ++j) out[j] = std::log(kGumbelWeight[j]);
      return out;
    }();
    double terms[kGumbelPoints];
    double top = -std::numeric_limits<double>::infinity();
    for (int j = 0; j < kGumbelPoints; ++j) {
      const double zeta = (kGumbelNode[j] - u - m) / s;
      double log_cdf = 0.0, lambda;
      if (zeta <= kPhiSaturates) vmath::log_normal_cdf(zeta, log_cdf, lambda);
      terms[j] = log_weight[j] + log_cdf;
      top = std::max(top, terms[j]);
    }
    double sum = 0.0;
    for (int j = 0; j < kGumbelPoints; ++j) sum += std::exp(terms[j] - top);
    return top + std::log(sum);
  }
  const int K = rule.size();
  // Every t e^f below 1e-17: log L = log(1 - E[t e^f] + ...) = -E[t e^f] to rounding.
  if (u + m + s * rule.z[K - 1] < -40.0) return -std::exp(u + m + 0.5 * var);
  double terms[quadrature::kMaxGaussHermitePoints];
  double top = -std::numeric_limits<double>::infinity();
  for (int k = 0; k < K; ++k) {
    terms[k] = std::log(rule.w[k]) - std::exp(u + m + s * rule.z[k]);
    top = std::max(top, terms[k]);
  }
  if (top == -std::numeric_limits<double>::infinity()) return top;
  double sum = 0.0;
  for (int k = 0; k < K; ++k) sum += std::exp(terms[k] - top);
  return top + std::log(sum);
}

// Below this, a wide point's class probability from wide_point has few digits left: the
// class's share of the integral comes from the Gumbel rule's W beyond its nodes (the smallest
// weight is 1e-27 at W = -64.6), and log_tilted_probability is exact. Compared on 300 random
// points (C = 4, variances 0.1 to 1e4): above 1e-8 the two agree to 1e-8 in log p; below,
// the wide grid's value was off by up to 0.015 at p ~ 1e-17, 1.7 at 1e-43 and 96 at 1e-83
// (-190.3 where the tilted value, -93.86, matches the tails' closed form).
constexpr double kTiltedBelow = 1e-8;

// log E[softmax_c] of a wide point, for a class far below the others. Tilting f_c by e^{f_c},
// E[e^{f_c} / S] = e^{m_c + v_c / 2} E[1 / (e^{g} + S_{-c})] with g ~ N(m_c + v_c, v_c), and
// 1 / x = int t e^{-tx} du (u = log t) gives
//   log E[softmax_c] = m_c + v_c / 2 + log int exp(u + log L~_c(u) + sum_{d != c} log L_d(u)) du,
// every term in log space (the probability itself may be e^-1e4). The integrand is log-concave
// in u (Prekopa: exp(-e^{u + f}) is log-concave in (u, f) and so is the normal density), so
// its mode is found by golden-section search and the trapezoidal rule runs outward from it
// until the integrand is e^-45 of its peak, with the point's wide-grid step h or, where the
// peak is narrower (several classes in their tails at once), half the width sigma that its
// curvature gives (the rule's error then ~exp(-2 pi^2 sigma^2 / h^2) < 1e-30).
double log_tilted_probability(const NormalRule& rule, int C, const double* m, const double* var, int c,
                              double h) {
  const double m_tilted = m[c] + var[c];
  auto log_integrand = [&](double u) {
    double value = u + log_class_term(rule, u, m_tilted, var[c]);
    for (int d = 0; d < C; ++d)
      if (d != c) value += log_class_term(rule, u, m[d], var[d]);
    return value;
  };
  // The mode lies where the tilted and the other classes' L fall: within their means' reach.
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (int d = 0; d < C; ++d) {
    const double md = d == c ? m_tilted : m[d], reach = kWideReach * std::sqrt(var[d]) + kWideMargin;
    lo = std::min(lo, -md - reach - var[d]);
    hi = std::max(hi, -md + reach + var[d]);
  }
  constexpr double kGolden = 0.61803398874989484820;
  double a = lo, b = hi;
  double x1 = b - kGolden * (b - a), x2 = a + kGolden * (b - a);
  double f1 = log_integrand(x1), f2 = log_integrand(x2);
  while (b - a > 0.5 * h) {
    if (f1 < f2) {
      a = x1;
      x1 = x2;
      f1 = f2;
      x2 = a + kGolden * (b - a);
      f2 = log_integrand(x2);
    } else {
      b = x2;
      x2 = x1;
      f2 = f1;
      x1 = b - kGolden * (b - a);
      f1 = log_integrand(x1);
    }
  }
  const double mode = 0.5 * (a + b), peak = log_integrand(mode);
  if (!std::isfinite(peak)) return -std::numeric_limits<double>::infinity();
  const double curvature = (log_integrand(mode + h) + log_integrand(mode - h) - 2.0 * peak) / (h * h);
  if (curvature < 0.0) h = std::min(h, 0.5 / std::sqrt(-curvature));
  constexpr double kDrop = 45.0;  // e^-45 of the peak: below the sum's rounding
  double sum = 1.0;
  for (int side : {-1, 1})
    for (int j = 1; j <= kMaxWideNodes; ++j) {
      const double r = log_integrand(mode + side * j * h) - peak;
      sum += std::exp(r);
      if (r < -kDrop) break;
    }
  return m[c] + 0.5 * var[c] + peak + std::log(h * sum);
}

// One point of log_class_probabilities. Class c's sums are scaled by e^{-o_c} with
// o_c = max(m_c, m_c + s_c z_max - 600), m_c = mu_c - shift: the scaled probability
// E[e^{f_c - shift - o_c} / S'] is then of order one however far class c lies below the
// others (no underflow), and the scaled nodes stay below e^600.
PYGPFAST_SIMD_CLONES void log_probabilities_point(const NormalRule& rule, int C, const double* mu,
                                                  const double* var, double* log_prob, double* work,
                                                  Tails tails, int label) {
  if (is_wide(C, var)) {  // E[softmax_c] = dE[lse]/dmu_c, normalised in log space
    wide_point(rule, C, mu, var, log_prob, nullptr, work);
    double total = 0.0;
    for (int ci = 0; ci < C; ++ci) total += log_prob[ci];
    const WideGrid grid(C, mu, var);
    double* m = work;  // (wide_point's scratch is done with)
    for (int ci = 0; ci < C; ++ci) m[ci] = mu[ci] - grid.shift;
    for (int ci = 0; ci < C; ++ci) {
      const double p = log_prob[ci] / total;
      const bool exact = tails == Tails::All || (tails == Tails::Label && ci == label);
      // (log(max(p, DBL_MIN)) was -708.4 for every class below e^-708)
      log_prob[ci] = p > kTiltedBelow || !exact ? std::log(std::max(p, std::numeric_limits<double>::min()))
                                                : log_tilted_probability(rule, C, m, var, ci, grid.h);
    }
    return;
  }
  const Point p(rule, C, mu, var, work);
  const int K = p.K;
  const double* z = rule.z.data();
  const double* w = rule.w.data();
  double* wg = p.c + C;      // [C, K] w_k g_ck, g_ck = e_ck e^{-o_c}
  double* L = wg + C * K;    // [C]
  double* prefix = L + C;    // [C]
  double* m_c = prefix + C;  // [C] sum_k w g q at the current node
  double* offset = m_c + C;  // [C] o_c
  double* g1 = offset + C;   // [C] sum_k w g  (the control variate t g1 e^{-tA} integrates to g1 / A)
  double* g2 = g1 + C;       // [C] sum_k w g e
  double* g3 = g2 + C;       // [C] sum_k w g e^2
  for (int ci = 0; ci < C; ++ci) {
    const double m = mu[ci] - p.shift, s = std::sqrt(var[ci]);
    const double* ec = p.e + ci * K;
    double* wgc = wg + ci * K;
    offset[ci] = std::max(m, m + s * z[K - 1] - kMaxScaledExponent);
    double s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (int k = 0; k < K; ++k) {
      wgc[k] = w[k] * vmath::exp(m - offset[ci] + s * z[k]);
      s1 += wgc[k];
      s2 += wgc[k] * ec[k];
      s3 += wgc[k] * ec[k] * ec[k];
    }
    g1[ci] = s1;
    g2[ci] = s2;
    g3[ci] = s3;
  }

  double* acc = log_prob;  // the grid sums of sum_j t (m_c prod_{d != c} L_d - g1_c e^{-tA})
  std::fill(acc, acc + C, 0.0);
  for (int node = 0, j = p.j_lo; node < kMaxNodes; ++node, ++j) {
    const double t = std::exp(j * kStep);
    double P = 1.0;
    for (int ci = 0; ci < C; ++ci) {
      const ClassSums s = class_sums<false>(t, p.e + ci * K, w, wg + ci * K, wg + ci * K, K);
      L[ci] = s.l;
      m_c[ci] = s.m;
      prefix[ci] = P;
      P *= s.l;
    }
    const double P0 = std::exp(-t * p.A);
    double suffix = 1.0, mass = 0.0;
    for (int ci = C - 1; ci >= 0; --ci) {
      // (t last: t g1 alone can overflow where P0 is 0)
      const double term = m_c[ci] * prefix[ci] * suffix * t, cv = g1[ci] * P0 * t;
      suffix *= L[ci];
      acc[ci] += term - cv;
      mass += term + cv;
    }
    if (P + P0 + mass < kStop) break;
  }

  // The nodes below j_lo: the scaled integrand minus its control variate is
  // t^2 (g1 a_c - g2) + t^3 (g3 / 2 + g2 K1 + g1 (K1^2 + K2 - A^2) / 2) + O(t^4), with
  // K1 = A - a_c and K2 = kappa2 - (b_c - a_c^2) (the other classes' cumulants).
  const double G2 = p.tail_sum(2), G3 = p.tail_sum(3);
  const double A = p.A;
  double max_log = -std::numeric_limits<double>::infinity();
  for (int ci = 0; ci < C; ++ci) {
    const double ac = p.a[ci];
    const double K1 = A - ac, K2 = p.kappa2 - (p.b[ci] - ac * ac);
    const double scaled = g1[ci] / A + kStep * acc[ci] + (g1[ci] * ac - g2[ci]) * G2 +
                          (0.5 * g3[ci] + g2[ci] * K1 + 0.5 * g1[ci] * (K2 - ac * (2.0 * A - ac))) * G3;
    log_prob[ci] = offset[ci] + std::log(std::max(scaled, std::numeric_limits<double>::min()));
    max_log = std::max(max_log, log_prob[ci]);
  }
  double total = 0.0;
  for (int ci = 0; ci < C; ++ci) total += std::exp(log_prob[ci] - max_log);
  const double log_total = max_log + std::log(total);
  for (int ci = 0; ci < C; ++ci) log_prob[ci] -= log_total;
}

// body(i, work) for every point, with a per-thread workspace of work_size doubles.
template <class Body>
void for_each_point(index_t n, index_t work_doubles, const Body& body) {
  parallel_for(n, kMinPointsPerThread, [&](index_t i) {
    thread_local std::vector<double> work;
    if (static_cast<index_t>(work.size()) < work_doubles) work.resize(work_doubles);
    body(i, work.data());
  });
}

}  // namespace

void variational_expectations(int num_classes, int n_gh, const double* y, const double* mu,
                              const double* var, index_t n, double* value, double* dmu, double* dvar) {
  const NormalRule rule(n_gh);
  const index_t C = num_classes;
  check_wide_points(num_classes, mu, var, n);
  for_each_point(n, work_size(num_classes, rule.size()), [&](index_t i, double* work) {
    expectation_point(rule, num_classes, static_cast<int>(y[i]), mu + i * C, var + i * C, value + i,
                      dmu + i * C, dvar + i * C, work);
  });
}

void log_class_probabilities(int num_classes, int n_gh, const double* mu, const double* var,
                             index_t n, double* log_prob, Tails tails, const double* labels) {
  const NormalRule rule(n_gh);
  const index_t C = num_classes;
  check_wide_points(num_classes, mu, var, n);
  for_each_point(n, work_size(num_classes, rule.size()), [&](index_t i, double* work) {
    log_probabilities_point(rule, num_classes, mu + i * C, var + i * C, log_prob + i * C, work, tails,
                            tails == Tails::Label ? static_cast<int>(labels[i]) : -1);
  });
}

}  // namespace pygpfast::softmax
