// The driver of the inference (inference.hpp): Algorithm 1's outer iterations with their guards,
// the choice of coupled iterations, the bound and the convergence tests; the state that the
// parts share; and the helpers that cvi.cpp's entry points share with them.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "inference.hpp"
#include "pygpfast/blas.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/linalg.hpp"

namespace pygpfast::cvi::detail {
namespace {

using blas::Uplo;
using linalg::fixed_order_sum;

// Past this lambda_i Sigma_ii, V computed from the site precisions (by rank-one updates, or from
// the Cholesky factor of B = I + Lambda^1/2 Sigma Lambda^1/2) has lost half its digits, and a
// failure there is the site precisions' doing more likely than the kernel's.
constexpr double kLargeSitePrecision = 1e8;

// Rounding slack when comparing bounds.
double slack(double bound) { return 1e-12 * std::max(1.0, std::fabs(bound)); }

// Damped repetitions of a sweep that lowered the bound before residual steps take over.
constexpr int kDampedSweeps = 3;
// V is rebuilt at convergence after an update that changed a variance by more than this factor,
// at most kMaxRebuilds times in a run. V's error grows much faster than the factor times eps:
// warm starts with lambda = 1e2 to 1e6 changed variances by 1e4 to 1e8 and left the bound
// carried along 1e-8 to 1e-3 relative off the bound at the returned (alpha, lambda) (250 of 290
// random starts at a limit of 1e8, 12 at 1e4, none at 1e2).
constexpr double kChangeLimit = 1e2;
constexpr int kMaxRebuilds = 2;

// Coupled mean steps (cvi.hpp): tried where Algorithm 1 converges slowly, once an iteration has
// gained at least kCoupledRate times the one before, and then in every iteration until one is
// undone. On 130 problems (synthetic logit, Poisson, stick-breaking and ordinal with N = 60,
// prior variances 2 to 1e4, length scales 0.3 to 20, and the 18 Figure 1 settings; tol = 1e-12)
// Algorithm 1 took 1424 iterations and 8.97 GFLOP; with this test 863 and 6.20 GFLOP (one
// iteration undone, no run longer); with coupled steps from the second iteration on 924 and
// 6.57 GFLOP (15 undone, 49 runs longer). Then: the undone iterations after which a run goes on
// without them (the GMRES tolerance, budget and restart, and the step of the central
// differences, were chosen on them too: means.cpp). Warm starts (lambda != 0) run Algorithm 1
// alone: there its sweeps move few sites (the flops of a sweep follow the sites that move),
// while after a coupled step all of them move; in the searches of the estimators, where every
// inference but the first is warm, coupled steps took 417 to 524 iterations instead of 624 but
// 1.35 to 1.64 times the flops (stick-breaking on scikit-learn's digits, N = 450, L = 9).
constexpr double kCoupledRate = 0.05;
// The multinomial bound's coupled iteration costs about twice one of Algorithm 1 (its step is
// a sweep's L N^3 flops); it is tried once each of the last two iterations gained at least
// this fraction of the one before. With the test above instead, a three-class fit (N = 600,
// 40 inferences) took 164 GFLOP where this test and Algorithm 1 alone take 139 (coupled steps
// where Algorithm 1 converges in 5 to 9 iterations anyway), and a ten-class fit on
// scikit-learn's digits 5.5e11 flops where this test takes 6.6e11 (Algorithm 1 alone 8.3e11).
constexpr double kCoupledRateMultinomial = 0.5;
constexpr int kMaxUndoneCoupled = 2;

}  // namespace

// ---- helpers shared with cvi.cpp

void check_sigma(ConstMatrixView Sigma) {
  require(Sigma.rows == Sigma.cols, "cvi: Sigma must be square, got ", Sigma.rows, "x", Sigma.cols);
  require(Sigma.rows >= 1, "cvi: need at least one data point");
  for (index_t i = 0; i < Sigma.rows; ++i)
    for (index_t j = 0; j <= i; ++j)
      if (!std::isfinite(Sigma(i, j)))
        throw std::invalid_argument("cvi: Sigma has a non-finite entry at (" + std::to_string(i) +
                                    ", " + std::to_string(j) + ")");
}

std::string not_positive_definite_hint(ConstMatrixView Sigma, const double* weight, bool squared) {
  double largest = 0.0;
  for (index_t i = 0; i < Sigma.rows; ++i)
    largest = std::max(largest, (squared ? weight[i] * weight[i] : weight[i]) * Sigma(i, i));
  if (!(largest > kLargeSitePrecision))
    return "the kernel matrix is not numerically positive semi-definite; add a White kernel";
  std::ostringstream os;
  os.precision(3);
  os << "the site precisions are too large for this prior (lambda_i Sigma_ii up to " << largest
     << ", so V = (Sigma^-1 + Lambda)^-1 keeps no digits); start from smaller ones (lambda = 0 "
        "is Algorithm 1's own start), or, if they are right, the kernel matrix may not be "
        "numerically positive semi-definite (add a White kernel)";
  return os.str();
}

double minus_kl(ConstMatrixView Sigma, index_t l, index_t N, double logdet, const double* lambda,
                const double* v, const double* alpha, const double* m, double mean) {
  double s = -logdet, size = std::fabs(logdet);
  for (index_t n = 0; n < N; ++n) {
    s += lambda[n] * v[n] - alpha[n] * (m[n] - mean);
    size += std::fabs(lambda[n] * v[n]) + std::fabs(alpha[n] * (m[n] - mean));
  }
  const double kl = -0.5 * s;
  size *= 0.5;
  if (kl < -1e-6 * size) {
    std::ostringstream os;
    os.precision(3);
    os << "the bound lost its digits: KL(q || p) of latent function " << l << " came out at "
       << kl << " (it is >= 0; its terms are of size " << size
       << "), as V = (Sigma^-1 + Lambda)^-1 lost its precision at this kernel's scale: "
       << not_positive_definite_hint(Sigma, lambda, false)
       << ", or use a kernel of smaller variance";
    throw LinAlgError("cvi", static_cast<int>(l + 1), os.str());
  }
  return 0.5 * s;
}

void factor_b(ConstMatrixView Sigma, const double* s, MatrixView B, bool jitter, Counter& count) {
  const index_t N = Sigma.rows;
  for (index_t i = 0; i < N; ++i) {
    double zero = 0.0;  // stays 0 unless an entry of the row is inf or NaN
    for (index_t j = 0; j <= i; ++j) {
      B(i, j) = s[i] * Sigma(i, j) * s[j];
      zero += B(i, j) * 0.0;
    }
    B(i, i) += 1.0;
    // Site precisions large enough to overflow s_i Sigma_ij s_j are a breakdown of the
    // inference (a warm start from far-away hyperparameters), not bad input.
    if (zero != 0.0)
      throw LinAlgError("cvi", static_cast<int>(i + 1),
                        "I + Lambda^1/2 Sigma Lambda^1/2 overflowed in row " +
                            std::to_string(i + 1) +
                            ": the site precisions are too large for this kernel; start from "
                            "smaller ones");
  }
  count.add(2.0 * static_cast<double>(N) * N + static_cast<double>(N) * N * N / 3.0);
  if (jitter) {
    linalg::cholesky_jitter(B);
    return;
  }
  const int info = blas::potrf_lower(B);
  if (info != 0)
    throw LinAlgError("dpotrf", info,
                      "I + Lambda^1/2 Sigma Lambda^1/2 is not numerically positive definite: " +
                          not_positive_definite_hint(Sigma, s, true));
}

// ---- the state

State::State(const LocalBound& lb, const double* y, ConstMatrixView Sigma, const double* mean,
             double* alpha, double* lambda, const Options& opt)
    : lb(lb), y(y), Sigma(Sigma), mean(mean), alpha(alpha), lambda(lambda), opt(opt),
      N(Sigma.rows), L(lb.num_latent()) {
  validate(lb);
  check_sigma(Sigma);
  check_labels(lb, y, N);
  require(opt.max_iter >= 0 && opt.block_size >= 0 && opt.max_newton >= 0 &&
              opt.max_damping >= 0 && !std::isnan(opt.tol) && opt.skip_tol >= 0,
          "cvi: invalid options (max_iter, block_size, max_newton, max_damping >= 0; "
          "skip_tol >= 0)");
  for (index_t i = 0; i < L * N; ++i) {
    require(std::isfinite(alpha[i]), "cvi: alpha has a non-finite entry");
    require(std::isfinite(lambda[i]), "cvi: lambda has a non-finite entry");
  }
  for (index_t l = 0; l < L; ++l) require(std::isfinite(mean[l]), "cvi: mean must be finite");
  const auto NN = static_cast<std::size_t>(N * N);
  V.resize(static_cast<std::size_t>(L) * NN);
  m.resize(static_cast<std::size_t>(L * N));
  v.resize(static_cast<std::size_t>(L * N));
  logdet.assign(static_cast<std::size_t>(L), 0.0);
  f.resize(static_cast<std::size_t>(N));
  dm.resize(m.size());
  dv.resize(m.size());
  d2m.resize(m.size());
}

void State::compute_mean(index_t l) {
  double* ml = m.data() + l * N;
  std::fill(ml, ml + N, mean[l]);
  blas::symv(Uplo::Lower, 1.0, Sigma, alpha + l * N, 1.0, ml);
  count.add(2.0 * static_cast<double>(N) * N);
}

void State::refresh_variances(index_t l) {
  const MatrixView Vl = V_of(l);
  for (index_t i = 0; i < N; ++i) v[l * N + i] = Vl(i, i);
}

// ---- the driver

Inference::Inference(const LocalBound& lb, const double* y, ConstMatrixView Sigma,
                     const double* mean, double* alpha, double* lambda, const Options& opt)
    : state_(lb, y, Sigma, mean, alpha, lambda, opt),
      sweep_(state_),
      means_(state_),
      start_(Clock::now()) {
  warm_ = sweep_.build_V();
  // (from warm starts only for the multinomial bound: cvi.hpp)
  coupled_ = opt.coupled_means && (lb.type == LocalBoundType::Multinomial || !warm_);
}

Result Inference::run() {
  const Options& opt = state_.opt;
  const index_t LN = state_.L * state_.N;
  // From a warm start (lambda != 0) the means are refitted to the prior first: the sweep
  // that follows then sees means close to their new optimum.
  const bool warm_means = warm_ && opt.max_iter > 0 && means_.update_means();
  double bound = evaluate();
  record(bound);
  // A warm start that the site residuals already call converged needs no sweep.
  if (warm_means && 4.0 * sweep_gain_estimate() <= opt.tol * std::max(1.0, std::fabs(bound)))
    result_.converged = true;
  Buffer saved_V, saved_lambda, saved_logdet, saved_residual;
  Buffer saved_alpha, saved_m;
  for (int it = 1; it <= opt.max_iter && !result_.converged; ++it) {
    const double previous = bound;
    saved_V = state_.V;
    saved_lambda.assign(state_.lambda, state_.lambda + LN);
    saved_logdet = state_.logdet;
    saved_residual = state_.residual;  // r at the saved point, left by evaluate()
    state_.count.add(static_cast<double>(state_.V.size()));
    auto restore = [&] {
      state_.V = saved_V;
      std::copy(saved_lambda.begin(), saved_lambda.end(), state_.lambda);
      state_.logdet = saved_logdet;
      for (index_t l = 0; l < state_.L; ++l) state_.refresh_variances(l);
    };
    // A coupled iteration (cvi.hpp): the means' step that anticipates the sweep, then the
    // sweep; undone (means included) if the bound ends below where it was.
    // (slow: the last iteration gained at least kCoupledRate times the one before; for the
    // multinomial bound each of the last two at least kCoupledRateMultinomial times its own)
    const bool slow =
        state_.lb.type == LocalBoundType::Multinomial
            ? gains_[2] > 0.0 && gains_[1] >= kCoupledRateMultinomial * gains_[2] &&
                  gains_[0] >= kCoupledRateMultinomial * gains_[1]
            : gains_[1] > 0.0 && gains_[0] >= kCoupledRate * gains_[1];
    bool kept = false;
    int refused_before = sweep_.refused_solves();
    if (coupled_ && (coupling_ || slow)) {
      coupling_ = true;
      saved_alpha.assign(state_.alpha, state_.alpha + LN);
      saved_m = state_.m;
      if (means_.coupled_step()) {
        sweep_.solve_sites(1.0, false);
        const double after = evaluate();
        kept = after >= previous - slack(previous);
        if (kept) {
          bound = after;
          ++result_.coupled_steps;
        }
      }
      if (!kept) {  // (also where GMRES did not converge)
        coupling_ = false;
        if (++result_.undone_coupled_steps >= kMaxUndoneCoupled) coupled_ = false;
        restore();
        std::copy(saved_alpha.begin(), saved_alpha.end(), state_.alpha);
        state_.m = saved_m;
        bound = evaluate();
        refused_before = sweep_.refused_solves();
      }
    }
    bool clean = kept && sweep_.refused_solves() == refused_before, means_done = true;
    if (!kept) {
      // (a) the variances, guarded: a sweep that lowers the bound is undone and repeated
      // with damped site updates (rho = 1/2, 1/4), then replaced by steps along the
      // residuals.
      bool moved = false;
      for (int attempt = 0; attempt <= opt.max_damping; ++attempt) {
        if (attempt > 0) {
          restore();
          ++result_.damped_sweeps;
        }
        if (attempt < kDampedSweeps) {
          const double rho = std::ldexp(1.0, -attempt);
          sweep_.solve_sites(rho, true);
        } else {
          sweep_.residual_step(std::ldexp(1.0, kDampedSweeps - 1 - attempt), saved_residual);
        }
        const double after = evaluate();
        if (after >= previous - slack(previous)) {
          bound = after;
          moved = true;
          break;
        }
      }
      if (!moved) {  // keep the variances as they were
        restore();
        bound = evaluate();
      }
      clean = moved && sweep_.refused_solves() == refused_before;
      // (b) the means by Newton's method (monotone by its line search).
      means_done = means_.update_means();
      bound = evaluate();
    }
    result_.iterations = it;
    record(bound);
    gains_[2] = gains_[1];
    gains_[1] = gains_[0];
    gains_[0] = bound - previous;
    const double target = opt.tol * std::max(1.0, std::fabs(bound));
    // (the sites' estimate of the next iteration's gain assumes means at their optimum for
    // the current lambda, which Newton's steps leave and a coupled iteration does not: a
    // Poisson run stopped on it 2e-8 short of the optimum at tol = 1e-12)
    if (means_done &&
        (bound - previous <= target || (!kept && 4.0 * sweep_gain_estimate() <= target))) {
      // A step that could not move the variances, or refused some, or leaves sites that
      // would still change their variance by a percent, or means off eq. (7) by a percent,
      // is a stall (the relative target means little once the bound itself is off by orders
      // of magnitude: Newton's steps on means with rates e^38 gain nothing measurable).
      const bool stationary =
          clean && largest_site_step() <= 0.01 && largest_mean_residual() <= 0.01;
      // An update that changed a variance by a large factor (either way) leaves errors in V
      // (from a start with rates e^38, a factor ~1e17: the bound carried along was -23.9
      // where V rebuilt from lambda gives -10.1). Past kChangeLimit, V is rebuilt; the
      // iterations go on from the rebuilt bound unless it agrees with the one carried
      // along, and a run that needs more than kMaxRebuilds, or whose lambda leaves V no
      // digits, is a stall.
      bool trusted = sweep_.max_change() <= kChangeLimit;
      if (stationary && !trusted && rebuilds_ < kMaxRebuilds) {
        ++rebuilds_;
        sweep_.reset_max_change();
        saved_V = state_.V;
        saved_lambda.assign(state_.lambda, state_.lambda + LN);
        saved_logdet = state_.logdet;
        try {
          sweep_.build_V();
        } catch (const LinAlgError&) {
          restore();
          bound = evaluate();
          break;
        }
        const double rebuilt = evaluate();
        // (agreement to 1e-10 relative at least: a rebuild from lambda Sigma_ii ~ 1e9 is
        // itself only that accurate, and asking for tol = 1e-12 stalled such runs)
        if (!(std::fabs(rebuilt - bound) <= std::max(target, 1e-10 * std::fabs(bound)))) {
          bound = rebuilt;
          continue;
        }
        trusted = true;
      }
      result_.converged = stationary && trusted;
      break;
    }
  }
  result_.bound = bound;
  result_.bracketed_solves = sweep_.bracketed_solves();
  result_.refused_solves = sweep_.refused_solves();
  residuals();
  result_.flops = state_.count.flops;
  result_.bound_evaluations = state_.count.evaluations;
  return result_;
}

void Inference::record(double bound) {
  if (!state_.opt.record_history) return;
  const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  result_.history.push_back({bound, state_.count.flops, state_.count.evaluations, seconds});
}

// The bound at (m, v): sum_n f_b + sum_l 1/2 [-log|I + Lambda_l Sigma| + lambda_l . v_l
// - alpha_l . (m_l - mean_l)]; also leaves f_b's derivatives and the site residuals
// r = lambda + 2 g^v in the state.
double Inference::evaluate() {
  const index_t N = state_.N, L = state_.L;
  local_bounds(state_.lb, state_.y, N, state_.m.data(), state_.v.data(), state_.f.data(),
               state_.dm.data(), state_.dv.data(), state_.d2m.data(), nullptr);
  state_.count.evaluate(static_cast<double>(N * L));
  Buffer& residual = state_.residual;
  residual.resize(state_.m.size());
  for (std::size_t i = 0; i < state_.m.size(); ++i)
    residual[i] = state_.lambda[i] + 2.0 * state_.dv[i];
  double bound = fixed_order_sum(state_.f.data(), N);
  for (index_t l = 0; l < L; ++l)
    bound += minus_kl(state_.Sigma, l, N, state_.logdet[l], state_.lambda + l * N,
                      state_.v.data() + l * N, state_.alpha + l * N, state_.m.data() + l * N,
                      state_.mean[l]);
  return bound;
}

// What the next sweep would gain, from the site residuals r = lambda + 2 g^v at the current
// (m, v) (left in the state by evaluate()): the scalar objective of site i is about
// -(v - v*)^2 / (2 v^2) near its maximum and v r is about the relative change of v, so the
// sweep gains about sum_i (v_i r_i)^2 / 4 (the bound carries phi / 2). Measured, a whole outer
// iteration gains 2 to 4 times this (the m-step gains too), hence the factor 4 where it is used.
double Inference::sweep_gain_estimate() const {
  double gain = 0.0;
  for (index_t i = 0; i < state_.L * state_.N; ++i) {
    const double d = state_.v[i] * state_.residual[i];
    gain += 0.25 * d * d;
  }
  return gain;
}

// max_i |v_i r_i|: about the largest relative change of a variance that another sweep makes.
double Inference::largest_site_step() const {
  double step = 0.0;
  for (index_t i = 0; i < state_.L * state_.N; ++i)
    step = std::max(step, std::fabs(state_.v[i] * state_.residual[i]));
  return step;
}

// max_i |alpha_i - dm_i| / max(1, |dm_i|): how far the means are from eq. (7), relative.
double Inference::largest_mean_residual() const {
  const double *alpha = state_.alpha, *dm = state_.dm.data();
  double r = 0.0;
  for (index_t i = 0; i < state_.L * state_.N; ++i)
    r = std::max(r, std::fabs(alpha[i] - dm[i]) / std::max(1.0, std::fabs(dm[i])));
  return r;
}

// Stationarity residuals of eqs. (7)-(8) at the end.
void Inference::residuals() {
  local_bounds(state_.lb, state_.y, state_.N, state_.m.data(), state_.v.data(), state_.f.data(),
               state_.dm.data(), state_.dv.data(), state_.d2m.data(), nullptr);
  for (index_t i = 0; i < state_.L * state_.N; ++i) {
    result_.max_residual_alpha =
        std::max(result_.max_residual_alpha, std::fabs(state_.alpha[i] - state_.dm[i]));
    result_.max_residual_lambda =
        std::max(result_.max_residual_lambda, std::fabs(state_.lambda[i] + 2.0 * state_.dv[i]));
  }
}

}  // namespace pygpfast::cvi::detail
