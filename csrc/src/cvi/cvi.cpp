// Concave variational inference (seed 004): the public entry points of cvi.hpp. The inference
// itself (Algorithm 1) is in inference.hpp: inference.cpp (the driver), sweep.cpp (the site
// precisions) and means.cpp (the means); here its callers, the gradients of fit_step, the
// Opper-Archambeau objective and prediction.
#include "pygpfast/cvi/cvi.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "inference.hpp"
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
using detail::check_sigma;
using detail::Counter;
using detail::factor_b;
using detail::Inference;
using linalg::fixed_order_sum;
using linalg::mirror_lower;
using workspace::Buffer;

// Problems of fewer points run on one thread, BLAS included (SingleThreadScope): their O(N^2)
// BLAS-2 calls and small factorisations are too short to pay for waking a second thread
// (measured on a shared 2-core machine: 50x slower with two threads at N = 60, 25x at N = 280).
constexpr index_t kOneThreadBelow = 512;

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
    linalg::solve_lower(Bv, Av, false);
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
    const double *a = alpha + l * N, *lam = lambda + l * N;
    value += detail::minus_kl(Sigma, l, N, logdet[l], lam, v.data() + l * N, a,
                              m.data() + l * N, mean[l]);
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
