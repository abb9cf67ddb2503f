// Gauss-Hermite quadrature.
#pragma once

#include <vector>

#include "pygpfast/view.hpp"

namespace pygpfast::quadrature {

// Largest supported number of Gauss-Hermite points.
constexpr int kMaxGaussHermitePoints = 100;

struct GaussHermiteRule {
  std::vector<double> x;  // nodes, ascending
  std::vector<double> w;  // weights for the weight function exp(-x^2) (sum = sqrt(pi))
};

// Physicists' Gauss-Hermite rule with n points (1 <= n <= 100), identical to
// numpy.polynomial.hermite.hermgauss(n) to ~1e-14. Rules are computed once and cached
// (thread-safe); the reference stays valid for the life of the process.
const GaussHermiteRule& gauss_hermite(int n);

}  // namespace pygpfast::quadrature
