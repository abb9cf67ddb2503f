// Concave variational inference (seed 004, Algorithm 1): see cvi.hpp for the method.
#include "pygpfast/cvi/cvi.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "pygpfast/blas.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/linalg.hpp"
#include "pygpfast/threads.hpp"
#include "pygpfast/workspace.hpp"

namespace pygpfast::cvi {
namespace {

using blas::Diag;
using blas::Side;
using blas::Trans;
using blas::Uplo;
using linalg::fixed_order_sum;
using linalg::mirror_lower;
using workspace::Buffer;
using Clock = std::chrono::steady_clock;

// The sweeps' rank-b updates of V (Inference::add_lower_update): column panels of N / 8
// columns within these bounds, and threads only for updates of at least this many flops
// (b N^2: 2.6e8 at N = 2000 and b = 64).
constexpr index_t kMinUpdatePanel = 64, kMaxUpdatePanel = 256;
constexpr double kParallelUpdateFlops = 3e7;

// Options::block_size = 0: rank-32 blocks below this many points, 64 from there. A block of b
// coordinates costs an O(b^2 N) recursion before its rank-b BLAS-3 update, which at small N
// outweighs what the longer update gains (fixed-kernel inferences, the same iterations and
// bound, 2 threads, 2026-11-25: scikit-learn's digits, N = 450 and ten classes, 3.3 to 3.9 s
// with 32 against 4.1 to 5.0 s with 64, the hyperparameter search 48 to 52 s against 54 to
// 65 s; three classes at N = 1000 3.3 to 3.8 s against 3.9 to 4.1 s; logit at N = 700 and
// 2000 the same either way; 128 at N = 450 three times slower than 64).
constexpr index_t kSmallBlocksBelow = 1500;

// Problems of fewer points run on one thread, BLAS included (SingleThreadScope): their O(N^2)
// BLAS-2 calls and small factorisations are too short to pay for waking a second thread
// (measured on a shared 2-core machine: 50x slower with two threads at N = 60, 25x at N = 280).
constexpr index_t kOneThreadBelow = 512;

// Work counted for Result::flops and Result::bound_evaluations.
struct Counter {
  double flops = 0.0;
  double evaluations = 0.0;
  void add(double f) { flops += f; }
  void evaluate(double points) { evaluations += points; }
};

void check_sigma(ConstMatrixView Sigma) {
  require(Sigma.rows == Sigma.cols, "cvi: Sigma must be square, got ", Sigma.rows, "x", Sigma.cols);
  require(Sigma.rows >= 1, "cvi: need at least one data point");
  for (index_t i = 0; i < Sigma.rows; ++i)
    for (index_t j = 0; j <= i; ++j)
      if (!std::isfinite(Sigma(i, j)))
        throw std::invalid_argument("cvi: Sigma has a non-finite entry at (" + std::to_string(i) +
                                    ", " + std::to_string(j) + ")");
}

// Past this lambda_i Sigma_ii, V computed from the site precisions (by rank-one updates, or from
// the Cholesky factor of B = I + Lambda^1/2 Sigma Lambda^1/2) has lost half its digits, and a
// failure there is the site precisions' doing more likely than the kernel's.
constexpr double kLargeSitePrecision = 1e8;

// The hint of a LinAlgError for a posterior precision or covariance found not positive definite,
// from the largest lambda_i Sigma_ii (lambda_i = weight[i]^2 when `squared`, else weight[i]).
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

// B = I + diag(s) Sigma diag(s) (lower triangle) and its lower Cholesky factor in place, with
// its flops counted. B >= I when Sigma is positive semi-definite; with `jitter` a B that
// rounding made indefinite is factorised with jitter (fine for a Newton direction, which the
// line search checks), otherwise that is a LinAlgError.
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
// without them; the GMRES tolerance (relative residual; 1e-6 and 1e-4 left 7 and 33 iterations
// undone on those problems), budget of products and restart length; the relative step of the
// central differences for F_mv and F_vv. Warm starts (lambda != 0) run Algorithm 1 alone: there
// its sweeps move few sites (the flops of a sweep follow the sites that move), while after a
// coupled step all of them move; in the searches of the estimators, where every inference but
// the first is warm, coupled steps took 417 to 524 iterations instead of 624 but 1.35 to 1.64
// times the flops (stick-breaking on scikit-learn's digits, N = 450, L = 9).
constexpr double kCoupledRate = 0.05;
// The multinomial bound's coupled iteration costs about twice one of Algorithm 1 (its step is
// a sweep's L N^3 flops); it is tried once each of the last two iterations gained at least
// this fraction of the one before. With the test above instead, a three-class fit (N = 600,
// 40 inferences) took 164 GFLOP where this test and Algorithm 1 alone take 139 (coupled steps
// where Algorithm 1 converges in 5 to 9 iterations anyway), and a ten-class fit on
// scikit-learn's digits 5.5e11 flops where this test takes 6.6e11 (Algorithm 1 alone 8.3e11).
constexpr double kCoupledRateMultinomial = 0.5;
constexpr int kMaxUndoneCoupled = 2;
constexpr double kCoupledSolveTol = 1e-9;
constexpr int kCoupledMaxProducts = 300, kCoupledRestart = 50;
constexpr double kSecondDerivativeStep = 1e-4;
// The multinomial bound's trust region: no mean moves by more than this in one coupled step.
// Chosen with the 5% test above: on glass (9 settings, cold and warm at 1.1 times the variance)
// and six synthetic problems, 1790 iterations and 67.1 GFLOP for Algorithm 1; with limits 1 to
// 6: 819, 570, 487, 458, 540, 892 iterations (34.4, 24.4, 21.6, 20.5, 25.5, 34.5 GFLOP), 0 to
// 12 of them undone; without a limit 1429 (cold starts at large variance undid their first two
// and went on alone).
constexpr double kMultinomialStepLimit = 3.0;

// Restarted GMRES (modified Gram-Schmidt, Givens rotations) for A x = b from x = 0, with
// `apply(x, y)` computing y = A x. Returns whether |b - A x| <= tol |b| was reached within
// max_products products; `products` receives their number, and `flops` the flops of GMRES's
// own vector work (the products' are the caller's to count).
template <class Apply>
bool gmres(index_t n, const Apply& apply, const double* b, double* x, double tol, int restart,
           int max_products, int& products, double& flops) {
  products = 0;
  const auto dn = static_cast<double>(n);
  flops = 2.0 * dn;
  std::fill(x, x + n, 0.0);
  double bnorm = 0.0;
  for (index_t i = 0; i < n; ++i) bnorm += b[i] * b[i];
  bnorm = std::sqrt(bnorm);
  if (bnorm == 0.0) return true;
  const auto m = static_cast<std::size_t>(restart);
  Buffer Q((m + 1) * static_cast<std::size_t>(n)), H((m + 1) * m), cs(m), sn(m), g(m + 1), w(n);
  while (products < max_products) {
    // r = b - A x into Q's first row
    double* q0 = Q.data();
    if (products == 0) {
      std::copy(b, b + n, q0);
    } else {
      apply(x, w.data());
      ++products;
      for (index_t i = 0; i < n; ++i) q0[i] = b[i] - w[i];
      flops += dn;
    }
    flops += 3.0 * dn;  // (beta and the scaling)
    double beta = 0.0;
    for (index_t i = 0; i < n; ++i) beta += q0[i] * q0[i];
    beta = std::sqrt(beta);
    if (!std::isfinite(beta)) return false;
    if (beta <= tol * bnorm) return true;
    for (index_t i = 0; i < n; ++i) q0[i] /= beta;
    std::fill(g.begin(), g.end(), 0.0);
    g[0] = beta;
    std::size_t k = 0;
    bool done = false;
    for (; k < m && products < max_products; ++k) {
      double* qk1 = Q.data() + (k + 1) * n;
      apply(Q.data() + k * n, qk1);
      ++products;
      for (std::size_t j = 0; j <= k; ++j) {
        const double* qj = Q.data() + j * n;
        double h = 0.0;
        for (index_t i = 0; i < n; ++i) h += qj[i] * qk1[i];
        H[j * m + k] = h;
        for (index_t i = 0; i < n; ++i) qk1[i] -= h * qj[i];
      }
      double h1 = 0.0;
      for (index_t i = 0; i < n; ++i) h1 += qk1[i] * qk1[i];
      h1 = std::sqrt(h1);
      if (h1 > 0.0)
        for (index_t i = 0; i < n; ++i) qk1[i] /= h1;
      flops += 4.0 * dn * static_cast<double>(k + 1) + 3.0 * dn + 6.0 * static_cast<double>(k) + 8.0;
      for (std::size_t j = 0; j < k; ++j) {  // earlier rotations on column k
        const double a = H[j * m + k], c = H[(j + 1) * m + k];
        H[j * m + k] = cs[j] * a + sn[j] * c;
        H[(j + 1) * m + k] = -sn[j] * a + cs[j] * c;
      }
      const double a = H[k * m + k], r = std::hypot(a, h1);
      if (!(r > 0.0) || !std::isfinite(r)) return false;
      cs[k] = a / r;
      sn[k] = h1 / r;
      H[k * m + k] = r;
      g[k + 1] = -sn[k] * g[k];
      g[k] = cs[k] * g[k];
      if (std::fabs(g[k + 1]) <= tol * bnorm || h1 == 0.0) {
        ++k;
        done = true;
        break;
      }
    }
    // x += Q^T y with H[:k, :k] y = g[:k] (upper triangular)
    Buffer yk(k);
    for (std::size_t j = k; j-- > 0;) {
      double t = g[j];
      for (std::size_t i = j + 1; i < k; ++i) t -= H[j * m + i] * yk[i];
      yk[j] = t / H[j * m + j];
    }
    for (std::size_t j = 0; j < k; ++j)
      for (index_t i = 0; i < n; ++i) x[i] += yk[j] * Q[j * n + i];
    flops += static_cast<double>(k * k) + 2.0 * dn * static_cast<double>(k);
    if (done) return true;
  }
  return false;
}

// The inference state: the caller's alpha and lambda [L, N], m and v [L, N], V_l [N, N] (the
// lower triangles are kept current) and log|I + Lambda_l Sigma| per latent function.
class Inference {
 public:
  Inference(const LocalBound& lb, const double* y, ConstMatrixView Sigma, const double* mean,
            double* alpha, double* lambda, const Options& opt)
      : lb_(lb), y_(y), Sigma_(Sigma), mean_(mean), alpha_(alpha), lambda_(lambda), opt_(opt),
        N_(Sigma.rows), L_(lb.num_latent()) {
    validate(lb);
    check_sigma(Sigma);
    check_labels(lb, y, N_);
    require(opt.max_iter >= 0 && opt.block_size >= 0 && opt.max_newton >= 0 &&
                opt.max_damping >= 0 && !std::isnan(opt.tol) && opt.skip_tol >= 0,
            "cvi: invalid options (max_iter, block_size, max_newton, max_damping >= 0; "
            "skip_tol >= 0)");
    for (index_t i = 0; i < L_ * N_; ++i) {
      require(std::isfinite(alpha[i]), "cvi: alpha has a non-finite entry");
      require(std::isfinite(lambda[i]), "cvi: lambda has a non-finite entry");
    }
    for (index_t l = 0; l < L_; ++l) require(std::isfinite(mean[l]), "cvi: mean must be finite");
    const auto NN = static_cast<std::size_t>(N_ * N_);
    V_.resize(static_cast<std::size_t>(L_) * NN);
    m_.resize(static_cast<std::size_t>(L_ * N_));
    v_.resize(static_cast<std::size_t>(L_ * N_));
    logdet_.assign(static_cast<std::size_t>(L_), 0.0);
    f_.resize(static_cast<std::size_t>(N_));
    dm_.resize(m_.size());
    dv_.resize(m_.size());
    d2m_.resize(m_.size());
    start_ = Clock::now();
    warm_ = build_V();
    // (from warm starts only for the multinomial bound: cvi.hpp)
    coupled_ = opt.coupled_means && (lb.type == LocalBoundType::Multinomial || !warm_);
  }

  Result run() {
    // From a warm start (lambda != 0) the means are refitted to the prior first: the sweep
    // that follows then sees means close to their new optimum.
    const bool warm_means = warm_ && opt_.max_iter > 0 && update_means();
    double bound = evaluate();
    record(bound);
    // A warm start that the site residuals already call converged needs no sweep.
    if (warm_means && 4.0 * sweep_gain_estimate() <= opt_.tol * std::max(1.0, std::fabs(bound)))
      result_.converged = true;
    Buffer saved_V, saved_lambda, saved_logdet, saved_residual;
    Buffer saved_alpha, saved_m;
    for (int it = 1; it <= opt_.max_iter && !result_.converged; ++it) {
      const double previous = bound;
      saved_V = V_;
      saved_lambda.assign(lambda_, lambda_ + L_ * N_);
      saved_logdet = logdet_;
      saved_residual = residual_;  // r at the saved point, left by evaluate()
      count_.add(static_cast<double>(V_.size()));
      auto restore = [&] {
        V_ = saved_V;
        std::copy(saved_lambda.begin(), saved_lambda.end(), lambda_);
        logdet_ = saved_logdet;
        for (index_t l = 0; l < L_; ++l) refresh_variances(l);
      };
      // A coupled iteration (cvi.hpp): the means' step that anticipates the sweep, then the
      // sweep; undone (means included) if the bound ends below where it was.
      // (slow: the last iteration gained at least kCoupledRate times the one before; for the
      // multinomial bound each of the last two at least kCoupledRateMultinomial times its own)
      const bool slow =
          lb_.type == LocalBoundType::Multinomial
              ? gains_[2] > 0.0 && gains_[1] >= kCoupledRateMultinomial * gains_[2] &&
                    gains_[0] >= kCoupledRateMultinomial * gains_[1]
              : gains_[1] > 0.0 && gains_[0] >= kCoupledRate * gains_[1];
      bool kept = false;
      int refused_before = result_.refused_solves;
      if (coupled_ && (coupling_ || slow)) {
        coupling_ = true;
        saved_alpha.assign(alpha_, alpha_ + L_ * N_);
        saved_m = m_;
        if (coupled_step()) {
          for (index_t l = 0; l < L_; ++l)
            sweep(l, [&](index_t i, double v_old, double c) {
              return solve_site(l, i, v_old, c, 1.0, false);
            });
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
          std::copy(saved_alpha.begin(), saved_alpha.end(), alpha_);
          m_ = saved_m;
          bound = evaluate();
          refused_before = result_.refused_solves;
        }
      }
      bool clean = kept && result_.refused_solves == refused_before, means_done = true;
      if (!kept) {
        // (a) the variances, guarded: a sweep that lowers the bound is undone and repeated
        // with damped site updates (rho = 1/2, 1/4), then replaced by steps along the
        // residuals.
        bool moved = false;
        for (int attempt = 0; attempt <= opt_.max_damping; ++attempt) {
          if (attempt > 0) {
            restore();
            ++result_.damped_sweeps;
          }
          if (attempt < kDampedSweeps) {
            const double rho = std::ldexp(1.0, -attempt);
            for (index_t l = 0; l < L_; ++l)
              sweep(l, [&](index_t i, double v_old, double c) {
                return solve_site(l, i, v_old, c, rho, true);
              });
          } else {
            residual_step(std::ldexp(1.0, kDampedSweeps - 1 - attempt), saved_residual);
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
        clean = moved && result_.refused_solves == refused_before;
        // (b) the means by Newton's method (monotone by its line search).
        means_done = update_means();
        bound = evaluate();
      }
      result_.iterations = it;
      record(bound);
      gains_[2] = gains_[1];
      gains_[1] = gains_[0];
      gains_[0] = bound - previous;
      const double target = opt_.tol * std::max(1.0, std::fabs(bound));
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
        bool trusted = max_change_ <= kChangeLimit;
        if (stationary && !trusted && rebuilds_ < kMaxRebuilds) {
          ++rebuilds_;
          max_change_ = 1.0;
          saved_V = V_;
          saved_lambda.assign(lambda_, lambda_ + L_ * N_);
          saved_logdet = logdet_;
          try {
            build_V();
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
    residuals();
    result_.flops = count_.flops;
    result_.bound_evaluations = count_.evaluations;
    return result_;
  }

  index_t N() const { return N_; }
  index_t L() const { return L_; }
  MatrixView V_of(index_t l) { return MatrixView(V_.data() + l * N_ * N_, N_, N_); }
  const Buffer& m() const { return m_; }
  const Buffer& v() const { return v_; }

 private:
  // Rounding slack when comparing bounds.
  static double slack(double bound) { return 1e-12 * std::max(1.0, std::fabs(bound)); }

  void record(double bound) {
    if (!opt_.record_history) return;
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    result_.history.push_back({bound, count_.flops, count_.evaluations, seconds});
  }

  // m_l = mean_l + Sigma alpha_l
  void compute_mean(index_t l) {
    double* m = m_.data() + l * N_;
    std::fill(m, m + N_, mean_[l]);
    blas::symv(Uplo::Lower, 1.0, Sigma_, alpha_ + l * N_, 1.0, m);
    count_.add(2.0 * static_cast<double>(N_) * N_);
  }

  void refresh_variances(index_t l) {
    const MatrixView V = V_of(l);
    for (index_t i = 0; i < N_; ++i) v_[l * N_ + i] = V(i, i);
  }

  // V_l = (Omega + Lambda_l)^-1 from V_l = Sigma by rank-one updates that set each lambda_i
  // from 0 to its current value, and the means from alpha. Returns whether any lambda_i != 0.
  bool build_V() {
    const Buffer target(lambda_, lambda_ + L_ * N_);
    std::fill(lambda_, lambda_ + L_ * N_, 0.0);
    std::fill(logdet_.begin(), logdet_.end(), 0.0);
    bool any = false;
    for (index_t l = 0; l < L_; ++l) {
      MatrixView V = V_of(l);
      for (index_t i = 0; i < N_; ++i) std::copy(Sigma_.row(i), Sigma_.row(i) + N_, V.row(i));
      const double* t = target.data() + l * N_;
      const bool nonzero = std::any_of(t, t + N_, [](double x) { return x != 0.0; });
      any = any || nonzero;
      if (nonzero)
        sweep(l, [&](index_t i, double /*v_old*/, double c) {
          if (!(c + t[i] > 0.0))
            throw LinAlgError("cvi", static_cast<int>(i + 1),
                              "the starting site precisions do not give a positive-definite "
                              "posterior precision Omega + Lambda (site " +
                                  std::to_string(i) + "); start from lambda = 0");
          return 1.0 / (c + t[i]);
        });
      else
        refresh_variances(l);
      compute_mean(l);
    }
    return any;
  }

  // The bound at (m, v): sum_n f_b + sum_l 1/2 [-log|I + Lambda_l Sigma| + lambda_l . v_l
  // - alpha_l . (m_l - mean_l)]; also leaves f_b's derivatives in dm_, dv_, d2m_.
  double evaluate() {
    local_bounds(lb_, y_, N_, m_.data(), v_.data(), f_.data(), dm_.data(), dv_.data(), d2m_.data(),
                 nullptr);
    count_.evaluate(static_cast<double>(N_ * L_));
    residual_.resize(m_.size());
    for (std::size_t i = 0; i < m_.size(); ++i) residual_[i] = lambda_[i] + 2.0 * dv_[i];
    double bound = fixed_order_sum(f_.data(), N_);
    for (index_t l = 0; l < L_; ++l) {
      const double *a = alpha_ + l * N_, *lam = lambda_ + l * N_;
      const double *m = m_.data() + l * N_, *v = v_.data() + l * N_;
      double s = -logdet_[l];
      for (index_t n = 0; n < N_; ++n) s += lam[n] * v[n] - a[n] * (m[n] - mean_[l]);
      bound += 0.5 * s;
    }
    return bound;
  }

  // One pass over the coordinates of latent l. For coordinate i the rule maps (i, v_old, c)
  // to the new marginal variance v (c = 1/v_old - lambda_i is held); then lambda_i = 1/v - c
  // and V += (v - v_old)/v_old^2 V[:, i] V[:, i]^T (eqs. 19-20). Blocked as in cvi.hpp: the
  // columns u_t = V[:, j_t] at the time of their update are W0 c_t for the block's starting
  // columns W0 = V[:, J], with c_t = e_t + sum_{r<t} s_r u_r[j_t] c_r, so the block's
  // updates add U diag(s) U^T with U = W0 [c_0 .. c_{b-1}].
  template <class Rule>
  void sweep(index_t l, Rule&& rule) {
    const index_t N = N_,
                  b = std::min(opt_.block_size > 0 ? opt_.block_size : N < kSmallBlocksBelow ? 32 : 64, N);
    MatrixView V = V_of(l);
    double* lam = lambda_ + l * N;
    double& logdet = logdet_[l];
    // Applies the rule to coordinate i with current variance v_old; returns s.
    auto update = [&](index_t i, double v_old) {
      if (!(v_old > 0.0))
        throw LinAlgError("cvi", static_cast<int>(i + 1),
                          "the posterior covariance lost positive definiteness at point " +
                              std::to_string(i) + " (a variance rounded to <= 0 in the rank-one "
                              "updates of V): " + not_positive_definite_hint(Sigma_, lam, false));
      const double c = 1.0 / v_old - lam[i];
      const double v_new = rule(i, v_old, c);
      lam[i] = 1.0 / v_new - c;
      logdet += std::log(v_old / v_new);
      max_change_ = std::max(max_change_, std::max(v_old / v_new, v_new / v_old));
      return (v_new - v_old) / (v_old * v_old);
    };
    if (b == 1) {  // the literal algorithm: one BLAS-2 rank-one update (DSYR) per coordinate
      Buffer u(static_cast<std::size_t>(N));
      for (index_t i = 0; i < N; ++i) {
        for (index_t p = 0; p < N; ++p) u[p] = p <= i ? V(i, p) : V(p, i);
        const double s = update(i, u[i]);
        if (s != 0.0) blas::syr(Uplo::Lower, s, u.data(), V);
        count_.add(static_cast<double>(N) * N);
      }
      refresh_variances(l);
      return;
    }
    Buffer W0(static_cast<std::size_t>(b * N));
    Buffer G(static_cast<std::size_t>(b * b)), Cm(static_cast<std::size_t>(b * b));
    Buffer Ub(static_cast<std::size_t>(b * b)), s(static_cast<std::size_t>(b));
    Buffer U(static_cast<std::size_t>(b * N)), R(static_cast<std::size_t>(b * N)),
        Us(static_cast<std::size_t>(b * N));
    for (index_t J0 = 0; J0 < N; J0 += b) {
      const index_t nb = std::min(b, N - J0);
      // W0 row t = column J0 + t of V, read from the lower triangle; G = V[J, J].
      for (index_t t = 0; t < nb; ++t) {
        const index_t j = J0 + t;
        double* w = W0.data() + t * N;
        std::copy(V.row(j), V.row(j) + j + 1, w);
        for (index_t p = j + 1; p < N; ++p) w[p] = V(p, j);
      }
      for (index_t t = 0; t < nb; ++t)
        for (index_t r = 0; r < nb; ++r) G[t * nb + r] = W0[t * N + J0 + r];
      std::fill(Cm.begin(), Cm.begin() + nb * nb, 0.0);  // Cm[r * nb + t] = (c_t)_r
      for (index_t t = 0; t < nb; ++t) {
        s[t] = update(J0 + t, G[t * nb + t]);
        for (index_t r = 0; r < nb; ++r) Ub[r * nb + t] = G[r * nb + t];  // u_t on the block
        Cm[t * nb + t] = 1.0;
        for (index_t q = 0; q < t; ++q) {
          const double w = s[q] * Ub[t * nb + q];
          if (w != 0.0)
            for (index_t r = 0; r < nb; ++r) Cm[r * nb + t] += w * Cm[r * nb + q];
        }
        if (s[t] != 0.0)
          for (index_t r = 0; r < nb; ++r) {
            const double w = s[t] * Ub[r * nb + t];
            for (index_t q = 0; q < nb; ++q) G[r * nb + q] += w * Ub[q * nb + t];
          }
      }
      // U rows = c_t^T W0 (U = Cm^T W0), then V_lower += U^T diag(s) U over the rows with
      // s != 0 (moved to the front, with s u_t in Us).
      {
        const SingleThreadScope small_product(true);
        blas::gemm(Trans::Yes, Trans::No, 1.0, ConstMatrixView(Cm.data(), nb, nb),
                   ConstMatrixView(W0.data(), nb, N), 0.0, MatrixView(U.data(), nb, N));
      }
      index_t k = 0;
      for (index_t t = 0; t < nb; ++t) {
        if (s[t] == 0.0) continue;
        if (k != t) std::copy(U.data() + t * N, U.data() + (t + 1) * N, U.data() + k * N);
        s[k++] = s[t];
      }
      add_lower_update(V, U.data(), s.data(), k, R.data(), Us.data());
      count_.add(2.0 * static_cast<double>(nb) * nb * N + 4.0 * static_cast<double>(nb) * nb * nb);
    }
    refresh_variances(l);
  }

  // V's lower triangle += U^T diag(s) U for the rows U [k, N] (row-major, leading dimension N;
  // s != 0), with scratch R, W [k, N]: R's rows are sqrt(s) u (s > 0) then sqrt(-s) u (s < 0),
  // so that the update is R+^T R+ - R-^T R-, and W = diag(s) U.
  //  * Updates of at least kParallelUpdateFlops: column panels of N / 8 columns (within
  //    [kMinUpdatePanel, kMaxUpdatePanel]), each its diagonal block by two SYRKs and the rows
  //    below by one GEMM. The threads take the panels dynamically, each with single-threaded
  //    BLAS: with a core taken by another process the free thread does most of them, where a
  //    BLAS call split in halves waits for its descheduled half. The panels are the same on any
  //    number of threads, and so is the result.
  //  * Smaller ones: two SYRKs on all of V.
  void add_lower_update(MatrixView V, const double* U, const double* s, index_t k, double* R,
                        double* W) {
    if (k == 0) return;
    const index_t N = V.rows;
    index_t np = 0;
    for (index_t t = 0; t < k; ++t) np += s[t] > 0.0;
    for (index_t t = 0, ip = 0, in = np; t < k; ++t) {
      const double root = std::sqrt(std::fabs(s[t]));
      double* dst = R + (s[t] > 0.0 ? ip++ : in++) * N;
      for (index_t p = 0; p < N; ++p) dst[p] = root * U[t * N + p];
    }
    count_.add(static_cast<double>(k) * N * N);
    // The lower triangle of V[c0:c0+w, c0:c0+w] += R+^T R+ - R-^T R- on those columns.
    auto diagonal = [&](index_t c0, index_t w) {
      const MatrixView D(V.data + c0 * N + c0, w, w, N);
      if (np > 0) blas::syrk(Uplo::Lower, Trans::Yes, 1.0, ConstMatrixView(R + c0, np, w, N), 1.0, D);
      if (np < k)
        blas::syrk(Uplo::Lower, Trans::Yes, -1.0, ConstMatrixView(R + np * N + c0, k - np, w, N),
                   1.0, D);
    };
    const index_t width = std::clamp<index_t>(N / 8, kMinUpdatePanel, kMaxUpdatePanel);
    const index_t panels = (N + width - 1) / width;
    if (static_cast<double>(k) * N * N < kParallelUpdateFlops) {
      diagonal(0, N);
      return;
    }
    [[maybe_unused]] const int nt = threads_for_blas_calls(panels, 1);
    for (index_t t = 0; t < k; ++t)
      for (index_t p = 0; p < N; ++p) W[t * N + p] = s[t] * U[t * N + p];
    auto panel = [&](index_t q) {
      const index_t c0 = q * width, w = std::min(width, N - c0), below = c0 + w;
      diagonal(c0, w);
      if (below < N)
        blas::gemm(Trans::Yes, Trans::No, 1.0, ConstMatrixView(U + below, k, N - below, N),
                   ConstMatrixView(W + c0, k, w, N), 1.0,
                   MatrixView(V.data + below * N + c0, N - below, w, N));
    };
    if (nt == 1) {  // (no OpenMP region: see parallel_for)
      const SingleThreadScope serial_blas(true);
      for (index_t q = 0; q < panels; ++q) panel(q);
    } else {
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
#endif
      {
        const SingleThreadScope serial_blas(true);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (index_t q = 0; q < panels; ++q) panel(q);
      }
    }
  }

  // The scalar problem of coordinate (l, i) (eq. 16): maximise
  //   phi(v) = log v - c v + 2 f_b(v),   v phi'(v) = g(v) = 1 - v (c + lambda(v)),
  // lambda = -2 g^v. The fixed-point iteration v <- 1/(c + lambda(v)) always moves towards
  // the root of g (g > 0 makes the step go up), but it converges only linearly, slowly where
  // phi is flat (at large prior variances its rate is about 0.2 sqrt(v) for the logit bound),
  // and it can leave (0, inf). So in u = log v: the first step is the fixed-point step, later
  // ones secant steps along the same side (doubling when the secant does not point ahead),
  // and once g changes sign the root is bracketed and polished by the Illinois method (with
  // bisection steps where it stalls). A result with a lower phi than v_old is refused. With
  // rho < 1 the site precision moves by rho times its step; with may_skip a site whose variance
  // would change by at most skip_tol is left (below). Returns the new variance.
  double solve_site(index_t l, index_t i, double v_old, double c, double rho, bool may_skip) {
    const double* mi = m_.data() + i;
    const double* vi = v_.data() + i;
    SiteBound e{};
    auto g = [&](double u) {
      const double v = std::exp(u);
      count_.evaluate(1.0);
      e = site_bound(lb_, y_[i], mi, vi, N_, l, v);
      return 1.0 - v * (c + e.lambda);
    };
    auto phi = [&](double v) { return std::log(v) - c * v + 2.0 * e.value; };
    double u0 = std::log(v_old), g0 = g(u0);
    const double phi0 = phi(v_old);
    // phi is flat at its maximum: values that differ by the rounding of its terms are equal.
    const double noise =
        1e-13 * (1.0 + std::fabs(std::log(v_old)) + std::fabs(c * v_old) + 2.0 * std::fabs(e.value));
    // Where the site's bound overflows at v_old (a Poisson site from V = Sigma with Sigma_ii
    // past ~1420: e^(v/2) = inf, and the bound -inf), the search starts from a variance at
    // which it is finite (phi0 = -inf then accepts any finite result).
    for (int k = 0; k < 64 && !std::isfinite(g0); ++k) g0 = g(u0 -= 1.0);
    constexpr double kTol = 1e-14;
    double u = u0;
    if (std::fabs(g0) > kTol) {
      const double d = c + e.lambda;
      double u1 = d > 0.0 ? -std::log(d) : u0 + 1.0;
      double g1 = g(u1);
      int k = 0;
      for (; k < 200 && std::fabs(g1) > kTol && (g1 > 0.0) == (g0 > 0.0) &&
             std::fabs(u1 - u0) > kTol * std::max(1.0, std::fabs(u1));
           ++k) {
        const double step = u1 - u0;
        double u2 = u1 - g1 * step / (g1 - g0);
        const double ahead = (u2 - u1) / step;
        if (!(ahead > 0.0 && ahead <= 8.0)) u2 = u1 + 2.0 * step;
        u0 = u1;
        g0 = g1;
        u1 = u2;
        g1 = g(u1);
      }
      u = u1;
      if (std::fabs(g1) > kTol && (g1 > 0.0) != (g0 > 0.0)) {  // bracketed: Illinois
        ++result_.bracketed_solves;
        double a = u0, ga = g0, b = u1, gb = g1;
        int stalled = 0;  // consecutive steps that did not halve |g|
        for (k = 0; k < 200 && std::fabs(b - a) > kTol * std::max(1.0, std::fabs(b)); ++k) {
          // Across a wide bracket g can span hundreds of orders of magnitude (a Poisson site
          // from V = Sigma: e^(v/2) with v ~ 1000 at one end, O(1) at the other). The
          // interpolated points then stay at the small end and the Illinois halvings of ga
          // would need a thousand steps to move them: after three steps that did not halve
          // |g|, bisect.
          const double t = stalled >= 3 ? 0.5 * (a + b) : b - gb * (b - a) / (gb - ga);
          const double gt = g(t);
          stalled = std::fabs(gt) > 0.5 * std::fabs(gb) ? stalled + 1 : 0;
          if ((gt > 0.0) != (gb > 0.0)) {
            a = b;
            ga = gb;
          } else {
            ga *= 0.5;
          }
          b = t;
          gb = gt;
          if (std::fabs(gb) <= kTol) break;
        }
        u = b;
      }
      g(u);  // (leaves e at the result for phi)
    }
    const double v = std::exp(u);
    if (!(phi(v) >= phi0 - noise) || !(v > 0.0) || !std::isfinite(v)) {
      ++result_.refused_solves;
      return v_old;
    }
    // (The multinomial bound's sites are always solved: its likelihood is flat along the shift
    // of all latents at a point, lse(m + t 1) = lse(m) + t, so the bound's curvature there is
    // the prior's alone, and the means' cheap Newton steps see sum_l lambda_l - 1 as extra
    // curvature. Skipped sites leave that sum off 1 by up to skip_tol / v: on separable
    // classes at prior variance 1e4, ~1e-3 against the prior's ~1e-6, and the steps crept.
    // Nor are the sweeps of coupled iterations, whose means' step counted on every site's
    // response: with skip_tol = 1e-4 one was undone and the run cost more than without.)
    if (may_skip && lb_.type != LocalBoundType::Multinomial &&
        std::fabs(v - v_old) <= opt_.skip_tol * v_old)
      return v_old;
    if (rho == 1.0) return v;
    const double lam_old = 1.0 / v_old - c, lam_new = 1.0 / v - c;
    return 1.0 / (c + lam_old + rho * (lam_new - lam_old));
  }

  // Newton's method for the means (eq. 21) with V fixed, maximising
  //   Psi = sum_n f_b - 1/2 sum_l alpha_l . (m_l - mean_l)
  // over alpha (m_l = mean_l + Sigma alpha_l), with a backtracking (Armijo) line search. The
  // Hessian in m is -(Omega + W), W = -d^2 f_b / dm^2 (block diagonal over latents except for
  // the multinomial bound, whose per-point block is diag(p) - p p^T).
  //  * Cheap steps, for all latents at once. For the likelihoods that are Gaussian
  //    expectations W = -2 g^v, which after a sweep equals the site precisions lambda, so
  //    (Omega + W)^-1 = V and the step costs SYMVs: with r = g^m - alpha, dm = V r. For the
  //    multinomial bound lambda = p, so Omega + W = V^-1 - P P^T (P stacks diag(p_l)) and by
  //    Woodbury dm_l = u_l + V_l (p_l z), u_l = V_l r_l, z = S^-1 sum_l p_l u_l with
  //    S = I - sum_l diag(p_l) V_l diag(p_l) (one N^3/3 Cholesky for all latents). Then
  //    dalpha = Omega dm = V^-1 dm - lambda dm without Omega.
  //  * Exact steps, one latent at a time in turn (block coordinate), GPML-style with W_l
  //    clipped at 0: with b = W (m - mean) + g^m, the Newton point is
  //    alpha = b - W^1/2 B^-1 W^1/2 Sigma b, B = I + W^1/2 Sigma W^1/2 (N^3/3).
  // Cheap steps are used while they are taken whole and cost less than exact ones (below).
  // The multinomial bound's cheap steps go on while they converge fast and leave the rest to
  // the next sweep, which brings lambda back to p (below). Returns false when the means were
  // left short of their optimum for that reason.
  bool update_means() {
    const index_t N = N_, L = L_;
    const bool multinomial = lb_.type == LocalBoundType::Multinomial;
    const auto LN = static_cast<std::size_t>(L * N);
    Buffer sw(N), rhs(N), r(LN), step_a(LN), step_m(LN), try_m(LN), try_a(LN), try_f(N), z(N);
    auto psi = [&](const double* f, const double* mm, const double* aa) {
      double kl = 0.0;
      for (index_t l = 0; l < L; ++l)
        for (index_t n = 0; n < N; ++n) kl += aa[l * N + n] * (mm[l * N + n] - mean_[l]);
      return fixed_order_sum(f, N) - 0.5 * kl;
    };
    bool exact = false;
    index_t latent = 0;   // the latent of the next exact step
    index_t settled = 0;  // consecutive exact steps without a measurable gain
    double last_gain = 0.0;
    for (int it = 0; it < opt_.max_newton * L; ++it) {
      local_bounds(lb_, y_, N, m_.data(), v_.data(), f_.data(), dm_.data(), dv_.data(), d2m_.data(),
                   nullptr);
      count_.evaluate(static_cast<double>(N * L));
      const double psi0 = psi(f_.data(), m_.data(), alpha_);
      for (std::size_t i = 0; i < LN; ++i) r[i] = dm_[i] - alpha_[i];
      std::fill(step_a.begin(), step_a.end(), 0.0);
      index_t first = 0, last = L;  // latents that move
      if (!exact) {
        for (index_t l = 0; l < L; ++l)
          blas::symv(Uplo::Lower, 1.0, V_of(l), r.data() + l * N, 0.0, step_m.data() + l * N);
        count_.add(2.0 * static_cast<double>(L) * N * N);
        if (multinomial && !woodbury_correction(step_m.data(), z.data(), step_a.data(), false) &&
            !woodbury_correction(step_m.data(), z.data(), step_a.data(), true)) {
          exact = true;
          continue;
        }
        for (std::size_t i = 0; i < LN; ++i) step_a[i] += r[i] - lambda_[i] * step_m[i];
      } else {
        first = latent;
        last = latent + 1;
        latent = (latent + 1) % L;
        exact_step(first, sw.data(), rhs.data(), step_a.data() + first * N);
      }
      for (index_t l = first; l < last; ++l)
        blas::symv(Uplo::Lower, 1.0, Sigma_, step_a.data() + l * N, 0.0, step_m.data() + l * N);
      count_.add(2.0 * static_cast<double>(last - first) * N * N);
      double slope = 0.0;  // d Psi / dt along the step
      for (index_t i = first * N; i < last * N; ++i) slope += step_m[i] * r[i];
      double gained = -1.0, t = 1.0;
      if (slope > 1e-15 * std::max(1.0, std::fabs(psi0))) {
        std::copy(m_.begin(), m_.end(), try_m.begin());
        std::copy(alpha_, alpha_ + LN, try_a.begin());
        for (int k = 0; k < 50; ++k, t *= 0.5) {
          for (index_t i = first * N; i < last * N; ++i) {
            try_m[i] = m_[i] + t * step_m[i];
            try_a[i] = alpha_[i] + t * step_a[i];
          }
          local_bounds(lb_, y_, N, try_m.data(), v_.data(), try_f.data(), nullptr, nullptr,
                       nullptr, nullptr);
          count_.evaluate(static_cast<double>(N * L));
          const double value = psi(try_f.data(), try_m.data(), try_a.data());
          if (std::isfinite(value) && value >= psi0 + 1e-4 * t * slope) {
            gained = value - psi0;
            break;
          }
        }
      }
      const double enough = std::max(opt_.tol, 0.0) * std::max(1.0, std::fabs(psi0));
      const bool small = gained <= enough;
      if (gained >= 0.0) {
        std::copy(try_m.begin(), try_m.end(), m_.begin());
        std::copy(try_a.begin(), try_a.end(), alpha_);
      }
      if (!exact) {
        if (gained < 0.0) {  // the cheap step failed: go on with exact ones
          exact = true;
          continue;
        }
        // Cheap steps converge linearly, with gains shrinking by about rate = gained /
        // last_gain per step.
        const double rate = it > 0 && last_gain > 0.0 ? gained / last_gain : 0.0;
        last_gain = gained;
        if (multinomial) {
          // Its cheap step is Newton's while lambda = p, and the means moving p away from
          // lambda make it slow or cut. Exact steps, one latent at a time, converge slowly
          // too (the latents are coupled through p p^T): measured at N = 1000, L = 3, 80 to
          // 90 of them (N^3 / 3 each) in an outer iteration, against a sweep's L N^3. So
          // stop once the gains still to come (a geometric series) are within the tolerance,
          // or hand over to the sweep once a step is cut or the rate exceeds 1/2.
          if (small && rate < 1.0 && gained * rate / (1.0 - rate) <= enough) return true;
          if (t < 1.0 || rate > 0.5) return false;
          continue;
        }
        if (small) break;
        // Switch when a step was cut, or when the cheap steps still needed
        // (log(enough / gained) / log(rate)) would cost more than exact ones: an exact step
        // costs N^3/3 + 4 N^2 flops (the Cholesky of B and two SYMVs), a cheap one 4 L N^2.
        if (t < 1.0) exact = true;
        if (!exact && rate > 0.1) {
          const double cheap_cost = 4.0 * static_cast<double>(L);
          const double exact_cost = static_cast<double>(N) / 3.0 + 4.0;
          exact = rate >= 1.0 || std::log(enough / gained) / std::log(rate) * cheap_cost > exact_cost;
        }
      } else {
        settled = small ? settled + 1 : 0;
        if (settled >= L) break;
      }
    }
    return true;
  }

  // The coupled mean step (cvi.hpp): (dm, dv) by GMRES, then alpha += dalpha and m from alpha.
  // Returns false, with alpha and m as they were, where GMRES does not converge or the step is
  // not finite. Reads g^m, g^v, d2m and r = lambda + 2 g^v at the current (m, v) from dm_, dv_,
  // d2m_ and residual_, which evaluate() left there (every iteration of run() ends with it).
  bool coupled_step() {
    if (lb_.type == LocalBoundType::Multinomial) return coupled_step_multinomial();
    const index_t N = N_, L = L_, LN = L * N;
    // The separable bounds' second derivatives (their latents do not interact): F_mm = d2m and
    // F_mv, F_vv by central differences of g^m and g^v in v.
    const Buffer& Fmm = d2m_;
    Buffer Fmv(LN), Fvv(LN);
    {
      Buffer vp(LN), vn(LN), dmp(LN), dvp(LN), dmn(LN), dvn(LN), fx(N);
      for (index_t i = 0; i < LN; ++i) {
        vp[i] = v_[i] * (1.0 + kSecondDerivativeStep);
        vn[i] = v_[i] * (1.0 - kSecondDerivativeStep);
      }
      local_bounds(lb_, y_, N, m_.data(), vp.data(), fx.data(), dmp.data(), dvp.data(), nullptr, nullptr);
      local_bounds(lb_, y_, N, m_.data(), vn.data(), fx.data(), dmn.data(), dvn.data(), nullptr, nullptr);
      count_.evaluate(2.0 * static_cast<double>(LN));
      for (index_t i = 0; i < LN; ++i) {
        const double h2 = vp[i] - vn[i];
        Fmv[i] = (dmp[i] - dmn[i]) / h2;
        Fvv[i] = (dvp[i] - dvn[i]) / h2;
      }
    }
    // The system is block diagonal over latents (separable bounds): one GMRES per latent, with
    // W_l = V_l o V_l formed in B's lower triangle (N^2 / 2 products) so that both products
    // are SYMVs.
    if (B_.empty()) B_.resize(static_cast<std::size_t>(N * N));
    const MatrixView Wl(B_.data(), N, N);
    Buffer dalpha(LN), rhs(2 * N), x(2 * N), a(N), c(N);
    const double n2 = static_cast<double>(N) * N;
    for (index_t l = 0; l < L; ++l) {
      const ConstMatrixView Vl = V_of(l);
      for (index_t i = 0; i < N; ++i)
        for (index_t j = 0; j <= i; ++j) Wl(i, j) = Vl(i, j) * Vl(i, j);
      const index_t o = l * N;
      for (index_t n = 0; n < N; ++n)
        dalpha[o + n] = dm_[o + n] - alpha_[o + n];  // g^m - alpha, the step's first term
      blas::symv(Uplo::Lower, 1.0, Vl, dalpha.data() + o, 0.0, rhs.data());
      blas::symv(Uplo::Lower, 1.0, Wl, residual_.data() + o, 0.0, rhs.data() + N);
      // y = A x for x = (dm, dv): a = (lambda + F_mm) dm + F_mv dv, c = 2 (F_mv dm + F_vv dv),
      // y = (dm - V a, dv - W c).
      auto apply = [&](const double* xv, double* yv) {
        for (index_t n = 0; n < N; ++n) {
          a[n] = (lambda_[o + n] + Fmm[o + n]) * xv[n] + Fmv[o + n] * xv[N + n];
          c[n] = 2.0 * (Fmv[o + n] * xv[n] + Fvv[o + n] * xv[N + n]);
        }
        std::copy(xv, xv + 2 * N, yv);
        blas::symv(Uplo::Lower, -1.0, Vl, a.data(), 1.0, yv);
        blas::symv(Uplo::Lower, -1.0, Wl, c.data(), 1.0, yv + N);
      };
      int products = 0;
      double gmres_flops = 0.0;
      const bool solved = gmres(2 * N, apply, rhs.data(), x.data(), kCoupledSolveTol, kCoupledRestart,
                                kCoupledMaxProducts, products, gmres_flops);
      // W (N^2 / 2 squares), the right-hand side (two SYMVs) and each product (two SYMVs, a
      // and c), dalpha below, and GMRES's own work
      count_.add(0.5 * n2 + 4.0 * n2 * (products + 1) + 8.0 * static_cast<double>(N) * products +
                 4.0 * static_cast<double>(N) + gmres_flops);
      if (!solved) return false;
      for (index_t n = 0; n < N; ++n) dalpha[o + n] += Fmm[o + n] * x[n] + Fmv[o + n] * x[N + n];
    }
    for (index_t i = 0; i < LN; ++i)
      if (!std::isfinite(dalpha[i])) return false;
    for (index_t i = 0; i < LN; ++i) alpha_[i] += dalpha[i];
    for (index_t l = 0; l < L; ++l) compute_mean(l);
    return true;
  }

  // The coupled mean step for the multinomial bound (cvi.hpp). Its local terms depend on
  // m + v / 2 only, so with p = softmax(m + v / 2) and H = diag(p) - p p^T per point,
  // F_mm = -H, F_mv = -H / 2 and F_vv = -H / 4, and the system reduces to one in
  // z = dm + dv / 2: with K_l = Sigma + W_l / 2 (block diagonal over latents),
  //     (I + K H) z = c,   c_l = Sigma g_l + W_l r_l / 2,   dalpha = g - H z,
  // g = g^m - alpha, r = lambda + 2 g^v. It is solved directly, as Laplace's method solves its
  // Newton step for the softmax (GPML's Algorithm 3.3, with K_l for Sigma): with P_l = diag(p_l),
  // M_l = I + P_l^1/2 K_l P_l^1/2, E_l = P_l^1/2 M_l^-1 P_l^1/2 and B_l = I + K_l P_l
  // (B_l^-1 = I - K_l E_l), Woodbury gives
  //     z = B^-1 c + B^-1 K Pi S^-1 Pi^T B^-1 c,
  //     S = I - sum_l P_l (K_l^-1 + P_l)^-1 P_l = diag(1 - sum_l p_l) + sum_l E_l,
  // positive definite because K^-1 + H is, and B_l^-1 K_l P_l w = K_l (p_l w - E_l K_l p_l w).
  // Per latent one Cholesky of M_l and its inverse (N^3 flops); M_l^-1 waits for the second
  // pass in V_l's strict upper triangle, which the iterations do not use (V is kept in the
  // lower one), and a diagonal of its own; K_l is formed again where it is needed (N^2).
  // Returns false, with alpha, m and V's lower triangle as they were, where a factorisation
  // fails or the step is not finite.
  bool coupled_step_multinomial() {
    const index_t N = N_, L = L_, LN = L * N;
    const auto NN = static_cast<std::size_t>(N * N);
    const double n2 = static_cast<double>(N) * N, n3 = n2 * N;
    const double* r = residual_.data();  // lambda - p
    Buffer p(LN), root(LN), g(LN), bc(LN), inv_diag(LN), q(N), t(N), u(N), e(N);
    for (index_t i = 0; i < LN; ++i) {
      p[i] = -2.0 * dv_[i];  // softmax(m + v / 2)
      root[i] = std::sqrt(p[i]);
      g[i] = dm_[i] - alpha_[i];
    }
    if (B_.empty()) B_.resize(NN);
    scratch_K_.resize(NN);
    scratch_S_.resize(NN);
    const MatrixView K(scratch_K_.data(), N, N), M(B_.data(), N, N), S(scratch_S_.data(), N, N);
    auto form_K = [&](index_t l) {  // the lower triangle of Sigma + (V_l o V_l) / 2
      const ConstMatrixView Vl = V_of(l);
      for (index_t i = 0; i < N; ++i)
        for (index_t j = 0; j <= i; ++j) K(i, j) = Sigma_(i, j) + 0.5 * Vl(i, j) * Vl(i, j);
      count_.add(1.5 * n2);
    };
    for (index_t i = 0; i < N; ++i) {
      double sum = 0.0;
      for (index_t l = 0; l < L; ++l) sum += p[l * N + i];
      std::fill(S.row(i), S.row(i) + i + 1, 0.0);
      S(i, i) = std::max(1.0 - sum, 0.0);
      q[i] = 0.0;
    }
    for (index_t l = 0; l < L; ++l) {
      const index_t o = l * N;
      const double* s = root.data() + o;
      double* c = bc.data() + o;
      form_K(l);
      for (index_t i = 0; i < N; ++i) {
        for (index_t j = 0; j <= i; ++j) M(i, j) = s[i] * K(i, j) * s[j];
        M(i, i) += 1.0;
      }
      // c_l = Sigma g_l + W_l r_l / 2 = K_l r_l + Sigma (g_l - r_l)
      for (index_t n = 0; n < N; ++n) t[n] = g[o + n] - r[o + n];
      blas::symv(Uplo::Lower, 1.0, K, r + o, 0.0, c);
      blas::symv(Uplo::Lower, 1.0, Sigma_, t.data(), 1.0, c);
      if (blas::potrf_lower(M) != 0 || blas::potri_lower(M) != 0) return false;
      // S += E_l; B_l^-1 c_l = c_l - K_l E_l c_l; q += p_l B_l^-1 c_l; M_l^-1 put aside
      const MatrixView Vl = V_of(l);
      for (index_t i = 0; i < N; ++i) {
        for (index_t j = 0; j < i; ++j) {
          S(i, j) += s[i] * M(i, j) * s[j];
          Vl(j, i) = M(i, j);
        }
        S(i, i) += s[i] * M(i, i) * s[i];
        inv_diag[o + i] = M(i, i);
      }
      for (index_t n = 0; n < N; ++n) t[n] = s[n] * c[n];
      blas::symv(Uplo::Lower, 1.0, M, t.data(), 0.0, u.data());
      for (index_t n = 0; n < N; ++n) u[n] *= s[n];
      blas::symv(Uplo::Lower, -1.0, K, u.data(), 1.0, c);
      for (index_t n = 0; n < N; ++n) q[n] += p[o + n] * c[n];
      count_.add(n2 + n3 + 11.0 * n2);
    }
    if (blas::potrf_lower(S) != 0) return false;
    blas::trsv(Uplo::Lower, Trans::No, Diag::NonUnit, S, q.data());
    blas::trsv(Uplo::Lower, Trans::Yes, Diag::NonUnit, S, q.data());
    count_.add(n3 / 3.0 + 2.0 * n2);
    // z_l = B_l^-1 c_l + K_l (p_l w - E_l K_l p_l w), w = S^-1 q (z left in bc)
    for (index_t l = 0; l < L; ++l) {
      const index_t o = l * N;
      const double* s = root.data() + o;
      const ConstMatrixView Vl = V_of(l);
      form_K(l);
      for (index_t n = 0; n < N; ++n) u[n] = p[o + n] * q[n];
      blas::symv(Uplo::Lower, 1.0, K, u.data(), 0.0, t.data());
      for (index_t n = 0; n < N; ++n) t[n] *= s[n];
      // M_l^-1 t: the upper triangle's SYMV takes V_l's diagonal, replaced by M_l^-1's
      blas::symv(Uplo::Upper, 1.0, Vl, t.data(), 0.0, e.data());
      for (index_t n = 0; n < N; ++n)
        u[n] -= s[n] * (e[n] + (inv_diag[o + n] - Vl(n, n)) * t[n]);
      blas::symv(Uplo::Lower, 1.0, K, u.data(), 1.0, bc.data() + o);
      count_.add(6.0 * n2);
    }
    // dalpha = g - H z, (H z)_ln = p_ln (z_ln - sum_k p_kn z_kn)
    for (index_t n = 0; n < N; ++n) {
      double pz = 0.0;
      for (index_t l = 0; l < L; ++l) pz += p[l * N + n] * bc[l * N + n];
      for (index_t l = 0; l < L; ++l) g[l * N + n] -= p[l * N + n] * (bc[l * N + n] - pz);
    }
    count_.add(4.0 * static_cast<double>(LN));
    for (index_t i = 0; i < LN; ++i)
      if (!std::isfinite(g[i])) return false;
    // The step is scaled so that no mean moves by more than kMultinomialStepLimit (a trust
    // region: the local terms' quadratic model holds over a few units of the logits only); m
    // moves along with alpha, as in update_means.
    Buffer step_m(LN);
    double largest = 0.0;
    for (index_t l = 0; l < L; ++l)
      blas::symv(Uplo::Lower, 1.0, Sigma_, g.data() + l * N, 0.0, step_m.data() + l * N);
    for (index_t i = 0; i < LN; ++i) largest = std::max(largest, std::fabs(step_m[i]));
    count_.add(2.0 * L * n2);
    const double scale = largest > kMultinomialStepLimit ? kMultinomialStepLimit / largest : 1.0;
    for (index_t i = 0; i < LN; ++i) {
      alpha_[i] += scale * g[i];
      m_[i] += scale * step_m[i];
    }
    return true;
  }

  // The multinomial correction of the cheap step (see update_means): on entry step_m holds
  // u_l = V_l r_l; on exit step_m holds dm_l = u_l + V_l (p_l z) and step_a holds p_l z.
  // Returns false when S is not positive definite (lambda far from p). With `clamp`, p_l is
  // replaced by p'_l = min(max(p_l, 0), max(lambda_l, 0)): then V^-1 - P' P'^T is at least
  // Omega + diag(p') - P' P'^T, positive definite as sum_l p'_l <= 1 at every point, so S is
  // too, and the step (on a Hessian with less coupling) still ascends. It serves where lambda
  // falls short of p: after the first sweep each latent's sweep has moved the others' p.
  bool woodbury_correction(double* step_m, double* z, double* step_a, bool clamp) {
    const index_t N = N_, L = L_;
    if (B_.empty()) B_.resize(static_cast<std::size_t>(N * N));
    Buffer p(static_cast<std::size_t>(L * N));
    for (index_t i = 0; i < L * N; ++i)
      p[i] = clamp ? std::clamp(-2.0 * dv_[i], 0.0, std::max(lambda_[i], 0.0)) : -2.0 * dv_[i];
    MatrixView S(B_.data(), N, N);
    for (index_t i = 0; i < N; ++i) {
      for (index_t j = 0; j <= i; ++j) {
        double s = 0.0;
        for (index_t l = 0; l < L; ++l) s += p[l * N + i] * V_of(l)(i, j) * p[l * N + j];
        S(i, j) = -s;
      }
      S(i, i) += 1.0;
    }
    if (blas::potrf_lower(S) != 0) return false;
    std::fill(z, z + N, 0.0);
    for (index_t l = 0; l < L; ++l)
      for (index_t n = 0; n < N; ++n) z[n] += p[l * N + n] * step_m[l * N + n];
    blas::trsv(Uplo::Lower, Trans::No, Diag::NonUnit, S, z);
    blas::trsv(Uplo::Lower, Trans::Yes, Diag::NonUnit, S, z);
    Buffer pz(N);
    for (index_t l = 0; l < L; ++l) {
      for (index_t n = 0; n < N; ++n) pz[n] = step_a[l * N + n] = p[l * N + n] * z[n];
      blas::symv(Uplo::Lower, 1.0, V_of(l), pz.data(), 1.0, step_m + l * N);
    }
    count_.add(3.0 * static_cast<double>(L) * N * N + static_cast<double>(N) * N * N / 3.0 +
               2.0 * static_cast<double>(N) * N);
    return true;
  }

  // The exact Newton step of latent l alone into step_a [N] (sw, rhs: scratch [N]).
  void exact_step(index_t l, double* sw, double* rhs, double* step_a) {
    const index_t N = N_;
    if (B_.empty()) B_.resize(static_cast<std::size_t>(N * N));
    MatrixView B(B_.data(), N, N);
    const double *g = dm_.data() + l * N, *h = d2m_.data() + l * N, *m = m_.data() + l * N;
    const double* a = alpha_ + l * N;
    for (index_t n = 0; n < N; ++n) {
      const double w = std::max(-h[n], 0.0);
      sw[n] = std::sqrt(w);
      rhs[n] = w * (m[n] - mean_[l]) + g[n];
    }
    factor_b(Sigma_, sw, B, true, count_);
    blas::symv(Uplo::Lower, 1.0, Sigma_, rhs, 0.0, step_a);
    for (index_t n = 0; n < N; ++n) step_a[n] *= sw[n];
    blas::trsv(Uplo::Lower, Trans::No, Diag::NonUnit, B, step_a);
    blas::trsv(Uplo::Lower, Trans::Yes, Diag::NonUnit, B, step_a);
    for (index_t n = 0; n < N; ++n) step_a[n] = rhs[n] - sw[n] * step_a[n] - a[n];
    count_.add(4.0 * static_cast<double>(N) * N);
  }

  // A step of every site precision along its residual, lambda <- lambda - t r with
  // r = lambda + 2 g^v from the start of the step: with m fixed the bound's gradient in lambda
  // is -1/2 (V o V) r and V o V is positive definite (Schur product), so -r is an ascent
  // direction and a small enough t raises the bound. Applied by the same blocked rank-one
  // updates (a sweep with given targets); a site whose target would leave c + lambda <= 0
  // moves half way to the bound of positivity instead.
  void residual_step(double t, const Buffer& r) {
    for (index_t l = 0; l < L_; ++l) {
      const double* rl = r.data() + l * N_;
      sweep(l, [&](index_t i, double v_old, double c) {
        const double lam = 1.0 / v_old - c;
        double target = lam - t * rl[i];
        if (!(c + target > 0.0)) target = 0.5 * (lam - c);
        return 1.0 / (c + target);
      });
    }
  }

  // What the next sweep would gain, from the site residuals r = lambda + 2 g^v at the current
  // (m, v) (left in residual_ by evaluate()): the scalar objective of site i is about
  // -(v - v*)^2 / (2 v^2) near its maximum and v r is about the relative change of v, so the
  // sweep gains about sum_i (v_i r_i)^2 / 4 (the bound carries phi / 2). Measured, a whole outer
  // iteration gains 2 to 4 times this (the m-step gains too), hence the factor 4 where it is used.
  double sweep_gain_estimate() const {
    double gain = 0.0;
    for (index_t i = 0; i < L_ * N_; ++i) {
      const double d = v_[i] * residual_[i];
      gain += 0.25 * d * d;
    }
    return gain;
  }

  // max_i |v_i r_i|: about the largest relative change of a variance that another sweep makes.
  double largest_site_step() const {
    double step = 0.0;
    for (index_t i = 0; i < L_ * N_; ++i) step = std::max(step, std::fabs(v_[i] * residual_[i]));
    return step;
  }

  // max_i |alpha_i - dm_i| / max(1, |dm_i|): how far the means are from eq. (7), relative.
  double largest_mean_residual() const {
    double r = 0.0;
    for (index_t i = 0; i < L_ * N_; ++i)
      r = std::max(r, std::fabs(alpha_[i] - dm_[i]) / std::max(1.0, std::fabs(dm_[i])));
    return r;
  }

  // Stationarity residuals of eqs. (7)-(8) at the end.
  void residuals() {
    local_bounds(lb_, y_, N_, m_.data(), v_.data(), f_.data(), dm_.data(), dv_.data(), d2m_.data(),
                 nullptr);
    for (index_t i = 0; i < L_ * N_; ++i) {
      result_.max_residual_alpha = std::max(result_.max_residual_alpha, std::fabs(alpha_[i] - dm_[i]));
      result_.max_residual_lambda =
          std::max(result_.max_residual_lambda, std::fabs(lambda_[i] + 2.0 * dv_[i]));
    }
  }

  const LocalBound& lb_;
  const double* y_;
  ConstMatrixView Sigma_;
  const double* mean_;
  double* alpha_;
  double* lambda_;
  const Options& opt_;
  index_t N_, L_;
  Buffer V_, m_, v_, logdet_, f_, dm_, dv_, d2m_, B_, residual_;
  Buffer scratch_K_, scratch_S_;  // the multinomial coupled step's K_l and S
  Counter count_;
  Result result_;
  bool warm_ = false;
  bool coupled_ = false;   // coupled iterations still allowed (Options::coupled_means)
  bool coupling_ = false;  // the last iteration was a coupled one
  double gains_[3] = {0.0, 0.0, 0.0};  // the bound's gains in the last three iterations
  // The largest factor by which an update changed a variance since V was last built (either
  // way), and the rebuilds.
  double max_change_ = 1.0;
  int rebuilds_ = 0;
  Clock::time_point start_;
};

}  // namespace

Result infer(const LocalBound& lb, const double* y, ConstMatrixView Sigma, const double* mean,
             double* alpha, double* lambda, const Options& opt, double* V_out) {
  const SingleThreadScope small(Sigma.rows < kOneThreadBelow);
  Inference inf(lb, y, Sigma, mean, alpha, lambda, opt);
  Result res = inf.run();
  if (V_out != nullptr) {
    const index_t N = inf.N();
    for (index_t l = 0; l < inf.L(); ++l) {
      MatrixView V = inf.V_of(l);
      mirror_lower(V);
      std::copy(V.data, V.data + N * N, V_out + l * N * N);
    }
  }
  return res;
}

void prior_covariance(const kernels::Kernel& kernel, ConstMatrixView X, double jitter, MatrixView S,
                      double* diag) {
  const index_t N = X.rows;
  require(N >= 1, "cvi: need at least one data point");
  require(X.cols == kernel.input_dim(), "cvi: X has ", X.cols, " columns but the kernel expects ",
          kernel.input_dim());
  require(S.rows == N && S.cols == N, "cvi: the prior covariance must be [N, N]");
  require(jitter >= 0.0 && std::isfinite(jitter), "cvi: jitter must be >= 0");
  kernel.K(X, X, true, S);
  if (diag != nullptr)
    for (index_t i = 0; i < N; ++i) diag[i] = S(i, i);
  linalg::add_relative_jitter(S, jitter);
}

namespace {

// Pi = (Sigma + Lambda^-1)^-1 = Lambda - Lambda V Lambda with V = (Sigma^-1 + Lambda)^-1 cancels
// about log10(lambda_i Sigma_ii) digits of V's relative accuracy in entry i: nothing for
// classification (lambda <= 1/4 for the logit bound), but Poisson sites with counts of 1e7 have
// lambda ~ 1e7, where Pi came out wrong in every digit (latent variances of 69 at the training
// inputs instead of 1e-7, predicted counts 1e15 times too large). Beyond kPiFromVLimit (three
// digits) Pi comes from B = I + Lambda^1/2 Sigma Lambda^1/2, whose eigenvalues are >= 1:
// Pi = Lambda^1/2 B^-1 Lambda^1/2, by Cholesky and its inverse (about N^3 flops).
constexpr double kPiFromVLimit = 1e3;

bool pi_from_v_cancels(ConstMatrixView Sigma, const double* lam) {
  bool large = false, negative = false;
  for (index_t i = 0; i < Sigma.rows; ++i) {
    large = large || lam[i] * Sigma(i, i) > kPiFromVLimit;
    negative = negative || lam[i] < 0.0;
  }
  return large && !negative;
}

// root[i] = lambda_i^1/2, lambda < 0 (which rounding can leave) counting as 0.
void site_roots(const double* lam, index_t N, double* root) {
  for (index_t i = 0; i < N; ++i) root[i] = std::sqrt(std::max(lam[i], 0.0));
}

// F = the lower Cholesky factor of B = I + Lambda^1/2 Sigma Lambda^1/2 (zero above the diagonal)
// from root = site_roots(lambda). B's eigenvalues are >= 1.
void factor_site_matrix(ConstMatrixView Sigma, const double* root, MatrixView F) {
  const index_t N = Sigma.rows;
  for (index_t i = 0; i < N; ++i) {
    for (index_t j = 0; j <= i; ++j) F(i, j) = root[i] * Sigma(i, j) * root[j];
    F(i, i) += 1.0;
    std::fill(F.row(i) + i + 1, F.row(i) + N, 0.0);
  }
  require(blas::potrf_lower(F) == 0,
          "cvi: I + Lambda^1/2 Sigma Lambda^1/2 is not positive definite (non-finite site precisions)");
}

// Pi's lower triangle into P (see pi_from_v_cancels), for lambda >= 0: Lambda^1/2 B^-1 Lambda^1/2.
void pi_by_cholesky(ConstMatrixView Sigma, const double* lam, MatrixView P) {
  Buffer root(static_cast<std::size_t>(Sigma.rows));
  site_roots(lam, Sigma.rows, root.data());
  factor_site_matrix(Sigma, root.data(), P);
  require(blas::potri_lower(P) == 0, "cvi: singular factor of I + Lambda^1/2 Sigma Lambda^1/2");
  for (index_t i = 0; i < Sigma.rows; ++i)
    for (index_t j = 0; j <= i; ++j) P(i, j) *= root[i] * root[j];
}

}  // namespace

Result fit_step(const kernels::Kernel& kernel, const LocalBound& lb, ConstMatrixView X,
                const double* y, const double* mean, double jitter, double* alpha,
                double* lambda, const Options& opt, Gradients* grads, double* Pi_out) {
  const index_t N = X.rows;
  const SingleThreadScope small(N < kOneThreadBelow);
  Buffer Sigma(static_cast<std::size_t>(N * N));
  MatrixView S(Sigma.data(), N, N);
  Buffer diag(static_cast<std::size_t>(N));  // K(X, X)'s own diagonal, for the kernel's vjp
  prior_covariance(kernel, X, jitter, S, diag.data());
  Inference inf(lb, y, S, mean, alpha, lambda, opt);
  Result res = inf.run();
  const index_t L = inf.L();
  if (grads == nullptr && Pi_out == nullptr) return res;
  // Pi_l = (Sigma + Lambda_l^-1)^-1 (written over V_l), G = 1/2 sum_l (a a^T - Pi_l).
  Buffer G;
  if (grads != nullptr) G.assign(static_cast<std::size_t>(N * N), 0.0);
  for (index_t l = 0; l < L; ++l) {
    MatrixView P = inf.V_of(l);
    const double* lam = lambda + l * N;
    const double* a = alpha + l * N;
    if (pi_from_v_cancels(S, lam)) {
      pi_by_cholesky(S, lam, P);
    } else {
      for (index_t i = 0; i < N; ++i) {
        for (index_t j = 0; j <= i; ++j) P(i, j) = -lam[i] * P(i, j) * lam[j];
        P(i, i) += lam[i];
      }
    }
    mirror_lower(P);
    if (Pi_out != nullptr) std::copy(P.data, P.data + N * N, Pi_out + l * N * N);
    if (grads != nullptr)
      for (index_t i = 0; i < N; ++i)
        for (index_t j = 0; j < N; ++j) G[i * N + j] += 0.5 * (a[i] * a[j] - P(i, j));
  }
  if (grads == nullptr) return res;
  require(grads->kernel != nullptr, "cvi: fit_step needs an output for the kernel gradient");
  std::fill(grads->kernel, grads->kernel + kernel.num_params(), 0.0);
  for (index_t i = 0; i < N; ++i) S(i, i) = diag[i];  // the inference is done with Sigma
  kernel.K_vjp(X, X, true, ConstMatrixView(G.data(), N, N), S, grads->kernel, nullptr, nullptr);
  if (grads->mean != nullptr)
    for (index_t l = 0; l < L; ++l) grads->mean[l] = fixed_order_sum(alpha + l * N, N);
  if (grads->thresholds != nullptr && lb.type == LocalBoundType::Ordinal) {
    Buffer f(static_cast<std::size_t>(N));
    local_bounds(lb, y, N, inf.m().data(), inf.v().data(), f.data(), nullptr, nullptr, nullptr,
                 grads->thresholds);
  }
  return res;
}

double oa_objective(const LocalBound& lb, const double* y, ConstMatrixView Sigma,
                    const double* mean, const double* alpha, const double* lambda,
                    double* dalpha, double* dlambda, double* flops, double* evaluations) {
  validate(lb);
  check_sigma(Sigma);
  const index_t N = Sigma.rows, L = lb.num_latent();
  const SingleThreadScope small(N < kOneThreadBelow);
  check_labels(lb, y, N);
  for (index_t i = 0; i < L * N; ++i)
    require(lambda[i] >= 0.0 && std::isfinite(lambda[i]) && std::isfinite(alpha[i]),
            "cvi: the Opper-Archambeau parameters must be finite with lambda >= 0");
  Counter count;
  Buffer m(static_cast<std::size_t>(L * N)), v(m.size()), logdet(static_cast<std::size_t>(L));
  Buffer V(static_cast<std::size_t>(L * N * N)), B(static_cast<std::size_t>(N * N)), sw(N);
  Buffer A(static_cast<std::size_t>(N * N));
  for (index_t l = 0; l < L; ++l) {
    const double* lam = lambda + l * N;
    for (index_t n = 0; n < N; ++n) sw[n] = std::sqrt(lam[n]);
    MatrixView Bv(B.data(), N, N);
    factor_b(Sigma, sw.data(), Bv, false, count);
    logdet[l] = 0.0;
    for (index_t n = 0; n < N; ++n) logdet[l] += 2.0 * std::log(Bv(n, n));
    // V = Sigma - A^T A with A = L_B^-1 diag(sw) Sigma.
    MatrixView Av(A.data(), N, N), Vl(V.data() + l * N * N, N, N);
    for (index_t i = 0; i < N; ++i)
      for (index_t j = 0; j < N; ++j) {
        Av(i, j) = sw[i] * Sigma(i, j);
        Vl(i, j) = Sigma(i, j);
      }
    blas::trsm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, Bv, Av);
    blas::syrk(Uplo::Lower, Trans::Yes, -1.0, Av, 1.0, Vl);
    mirror_lower(Vl);
    for (index_t n = 0; n < N; ++n) v[l * N + n] = Vl(n, n);
    double* ml = m.data() + l * N;
    std::fill(ml, ml + N, mean[l]);
    blas::symv(Uplo::Lower, 1.0, Sigma, alpha + l * N, 1.0, ml);
    count.add(2.0 * static_cast<double>(N) * N * N + 4.0 * static_cast<double>(N) * N);
  }
  Buffer f(static_cast<std::size_t>(N)), dm(m.size()), dv(m.size());
  local_bounds(lb, y, N, m.data(), v.data(), f.data(), dm.data(), dv.data(), nullptr, nullptr);
  count.evaluate(static_cast<double>(N * L));
  double value = fixed_order_sum(f.data(), N);
  Buffer r(N);
  for (index_t l = 0; l < L; ++l) {
    const double *a = alpha + l * N, *lam = lambda + l * N, *ml = m.data() + l * N;
    double s = -logdet[l];
    for (index_t n = 0; n < N; ++n) s += lam[n] * v[l * N + n] - a[n] * (ml[n] - mean[l]);
    value += 0.5 * s;
    if (dalpha != nullptr) {
      for (index_t n = 0; n < N; ++n) r[n] = dm[l * N + n] - a[n];
      blas::symv(Uplo::Lower, 1.0, Sigma, r.data(), 0.0, dalpha + l * N);
      count.add(2.0 * static_cast<double>(N) * N);
    }
    if (dlambda != nullptr) {
      for (index_t n = 0; n < N; ++n) r[n] = lam[n] + 2.0 * dv[l * N + n];
      ConstMatrixView Vl(V.data() + l * N * N, N, N);
      for (index_t i = 0; i < N; ++i) {
        double s2 = 0.0;
        const double* row = Vl.row(i);
        for (index_t j = 0; j < N; ++j) s2 += row[j] * row[j] * r[j];
        dlambda[l * N + i] = -0.5 * s2;
      }
      count.add(3.0 * static_cast<double>(N) * N);
    }
  }
  if (flops != nullptr) *flops += count.flops;
  if (evaluations != nullptr) *evaluations += count.evaluations;
  return value;
}

void predictive_factor(const kernels::Kernel& kernel, ConstMatrixView X, double jitter,
                       const double* lambda, index_t L, double* F) {
  const index_t N = X.rows;
  Buffer Sigma(static_cast<std::size_t>(N * N)), root(static_cast<std::size_t>(N));
  const MatrixView S(Sigma.data(), N, N);
  prior_covariance(kernel, X, jitter, S, nullptr);
  for (index_t l = 0; l < L; ++l) {
    site_roots(lambda + l * N, N, root.data());
    factor_site_matrix(S, root.data(), MatrixView(F + l * N * N, N, N));
  }
}

void predict_f(const kernels::Kernel& kernel, ConstMatrixView X, const double* mean,
               const double* alpha, const double* lambda, const double* F, index_t L,
               ConstMatrixView Xnew, MatrixView mean_out, MatrixView var_out) {
  const index_t N = X.rows, T = Xnew.rows;
  require(X.cols == kernel.input_dim() && Xnew.cols == X.cols,
          "cvi: X and Xnew must have the kernel's ", kernel.input_dim(), " columns");
  require(mean_out.rows == T && mean_out.cols == L && var_out.rows == T && var_out.cols == L,
          "cvi: mean_out and var_out must be [T, L]");
  constexpr index_t kChunk = 512;  // test rows per block: bounds the [chunk, N] scratch
  Buffer Ks(static_cast<std::size_t>(std::min(T, kChunk) * N)), Q(Ks.size()), kss(kChunk), mu(kChunk),
      root(static_cast<std::size_t>(N));
  for (index_t t0 = 0; t0 < T; t0 += kChunk) {
    const index_t rows = std::min(kChunk, T - t0);
    const ConstMatrixView Xc(Xnew.row(t0), rows, Xnew.cols, Xnew.ld);
    MatrixView K(Ks.data(), rows, N), W(Q.data(), rows, N);
    kernel.K(Xc, X, false, K);
    kernel.Kdiag(Xc, kss.data());
    for (index_t l = 0; l < L; ++l) {
      blas::gemv(Trans::No, 1.0, K, alpha + l * N, 0.0, mu.data());
      site_roots(lambda + l * N, N, root.data());
      for (index_t t = 0; t < rows; ++t)
        for (index_t n = 0; n < N; ++n) W(t, n) = K(t, n) * root[n];
      // Rows of W become (F_l^-1 Lambda^1/2 k_t)^T.
      blas::trsm(blas::Side::Right, blas::Uplo::Lower, Trans::Yes, blas::Diag::NonUnit, 1.0,
                 ConstMatrixView(F + l * N * N, N, N), W);
      for (index_t t = 0; t < rows; ++t) {
        double q = 0.0;
        for (index_t n = 0; n < N; ++n) q += W(t, n) * W(t, n);
        mean_out(t0 + t, l) = mean[l] + mu[t];
        var_out(t0 + t, l) = std::max(kss[t] - q, 0.0);
      }
    }
  }
}

}  // namespace pygpfast::cvi
