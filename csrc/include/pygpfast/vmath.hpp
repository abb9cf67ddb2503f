// Elementwise maths that vectorises. glibc's exp is a scalar call per element (about half of
// the time of an RBF kernel matrix); the versions here have no branches and no table
// lookups, so the compiler turns loops over them into SIMD code. Hot loops are compiled
// twice (PYGPFAST_SIMD_CLONES): for x86-64-v3 (AVX2 + FMA) and for the baseline, picked at
// load time, so wheels stay portable. The core is compiled with -fno-trapping-math and
// -fopenmp-simd so that selects and `#pragma omp simd` reductions vectorise.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define PYGPFAST_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
#endif
#ifndef PYGPFAST_SIMD_CLONES
#define PYGPFAST_SIMD_CLONES
#endif

namespace pygpfast::vmath {

// exp(x): x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite split of ln2), e^r by its Taylor
// series to degree 13 (truncation below 4e-18 relative), times 2^n built in the exponent
// bits. Within 1 ulp of the correctly rounded value on [-708, 709]; 0 below -708 (no
// subnormal results, all below 3.3e-308) and +inf above 709.
[[gnu::always_inline]] inline double exp(double x) {
  constexpr double kLog2e = 1.4426950408889634;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kShift = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  constexpr std::int64_t kShiftBits = 0x4338000000000000LL;
  const double xc = x < -708.0 ? -708.0 : (x > 709.0 ? 709.0 : x);
  const double t = xc * kLog2e + kShift;
  const double n = t - kShift;
  const double r = (xc - n * kLn2Hi) - n * kLn2Lo;
  double p = 1.0 / 6227020800.0;
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  std::int64_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  // t and kShift share their exponent, so their bit patterns differ by exactly n.
  const std::int64_t e = (bits - kShiftBits + 1023) << 52;
  double scale;
  std::memcpy(&scale, &e, sizeof scale);
  const double v = p * scale;
  return x < -708.0 ? 0.0 : (x > 709.0 ? __builtin_inf() : v);
}

// log(x): x = 2^e m with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s) with s = (m - 1)/(m + 1),
// |s| <= 0.172, by its odd series to s^23 (truncation below 1e-18). Within 2 ulp for x > 0
// (subnormals included); -inf at 0, NaN below 0 or for NaN, +inf at +inf.
[[gnu::always_inline]] inline double log(double x) {
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kTwo54 = 18014398509481984.0;
  const bool sub = x < 2.2250738585072014e-308;
  const double xs = sub ? x * kTwo54 : x;
  std::uint64_t bits;
  std::memcpy(&bits, &xs, sizeof bits);
  // The biased exponent as a double without an int64 -> double conversion (AVX2 has none):
  // the bits 0x433 << 52 | E are the double 2^52 + E.
  const std::uint64_t ebits = (bits >> 52 & 0x7FF) | 0x4330000000000000ULL;
  double biased;
  std::memcpy(&biased, &ebits, sizeof biased);
  double dn = biased - (4503599627370496.0 + 1023.0) - (sub ? 54.0 : 0.0);
  const std::uint64_t mbits = (bits & 0x000FFFFFFFFFFFFFULL) | 0x3FF0000000000000ULL;
  double m;
  std::memcpy(&m, &mbits, sizeof m);
  const bool big = m > 1.4142135623730951;
  m = big ? 0.5 * m : m;
  dn = big ? dn + 1.0 : dn;
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;
  double q = 1.0 / 23.0;
  q = q * z + 1.0 / 21.0;
  q = q * z + 1.0 / 19.0;
  q = q * z + 1.0 / 17.0;
  q = q * z + 1.0 / 15.0;
  q = q * z + 1.0 / 13.0;
  q = q * z + 1.0 / 11.0;
  q = q * z + 1.0 / 9.0;
  q = q * z + 1.0 / 7.0;
  q = q * z + 1.0 / 5.0;
  q = q * z + 1.0 / 3.0;
  // log m = 2s + 2 s z q = f - s (f - 2 z q), since 2s = f - s f; f = m - 1 is exact.
  const double lm = f - s * (f - 2.0 * z * q);
  const double v = dn * kLn2Hi + (lm + dn * kLn2Lo);
  const double nan = __builtin_nan("");
  return x > 0.0 ? (x < __builtin_inf() ? v : x) : (x == 0.0 ? -__builtin_inf() : nan);
}

// log(1 + x) for x >= -1: with u = 1 + x rounded, log1p(x) = log(u) x / (u - 1), which
// cancels u's rounding error (exact to first order); x itself where u == 1.
[[gnu::always_inline]] inline double log1p(double x) {
  const double u = 1.0 + x;
  const double d = u - 1.0;
  const double r = vmath::log(u) * (x / (d == 0.0 ? 1.0 : d));
  return d == 0.0 ? x : (u < __builtin_inf() ? r : x);
}

// log Phi(g) and the inverse Mills ratio lambda = phi(g) / Phi(g) of the standard normal, for
// every g (no underflow in the lower tail, no cancellation). With x = -g / sqrt(2),
// erfc(|x|) = t exp(P(t) - x^2) for t = 2 / (2 + |x|), where P is a degree-24 Chebyshev
// series in c = 2t - 1 fitted for pygpfast to log(erfcx(x) / t) on t in (0, 1] (max error 5e-15).
// Then for g <= 0:  log Phi = log(t / 2) + P - x^2,  lambda = sqrt(2/pi) / (t e^P);
// for g > 0:        log Phi = log1p(-Q),  lambda = phi / (1 - Q),  Q = t exp(P - x^2) / 2.
// The tails need no special case: P stays bounded as t -> 0.
//
// A single evaluation is one long chain of dependent operations (the series, then two exps and
// a log), so a loop that evaluates one g per SIMD lane waits on latency. The array form below
// runs it in two passes over a block (the series; then the exps and the log), which lets the
// processor overlap consecutive iterations: about 1.8x the throughput of the fused form.

// t = 2 / (2 + |x|) and P(t) for x = -g / sqrt(2), so that erfc(|x|) = t e^P e^{-x^2} (also
// used for the normal tails of piecewise.cpp). The series is summed as its even and odd halves,
// two independent recurrences in v = T_2(c) = 2c^2 - 1 (T_2j(c) = T_j(v) and T_2j+1(c) =
// c V_j(v), V the Chebyshev polynomials of the third kind), which halves the dependency chain of
// Clenshaw's recurrence.
[[gnu::always_inline]] inline void erfcx_series(double g, double& t, double& P) {
  static constexpr double kC[25] = {
      -6.51326859890855148e-01, 6.41969792356490099e-01,  1.94764732041855411e-02,
      -9.56151478680877104e-03, -9.46595344482100342e-04, 3.66839497852726969e-04,
      4.25233248068322746e-05,  -2.02785781124834164e-05, -1.62429000480389293e-06,
      1.30365583557102143e-06,  1.56264415380449618e-08,  -8.52380958271620829e-08,
      6.52905413689479474e-09,  5.05934347976810221e-09,  -9.91364177846134787e-10,
      -2.27365106759317078e-10, 9.64678325973045674e-11,  2.39411231068851839e-12,
      -6.88624288628923094e-12, 8.94540568574922627e-13,  3.12893722271085440e-13,
      -1.12677082495622968e-13, 1.68834618708027034e-16,  7.03826335680776656e-15,
      -1.69362732118548613e-15};
  constexpr double kInvSqrt2 = 0.70710678118654752440;
  const double x = -g * kInvSqrt2;
  const double ax = x < 0.0 ? -x : x;
  t = 2.0 / (2.0 + ax);
  const double c = 2.0 * t - 1.0;
  const double v = 2.0 * c * c - 1.0;
  // (Fully unrolled: an inner loop would stop the vectoriser.)
  double e1 = 0.0, e2 = 0.0, o1 = 0.0, o2 = 0.0;
#pragma GCC unroll 12
  for (int j = 12; j >= 1; --j) {
    const double e0 = kC[2 * j] + 2.0 * v * e1 - e2;
    e2 = e1;
    e1 = e0;
  }
#pragma GCC unroll 11
  for (int j = 11; j >= 1; --j) {
    const double o0 = kC[2 * j + 1] + 2.0 * v * o1 - o2;
    o2 = o1;
    o1 = o0;
  }
  P = (kC[0] + v * e1 - e2) + c * (kC[1] + (2.0 * v - 1.0) * o1 - o2);
}

namespace detail {

// log Phi(g) and lambda from t and P (see above).
[[gnu::always_inline]] inline void log_normal_cdf_from_series(double g, double t, double P, double& log_cdf,
                                                              double& lambda) {
  constexpr double kInvSqrt2Pi = 0.39894228040143267794;
  constexpr double kSqrt2OverPi = 0.79788456080286535588;
  const double x2 = 0.5 * g * g;
  // Both halves share e^P, e^-x^2 (Q = t e^P e^-x^2 / 2 underflows to 0 where e^-x^2 does,
  // which is Q's correct rounding there) and one log: of t/2 below, of u = 1 - Q above,
  // where log1p(-Q) = log(u) (-Q) / (u - 1) cancels u's rounding.
  const bool lower = g <= 0.0;
  const double eP = vmath::exp(P), ex2 = vmath::exp(-x2);
  const double Q = 0.5 * t * eP * ex2;
  const double u = 1.0 - Q;
  const double d = u - 1.0;
  const double upper_ratio = d == 0.0 ? 1.0 : -Q / d;
  const double lg = vmath::log(lower ? 0.5 * t : u);
  log_cdf = lower ? lg + (P - x2) : (d == 0.0 ? -Q : lg * upper_ratio);
  lambda = (lower ? kSqrt2OverPi : kInvSqrt2Pi * ex2) / (lower ? t * eP : u);
}

}  // namespace detail

// One value (for code that evaluates few of them).
[[gnu::always_inline]] inline void log_normal_cdf(double g, double& log_cdf, double& lambda) {
  double t, P;
  erfcx_series(g, t, P);
  detail::log_normal_cdf_from_series(g, t, P, log_cdf, lambda);
}

// n values: log_cdf[i] = log Phi(g[i]), lambda[i] = phi(g[i]) / Phi(g[i]), in two passes over
// blocks of kLogNormalCdfBlock values.
constexpr int kLogNormalCdfBlock = 256;
[[gnu::always_inline]] inline void log_normal_cdf(const double* g, double* log_cdf, double* lambda,
                                                  long n) {
  double t[kLogNormalCdfBlock], P[kLogNormalCdfBlock];
  for (long start = 0; start < n; start += kLogNormalCdfBlock) {
    const long m = n - start < kLogNormalCdfBlock ? n - start : kLogNormalCdfBlock;
    const double* gb = g + start;
#pragma omp simd
    for (long i = 0; i < m; ++i) erfcx_series(gb[i], t[i], P[i]);
#pragma omp simd
    for (long i = 0; i < m; ++i)
      detail::log_normal_cdf_from_series(gb[i], t[i], P[i], log_cdf[start + i], lambda[start + i]);
  }
}

// Laplace's continued fraction of the standard normal's Mills ratio in the lower tail: for
// x > 0, Phi(-x) / phi(x) = 1 / (x + T1) with T_k = k / (x + T_{k+1}). The inverse Mills ratio
// at g = -x is then lambda = x + T1, and T1 = lambda + g and T2 come out positive, without the
// cancellation of that difference (which loses about log10(g^2) digits). From x = 4 on, 40 terms
// reach double precision (checked against 2000 terms). Scalar: for the few callers that need
// the tail's curvature, not for hot loops.
constexpr double kMillsFractionFrom = 4.0;
constexpr int kMillsFractionTerms = 40;
inline void mills_fraction_tails(double x, double& T1, double& T2) {
  double t = 0.0;
  for (int k = kMillsFractionTerms; k >= 2; --k) t = k / (x + t);
  T2 = t;
  T1 = 1.0 / (x + t);
}

}  // namespace pygpfast::vmath
