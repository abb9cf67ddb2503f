// Elementwise maths that vectorises. glibc's exp is a scalar call per element (about half of
// the time of an RBF kernel matrix); the versions here have no branches and no table
// lookups, so the compiler turns loops over them into SIMD code. Hot loops are compiled
// three times (PYGPFAST_SIMD_CLONES): for x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA) and the
// baseline, picked at load time, so wheels stay portable. The core is compiled with
// -fno-trapping-math and -fopenmp-simd so that selects and `#pragma omp simd` reductions
// vectorise.
#pragma once

#include <algorithm>
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

namespace detail {

// e^{x + x_lo} for x in [-708, 709], without range checks: x = n ln2 + r with |r| <= ln2 / 2
// (Cody-Waite split of ln2), e^{r + x_lo} by its Taylor series to degree 13 (truncation below
// 4e-18 relative), times 2^n built in the exponent bits. x_lo is a low part (|x_lo| <= 1e-4)
// for an argument that one double cannot hold; pass -0.0 for none (adding -0.0 folds away).
[[gnu::always_inline]] inline double exp_core(double x, double x_lo) {
  constexpr double kLog2e = 1.4426950408889634;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kShift = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  constexpr std::uint64_t kShiftBits = 0x4338000000000000ULL;
  const double t = x * kLog2e + kShift;
  const double n = t - kShift;
  const double r = ((x - n * kLn2Hi) - n * kLn2Lo) + x_lo;
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
  std::uint64_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  // t and kShift share their exponent, so their bit patterns differ by exactly n. (Unsigned: a
  // NaN's bits make garbage, discarded by exp's select, where signed arithmetic would be
  // undefined.)
  const std::uint64_t e = (bits - kShiftBits + 1023) << 52;
  double scale;
  std::memcpy(&scale, &e, sizeof scale);
  return p * scale;
}

}  // namespace detail

// exp(x) within 1 ulp of the correctly rounded value on [-708, 709]; 0 below -708 (no
// subnormal results, all below 3.3e-308), +inf above 709, NaN for NaN. The range handling
// costs: a loop of exps alone takes 0.86 ns per value with AVX-512 and 1.3-1.7 with AVX2 on
// Zen 4, exp_core with a clamp and a select on the one side a caller's range needs (as
// exp_minus_half_square) 0.67 and 0.9-1.1.
[[gnu::always_inline]] inline double exp(double x) {
  const double xc = x < -708.0 ? -708.0 : (x > 709.0 ? 709.0 : x);
  const double v = detail::exp_core(xc, -0.0);
  return x < -708.0 ? 0.0 : (x > 709.0 ? __builtin_inf() : v);
}

namespace detail {

// log(x) - k ln2 for a positive, normal, finite x, without checks (other x give finite
// garbage; k: for an x scaled by 2^k beforehand, 0.0 for none): x = 2^e m with m in
// [sqrt(1/2), sqrt(2)), log m = 2 atanh(s) with s = (m - 1)/(m + 1), |s| <= 0.172, by its odd
// series to s^23 (truncation below 1e-18). Within 2 ulp.
[[gnu::always_inline]] inline double log_core(double x, double k) {
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  std::uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  // The biased exponent as a double without an int64 -> double conversion (AVX2 has none):
  // the bits 0x433 << 52 | E are the double 2^52 + E.
  const std::uint64_t ebits = (bits >> 52 & 0x7FF) | 0x4330000000000000ULL;
  double biased;
  std::memcpy(&biased, &ebits, sizeof biased);
  double dn = biased - (4503599627370496.0 + 1023.0) - k;
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
  return dn * kLn2Hi + (lm + dn * kLn2Lo);
}

}  // namespace detail

// log(x): log_core, subnormals scaled by 2^54 first. Within 2 ulp for x > 0 (subnormals
// included); -inf at 0, NaN below 0 or for NaN, +inf at +inf.
[[gnu::always_inline]] inline double log(double x) {
  constexpr double kTwo54 = 18014398509481984.0;
  const bool sub = x < 2.2250738585072014e-308;
  const double v = detail::log_core(sub ? x * kTwo54 : x, sub ? 54.0 : 0.0);
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

// Q(|g|) e^{g^2/2}, where Q(z) = erfc(z / sqrt 2) / 2 is the standard normal's upper tail: the
// tail without its Gaussian factor, between 1/2 (g = 0) and 1 / (|g| sqrt(2 pi)) (|g| -> inf),
// so that neither tail underflows. With t = a / (a + |g|) in (0, 1] and a = 5 it is t S(t) for
// a smooth S that a polynomial of degree 22 in s = t - 5/64 matches within 6e-17 relative
// (Chebyshev interpolant, converted; fitted for pygpfast). The classic mapping of
// erfc(x) = t e^{P(t)} e^{-x^2}, t = 2 / (2 + x) with x = |g| / sqrt 2 (a = 2 sqrt 2), needs
// degree 26 for that (6e-15 at 22). The shift 5/64 makes the monomial sum well conditioned
// (sum |b_k s^k| <= 1.19 S; 7.1 in c = 2t - 1). It is summed as its even and odd halves in
// s^2, two independent Horner chains.
[[gnu::always_inline]] inline double normal_tail_scaled(double g) {
  static constexpr double kEven[12] = {
      8.65253474442369691e-02,  9.55480635676402290e-02,  8.43813447515091852e-02,
      5.44708281460301869e-02,  2.02286409920937084e-02,  -5.99515113941942804e-04,
      -3.33998887391691486e-03, -5.67534637104812924e-03, -4.31104713765850106e-02,
      -7.34633589330306314e-02, -2.32634416165951943e-02, -6.58879741070999615e-04};
  static constexpr double kOdd[11] = {
      9.31687420243623582e-02,  9.27165462512297839e-02,  7.11277958551655709e-02,
      3.66598082851980409e-02,  7.37872065999733550e-03,  -3.81733459234734210e-03,
      -5.41009609883477905e-06, 2.16910124230048698e-02,  6.70869973423992294e-02,
      5.23705190692294736e-02,  5.90302527990552942e-03};
  constexpr double kA = 5.0, kT0 = 0.078125;
  // (fabs, not g < 0 ? -g : g: GCC splits the division over that select's two arms.)
  const double t = kA / (kA + __builtin_fabs(g));
  const double s = t - kT0, s2 = s * s;
  // (Fully unrolled: an inner loop would stop the vectoriser.)
  double e = kEven[11], o = kOdd[10];
#pragma GCC unroll 11
  for (int j = 10; j >= 0; --j) e = e * s2 + kEven[j];
#pragma GCC unroll 10
  for (int j = 9; j >= 0; --j) o = o * s2 + kOdd[j];
  return t * (e + s * o);
}

// e^{-g^2/2} within 1 ulp, 0 from g^2/2 > 708 on (below 3.3e-308). g^2/2 = h + l with h =
// gh^2 / 2 exact for gh, g's upper 26 bits, and l = x2 - h passed to exp as a low part: rounding
// g^2/2 would cost up to g^2/2 ulp of relative accuracy (6e-14 at g = 37).
[[gnu::always_inline]] inline double exp_minus_half_square(double g) {
  std::uint64_t bits;
  std::memcpy(&bits, &g, sizeof bits);
  bits &= 0xFFFFFFFFF8000000ULL;
  double gh;
  std::memcpy(&gh, &bits, sizeof gh);
  const double gl = g - gh;
  const double h = 0.5 * gh * gh, l = gl * (gh + 0.5 * gl);
  const double v = detail::exp_core(std::max(-h, -708.0), -l);
  return -h < -708.0 ? 0.0 : v;
}

// log Phi(g) and the inverse Mills ratio lambda = phi(g) / Phi(g) of the standard normal, for
// every g (no underflow in the lower tail, no cancellation), from y = normal_tail_scaled(g),
// E = exp_minus_half_square(g) and x2 = g^2 / 2, with c = 1 / sqrt(2 pi):
//   g <= 0:  Phi = y E,  log Phi = log y - x2,  lambda = c / y;
//   g > 0:   Phi = u = 1 - Q with Q = y E,  log Phi = log1p(-Q) = log u + d (1 + Q),
//            lambda = c E / u,
// where d = (1 - Q) - u is u's rounding error (exact, |d| <= 2^-54): log1p(-Q) = log u +
// log1p(d / u), and d (1 + Q) is that second term within 1e-16 of the result (no division).
// Both halves share the one exp, the one log (of L = y below, of L = u above) and the one
// division. E's exact exponent keeps Q's relative accuracy in the upper tail; E = 0 from
// x2 > 708 on, where Q < 4e-310 and lambda < 1.4e-308.
// In four steps, so that the array form can run each over a block (see below): y; E; L, the
// value added to log L and the numerator of lambda; the log and the division.
namespace detail {

[[gnu::always_inline]] inline void log_normal_cdf_parts(double g, double y, double E, double& L,
                                                        double& add, double& numerator) {
  constexpr double kInvSqrt2Pi = 0.39894228040143267794;
  const double Q = y * E;
  const double u = 1.0 - Q;
  const double d = (1.0 - u) - Q;
  const bool lower = g <= 0.0;
  L = lower ? y : u;
  add = lower ? -(0.5 * g * g) : d + d * Q;
  numerator = lower ? kInvSqrt2Pi : kInvSqrt2Pi * E;
}

// L is normal in (0, 1] unless |g| > 1e307, where log Phi = -inf and the log does not matter.
[[gnu::always_inline]] inline void log_normal_cdf_finish(double L, double add, double numerator,
                                                         double& log_cdf, double& lambda) {
  log_cdf = log_core(L, 0.0) + add;
  lambda = numerator / L;
}

}  // namespace detail

// One value (for code that evaluates few of them).
[[gnu::always_inline]] inline void log_normal_cdf(double g, double& log_cdf, double& lambda) {
  double L, add, numerator;
  detail::log_normal_cdf_parts(g, normal_tail_scaled(g), exp_minus_half_square(g), L, add, numerator);
  detail::log_normal_cdf_finish(L, add, numerator, log_cdf, lambda);
}

// n values: log_cdf[i] = log Phi(g[i]), lambda[i] = phi(g[i]) / Phi(g[i]). The four steps run
// as four loops over blocks of kLogNormalCdfBlock values: the series, the exp and the log with
// the division are each a long chain of dependent operations, and short loops let the processor
// overlap more of their iterations. On Zen 4, one thread: 3.3 ns per value with AVX-512 and
// 4.5 with AVX2; as one fused loop 4.1 and 6.6, as three (the exp and the selects after it
// together) 3.4 and 5.1. Every step writes its own arrays: writing L over y (a store under a
// condition) compiles to masked stores behind a branch.
constexpr int kLogNormalCdfBlock = 256;
[[gnu::always_inline]] inline void log_normal_cdf(const double* g, double* log_cdf, double* lambda,
                                                  long n) {
  double y[kLogNormalCdfBlock], E[kLogNormalCdfBlock], L[kLogNormalCdfBlock];
  for (long start = 0; start < n; start += kLogNormalCdfBlock) {
    const long m = n - start < kLogNormalCdfBlock ? n - start : kLogNormalCdfBlock;
    const double* gb = g + start;
    double* lc = log_cdf + start;
    double* la = lambda + start;
#pragma omp simd
    for (long i = 0; i < m; ++i) y[i] = normal_tail_scaled(gb[i]);
#pragma omp simd
    for (long i = 0; i < m; ++i) E[i] = exp_minus_half_square(gb[i]);
#pragma omp simd
    for (long i = 0; i < m; ++i) detail::log_normal_cdf_parts(gb[i], y[i], E[i], L[i], lc[i], la[i]);
#pragma omp simd
    for (long i = 0; i < m; ++i) detail::log_normal_cdf_finish(L[i], lc[i], la[i], lc[i], la[i]);
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
