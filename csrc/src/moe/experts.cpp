#include "pygpfast/moe/experts.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "pygpfast/blas.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/kernels.hpp"
#include "pygpfast/likelihoods.hpp"
#include "pygpfast/linalg.hpp"
#include "pygpfast/threads.hpp"
#include "pygpfast/vmath.hpp"

namespace pygpfast::moe {

namespace {

constexpr double kLog2Pi = 1.8378770664093454836;
constexpr double kInf = std::numeric_limits<double>::infinity();

void resize(std::vector<double>& v, index_t n) {
  if (static_cast<index_t>(v.size()) < n) v.resize(static_cast<std::size_t>(n));
}

kernels::Kernel make_kernel(const KernelSpec& spec, const double* params, index_t input_dim) {
  return kernels::Kernel(spec.codes, spec.n_codes, params, spec.n_params, input_dim);
}

// log p(y | f), its first derivative, W = -second derivative and the third derivative, for one
// label y in {0, 1}.
struct Derivatives {
  double log_p, d1, w, d3;
};

Derivatives probit_derivatives(double y, double f) {
  const double s = y > 0.5 ? 1.0 : -1.0, z = s * f;
  double log_cdf, lambda;
  vmath::log_normal_cdf(z, log_cdf, lambda);
  // With h(z) = log Phi(z): h' = lambda, -h'' = lambda T1 with T1 = lambda + z, and
  // h''' = lambda (T1 (T1 + lambda) - 1). Deep in the lower tail (z = -x, x > 4) T1 and
  // T1 (T1 + lambda) - 1 = T1 (2 T1 - T2) come from the Mills-ratio fraction, without the
  // cancellation of lambda + z.
  double T1 = lambda + z, h3;
  if (z < -vmath::kMillsFractionFrom) {
    double T2;
    vmath::mills_fraction_tails(-z, T1, T2);
    h3 = lambda * T1 * (2.0 * T1 - T2);
  } else {
    h3 = lambda * (T1 * (T1 + lambda) - 1.0);
  }
  return {log_cdf, s * lambda, lambda * T1, s * h3};
}

Derivatives logit_derivatives(double y, double f) {
  const double s = y > 0.5 ? 1.0 : -1.0, z = s * f;
  // log sigmoid(z) without overflow; pi = sigmoid(f).
  const double log_p = z > 0.0 ? -std::log1p(std::exp(-z)) : z - std::log1p(std::exp(z));
  const double pi = f >= 0.0 ? 1.0 / (1.0 + std::exp(-f)) : std::exp(f) / (1.0 + std::exp(f));
  const double w = pi * (1.0 - pi);
  return {log_p, y - pi, w, -w * (1.0 - 2.0 * pi)};
}

Derivatives derivatives(Likelihood lik, double y, double f) {
  return lik == Likelihood::Probit ? probit_derivatives(y, f) : logit_derivatives(y, f);
}

double log_lik_sum(Likelihood lik, const double* y, const double* f, index_t n) {
  double s = 0.0;
  for (index_t i = 0; i < n; ++i) s += derivatives(lik, y[i], f[i]).log_p;
  return s;
}

// Finite inputs (and labels in {0, 1} for classification), checked once per evaluation: O(n D)
// against the evaluation's O(n^3).
void check_block_data(ConstMatrixView X, const double* y, bool labels) {
  for (index_t i = 0; i < X.rows; ++i) {
    for (index_t j = 0; j < X.cols; ++j)
      require(std::isfinite(X(i, j)), "moe: X has a non-finite value at (", i, ", ", j, ")");
    require(std::isfinite(y[i]), "moe: y has a non-finite value at ", i);
    require(!labels || y[i] == 0.0 || y[i] == 1.0, "moe: classification labels must be 0 or 1, got y[", i,
            "] = ", y[i]);
  }
}

double sum_log_diag(ConstMatrixView L) {
  double s = 0.0;
  for (index_t i = 0; i < L.rows; ++i) s += std::log(L(i, i));
  return s;
}

// B = I + sW K sW into L, factorised (jitter escalation as for any Cholesky).
linalg::CholeskyResult factor_B(ConstMatrixView K, const double* sW, MatrixView L, const JitterOptions& jitter) {
  const index_t n = K.rows;
  for (index_t i = 0; i < n; ++i) {
    for (index_t j = 0; j <= i; ++j) L(i, j) = sW[i] * K(i, j) * sW[j];
    L(i, i) += 1.0;
  }
  return linalg::cholesky_jitter(L, jitter.initial, jitter.max);
}

}  // namespace

EvidenceResult gaussian_evidence(const KernelSpec& spec, const double* params, ConstMatrixView X,
                                 const double* y, double noise_variance, double mean,
                                 const JitterOptions& jitter, BlockWorkspace& ws, double* d_params,
                                 double* d_noise, double* d_mean) {
  const index_t n = X.rows;
  require(n >= 1, "gaussian_evidence: the block is empty");
  require(std::isfinite(noise_variance) && noise_variance > 0.0,
          "gaussian_evidence: the noise variance must be positive and finite, got ", noise_variance);
  require(std::isfinite(mean), "gaussian_evidence: the mean must be finite, got ", mean);
  check_block_data(X, y, false);
  const kernels::Kernel kernel = make_kernel(spec, params, X.cols);
  resize(ws.K, n * n);
  resize(ws.L, n * n);
  resize(ws.alpha, n);
  const MatrixView K(ws.K.data(), n, n), L(ws.L.data(), n, n);
  kernel.K(X, X, true, K);
  for (index_t i = 0; i < n; ++i) {
    for (index_t j = 0; j <= i; ++j) L(i, j) = K(i, j);
    L(i, i) += noise_variance;
  }
  EvidenceResult res;
  res.jitter = linalg::cholesky_jitter(L, jitter.initial, jitter.max).jitter;
  double* alpha = ws.alpha.data();
  for (index_t i = 0; i < n; ++i) alpha[i] = y[i] - mean;
  double rr = 0.0;
  blas::trsv(blas::Uplo::Lower, blas::Trans::No, blas::Diag::NonUnit, L, alpha);
  for (index_t i = 0; i < n; ++i) rr += alpha[i] * alpha[i];
  blas::trsv(blas::Uplo::Lower, blas::Trans::Yes, blas::Diag::NonUnit, L, alpha);
  res.log_evidence = -0.5 * rr - sum_log_diag(L) - 0.5 * static_cast<double>(n) * kLog2Pi;

  if (d_mean != nullptr) *d_mean = linalg::fixed_order_sum(alpha, n);
  if (d_params == nullptr && d_noise == nullptr) return res;
  // G = (alpha alpha^T - C^-1) / 2, the adjoint of C: d log Z = sum_ij G_ij dC_ij.
  resize(ws.work, n * n);
  const MatrixView G(ws.work.data(), n, n);
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j <= i; ++j) G(i, j) = L(i, j);
  const int info = blas::potri_lower(G);
  if (info != 0) throw LinAlgError("dpotri", info, "the inverse of the block's covariance failed");
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j <= i; ++j) {
      const double g = 0.5 * (alpha[i] * alpha[j] - G(i, j));
      G(i, j) = g;
      G(j, i) = g;
    }
  if (d_noise != nullptr) {
    double trace = 0.0;
    for (index_t i = 0; i < n; ++i) trace += G(i, i);
    *d_noise = trace;
  }
  if (d_params != nullptr) {
    std::fill(d_params, d_params + spec.n_params, 0.0);
    kernel.K_vjp(X, X, true, G, K, d_params, nullptr, nullptr);
  }
  return res;
}

EvidenceResult laplace_evidence(const KernelSpec& spec, const double* params, ConstMatrixView X,
                                const double* y, Likelihood lik, const JitterOptions& jitter,
                                const LaplaceOptions& opt, BlockWorkspace& ws, double* d_params) {
  const index_t n = X.rows;
  require(n >= 1, "laplace_evidence: the block is empty");
  require(lik == Likelihood::Probit || lik == Likelihood::Logit,
          "laplace_evidence: the likelihood must be probit or logit");
  require(opt.max_iter >= 1 && opt.tol > 0.0, "laplace_evidence: max_iter must be >= 1 and tol > 0");
  check_block_data(X, y, true);
  const kernels::Kernel kernel = make_kernel(spec, params, X.cols);
  for (auto* v : {&ws.alpha, &ws.f, &ws.W, &ws.a, &ws.v1, &ws.v2, &ws.v3}) resize(*v, n);
  resize(ws.K, n * n);
  resize(ws.L, n * n);
  const MatrixView K(ws.K.data(), n, n), L(ws.L.data(), n, n);
  kernel.K(X, X, true, K);
  double *f = ws.f.data(), *a = ws.a.data(), *W = ws.W.data(), *g = ws.alpha.data();
  double *sW = ws.v1.data(), *b = ws.v2.data(), *t = ws.v3.data();
  std::fill(f, f + n, 0.0);
  std::fill(a, a + n, 0.0);
  double psi = log_lik_sum(lik, y, f, n);

  EvidenceResult res;
  auto derivs_at_f = [&] {
    for (index_t i = 0; i < n; ++i) {
      const Derivatives d = derivatives(lik, y[i], f[i]);
      g[i] = d.d1;
      W[i] = d.w;
      sW[i] = std::sqrt(std::max(d.w, 0.0));
    }
  };
  bool converged = false;
  std::vector<double> a_new(static_cast<std::size_t>(n)), f_new(static_cast<std::size_t>(n));
  for (int it = 0; it < opt.max_iter && !converged; ++it) {
    ++res.newton_iterations;
    derivs_at_f();
    factor_B(K, sW, L, jitter);
    // b = W f + g; a_new = b - sW L^-T L^-1 sW K b.
    for (index_t i = 0; i < n; ++i) b[i] = W[i] * f[i] + g[i];
    blas::symv(blas::Uplo::Lower, 1.0, K, b, 0.0, t);
    for (index_t i = 0; i < n; ++i) t[i] *= sW[i];
    blas::trsv(blas::Uplo::Lower, blas::Trans::No, blas::Diag::NonUnit, L, t);
    blas::trsv(blas::Uplo::Lower, blas::Trans::Yes, blas::Diag::NonUnit, L, t);
    for (index_t i = 0; i < n; ++i) a_new[i] = b[i] - sW[i] * t[i];
    // The Newton step in a, halved while psi falls (psi is concave in a for log-concave p).
    double step = 1.0, psi_new = -kInf;
    for (int halvings = 0; halvings < 60; ++halvings) {
      for (index_t i = 0; i < n; ++i) t[i] = a[i] + step * (a_new[i] - a[i]);
      blas::symv(blas::Uplo::Lower, 1.0, K, t, 0.0, f_new.data());
      double af = 0.0;
      for (index_t i = 0; i < n; ++i) af += t[i] * f_new[i];
      psi_new = -0.5 * af + log_lik_sum(lik, y, f_new.data(), n);
      if (psi_new >= psi) break;
      step *= 0.5;
    }
    if (!(psi_new >= psi)) {  // no ascent at all: psi is at its maximum to rounding
      converged = true;
      break;
    }
    double moved = 0.0;
    for (index_t i = 0; i < n; ++i) moved = std::max(moved, std::fabs(f_new[i] - f[i]));
    converged = psi_new - psi <= opt.tol * std::max(1.0, std::fabs(psi_new)) && moved <= std::sqrt(opt.tol);
    std::copy(t, t + n, a);
    std::copy(f_new.begin(), f_new.end(), f);
    psi = psi_new;
  }
  if (!converged)
    throw LinAlgError("laplace_mode", opt.max_iter,
                      "Newton's method for the Laplace mode did not converge in " + std::to_string(opt.max_iter) +
                          " steps; raise the Newton iteration limit or check the kernel's scale");
  // W and the factor of B at the mode.
  derivs_at_f();
  res.jitter = factor_B(K, sW, L, jitter).jitter;
  double af = 0.0;
  for (index_t i = 0; i < n; ++i) af += a[i] * f[i];
  res.log_evidence = -0.5 * af + log_lik_sum(lik, y, f, n) - sum_log_diag(L);
  if (d_params == nullptr) return res;

  // Algorithm 5.1. R = sW B^-1 sW = (W^-1 + K)^-1; C = L^-1 sW K, and
  // s2 = d(-log|B| / 2) / df = diag(K - C^T C) d3 / 2 with d3 the third derivative of log p (dW/df =
  // -d3): the evidence's change through the mode, whose own change is (I - K R) dK g. (The book's
  // Algorithm 5.1 prints s2 with the opposite sign; finite differences side with this one.)
  resize(ws.work, 2 * n * n);
  const MatrixView R(ws.work.data(), n, n), C(ws.work.data() + n * n, n, n);
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j <= i; ++j) R(i, j) = L(i, j);
  const int info = blas::potri_lower(R);
  if (info != 0) throw LinAlgError("dpotri", info, "the inverse of B in the Laplace gradient failed");
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j <= i; ++j) {
      const double r = sW[i] * R(i, j) * sW[j];
      R(i, j) = r;
      R(j, i) = r;
    }
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < n; ++j) C(i, j) = sW[i] * K(i, j);
  linalg::solve_lower(L, C, false);
  double* s2 = b;
  std::fill(s2, s2 + n, 0.0);
  for (index_t k = 0; k < n; ++k)
    for (index_t i = 0; i < n; ++i) s2[i] += C(k, i) * C(k, i);
  for (index_t i = 0; i < n; ++i) s2[i] = 0.5 * (K(i, i) - s2[i]) * derivatives(lik, y[i], f[i]).d3;
  // u = (I - R K) s2, and the adjoint of K:
  // G = (a a^T - R) / 2 + (u g^T + g u^T) / 2, so that d log Z / d theta = sum_ij G_ij dK_ij / dtheta.
  double* u = t;
  std::vector<double> Ks(static_cast<std::size_t>(n));
  blas::symv(blas::Uplo::Lower, 1.0, K, s2, 0.0, Ks.data());
  blas::symv(blas::Uplo::Lower, 1.0, R, Ks.data(), 0.0, u);
  for (index_t i = 0; i < n; ++i) u[i] = s2[i] - u[i];
  const MatrixView G = C;  // (C is no longer needed)
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < n; ++j) G(i, j) = 0.5 * (a[i] * a[j] - R(i, j) + u[i] * g[j] + g[i] * u[j]);
  std::fill(d_params, d_params + spec.n_params, 0.0);
  kernel.K_vjp(X, X, true, G, K, d_params, nullptr, nullptr);
  return res;
}

void check_blocks(const index_t* offsets, const index_t* rows, index_t blocks, index_t n_rows) {
  require(blocks >= 1, "moe: there must be at least one block");
  require(offsets[0] == 0, "moe: offsets[0] must be 0, got ", offsets[0]);
  for (index_t p = 0; p < blocks; ++p)
    require(offsets[p + 1] > offsets[p], "moe: block ", p, " is empty (offsets[", p, "] = ", offsets[p],
            ", offsets[", p + 1, "] = ", offsets[p + 1], "); drop empty experts before the call");
  for (index_t i = 0; i < offsets[blocks]; ++i)
    require(rows[i] >= 0 && rows[i] < n_rows, "moe: rows[", i, "] = ", rows[i], " is outside [0, ", n_rows, ")");
}

void factor_offsets(const index_t* offsets, index_t blocks, index_t* out) {
  out[0] = 0;
  for (index_t p = 0; p < blocks; ++p) {
    const index_t n = offsets[p + 1] - offsets[p];
    out[p + 1] = out[p] + n * n;
  }
}

namespace {

// Runs body(p) for every block, largest first, on OpenMP threads (for_each_blas_task over the
// sorted blocks), every thread inside a SingleThreadScope (also on one thread, so that the
// arithmetic is the same for every thread count). A failure is rethrown after the region: that
// of the lowest-numbered failed block (region_errors.hpp), its message naming the block.
template <class Body>
void for_each_block(const index_t* offsets, index_t blocks, const Body& body) {
  std::vector<index_t> order(static_cast<std::size_t>(blocks));
  std::iota(order.begin(), order.end(), index_t{0});
  std::stable_sort(order.begin(), order.end(), [&](index_t p, index_t q) {
    return offsets[p + 1] - offsets[p] > offsets[q + 1] - offsets[q];
  });
  auto block = [&](index_t p, BlockWorkspace& ws) {
    const auto where = [&] {
      return "block " + std::to_string(p) + " (" + std::to_string(offsets[p + 1] - offsets[p]) + " rows): ";
    };
    try {
      body(p, ws);
    } catch (const LinAlgError& e) {
      throw LinAlgError(e.routine(), e.info(), where() + e.what());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(where() + e.what());
    }
  };
  // (blocks in `order`, an exception's rank the block's number)
  auto block_at = [&](index_t i) { return order[static_cast<std::size_t>(i)]; };
  for_each_blas_task<BlockWorkspace>(
      blocks, threads_for_blas_calls(blocks, 1), [&](index_t i, BlockWorkspace& ws) { block(block_at(i), ws); },
      block_at);
}

// Copies rows[0..n) of X into buffer [n, D].
ConstMatrixView copy_rows(ConstMatrixView X, const index_t* rows, index_t n, std::vector<double>& buffer) {
  const index_t D = X.cols;
  resize(buffer, n * D);
  for (index_t i = 0; i < n; ++i) std::copy(X.row(rows[i]), X.row(rows[i]) + D, buffer.data() + i * D);
  return ConstMatrixView(buffer.data(), n, D);
}

// Copies the block's rows of X and y into ws.X [n, D] and ws.y [n].
ConstMatrixView gather(ConstMatrixView X, const double* y, const index_t* rows, index_t n, BlockWorkspace& ws) {
  const ConstMatrixView Xb = copy_rows(X, rows, n, ws.X);
  if (y != nullptr) {
    resize(ws.y, n);
    for (index_t i = 0; i < n; ++i) ws.y[static_cast<std::size_t>(i)] = y[rows[i]];
  }
  return Xb;
}

void check_finite(ConstMatrixView X, const char* name) {
  for (index_t i = 0; i < X.rows; ++i)
    for (index_t j = 0; j < X.cols; ++j)
      require(std::isfinite(X(i, j)), "moe: ", name, " has a non-finite value at (", i, ", ", j, ")");
}

// Checks the starting or fitted hyperparameters of every block (the kernel's parser checks its
// parameters).
void check_start(const KernelSpec& spec, const Start& s, index_t blocks, index_t D, bool gaussian) {
  require(s.params != nullptr, "moe: kernel parameters are missing");
  const index_t kernel_rows = s.params_stride == 0 ? 1 : blocks;
  for (index_t p = 0; p < kernel_rows; ++p) make_kernel(spec, s.params + p * s.params_stride, D);
  if (!gaussian) return;
  require(s.noise_variance != nullptr && s.mean != nullptr, "moe: noise variance and mean are missing");
  for (index_t p = 0; p < (s.noise_stride == 0 ? 1 : blocks); ++p) {
    const double v = s.noise_variance[p * s.noise_stride];
    require(std::isfinite(v) && v > 0.0, "moe: the noise variance of block ", p, " must be positive and finite, got ", v);
  }
  for (index_t p = 0; p < (s.mean_stride == 0 ? 1 : blocks); ++p)
    require(std::isfinite(s.mean[p * s.mean_stride]), "moe: the mean of block ", p, " is not finite");
}

double log_prior(const FitOptions& o, const double* u, index_t coords, double* grad) {
  double lp = 0.0;
  if (o.prior_loc == nullptr || o.prior_scale == nullptr) return lp;
  for (index_t c = 0; c < coords; ++c) {
    const double s = o.prior_scale[c];
    if (s == 0.0) continue;
    const double z = (u[c] - o.prior_loc[c]) / s;
    lp += -0.5 * z * z - std::log(s) - 0.5 * kLog2Pi;
    if (grad != nullptr) grad[c] += -z / s;
  }
  return lp;
}

}  // namespace

void fit_blocks(const KernelSpec& spec, const Start& start, ConstMatrixView X, const double* y,
                const index_t* offsets, const index_t* rows, index_t blocks, const FitOptions& o,
                const FitOutputs& out) {
  const bool gaussian = o.likelihood == Likelihood::Gaussian;
  const index_t N = X.rows, D = X.cols, P = spec.n_params;
  require(N >= 1 && D >= 1, "moe: X must have at least one row and one column");
  check_finite(X, "X");
  for (index_t i = 0; i < N; ++i) {
    require(std::isfinite(y[i]), "moe: y has a non-finite value at ", i);
    require(gaussian || y[i] == 0.0 || y[i] == 1.0, "moe: classification labels must be 0 or 1, got y[", i,
            "] = ", y[i]);
  }
  check_blocks(offsets, rows, blocks, N);
  check_start(spec, start, blocks, D, gaussian);
  require(std::isfinite(o.scale) && o.scale > 0.0, "moe: scale must be positive and finite, got ", o.scale);
  for (index_t c = 0; c < P + 2; ++c) {
    if (o.prior_loc != nullptr && o.prior_scale != nullptr) {
      require(std::isfinite(o.prior_loc[c]), "moe: prior_loc[", c, "] is not finite");
      require(std::isfinite(o.prior_scale[c]) && o.prior_scale[c] >= 0.0, "moe: prior_scale[", c,
              "] must be >= 0 and finite, got ", o.prior_scale[c]);
    }
    const double lo = o.lower != nullptr ? o.lower[c] : -kInf, hi = o.upper != nullptr ? o.upper[c] : kInf;
    require(!std::isnan(lo) && !std::isnan(hi) && lo <= hi, "moe: bounds of coordinate ", c, " are [", lo, ", ", hi, "]");
  }
  require(o.lbfgs.max_iter >= 0, "moe: max_iter must be >= 0");

  // The optimised coordinates of u = (log params, log s2, m).
  std::vector<index_t> coords;
  if (o.optimize) {
    for (index_t c = 0; c < P; ++c) coords.push_back(c);
    if (gaussian && o.fit_noise) coords.push_back(P);
    if (gaussian && o.fit_mean) coords.push_back(P + 1);
  }
  const index_t n_opt = static_cast<index_t>(coords.size());
  const index_t prior_coords = gaussian ? P + 2 : P;
  std::vector<double> lower(static_cast<std::size_t>(n_opt)), upper(static_cast<std::size_t>(n_opt));
  for (index_t k = 0; k < n_opt; ++k) {
    const index_t c = coords[static_cast<std::size_t>(k)];
    lower[static_cast<std::size_t>(k)] = o.lower != nullptr ? o.lower[c] : -kInf;
    upper[static_cast<std::size_t>(k)] = o.upper != nullptr ? o.upper[c] : kInf;
  }
  std::vector<index_t> foffs(static_cast<std::size_t>(blocks + 1));
  factor_offsets(offsets, blocks, foffs.data());

  for_each_block(offsets, blocks, [&](index_t p, BlockWorkspace& ws) {
    const index_t n = offsets[p + 1] - offsets[p];
    const ConstMatrixView Xb = gather(X, y, rows + offsets[p], n, ws);
    // The copy of y: ws.y is reused by the evaluations below.
    const std::vector<double> yb(ws.y.begin(), ws.y.begin() + n);
    std::vector<double> u(static_cast<std::size_t>(P + 2)), theta(static_cast<std::size_t>(P)),
        dtheta(static_cast<std::size_t>(P));
    const double* p0 = start.params + p * start.params_stride;
    for (index_t c = 0; c < P; ++c) u[static_cast<std::size_t>(c)] = std::log(p0[c]);
    u[static_cast<std::size_t>(P)] = gaussian ? std::log(start.noise_variance[p * start.noise_stride]) : 0.0;
    u[static_cast<std::size_t>(P + 1)] = gaussian ? start.mean[p * start.mean_stride] : 0.0;

    // The objective scale * log Z + log prior at u, with its gradient in u (all P + 2 coordinates).
    auto evaluate = [&](const double* uu, double* grad, EvidenceResult& r) {
      for (index_t c = 0; c < P; ++c) theta[static_cast<std::size_t>(c)] = std::exp(uu[c]);
      double d_noise = 0.0, d_mean = 0.0;
      if (gaussian) {
        r = gaussian_evidence(spec, theta.data(), Xb, yb.data(), std::exp(uu[P]), uu[P + 1], o.jitter, ws,
                              grad ? dtheta.data() : nullptr, grad ? &d_noise : nullptr, grad ? &d_mean : nullptr);
      } else {
        r = laplace_evidence(spec, theta.data(), Xb, yb.data(), o.likelihood, o.jitter, o.laplace, ws,
                             grad ? dtheta.data() : nullptr);
      }
      if (grad != nullptr) {
        for (index_t c = 0; c < P; ++c)
          grad[c] = o.scale * dtheta[static_cast<std::size_t>(c)] * theta[static_cast<std::size_t>(c)];
        grad[P] = o.scale * d_noise * std::exp(uu[P]);
        grad[P + 1] = o.scale * d_mean;
      }
      return o.scale * r.log_evidence + log_prior(o, uu, prior_coords, grad);
    };

    EvidenceResult r;
    if (n_opt > 0) {
      std::vector<double> x(static_cast<std::size_t>(n_opt)), ufull(u), gfull(static_cast<std::size_t>(P + 2));
      for (index_t k = 0; k < n_opt; ++k) x[static_cast<std::size_t>(k)] = u[static_cast<std::size_t>(coords[k])];
      bool first = true;
      auto objective = [&](const double* xx, double* grad) -> double {
        for (index_t k = 0; k < n_opt; ++k) ufull[static_cast<std::size_t>(coords[k])] = xx[k];
        EvidenceResult er;
        double value;
        try {
          value = evaluate(ufull.data(), gfull.data(), er);
        } catch (const LinAlgError&) {
          if (first) throw;  // the start itself fails: say why
          return kInf;       // a trial point too far out: the line search shortens the step
        }
        first = false;
        for (index_t k = 0; k < n_opt; ++k) grad[k] = -gfull[static_cast<std::size_t>(coords[k])];
        return -value;
      };
      const optimize::LbfgsResult lr =
          optimize::minimize_lbfgs(objective, x.data(), n_opt, lower.data(), upper.data(), o.lbfgs);
      for (index_t k = 0; k < n_opt; ++k) u[static_cast<std::size_t>(coords[k])] = x[static_cast<std::size_t>(k)];
      if (out.iterations) out.iterations[p] = lr.iterations;
      if (out.evaluations) out.evaluations[p] = lr.evaluations;
      if (out.status) out.status[p] = static_cast<std::int32_t>(lr.status);
    } else {
      if (out.iterations) out.iterations[p] = 0;
      if (out.evaluations) out.evaluations[p] = 0;
      if (out.status) out.status[p] = -1;
    }
    // The final evaluation at the returned point fills the workspace for prediction.
    const double objective = evaluate(u.data(), nullptr, r);
    if (out.params)
      for (index_t c = 0; c < P; ++c) out.params[p * P + c] = std::exp(u[static_cast<std::size_t>(c)]);
    if (out.noise_variance) out.noise_variance[p] = gaussian ? std::exp(u[static_cast<std::size_t>(P)]) : 0.0;
    if (out.mean) out.mean[p] = gaussian ? u[static_cast<std::size_t>(P + 1)] : 0.0;
    if (out.log_evidence) out.log_evidence[p] = r.log_evidence;
    if (out.objective) out.objective[p] = objective;
    if (out.log_prior) out.log_prior[p] = objective - o.scale * r.log_evidence;
    if (out.jitter) out.jitter[p] = r.jitter;
    if (out.alpha) std::copy(ws.alpha.begin(), ws.alpha.begin() + n, out.alpha + offsets[p]);
    if (out.factor) std::copy(ws.L.begin(), ws.L.begin() + n * n, out.factor + foffs[static_cast<std::size_t>(p)]);
    if (!gaussian) {
      if (out.f) std::copy(ws.f.begin(), ws.f.begin() + n, out.f + offsets[p]);
      if (out.W) std::copy(ws.W.begin(), ws.W.begin() + n, out.W + offsets[p]);
    }
  });
}

void predict_blocks(const KernelSpec& spec, const Start& fitted, ConstMatrixView X, const index_t* offsets,
                    const index_t* rows, index_t blocks, Likelihood lik, const double* alpha,
                    const double* factor, const double* W, ConstMatrixView Xnew, const PredictOutputs& out,
                    const TestRows& test) {
  const bool gaussian = lik == Likelihood::Gaussian;
  const index_t N = X.rows, D = X.cols, T = Xnew.rows;
  require(Xnew.cols == D, "moe: Xnew has ", Xnew.cols, " columns but X has ", D);
  check_finite(X, "X");
  check_finite(Xnew, "Xnew");
  check_blocks(offsets, rows, blocks, N);
  check_start(spec, fitted, blocks, D, gaussian);
  require(alpha != nullptr && factor != nullptr && (gaussian || W != nullptr), "moe: fitted arrays are missing");
  std::vector<index_t> foffs(static_cast<std::size_t>(blocks + 1));
  factor_offsets(offsets, blocks, foffs.data());
  for (index_t i = 0; i < offsets[blocks]; ++i) {
    require(std::isfinite(alpha[i]), "moe: alpha has a non-finite value at ", i);
    if (!gaussian)  // (W is null for a Gaussian likelihood: not even the message may name W[i])
      require(std::isfinite(W[i]) && W[i] >= 0.0, "moe: W must be >= 0 and finite, got W[", i, "] = ", W[i]);
  }
  require((test.offsets == nullptr) == (test.rows == nullptr), "moe: test row offsets and rows go together");
  if (test.offsets != nullptr) {
    require(test.offsets[0] == 0, "moe: test row offsets[0] must be 0, got ", test.offsets[0]);
    for (index_t p = 0; p < blocks; ++p)
      require(test.offsets[p + 1] >= test.offsets[p], "moe: test row offsets must be non-decreasing (block ", p, ")");
    for (index_t i = 0; i < test.offsets[blocks]; ++i)
      require(test.rows[i] >= 0 && test.rows[i] < T, "moe: test rows[", i, "] = ", test.rows[i], " is outside [0, ",
              T, ")");
  }
  if (T == 0) return;
  likelihoods::Likelihood logit;
  logit.type = likelihoods::LikelihoodType::BernoulliLogit;

  for_each_block(offsets, blocks, [&](index_t p, BlockWorkspace& ws) {
    const index_t n = offsets[p + 1] - offsets[p];
    const ConstMatrixView Xb = gather(X, nullptr, rows + offsets[p], n, ws);
    const kernels::Kernel kernel = make_kernel(spec, fitted.params + p * fitted.params_stride, D);
    const ConstMatrixView L(factor + foffs[static_cast<std::size_t>(p)], n, n);
    const double* a = alpha + offsets[p];
    const double noise = gaussian ? fitted.noise_variance[p * fitted.noise_stride] : 0.0;
    const double m = gaussian ? fitted.mean[p * fitted.mean_stride] : 0.0;
    // This block's test rows: all of Xnew, or those listed, gathered (row i of Xp is test row at(i)).
    const index_t* listed = test.rows != nullptr ? test.rows + test.offsets[p] : nullptr;
    const index_t Tp = listed != nullptr ? test.offsets[p + 1] - test.offsets[p] : T;
    if (Tp == 0) return;
    const ConstMatrixView Xp = listed != nullptr ? copy_rows(Xnew, listed, Tp, ws.Xt) : Xnew;
    // Test points in chunks of about 2^18 kernel entries.
    const index_t chunk = std::max<index_t>(1, std::min<index_t>(Tp, (index_t{1} << 18) / n));
    resize(ws.K, chunk * n);
    for (auto* v : {&ws.v1, &ws.v2, &ws.v3, &ws.f}) resize(*v, chunk);
    double *mu = ws.v1.data(), *var = ws.v2.data(), *kd = ws.v3.data(), *pr = ws.f.data();
    std::vector<double> sW;
    if (!gaussian) {
      sW.resize(static_cast<std::size_t>(n));
      for (index_t j = 0; j < n; ++j) sW[static_cast<std::size_t>(j)] = std::sqrt(W[offsets[p] + j]);
    }
    for (index_t t0 = 0; t0 < Tp; t0 += chunk) {
      const index_t tc = std::min(chunk, Tp - t0);
      const ConstMatrixView Xc(Xp.row(t0), tc, D, Xp.ld);
      const MatrixView Kx(ws.K.data(), tc, n);
      kernel.K(Xc, Xb, false, Kx);
      kernel.Kdiag(Xc, kd);
      blas::gemv(blas::Trans::No, 1.0, Kx, a, 0.0, mu);
      if (!gaussian)
        for (index_t t = 0; t < tc; ++t)
          for (index_t j = 0; j < n; ++j) Kx(t, j) *= sW[static_cast<std::size_t>(j)];
      // Row t of Kx L^-T is (L^-1 k_t)^T.
      blas::trsm(blas::Side::Right, blas::Uplo::Lower, blas::Trans::Yes, blas::Diag::NonUnit, 1.0, L, Kx);
      for (index_t t = 0; t < tc; ++t) {
        double s = 0.0;
        for (index_t j = 0; j < n; ++j) s += Kx(t, j) * Kx(t, j);
        var[t] = std::max(kd[t] - s, 0.0);
        mu[t] += m;
      }
      if (lik == Likelihood::Probit)
        for (index_t t = 0; t < tc; ++t) pr[t] = 0.5 * std::erfc(-mu[t] / std::sqrt(2.0 * (1.0 + var[t])));
      else if (lik == Likelihood::Logit)
        likelihoods::predict_mean_and_var(logit, mu, var, tc, pr, ws.K.data());  // (Kx is spent)
      for (index_t t = 0; t < tc; ++t) {
        const index_t o = (listed != nullptr ? listed[t0 + t] : t0 + t) * blocks + p;
        if (out.mean) out.mean[o] = mu[t];
        if (out.var) out.var[o] = var[t];
        if (gaussian && out.var_y) out.var_y[o] = var[t] + noise;
        if (!gaussian && out.prob) out.prob[o] = pr[t];
      }
    }
  });
}

}  // namespace pygpfast::moe
