// The inference of cvi.hpp (Algorithm 1 with its guards, and the coupled mean steps), private to
// the core. Three parts share one State, the iterate:
//   SiteSweep  (a) the site precisions with the means fixed: the sweeps of scalar solves and
//              blocked rank-one updates of V, the residual steps, V built from lambda (sweep.cpp)
//   MeanSteps  (b) the means with V fixed: Newton's steps (cheap, Woodbury-corrected, exact) and
//              the coupled steps that anticipate the next sweep (means.cpp)
//   Inference  the driver: the outer iterations, their guards (undone and damped sweeps, undone
//              coupled iterations, rebuilds of V), the choice of coupled iterations, the bound,
//              the convergence tests, the history (inference.cpp)
// See cvi.hpp for the method; the public entry points (infer, fit_step, ...) are in cvi.cpp.
#pragma once

#include <chrono>
#include <string>

#include "pygpfast/cvi/cvi.hpp"
#include "pygpfast/view.hpp"
#include "pygpfast/workspace.hpp"

namespace pygpfast::cvi::detail {

using workspace::Buffer;

// Work counted for Result::flops and Result::bound_evaluations.
struct Counter {
  double flops = 0.0;
  double evaluations = 0.0;
  void add(double f) { flops += f; }
  void evaluate(double points) { evaluations += points; }
};

// Throws std::invalid_argument unless Sigma is square, non-empty and finite (lower triangle).
void check_sigma(ConstMatrixView Sigma);

// The hint of a LinAlgError for a posterior precision or covariance found not positive definite,
// from the largest lambda_i Sigma_ii (lambda_i = weight[i]^2 when `squared`, else weight[i]).
std::string not_positive_definite_hint(ConstMatrixView Sigma, const double* weight, bool squared);

// -KL(q_l || p_l) for latent function l from its sites: 1/2 [-log|I + Lambda Sigma| + lambda . v
// - alpha . (m - mean)] (logdet = log|I + Lambda Sigma|, v = diag V, m = mean + Sigma alpha).
// The KL is >= 0 exactly; where it comes out negative beyond rounding (1e-6 of its terms' size)
// V has lost its digits (a kernel matrix too ill-conditioned at its scale), and the bound is
// meaningless (it was positive for binary labels): LinAlgError.
double minus_kl(ConstMatrixView Sigma, index_t l, index_t N, double logdet, const double* lambda,
                const double* v, const double* alpha, const double* m, double mean);

// B = I + diag(s) Sigma diag(s) (lower triangle) and its lower Cholesky factor in place, with
// its flops counted. B >= I when Sigma is positive semi-definite; with `jitter` a B that
// rounding made indefinite is factorised with jitter (fine for a Newton direction, which the
// line search checks), otherwise that is a LinAlgError.
void factor_b(ConstMatrixView Sigma, const double* s, MatrixView B, bool jitter, Counter& count);

// The iterate that the parts share: the problem, the caller's alpha and lambda [L, N], m and v
// [L, N], V_l [N, N] (the lower triangles are kept current), log|I + Lambda_l Sigma| per latent
// function, and f_b with its derivatives at the last evaluation. Constructed from validated
// input (std::invalid_argument otherwise), with V and m not yet built (SiteSweep::build_V).
struct State {
  State(const LocalBound& lb, const double* y, ConstMatrixView Sigma, const double* mean,
        double* alpha, double* lambda, const Options& opt);

  MatrixView V_of(index_t l) { return MatrixView(V.data() + l * N * N, N, N); }
  // m_l = mean_l + Sigma alpha_l
  void compute_mean(index_t l);
  // v_l = diag(V_l)
  void refresh_variances(index_t l);

  const LocalBound& lb;
  const double* y;
  ConstMatrixView Sigma;
  const double* mean;
  double* alpha;
  double* lambda;
  const Options& opt;
  index_t N, L;
  Buffer V;       // [L, N, N]
  Buffer m, v;    // [L, N]
  Buffer logdet;  // [L]
  // f_b [N], g^m, g^v and d2m [L, N] where local_bounds last left them, and the site residuals
  // r = lambda + 2 g^v [L, N] at the last Inference::evaluate()
  Buffer f, dm, dv, d2m, residual;
  Counter count;
};

// (a) The site precisions with the means fixed (sweep.cpp).
class SiteSweep {
 public:
  explicit SiteSweep(State& state) : state_(state) {}

  // V_l = (Omega + Lambda_l)^-1 from V_l = Sigma by rank-one updates that set each lambda_i
  // from 0 to its current value, and the means from alpha. Returns whether any lambda_i != 0.
  bool build_V();
  // One sweep over every latent's sites, each solved by solve_site (rho, may_skip).
  void solve_sites(double rho, bool may_skip);
  // lambda <- lambda - t r for the residuals r [L, N] (see sweep.cpp).
  void residual_step(double t, const Buffer& r);

  // The largest factor by which an update changed a variance (either way) since the last reset.
  double max_change() const { return max_change_; }
  void reset_max_change() { max_change_ = 1.0; }
  int bracketed_solves() const { return bracketed_solves_; }
  int refused_solves() const { return refused_solves_; }

 private:
  template <class Rule>
  void sweep(index_t l, Rule&& rule);
  void add_lower_update(MatrixView V, const double* U, const double* s, index_t k, double* R,
                        double* W);
  double solve_site(index_t l, index_t i, double v_old, double c, double rho, bool may_skip);

  State& state_;
  double max_change_ = 1.0;
  int bracketed_solves_ = 0;
  int refused_solves_ = 0;
};

// (b) The means with V fixed (means.cpp).
class MeanSteps {
 public:
  explicit MeanSteps(State& state) : state_(state) {}

  // Newton's method for the means; false when they were left short of their optimum for the
  // next sweep to finish (the multinomial bound).
  bool update_means();
  // The coupled mean step; false, with alpha and m as they were, where it cannot be taken.
  bool coupled_step();

 private:
  bool coupled_step_multinomial();
  bool woodbury_correction(double* step_m, double* z, double* step_a, bool clamp);
  void exact_step(index_t l, double* sw, double* rhs, double* step_a);

  State& state_;
  Buffer B_;  // [N, N] scratch: the exact steps' B, the Woodbury S, the coupled steps' W_l or M_l
  Buffer scratch_K_, scratch_S_;  // the multinomial coupled step's K_l and S
};

// The driver (inference.cpp): Algorithm 1's outer iterations from the caller's (alpha, lambda),
// which run() overwrites with the solution.
class Inference {
 public:
  using Clock = std::chrono::steady_clock;

  Inference(const LocalBound& lb, const double* y, ConstMatrixView Sigma, const double* mean,
            double* alpha, double* lambda, const Options& opt);

  Result run();

  index_t N() const { return state_.N; }
  index_t L() const { return state_.L; }
  MatrixView V_of(index_t l) { return state_.V_of(l); }
  const Buffer& m() const { return state_.m; }
  const Buffer& v() const { return state_.v; }

 private:
  void record(double bound);
  double evaluate();
  double sweep_gain_estimate() const;
  double largest_site_step() const;
  double largest_mean_residual() const;
  void residuals();

  State state_;
  SiteSweep sweep_;
  MeanSteps means_;
  Result result_;
  Clock::time_point start_;
  bool warm_ = false;
  bool coupled_ = false;   // coupled iterations still allowed (Options::coupled_means)
  bool coupling_ = false;  // the last iteration was a coupled one
  double gains_[3] = {0.0, 0.0, 0.0};  // the bound's gains in the last three iterations
  int rebuilds_ = 0;  // rebuilds of V (run())
};

}  // namespace pygpfast::cvi::detail
