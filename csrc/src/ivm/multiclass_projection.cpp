// Constrained ADF projection of the joint multi-class IVM (notes/ivm-math.md section 2.4):
// the site mean b matches the tilted mean exactly; pi minimises
//   f(pi) = [-log|A^{-1} + Pi(pi)| + tr(Pi(pi) A_hat)] / 2,  Pi(pi) = diag(pi) - pi pi^T / 1^T pi,
// the convex f_vex = [-log|A^{-1} + Pi| + sum_k pi_k A_hat_kk] / 2 plus the concave
// -pi^T A_hat pi / (2 alpha), by Newton steps safeguarded with the convex majoriser's Hessian.
#include <algorithm>
#include <cmath>
#include <vector>

#include "pygpfast/errors.hpp"
#include "pygpfast/ivm/multiclass.hpp"
#include "small_dense.hpp"

namespace pygpfast::ivm {

namespace {

constexpr double kPiMin = 1e-10, kPiMax = 1e10;

struct Objective {
  int C;
  std::vector<double> LA;  // chol(A)
  std::vector<double> A_hat;
  double logdet_A;
  // scratch
  std::vector<double> Pi, T, Bm, Lb, X, S, Dm, G, Gh, row;

  Objective(int C_, const double* A, const double* A_hat_) : C(C_), LA(C_ * C_), A_hat(A_hat_, A_hat_ + C_ * C_) {
    if (!small::cholesky(C, A, LA.data()))
      throw LinAlgError("cholesky", 1, "the cavity covariance A is not positive definite");
    logdet_A = small::logdet_cholesky(C, LA.data());
    const std::size_t CC = static_cast<std::size_t>(C * C);
    Pi.resize(CC);
    T.resize(CC);
    Bm.resize(CC);
    Lb.resize(CC);
    X.resize(CC);
    S.resize(CC);
    Dm.resize(CC);
    G.resize(CC);
    Gh.resize(CC);
    row.resize(static_cast<std::size_t>(C));
  }

  // f at pi; with grad/hess/hess_vex non-null also those. Returns +inf when a factor fails.
  double eval(const double* pi, double* grad, double* hess, double* hess_vex) {
    double alpha = 0.0;
    for (int k = 0; k < C; ++k) alpha += pi[k];
    for (int k = 0; k < C; ++k)
      for (int l = 0; l < C; ++l) Pi[k * C + l] = (k == l ? pi[k] : 0.0) - pi[k] * pi[l] / alpha;
    // Bm = I + LA^T Pi LA
    for (int k = 0; k < C; ++k)
      for (int l = 0; l < C; ++l) {
        double s = 0.0;
        for (int m = l; m < C; ++m) s += Pi[k * C + m] * LA[m * C + l];
        T[k * C + l] = s;  // (Pi LA)
      }
    for (int k = 0; k < C; ++k)
      for (int l = 0; l < C; ++l) {
        double s = k == l ? 1.0 : 0.0;
        for (int m = k; m < C; ++m) s += LA[m * C + k] * T[m * C + l];
        Bm[k * C + l] = s;
      }
    if (!small::cholesky(C, Bm.data(), Lb.data())) return HUGE_VAL;
    double tr = 0.0;
    for (int k = 0; k < C; ++k)
      for (int l = 0; l < C; ++l) tr += Pi[k * C + l] * A_hat[l * C + k];
    const double f = 0.5 * (logdet_A - small::logdet_cholesky(C, Lb.data()) + tr);
    if (grad == nullptr) return f;
    // S = (A^{-1} + Pi)^{-1} = X X^T, X = LA Lb^{-T}
    for (int i = 0; i < C; ++i) {
      for (int j = 0; j < C; ++j) row[j] = LA[i * C + j];
      small::solve_lower(C, Lb.data(), row.data());
      for (int j = 0; j < C; ++j) X[i * C + j] = row[j];
    }
    for (int i = 0; i < C; ++i)
      for (int j = 0; j < C; ++j) {
        double s = 0.0;
        for (int m = 0; m < C; ++m) s += X[i * C + m] * X[j * C + m];
        S[i * C + j] = s;
      }
    // G = W^T S W, G_hat = W^T A_hat W with W = I - rho 1^T (columns e_k - rho).
    auto project = [&](const double* M, double* out) {
      std::vector<double>& Mr = row;  // M rho
      double rMr = 0.0;
      for (int k = 0; k < C; ++k) {
        double s = 0.0;
        for (int l = 0; l < C; ++l) s += M[k * C + l] * pi[l] / alpha;
        Mr[k] = s;
      }
      for (int k = 0; k < C; ++k) rMr += pi[k] / alpha * Mr[k];
      for (int k = 0; k < C; ++k)
        for (int l = 0; l < C; ++l) out[k * C + l] = M[k * C + l] - Mr[k] - Mr[l] + rMr;
    };
    project(S.data(), G.data());
    project(A_hat.data(), Gh.data());
    for (int k = 0; k < C; ++k) grad[k] = 0.5 * (Gh[k * C + k] - G[k * C + k]);
    for (int k = 0; k < C; ++k)
      for (int l = 0; l < C; ++l) {
        const double gg = 0.5 * G[k * C + l] * G[k * C + l];
        if (hess != nullptr) hess[k * C + l] = gg + (G[k * C + l] - Gh[k * C + l]) / alpha;
        if (hess_vex != nullptr) hess_vex[k * C + l] = gg + G[k * C + l] / alpha;
      }
    return f;
  }
};

// Solves H x = -g by Cholesky; false when H is not safely positive definite.
bool newton_direction(int C, const double* H, const double* g, double* x, double* L) {
  double max_diag = 0.0;
  for (int k = 0; k < C; ++k) max_diag = std::max(max_diag, std::fabs(H[k * C + k]));
  if (!small::cholesky(C, H, L)) return false;
  for (int k = 0; k < C; ++k)
    if (L[k * C + k] * L[k * C + k] < 1e-12 * max_diag) return false;
  for (int k = 0; k < C; ++k) x[k] = -g[k];
  small::solve_cholesky(C, L, x);
  return true;
}

}  // namespace

double projection_objective(int C, const double* A, const double* A_hat, const double* pi, double* grad,
                            double* hessian) {
  require(C >= 2, "projection: C must be >= 2, got ", C);
  for (int k = 0; k < C; ++k) require(pi[k] > 0.0 && std::isfinite(pi[k]), "projection: pi must be positive");
  Objective obj(C, A, A_hat);
  std::vector<double> g(static_cast<std::size_t>(C));
  const double f = obj.eval(pi, grad != nullptr ? grad : g.data(), hessian, nullptr);
  return f;
}

ProjectionResult project_constrained_site(int C, const double* h, const double* A, const double* h_hat,
                                          const double* A_hat, const double* pi0, int max_iterations) {
  require(C >= 2, "projection: C must be >= 2, got ", C);
  require(max_iterations >= 1, "projection: max_iterations must be >= 1");
  for (int k = 0; k < C * C; ++k)
    require(std::isfinite(A[k]) && std::isfinite(A_hat[k]), "projection: A and A_hat must be finite");
  for (int k = 0; k < C; ++k)
    require(std::isfinite(h[k]) && std::isfinite(h_hat[k]) && pi0[k] >= 0.0 && std::isfinite(pi0[k]),
            "projection: h, h_hat and pi0 must be finite and pi0 non-negative");
  {
    std::vector<double> tmp(static_cast<std::size_t>(C * C));
    if (!small::cholesky(C, A_hat, tmp.data()))
      throw LinAlgError("cholesky", 1, "the tilted covariance A_hat is not positive definite");
  }
  Objective obj(C, A, A_hat);
  const std::size_t CC = static_cast<std::size_t>(C * C);
  std::vector<double> pi(pi0, pi0 + C), grad(C), H(CC), Hv(CC), L(CC), dir(C), trial(C);
  for (auto& p : pi) p = std::clamp(p, kPiMin, kPiMax);
  ProjectionResult res;
  double f = obj.eval(pi.data(), grad.data(), H.data(), Hv.data());
  std::vector<double> dir2(C), trial2(C), Hs(CC);
  // Armijo backtracking along dir from pi (kept positive); returns the accepted f (or +inf).
  auto line_search = [&](const std::vector<double>& dv, double dec, std::vector<double>& out) {
    double t = 1.0;
    for (int k = 0; k < C; ++k)
      if (dv[k] < 0.0) t = std::min(t, 0.99 * (pi[k] - 0.5 * kPiMin) / -dv[k]);
    for (int ls = 0; ls < 60; ++ls) {
      for (int k = 0; k < C; ++k) out[k] = std::clamp(pi[k] + t * dv[k], kPiMin, kPiMax);
      const double fn = obj.eval(out.data(), nullptr, nullptr, nullptr);
      if (fn <= f + 1e-4 * t * dec) return fn;
      t *= 0.5;
    }
    return HUGE_VAL;
  };
  auto decrement = [&](std::vector<double>& dv) {
    double dec = 0.0;
    for (int k = 0; k < C; ++k) dec += grad[k] * dv[k];
    if (!(dec < 0.0)) {
      dec = 0.0;
      for (int k = 0; k < C; ++k) {
        dv[k] = -grad[k];
        dec -= grad[k] * grad[k];
      }
    }
    return dec;
  };
  for (int it = 0; it < max_iterations; ++it) {
    const bool newton = newton_direction(C, H.data(), grad.data(), dir.data(), L.data());
    bool shifted = false;
    if (!newton) {
      // Indefinite Hessian: the convex majoriser's Newton direction (a CCCP step, always descent),
      // and the Newton direction of H + tau I (tau grown until positive definite), which escapes
      // non-convex regions where CCCP steps crawl; the better of the two is taken.
      ++res.majoriser_steps;
      if (!newton_direction(C, Hv.data(), grad.data(), dir.data(), L.data()))
        for (int k = 0; k < C; ++k) dir[k] = -grad[k];
      double scale = 0.0;
      for (int k = 0; k < C; ++k) scale = std::max(scale, std::fabs(H[k * C + k]));
      double tau = 1e-8 * std::max(scale, 1e-300);
      for (int attempt = 0; attempt < 40 && !shifted; ++attempt, tau *= 4.0) {
        Hs = H;
        for (int k = 0; k < C; ++k) Hs[k * C + k] += tau;
        shifted = newton_direction(C, Hs.data(), grad.data(), dir2.data(), L.data());
      }
    }
    const double dec = decrement(dir);
    if (std::fabs(dec) < 1e-13 * std::max(1.0, std::fabs(f))) {
      res.converged = true;
      break;
    }
    double f_new = line_search(dir, dec, trial);
    if (shifted) {
      const double dec2 = decrement(dir2);
      const double f2 = line_search(dir2, dec2, trial2);
      if (f2 < f_new) {
        f_new = f2;
        trial = trial2;
      }
    }
    const bool accepted = f_new < HUGE_VAL;
    ++res.iterations;
    if (!accepted) {
      // No decrease representable: at the optimum to rounding.
      res.converged = std::fabs(dec) < 1e-8 * std::max(1.0, std::fabs(f));
      break;
    }
    pi = trial;
    const double f_old = f;
    f = obj.eval(pi.data(), grad.data(), H.data(), Hv.data());
    // An optimum at pi_k -> infinity (f approaching its infimum along a nearly flat direction) never
    // meets the decrement test: stop once a step gains less than 1e-12 |f| while the
    // decrement is small.
    if (f_old - f <= 1e-12 * std::max(1.0, std::fabs(f))) {
      res.converged = true;
      break;
    }
  }
  res.objective = f;
  res.pi = pi;
  // g = A^{-1} (h_hat - h), b = g + Pi h_hat.
  res.g.resize(C);
  for (int k = 0; k < C; ++k) res.g[k] = h_hat[k] - h[k];
  small::solve_cholesky(C, obj.LA.data(), res.g.data());
  double alpha = 0.0, pih = 0.0;
  for (int k = 0; k < C; ++k) {
    alpha += pi[k];
    pih += pi[k] * h_hat[k];
  }
  res.b.resize(C);
  for (int k = 0; k < C; ++k) res.b[k] = res.g[k] + pi[k] * h_hat[k] - pi[k] * pih / alpha;
  return res;
}

}  // namespace pygpfast::ivm
