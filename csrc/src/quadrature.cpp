#include "pygpfast/quadrature.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <mutex>
#include <string>

#include "pygpfast/errors.hpp"

namespace pygpfast::quadrature {
namespace {


// Orthonormal Hermite polynomials p_n(x) and p_{n-1}(x) (orthonormal for the weight
// exp(-x^2)) by their three-term recurrence, which stays in range where the classical
// H_n(x) overflows.
struct HermitePair {
  long double p_n;
  long double p_n_minus_1;
};

HermitePair orthonormal_hermite(int n, long double x) {
  const long double pi_to_minus_quarter = 0.75112554446494248285870300477622637L;
  long double p_prev = 0.0L;
  long double p = pi_to_minus_quarter;
  for (int j = 1; j <= n; ++j) {
    const long double next =
        x * std::sqrt(2.0L / j) * p - std::sqrt(static_cast<long double>(j - 1) / j) * p_prev;
    p_prev = p;
    p = next;
  }
  return {p, p_prev};
}

// Newton's method on p_n (p_n' = sqrt(2n) p_{n-1}) in extended precision, from the initial
// guesses of Numerical Recipes' gauher (largest root first, each guess extrapolated from
// the roots already found). The weights are 1 / (n p_{n-1}(x)^2).
GaussHermiteRule compute_rule(int n) {
  GaussHermiteRule rule;
  rule.x.resize(n);
  rule.w.resize(n);
  const long double tolerance = 8 * std::numeric_limits<long double>::epsilon();
  const int n_nonnegative = (n + 1) / 2;
  std::array<long double, kMaxGaussHermitePoints> roots{};  // non-negative roots, largest first
  for (int i = 0; i < n_nonnegative; ++i) {
    long double z;
    if (n % 2 == 1 && i == n_nonnegative - 1) {
      z = 0.0L;  // the middle root of an odd rule is 0 by symmetry
    } else {
      if (i == 0)
        z = std::sqrt(2.0L * n + 1) - 1.85575L * std::pow(2.0L * n + 1, -0.16667L);
      else if (i == 1)
        z = roots[0] - 1.14L * std::pow(static_cast<long double>(n), 0.426L) / roots[0];
      else if (i == 2)
        z = 1.86L * roots[1] - 0.86L * roots[0];
      else if (i == 3)
        z = 1.91L * roots[2] - 0.91L * roots[1];
      else
        z = 2.0L * roots[i - 1] - roots[i - 2];
      for (int iteration = 0; iteration < 100; ++iteration) {
        const HermitePair h = orthonormal_hermite(n, z);
        const long double step = h.p_n / (std::sqrt(2.0L * n) * h.p_n_minus_1);
        z -= step;
        if (std::fabs(step) <= tolerance * std::max(1.0L, std::fabs(z))) break;
      }
    }
    roots[i] = z;
    const long double p_n_minus_1 = orthonormal_hermite(n, z).p_n_minus_1;
    const auto weight = static_cast<double>(1.0L / (n * p_n_minus_1 * p_n_minus_1));
    rule.x[n - 1 - i] = static_cast<double>(z);
    rule.x[i] = -static_cast<double>(z);
    rule.w[n - 1 - i] = weight;
    rule.w[i] = weight;
  }
  return rule;
}

}  // namespace

const GaussHermiteRule& gauss_hermite(int n) {
  require(n >= 1 && n <= kMaxGaussHermitePoints, "gauss_hermite: the number of points must be between 1 and ",
          kMaxGaussHermitePoints, ", got ", n);
  static std::array<std::once_flag, kMaxGaussHermitePoints> computed;
  static std::array<GaussHermiteRule, kMaxGaussHermitePoints> rules;
  std::call_once(computed[n - 1], [n] { rules[n - 1] = compute_rule(n); });
  return rules[n - 1];
}

}  // namespace pygpfast::quadrature
