// Concave variational inference for full (non-sparse) GP models with non-conjugate likelihoods
// (Khan, Mohamed & Murphy 2012, seed 004), with the piecewise bounds of Marlin, Khan & Murphy
// 2011 (piecewise.hpp).
//
// Model. L latent functions z_l ~ N(mean_l 1, Sigma), independent, Sigma [N, N] shared; for each
// point n a likelihood p(y_n | z_n) of the vector z_n = (z_1n, ..., z_Ln). The posterior
// approximation is q(z_l) = N(m_l, V_l). The bound (eq. 6) is
//   L = sum_l 1/2 [log|V_l Omega| - tr(V_l Omega) - (m_l - mean_l)^T Omega (m_l - mean_l) + N]
//       + sum_n f_b(y_n, m_n, v_n),        Omega = Sigma^-1, v_ln = [V_l]_nn,
// with a local variational bound f_b <= E_q[log p(y_n | z_n)] in closed form (LocalBound).
// A joint q over all L N values loses nothing: f_b sees only the marginal variances, so at the
// optimum V^-1 = Omega - 2 diag(g^v) is block diagonal across latent functions (eq. 8).
//
// Parameterisation. Everything is stored through alpha_l = Omega (m_l - mean_l) and the site
// precisions lambda_l (K_l = V_l^-1 = Omega + diag(lambda_l), eq. 9 with the optimum's form),
// so Omega is never formed and Sigma may be singular:
//   m_l = mean_l + Sigma alpha_l,  V_l = (Omega + Lambda_l)^-1,
//   log|V_l Omega| = -log|I + Lambda_l Sigma|,  tr(V_l Omega) = N - sum_n lambda_ln v_ln.
// At the optimum alpha = g^m and lambda = -2 g^v (eqs. 7-8).
//
// Algorithm 1 (section 6), per outer iteration:
//  (a) for every latent l and point i, with m fixed: the cavity precision c = 1/v_ii - lambda_i
//      (= Omega_ii - k~_22 of eq. 13, since k_ii = Omega_ii + lambda_i) is held, and v_ii
//      maximises log v - c v + 2 f_b(v) (eq. 16) by the fixed-point iteration
//      v <- 1 / (c - 2 g^v(v)), guarded (below); then lambda_i = 1/v - c and V gets the
//      rank-one update V += (v - v_old) / v_old^2 V[:, i] V[:, i]^T (eqs. 19-20, whose sign in
//      eq. 19 is a typo: the column scales by v / v_old). log|I + Lambda Sigma| follows each
//      update exactly: it grows by log(v_old / v).
//  (b) m by Newton's method on eq. (21) with V fixed, with a backtracking line search. For
//      the likelihoods that are Gaussian expectations the Hessian's likelihood part is
//      W = -2 g^v = lambda after a sweep, so (Omega + W)^-1 = V and a step costs two SYMVs; for
//      the multinomial bound W = diag(p) - p p^T per point and a Woodbury correction through
//      one N x N Cholesky makes the step joint over the C latents. When such a step is cut by
//      the line search, or when the cheap steps converge so slowly that the ones still needed
//      would cost more flops than exact steps, exact GPML-style steps take over (B = I +
//      W^1/2 Sigma W^1/2, N^3/3 flops, one latent at a time).
// Blocked form of (a): the coordinates of a block J of b points are updated one after another
// exactly as above using only the b x b block of V (O(b^2) each), and the accumulated rank-b
// update V += U diag(s) U^T is applied at the end of the block (BLAS 3): by two SYRKs (one per
// sign of s), or, for big updates on two threads, by column panels of V's lower triangle (the
// diagonal block by SYRKs, the rows below by a GEMM) which the threads take dynamically with
// single-threaded BLAS (with another process on one of two cores the free thread does most of
// the panels: the fit of bench/python/cvi_vs_sklearn.py at N = 2000 slowed 1.5x where
// two-thread SYRKs slowed it 2.2x). The iterates are those of the literal rank-one algorithm
// (block_size = 1, BLAS 2, one DSYR per coordinate), with the same N^3 flops per sweep run as
// BLAS 3 instead of memory-bound BLAS 2. Only the lower triangle of V is updated during a sweep.
//
// Coupled mean steps (Options::coupled_means; not in the seed). Where the prior variance is
// large the means and the site precisions are strongly coupled and the alternation of (a) and
// (b) converges only linearly: (b) moves m to the optimum for the old lambda, which the next
// sweep moves (on ionosphere at prior variance 403 the bound's increments fall by about 0.27 per
// iteration). Where Algorithm 1 converges that slowly, an iteration is instead a Newton step for
// the reduced objective F~(m) = max_lambda F(m, lambda), followed by a sweep. With W = V o V (a
// change dlambda of the site precisions moves the variances by dv = -W dlambda), r = lambda +
// 2 g^v and the local second derivatives F_mm, F_mv, F_vv (diagonal: the bounds below are
// separable over latents and points), the step (dm, dv) solves
//     (I - V (Lambda + F_mm)) dm - V F_mv dv = V (g^m - alpha)     [Newton's row for m, times V]
//     -2 W F_mv dm + (I - 2 W F_vv) dv      = W r                [lambda = -2 g^v, linearised]
// per latent (the system is block diagonal over latents), by GMRES whose products are two SYMVs,
// with V_l and with W_l (formed once per step in B's lower triangle); 12 to 41 products (most
// 20 to 30) reach the relative residual 1e-9. Then dalpha = g^m - alpha + F_mm dm + F_mv dv.
// The step is taken whole: it aims at the bound after the sweep, not at the old lambda. It is
// tried once an iteration has gained at least 5% of the one before (inference.cpp), and from
// there on in every iteration; for the separable bounds not from warm starts (whose sweeps
// move few sites, where after a coupled step all move). A coupled iteration ends the run on
// its own gain only: the sites' estimate of the next gain (sweep_gain_estimate) assumes means
// at their optimum for the current lambda, which only Newton's steps leave. An iteration whose
// sweep ends below the previous bound is undone (means included) and run as Algorithm 1's, and
// after two such (or a GMRES that does not converge) the run goes on with Algorithm 1 alone.
// F_mm is d2m (these bounds are Gaussian expectations: df/dv = d2f/dm2 / 2), and F_mv and F_vv
// come from central differences of g^m and g^v in v. A coupled iteration costs about 1.1 to 1.3
// times one of Algorithm 1 (the GMRES products and W against the sweep's N^3 flops; digits,
// N = 450).
// Measured (bench/README.md, Figure 1): at log sigma = 3 on ionosphere and glass
// (stick-breaking) 6 or 7 iterations to the seed's criterion instead of 9 to 12, and 6 or 7 to
// the optimum instead of 10 to 12, with 24 to 41% fewer flops; at log sigma <= 1 the same
// counts as Algorithm 1 (no coupled step runs).
// The multinomial bound: its latents interact (F = -H per point, H = diag(p) - p p^T, with the
// softmax's shift as a near-null direction), and GMRES on the system above needed over 100
// products even preconditioned. But its local terms depend on m + v / 2 only, so F_mv = F_mm / 2
// and F_vv = F_mm / 4, and with z = dm + dv / 2 the system reduces to
//     (I + K H) z = Sigma g + W r / 2,   K_l = Sigma + W_l / 2,   dalpha = g - H z,
// g = g^m - alpha: Laplace's Newton step for the softmax with K_l in place of Sigma, solved
// directly as GPML's Algorithm 3.3 solves that one (one Cholesky of N x N and its inverse per
// latent, one more for all; about L N^3 flops, the price of a sweep). The step is scaled so that
// no mean moves by more than 3 (a trust region: far from the optimum the linearised response of
// the variances, W r, asks for means moving by hundreds); it is tried from warm starts too,
// where Algorithm 1 is slowest for this bound (the latents' coupling through p p^T), but only
// once each of the last two iterations gained at least half the one before (a coupled
// iteration costs about two of Algorithm 1). Measured (bench/README.md): a ten-class fit on
// scikit-learn's digits (N = 450) 6.6e11 instead of 8.3e11 flops, its slowest warm starts 8 or 9
// iterations instead of 33 to 39; cold starts on glass at log sigma = 3 52 to 57 iterations
// instead of 216 to 249; no more flops than Algorithm 1 where that converges in a few
// iterations.
//
// Guards. The seed's argument that each scalar problem is concave does not hold for the
// piecewise bounds (its expectation is not jointly concave in (m, v), and the bound jumps at its
// breakpoints), and the scalar solve can meet the flat top of its objective in rounding: the
// fixed-point iteration is accelerated by secant steps and bracketed (Illinois) when it
// overshoots, and a result that lowers the scalar objective by more than its rounding is
// refused. The coordinate updates are not exact coordinate ascent of the bound itself (the other
// sites' variances move too), so a sweep can lower the bound (it does for the multinomial bound):
// such a sweep is undone and repeated with damped site updates (rho = 1/2, 1/4), then replaced by
// steps of lambda along -r, r = lambda + 2 g^v, which is an ascent direction (with m fixed the
// gradient in lambda is -1/2 (V o V) r and V o V is positive definite). The Newton steps are
// monotone by their line search, so the bound never decreases from one outer iteration to the
// next. A run that stops on a step that could not move, refused a solve, or leaves a site whose
// variance would still change by a percent is reported not converged.
//
// Warm starts. The starting alpha and lambda may be any (lambda with Omega + Lambda positive
// definite); V = (Omega + Lambda)^-1 is then built from V = Sigma by one pass of the same
// blocked rank-one updates that sets each lambda_i to its starting value (N^3 flops, no
// Cholesky), the means are refitted first (step b), and no sweep runs when the site residuals
// already meet the tolerance. alpha = lambda = 0 is Algorithm 1's initialisation (V = Sigma,
// m = mean). The cavity precision 1/v - lambda loses its digits when lambda v is close to 1
// (a site precision that dwarfs the prior's, e.g. a start with Poisson rates e^38): such a
// start stalls and is reported not converged.
//
// Hyperparameters. At the optimum the gradient of the bound with respect to Sigma is (envelope
// theorem) G = 1/2 sum_l [alpha_l alpha_l^T - Pi_l], Pi_l = (Sigma + Lambda_l^-1)^-1 =
// Lambda_l - Lambda_l V_l Lambda_l (O(N^2) from V; no extra factorisation), d/dmean_l =
// sum_n alpha_ln, and d/dthresholds = sum_n d f_b / d thresholds.
//
// Prediction at new inputs: mean = mean_l + K_*^T alpha_l, var = k_** - diag(K_*^T Pi_l K_*)
// written as k_** - |F_l^-1 (Lambda_l^1/2 k_*)|^2 with F_l F_l^T = I + Lambda_l^1/2 Sigma
// Lambda_l^1/2 (predictive_factor): the explicit quadratic form in Pi_l cancels about
// log10(lambda Sigma_ii) digits (the latent variances of Poisson sites with counts of 1e7,
// ~1e-7, came out 5 times too large), the norm of a triangular solve none.
//
// Flop counts (Result::flops) are exact operation counts of the BLAS/LAPACK calls made (GEMM
// 2mnk, SYRK n^2 k, SYR n^2, POTRF n^3/3, TRSV n^2, SYMV 2 n^2, ...) plus the O(N^2)
// elementwise passes; local-bound evaluations (per point and latent function) are counted
// separately (Result::bound_evaluations).
#pragma once

#include <vector>

#include "pygpfast/kernels.hpp"
#include "pygpfast/piecewise.hpp"
#include "pygpfast/view.hpp"

namespace pygpfast::cvi {

// Local variational bounds f_b(y, m, v) <= E_{N(z | m, v)}[log p(y | z)] of Table 1 of the
// seed, with llp(x) = log(1 + e^x) replaced by a piecewise upper bound B >= llp:
enum class LocalBoundType : int {
  BernoulliLogit = 0,  // y in {0, 1}; 1 latent: y m - E[B(z)]
  Poisson = 1,         // y >= 0 (counts; real y by the same formula); 1 latent:
                       //   y m - exp(m + v/2) - lgamma(y + 1)  (exact)
  Multinomial = 2,     // y in {0..C-1}; C latents: m_y - lse(m + v/2)  (Blei & Lafferty)
  StickBreaking = 3,   // y in {0..C-1}; C-1 latents: log p(y = k) = log sigmoid(z_k)
                       //   + sum_{j<k} log sigmoid(-z_j) (no first term for k = C-1),
                       //   each log sigmoid(+-z) = (z or 0) - llp(z) bounded by B
  Ordinal = 4,         // y in {0..K-1}; 1 latent; cumulative logit p(y <= k) = sigmoid(phi_k - z):
                       //   log p(y = k) = (phi_k - z) - llp(phi_k - z) - llp(phi_{k-1} - z)
                       //   + log(1 - exp(phi_{k-1} - phi_k)) inside, one llp term at the ends
};

struct LocalBound {
  LocalBoundType type = LocalBoundType::BernoulliLogit;
  piecewise::Bound llp;             // BernoulliLogit, StickBreaking, Ordinal
  int num_classes = 0;              // C (Multinomial, StickBreaking) or K (Ordinal); else 0
  std::vector<double> thresholds;   // Ordinal: the K - 1 increasing cut points phi
  index_t num_latent() const;       // L
  index_t num_thresholds() const { return static_cast<index_t>(thresholds.size()); }
};

// Throws std::invalid_argument unless the description is well formed.
void validate(const LocalBound& lb);

// Throws std::invalid_argument naming the first label outside the likelihood's support.
void check_labels(const LocalBound& lb, const double* y, index_t n);

// For every point n < N with latent marginals m, v [L, N] (latent-major: m[l * N + n]):
//   value[n] = f_b(y_n, m_n, v_n), and [L, N] arrays dm = df_b/dm, dv = df_b/dv and
//   d2m = d^2 f_b / dm_l^2 (the diagonal of the Hessian in m), and, for Ordinal,
//   dthresholds [K-1] = sum_n d f_b / d phi. Any output but value may be null.
// OpenMP over points; results do not depend on the thread count.
void local_bounds(const LocalBound& lb, const double* y, index_t N, const double* m,
                  const double* v, double* value, double* dm, double* dv, double* d2m,
                  double* dthresholds);

// Point n's bound as a function of one latent variance, for the scalar solves: value = f_b (up
// to terms that do not depend on v_l) and lambda = -2 d f_b / d v_l at v_l, with the other
// latents at m[j * stride], v[j * stride] (pointers to point n's latent 0).
struct SiteBound {
  double value;
  double lambda;
};
SiteBound site_bound(const LocalBound& lb, double y, const double* m, const double* v,
                     index_t stride, index_t l, double v_l);

struct Options {
  int max_iter = 200;          // outer iterations (sweep + Newton on m)
  double tol = 1e-10;          // stop when an outer iteration raises the bound by less than
                               //   tol * max(1, |bound|), or when the site residuals predict
                               //   less than that for the next one (inference.cpp); a
                               //   negative tol runs all max_iter iterations
  index_t block_size = 0;      // coordinates per block; 1 = literal rank-one updates (BLAS 2);
                               //   0 = by the problem's size (sweep.cpp: 32 below 1500 points,
                               //   64 from there)
  double skip_tol = 0.0;       // a coordinate whose variance would change by at most
                               //   skip_tol * v is left as it is (no rank-one update);
                               //   not for Multinomial, whose Newton steps for the means
                               //   need lambda = p (sweep.cpp, solve_site)
  int max_newton = 30;         // Newton iterations for m per outer iteration
  int max_damping = 8;         // halvings of rho for a sweep that lowers the bound
  bool record_history = true;  // fill Result::history
  bool coupled_means = true;   // where Algorithm 1 converges slowly, the means' step anticipates
                               //   the sweep (see "Coupled mean steps" above); false runs the
                               //   seed's Algorithm 1 as written
};

// State after each outer iteration (index 0: the starting point).
struct Record {
  double bound;
  double flops;    // cumulative
  double bound_evaluations;  // cumulative
  double seconds;  // cumulative wall time
};

struct Result {
  double bound = 0.0;
  int iterations = 0;
  bool converged = false;
  double flops = 0.0;
  double bound_evaluations = 0.0;
  double max_residual_alpha = 0.0;   // max |alpha - g^m| at the end (eq. 7)
  double max_residual_lambda = 0.0;  // max |lambda + 2 g^v| at the end (eq. 8)
  int damped_sweeps = 0;             // sweeps repeated with damping (bound would have dropped)
  int bracketed_solves = 0;          // scalar solves that left the plain fixed-point iteration
  int refused_solves = 0;            // scalar solves whose result was refused
  int coupled_steps = 0;             // outer iterations made of a coupled mean step and a sweep
  int undone_coupled_steps = 0;      // such iterations undone (the bound would have dropped)
  std::vector<Record> history;
};

// Algorithm 1 from the starting point (alpha, lambda) [L, N] (overwritten by the solution).
// Sigma [N, N] symmetric (both triangles), mean [L]. When V_out [L, N, N] is not null, it
// receives the posterior covariances (both triangles). Throws std::invalid_argument for bad
// input, LinAlgError when the starting lambda does not give a positive-definite Omega + Lambda.
Result infer(const LocalBound& lb, const double* y, ConstMatrixView Sigma, const double* mean,
             double* alpha, double* lambda, const Options& opt, double* V_out);

// Outputs of fit_step (caller-allocated; null to skip, except dkernel when gradients are asked).
struct Gradients {
  double* kernel = nullptr;      // [P] w.r.t. the kernel's positive parameters
  double* mean = nullptr;        // [L]
  double* thresholds = nullptr;  // [K-1] (Ordinal)
};

// The prior covariance of fit_step, Sigma = K(X, X) + jitter mean(diag K) I, into S [N, N];
// K's own diagonal into diag [N] when it is not null.
void prior_covariance(const kernels::Kernel& kernel, ConstMatrixView X, double jitter, MatrixView S,
                      double* diag);

// One evaluation of the hyperparameter objective: Sigma = prior_covariance(X),
// inference from the warm start (alpha, lambda) (overwritten), the bound at the optimum and,
// when grads is not null, its gradients (envelope theorem, see above; the jitter is held
// fixed). When Pi_out [L, N, N] is not null it receives Pi_l = (Sigma + Lambda_l^-1)^-1 (for
// tests: prediction uses predictive_factor). The rank-one updates lose accuracy when Sigma is
// numerically singular and the site precisions are large (a conditional variance then rounds
// to <= 0, a LinAlgError); a relative jitter of 1e-6 bounds the condition number of Sigma.
Result fit_step(const kernels::Kernel& kernel, const LocalBound& lb, ConstMatrixView X,
                const double* y, const double* mean, double jitter, double* alpha,
                double* lambda, const Options& opt, Gradients* grads, double* Pi_out);

// The Opper-Archambeau objective (eq. 11): the same bound at m_l = mean_l + Sigma alpha_l,
// V_l = (Omega + Lambda_l)^-1, lambda >= 0, with its gradients [L, N] in alpha and lambda
// (d/dalpha = Sigma (g^m - alpha), d/dlambda_i = -1/2 sum_j V_ij^2 (lambda_j + 2 g^v_j)).
// 7/3 N^3 flops per latent (POTRF of B = I + Lambda^1/2 Sigma Lambda^1/2, TRSM, SYRK for V).
// Adds its flops and bound evaluations to *flops and *evaluations when they are not null.
double oa_objective(const LocalBound& lb, const double* y, ConstMatrixView Sigma,
                    const double* mean, const double* alpha, const double* lambda,
                    double* dalpha, double* dlambda, double* flops, double* evaluations);

// F_l [L, N, N] (lower; zero above the diagonal): the Cholesky factors of I + Lambda_l^1/2
// Sigma Lambda_l^1/2 for the site precisions lambda [L, N] (negative ones, which rounding can
// leave, count as 0) and Sigma = prior_covariance(X) with the fit's jitter. N^3 / 3 flops each.
void predictive_factor(const kernels::Kernel& kernel, ConstMatrixView X, double jitter,
                       const double* lambda, index_t L, double* F);

// Latent marginals at new inputs Xnew [T, D]: mean_out, var_out [T, L] from the training
// inputs X [N, D], mean [L], alpha [L, N] and lambda [L, N] of fit_step and F [L, N, N] of
// predictive_factor.
void predict_f(const kernels::Kernel& kernel, ConstMatrixView X, const double* mean,
               const double* alpha, const double* lambda, const double* F, index_t L,
               ConstMatrixView Xnew, MatrixView mean_out, MatrixView var_out);

}  // namespace pygpfast::cvi
