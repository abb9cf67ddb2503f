#include "pygpfast/piecewise.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "pygpfast/errors.hpp"
#include "pygpfast/threads.hpp"
#include "pygpfast/vmath.hpp"

namespace pygpfast::piecewise {
namespace {

constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)

// Beyond this many standard deviations phi(z) and the tail Q(z) are below 1e-347: they are set to
// exactly 0 (as are z phi(z) and z^2 phi(z)), so that huge z never forms inf * 0.
constexpr double kTailCut = 40.0;

// A loop over points is split across threads only when each thread gets at least this many
// breakpoint evaluations (an erfc series and an exp each).
constexpr index_t kMinEvaluationsPerThread = 4096;

// The standardised breakpoint z = (t - m) / s with phi(z) and the small tail Q(|z|) = P(Z > |z|).
struct Knot {
  double z;
  double phi;
  double tail;
};

// The interior breakpoints' Knots for x ~ N(m, s^2): z[k], phi[k], tail[k] for knots[k + 1],
// k < R - 1, as one loop the compiler vectorises (vmath's exp and scaled normal tail: phi =
// e^{-z^2/2} / sqrt(2 pi) and Q(|z|) = normal_tail_scaled(z) e^{-z^2/2} share one exp).
// Beyond kTailCut both are 0.
PYGPFAST_SIMD_CLONES void interior_knots(const double* knots, index_t R, double m, double s,
                                         double* z, double* phi, double* tail) {
#pragma omp simd
  for (index_t k = 0; k < R - 1; ++k) {
    const double zk = (knots[k + 1] - m) / s;
    const double inside = std::fabs(zk) < kTailCut ? 1.0 : 0.0;
    const double zc = inside != 0.0 ? zk : 0.0;
    const double g = vmath::exp(-0.5 * zc * zc);
    z[k] = zk;
    phi[k] = inside * kInvSqrt2Pi * g;
    tail[k] = inside * vmath::normal_tail_scaled(zc) * g;
  }
}

// P(lo <= Z < hi) for Z ~ N(0, 1) from the small tails, so that no digit is lost when both limits
// lie in the same tail (mass down to 1e-300 keeps its relative accuracy).
double mass_between(const Knot& lo, const Knot& hi) {
  if (lo.z >= 0.0) return lo.tail - hi.tail;
  if (hi.z <= 0.0) return hi.tail - lo.tail;
  return (1.0 - lo.tail) - hi.tail;
}

// z phi(z), exactly 0 at the cut (and at z = +-inf).
double z_phi(const Knot& k) { return k.phi == 0.0 ? 0.0 : k.z * k.phi; }

// A piece narrower than this in z (s > 1e3 times its width in x) takes its moments by
// narrow_moments: the closed forms are differences of values near Phi(z) and phi(z) whose
// rounding, 1e-16 absolute, the piece's a v and s weights scale up (E[B] 3.6% high at v = 1e30
// and half the right value from v ~ 1e60, where every interior piece lies within 1e-15 of
// z = -m / s; d/dv 1000 times off).
constexpr double kNarrowPiece = 1e-3;

// M_k = int_lo^hi z^k phi(z) dz, k = 0, 1, 2, by the 8-point Gauss-Legendre rule (exact to
// rounding on an interval this narrow: the error term is below (width / 2)^16 / 16!).
void narrow_moments(double lo, double hi, double& M0, double& M1, double& M2) {
  static constexpr double kNode[4] = {0.18343464249564978, 0.52553240991632899, 0.79666647741362673,
                                      0.96028985649753618};
  static constexpr double kWeight[4] = {0.36268378337836166, 0.31370664587788688, 0.22238103445337443,
                                        0.10122853629037706};
  const double half = 0.5 * (hi - lo), mid = 0.5 * (hi + lo);
  M0 = M1 = M2 = 0.0;
  for (int k = 0; k < 4; ++k)
    for (double z : {mid - half * kNode[k], mid + half * kNode[k]}) {
      const double f = kWeight[k] * half * kInvSqrt2Pi * std::exp(-0.5 * z * z);
      M0 += f;
      M1 += f * z;
      M2 += f * z * z;
    }
}

// v == 0: the bound itself at m (right piece at a breakpoint, as B is defined on [l, h)), its
// slope there and d/dv -> B''(m) / 2 = a (the limits as v -> 0+ away from the breakpoints).
Expectation at_point(const Bound& bound, double m) {
  const index_t R = bound.pieces();
  const auto first = bound.knots.begin() + 1;
  const auto last = bound.knots.begin() + R;
  const index_t r = static_cast<index_t>(std::upper_bound(first, last, m) - first);
  const double a = bound.a[r], b = bound.b[r], c = bound.c[r];
  return {(a * m + b) * m + c, 2.0 * a * m + b, a};
}

// x ~ N(m, v), v > 0, s = sqrt(v). With z = (x - m) / s, piece r contributes
//   E[q(x) 1] = (q(m) + a v) M0 + s q'(m) (phi_lo - phi_hi) + a v (z_lo phi_lo - z_hi phi_hi)
// (from E[z 1] = phi_lo - phi_hi and E[z^2 1] = M0 + z_lo phi_lo - z_hi phi_hi), and
// integration by parts (d/dm N = -d/dx N, d/dv N = d^2/dx^2 N / 2) gives the derivatives as
// piece terms plus, at each breakpoint t_k with density N(t_k) = phi(z_k) / s and jumps
// dq = q_{k+1}(t_k) - q_k(t_k), dq' = q'_{k+1}(t_k) - q'_k(t_k):
//   d/dm = sum_r [q'(m) M0 + 2 a s (phi_lo - phi_hi)] + sum_k dq N(t_k)
//   d/dv = sum_r a M0 + sum_k N(t_k) (dq z_k / s + dq') / 2.
// (The jump terms are why d/dm is not E[B'] when B is discontinuous.)
Expectation expected_at(const Bound& bound, double m, double v) {
  const index_t R = bound.pieces();
  const double s = std::sqrt(v);
  double value = 0.0, dm = 0.0, dv = 0.0;
  double jump_m = 0.0, jump_v = 0.0;  // sum_k phi_k dq_k and sum_k phi_k (dq_k z_k / s + dq'_k)
  constexpr index_t kStack = 64;
  double stack[3 * kStack];
  std::vector<double> heap;
  double* zs = stack;
  if (R - 1 > kStack) {
    heap.resize(static_cast<std::size_t>(3 * (R - 1)));
    zs = heap.data();
  }
  const index_t stride = R - 1 > kStack ? R - 1 : kStack;
  double *phis = zs + stride, *tails = zs + 2 * stride;
  interior_knots(bound.knots.data(), R, m, s, zs, phis, tails);
  Knot lo{-std::numeric_limits<double>::infinity(), 0.0, 0.0};
  for (index_t r = 0; r < R; ++r) {
    const Knot hi = r + 1 < R ? Knot{zs[r], phis[r], tails[r]}
                              : Knot{std::numeric_limits<double>::infinity(), 0.0, 0.0};
    const double a = bound.a[r], b = bound.b[r], c = bound.c[r];
    const double m0 = mass_between(lo, hi);
    if (m0 == 0.0 && lo.phi == 0.0 && hi.phi == 0.0) {  // no mass: its terms are 0 (a m^2 may be inf)
      lo = hi;
      continue;
    }
    // The piece's moments int z^k phi: M0 = m0, M1 = phi_lo - phi_hi, M2 = M0 + [z phi]_hi^lo.
    double M0 = m0, M1 = lo.phi - hi.phi, M2 = 0.0;
    if (hi.z - lo.z < kNarrowPiece)  // (both knots finite)
      narrow_moments(lo.z, hi.z, M0, M1, M2);
    else
      M2 = m0 + (z_phi(lo) - z_phi(hi));
    const double slope_m = 2.0 * a * m + b;
    value += ((a * m + b) * m + c) * M0 + s * slope_m * M1 + a * v * M2;
    dm += slope_m * M0 + 2.0 * a * s * M1;
    dv += a * M0;
    if (r + 1 < R && hi.phi != 0.0) {
      const double t = bound.knots[r + 1];
      const double an = bound.a[r + 1], bn = bound.b[r + 1], cn = bound.c[r + 1];
      const double dq = ((an - a) * t + (bn - b)) * t + (cn - c);
      const double dslope = 2.0 * (an - a) * t + (bn - b);
      jump_m += hi.phi * dq;
      jump_v += hi.phi * (dq * hi.z / s + dslope);
    }
    lo = hi;
  }
  return {value, dm + jump_m / s, dv + 0.5 * jump_v / s};
}

void check_points(const double* m, const double* v, index_t n) {
  for (index_t i = 0; i < n; ++i) {
    if (!std::isfinite(m[i]))
      throw std::invalid_argument("m[" + std::to_string(i) + "] = " + format_value(m[i]) +
                                  ": means must be finite");
    if (!(v[i] >= 0.0 && std::isfinite(v[i])))
      throw std::invalid_argument("v[" + std::to_string(i) + "] = " + format_value(v[i]) +
                                  ": variances must be finite and >= 0");
  }
}

}  // namespace

Expectation expected_bound_at(const Bound& bound, double m, double v) {
  return v > 0.0 ? expected_at(bound, m, v) : at_point(bound, m);
}

// (Messages are built only on failure: expected_bound validates on every call, also for n = 1.)
void validate(const Bound& bound) {
  const index_t R = bound.pieces();
  if (R < 1) throw std::invalid_argument("a piecewise bound needs at least one piece");
  if (static_cast<index_t>(bound.b.size()) != R || static_cast<index_t>(bound.c.size()) != R)
    throw std::invalid_argument(
        "a, b and c must have the same length (one entry per piece), got " +
        std::to_string(bound.a.size()) + ", " + std::to_string(bound.b.size()) + " and " +
        std::to_string(bound.c.size()));
  if (static_cast<index_t>(bound.knots.size()) != R + 1)
    throw std::invalid_argument("knots must have one more entry than there are pieces (" +
                                std::to_string(R + 1) + "), got " +
                                std::to_string(bound.knots.size()));
  if (bound.knots.front() != -std::numeric_limits<double>::infinity() ||
      bound.knots.back() != std::numeric_limits<double>::infinity())
    throw std::invalid_argument("knots must start at -inf and end at +inf");
  for (index_t k = 1; k < R; ++k) {
    if (!std::isfinite(bound.knots[k]))
      throw std::invalid_argument("knots[" + std::to_string(k) + "] = " +
                                  format_value(bound.knots[k]) +
                                  ": interior breakpoints must be finite");
    if (!(bound.knots[k] > bound.knots[k - 1]))
      throw std::invalid_argument("knots must be strictly increasing, but knots[" +
                                  std::to_string(k) + "] = " + format_value(bound.knots[k]) +
                                  " follows " + format_value(bound.knots[k - 1]));
  }
  for (index_t r = 0; r < R; ++r) {
    if (!(std::isfinite(bound.a[r]) && std::isfinite(bound.b[r]) && std::isfinite(bound.c[r])))
      throw std::invalid_argument("the coefficients of piece " + std::to_string(r) +
                                  " must be finite");
    if (!(bound.a[r] >= 0.0))
      throw std::invalid_argument("a[" + std::to_string(r) + "] = " + format_value(bound.a[r]) +
                                  ": quadratic coefficients must be >= 0");
  }
}

void expected_bound(const Bound& bound, const double* m, const double* v, index_t n, double* value,
                    double* dm, double* dv) {
  validate(bound);
  check_points(m, v, n);
  const index_t R = bound.pieces();
  parallel_for(n, std::max<index_t>(1, kMinEvaluationsPerThread / R), [&](index_t i) {
    const Expectation res = expected_bound_at(bound, m[i], v[i]);
    value[i] = res.value;
    if (dm != nullptr) dm[i] = res.dm;
    if (dv != nullptr) dv[i] = res.dv;
  });
}

}  // namespace pygpfast::piecewise
