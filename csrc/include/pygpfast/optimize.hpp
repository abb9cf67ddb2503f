// A small bounded L-BFGS for a handful of parameters (hyperparameters of one GP expert).
//
// Minimises f(x) subject to lower <= x <= upper (either bound may be infinite) by limited-memory
// BFGS with box constraints handled by projection: variables at a bound whose gradient points out
// of the box are held fixed for the step, the two-loop direction is taken on the others, and the
// line search backtracks along the projected path x(alpha) = P(x + alpha d) until the Armijo
// condition holds. Correction pairs are kept only when s^T y > 0, so the inverse-Hessian
// estimate stays positive definite. Meant for n of order 1 to 100; every vector is O(m n).
//
// The objective may return a non-finite value (or throw LinAlgError, which the caller should turn
// into +inf) at trial points: the line search then shortens the step. A non-finite value at the
// starting point is an error. The iteration is deterministic (no threads, no randomness).
#pragma once

#include <functional>

#include "pygpfast/view.hpp"

namespace pygpfast::optimize {

struct LbfgsOptions {
  int max_iter = 200;       // iterations (accepted steps)
  int max_evals = 0;        // objective evaluations in all; 0 = 20 * max_iter
  int memory = 10;          // correction pairs kept
  double ftol = 1e-10;      // stop when (f_old - f_new) <= ftol * max(|f_old|, |f_new|, 1)
  double gtol = 1e-6;       // stop when the projected gradient's largest entry is <= gtol
  double max_step = 3.0;    // no coordinate moves more than this in one line search's first trial
  double armijo = 1e-4;     // sufficient-decrease constant c1
  int max_backtracks = 40;  // trial steps per line search
};

enum class Status {
  GradientTolerance = 0,   // projected gradient small
  ObjectiveTolerance = 1,  // relative decrease small
  MaxIterations = 2,       // max_iter or max_evals reached
  LineSearchFailed = 3,    // no trial step decreased f (x is the best point seen)
};

struct LbfgsResult {
  double f = 0.0;         // objective at the returned x
  int iterations = 0;     // accepted steps
  int evaluations = 0;    // objective evaluations
  Status status = Status::MaxIterations;
  double projected_gradient = 0.0;  // largest entry of the projected gradient at x
  bool converged() const { return status == Status::GradientTolerance || status == Status::ObjectiveTolerance; }
};

// f(x, grad): the objective at x [n], writing its gradient into grad [n].
using Objective = std::function<double(const double* x, double* grad)>;

// Minimises `fun` from x [n] (projected into the box first); x is overwritten with the best point.
// lower, upper [n] may be null (unbounded). Throws std::invalid_argument on bad options, bounds
// with lower > upper, or a non-finite objective or gradient at the start.
LbfgsResult minimize_lbfgs(const Objective& fun, double* x, index_t n, const double* lower,
                           const double* upper, const LbfgsOptions& options = {});

}  // namespace pygpfast::optimize
