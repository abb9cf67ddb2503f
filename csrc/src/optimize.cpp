#include "pygpfast/optimize.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "pygpfast/errors.hpp"

namespace pygpfast::optimize {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// True when coordinate i sits on a bound and the gradient pushes it out of the box.
bool held(double x, double g, double lo, double hi) { return (x <= lo && g > 0.0) || (x >= hi && g < 0.0); }

}  // namespace

LbfgsResult minimize_lbfgs(const Objective& fun, double* x, index_t n, const double* lower,
                           const double* upper, const LbfgsOptions& opt) {
  require(n >= 0, "lbfgs: negative dimension");
  require(opt.max_iter >= 0, "lbfgs: max_iter must be >= 0, got ", opt.max_iter);
  require(opt.memory >= 1, "lbfgs: memory must be >= 1, got ", opt.memory);
  require(opt.ftol >= 0 && opt.gtol >= 0, "lbfgs: tolerances must be >= 0");
  require(opt.max_step > 0 && opt.armijo > 0 && opt.armijo < 0.5, "lbfgs: bad line-search constants");
  const std::size_t N = static_cast<std::size_t>(n);
  std::vector<double> lo(N, -kInf), hi(N, kInf);
  for (std::size_t i = 0; i < N; ++i) {
    if (lower != nullptr) lo[i] = lower[i];
    if (upper != nullptr) hi[i] = upper[i];
    require(!(lo[i] > hi[i]) && !std::isnan(lo[i]) && !std::isnan(hi[i]), "lbfgs: bounds of coordinate ", i,
            " are [", lo[i], ", ", hi[i], "]");
    require(std::isfinite(x[i]), "lbfgs: the starting point is not finite at coordinate ", i);
    x[i] = std::min(std::max(x[i], lo[i]), hi[i]);
  }
  const int max_evals = opt.max_evals > 0 ? opt.max_evals : 20 * std::max(opt.max_iter, 1);

  LbfgsResult res;
  std::vector<double> xv(x, x + n), g(N), xt(N), gt(N), d(N), q(N), alpha_hist;
  double f = fun(xv.data(), g.data());
  res.evaluations = 1;
  bool finite = std::isfinite(f);
  for (double v : g) finite = finite && std::isfinite(v);
  require(finite, "lbfgs: the objective or its gradient is not finite at the starting point");

  // Correction pairs, oldest first.
  std::vector<std::vector<double>> S, Y;
  std::vector<double> rho;

  auto projected_gradient = [&] {
    double m = 0.0;
    for (std::size_t i = 0; i < N; ++i) {
      // The step to the box along -g, capped at |g|.
      double step = -g[i];
      if (xv[i] + step < lo[i]) step = lo[i] - xv[i];
      if (xv[i] + step > hi[i]) step = hi[i] - xv[i];
      m = std::max(m, std::fabs(step));
    }
    return m;
  };

  res.status = Status::MaxIterations;
  while (true) {
    res.projected_gradient = projected_gradient();
    if (res.projected_gradient <= opt.gtol) {
      res.status = Status::GradientTolerance;
      break;
    }
    if (res.iterations >= opt.max_iter || res.evaluations >= max_evals) {
      res.status = Status::MaxIterations;
      break;
    }
    // Two-loop recursion on the free coordinates.
    std::vector<bool> free(N);
    for (std::size_t i = 0; i < N; ++i) {
      free[i] = !held(xv[i], g[i], lo[i], hi[i]);
      q[i] = free[i] ? g[i] : 0.0;
    }
    const std::size_t m = S.size();
    alpha_hist.assign(m, 0.0);
    for (std::size_t k = m; k-- > 0;) {
      double a = 0.0;
      for (std::size_t i = 0; i < N; ++i) a += free[i] ? S[k][i] * q[i] : 0.0;
      a *= rho[k];
      alpha_hist[k] = a;
      for (std::size_t i = 0; i < N; ++i)
        if (free[i]) q[i] -= a * Y[k][i];
    }
    if (m > 0) {
      const double gamma = dot(S[m - 1], Y[m - 1]) / dot(Y[m - 1], Y[m - 1]);
      for (double& v : q) v *= gamma;
    }
    for (std::size_t k = 0; k < m; ++k) {
      double b = 0.0;
      for (std::size_t i = 0; i < N; ++i) b += free[i] ? Y[k][i] * q[i] : 0.0;
      b *= rho[k];
      for (std::size_t i = 0; i < N; ++i)
        if (free[i]) q[i] += S[k][i] * (alpha_hist[k] - b);
    }
    double gd = 0.0, dnorm = 0.0, gnorm = 0.0;
    for (std::size_t i = 0; i < N; ++i) {
      d[i] = free[i] ? -q[i] : 0.0;
      gd += g[i] * d[i];
      dnorm += d[i] * d[i];
      gnorm += free[i] ? g[i] * g[i] : 0.0;
    }
    if (!(gd < -1e-12 * std::sqrt(dnorm * gnorm))) {  // not a descent direction: restart
      S.clear();
      Y.clear();
      rho.clear();
      gd = 0.0;
      for (std::size_t i = 0; i < N; ++i) {
        d[i] = free[i] ? -g[i] : 0.0;
        gd += g[i] * d[i];
      }
    }
    // First trial: the full step, capped so that no coordinate moves more than max_step.
    double dmax = 0.0;
    for (double v : d) dmax = std::max(dmax, std::fabs(v));
    double step = std::min(1.0, opt.max_step / dmax);
    bool accepted = false;
    double ft = kInf;
    for (int bt = 0; bt < opt.max_backtracks && res.evaluations < max_evals; ++bt) {
      double decrease = 0.0;  // g^T (x(step) - x): the projected path's first-order change
      bool moved = false;
      for (std::size_t i = 0; i < N; ++i) {
        xt[i] = std::min(std::max(xv[i] + step * d[i], lo[i]), hi[i]);
        decrease += g[i] * (xt[i] - xv[i]);
        moved = moved || xt[i] != xv[i];
      }
      if (!moved) break;
      ft = fun(xt.data(), gt.data());
      ++res.evaluations;
      bool ok = std::isfinite(ft);
      for (double v : gt) ok = ok && std::isfinite(v);
      if (ok && ft <= f + opt.armijo * decrease) {
        accepted = true;
        break;
      }
      // Shorten: the minimiser of the quadratic through f, the slope and ft, kept in
      // [0.1, 0.5] of the step (plain halving after a non-finite value).
      double next = 0.5 * step;
      if (ok && decrease < 0.0) {
        const double curvature = ft - f - decrease;
        if (curvature > 0.0) next = std::min(0.5 * step, std::max(0.1 * step, -0.5 * decrease * step / curvature));
      }
      step = next;
    }
    if (!accepted) {
      res.status = res.evaluations >= max_evals ? Status::MaxIterations : Status::LineSearchFailed;
      break;
    }
    ++res.iterations;
    std::vector<double> s(N), y(N);
    for (std::size_t i = 0; i < N; ++i) {
      s[i] = xt[i] - xv[i];
      y[i] = gt[i] - g[i];
    }
    const double sy = dot(s, y), yy = dot(y, y);
    if (sy > 1e-10 * yy && sy > 0.0) {
      if (S.size() == static_cast<std::size_t>(opt.memory)) {
        S.erase(S.begin());
        Y.erase(Y.begin());
        rho.erase(rho.begin());
      }
      S.push_back(std::move(s));
      Y.push_back(std::move(y));
      rho.push_back(1.0 / sy);
    }
    const double f_old = f;
    xv.swap(xt);
    g.swap(gt);
    f = ft;
    if (f_old - f <= opt.ftol * std::max({std::fabs(f_old), std::fabs(f), 1.0})) {
      res.projected_gradient = projected_gradient();
      res.status = res.projected_gradient <= opt.gtol ? Status::GradientTolerance : Status::ObjectiveTolerance;
      break;
    }
  }
  std::copy(xv.begin(), xv.end(), x);
  res.f = f;
  return res;
}

}  // namespace pygpfast::optimize
