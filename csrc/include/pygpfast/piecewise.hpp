// Piecewise linear / quadratic upper bounds on the logistic-log-partition llp(x) = log(1 + e^x)
// (Marlin, Khan & Murphy 2011; used by seed 004 with R = 20) and their expectations under a
// Gaussian, the per-point building block of the concave variational bounds in cvi.hpp.
//
// A bound has R pieces: on [knots[r], knots[r + 1]) it is a[r] x^2 + b[r] x + c[r], with
// knots[0] = -inf and knots[R] = +inf. Linear bounds have a = 0. The coefficient tables are
// computed by pygpfast (pygpfast/piecewise.py) and passed in; the core does no file I/O.
#pragma once

#include <vector>

#include "pygpfast/view.hpp"

namespace pygpfast::piecewise {

struct Bound {
  std::vector<double> knots;  // [R + 1], increasing, knots[0] = -inf, knots[R] = +inf
  std::vector<double> a, b, c;  // [R] each
  index_t pieces() const { return static_cast<index_t>(a.size()); }
};

// Throws std::invalid_argument unless the table is well formed (sizes, ordering, infinite ends,
// a >= 0, finite coefficients).
void validate(const Bound& bound);

// For i < n, with x ~ N(m[i], v[i]), v[i] >= 0:
//   value[i] = E[B(x)],  dm[i] = d value / d m,  dv[i] = d value / d v.
// (d^2 value / d m^2 = 2 dv by the heat equation, so Newton steps on m need nothing more.)
// Any of dm, dv may be null. Stable for |m| large and v -> 0 (then value -> B(m)).
// OpenMP over i; results do not depend on the thread count.
void expected_bound(const Bound& bound, const double* m, const double* v, index_t n, double* value,
                    double* dm, double* dv);

// The same for one point, without validation: for callers that validated the bound once and
// evaluate it point by point (the scalar solves of cvi.hpp). Requires v >= 0.
struct Expectation {
  double value;
  double dm;
  double dv;
};
Expectation expected_bound_at(const Bound& bound, double m, double v);

}  // namespace pygpfast::piecewise
