#include "pygpfast/svgp.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "pygpfast/blas.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/linalg.hpp"
#include "pygpfast/threads.hpp"

namespace pygpfast::svgp {
namespace {

using blas::Diag;
using blas::Side;
using blas::Trans;
using blas::Uplo;

using Buffer = std::vector<double>;

void check_shapes(const kernels::Kernel& kernel, const Variational& q, ConstMatrixView X) {
  const index_t M = q.Z.rows;
  require(M >= 1, "svgp: need at least one inducing point");
  require(q.Z.cols == kernel.input_dim(), "svgp: Z has " + std::to_string(q.Z.cols) +
                                              " columns but the kernel expects " +
                                              std::to_string(kernel.input_dim()));
  require(X.cols == q.Z.cols, "svgp: X has " + std::to_string(X.cols) + " columns but Z has " +
                                  std::to_string(q.Z.cols));
  require(q.q_sqrt.rows == M && q.q_sqrt.cols == M, "svgp: q_sqrt must be [M, M]");
  for (index_t i = 0; i < M; ++i)
    if (q.q_sqrt(i, i) == 0.0)
      throw std::invalid_argument("svgp: q_sqrt has a zero on its diagonal (row " + std::to_string(i) +
                                  "); S = L L^T must be positive definite");
}

// Lz with Lz Lz^T = K(Z, Z) + jitter I. Returns the extra jitter escalation needed.
double inducing_cholesky(const kernels::Kernel& kernel, ConstMatrixView Z, double jitter,
                         Buffer& Lz) {
  const index_t M = Z.rows;
  Lz.assign(static_cast<std::size_t>(M * M), 0.0);
  MatrixView L(Lz.data(), M, M);
  kernel.K(Z, Z, true, L);
  for (index_t i = 0; i < M; ++i) L(i, i) += jitter;
  return linalg::cholesky_jitter(L).jitter;
}

// Whitened parameters: (m_w, L_w) = (m, tril L) when whitened, else (Lz^-1 m, Lz^-1 tril L).
void whitened_parameters(const Variational& q, ConstMatrixView Lz, Buffer& mw, Buffer& Lw) {
  const index_t M = q.Z.rows;
  mw.assign(q.q_mu, q.q_mu + M);
  Lw.assign(static_cast<std::size_t>(M * M), 0.0);
  for (index_t i = 0; i < M; ++i)
    for (index_t j = 0; j <= i; ++j) Lw[i * M + j] = q.q_sqrt(i, j);
  if (!q.whiten) {
    blas::trsv(Uplo::Lower, Trans::No, Diag::NonUnit, Lz, mw.data());
    blas::trsm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, Lz, MatrixView(Lw.data(), M, M));
  }
}

// var[n] = kdiag[n] - sum_m A[m, n]^2 + sum_m T[m, n]^2, clamped at 0 against rounding.
void marginal_variances(ConstMatrixView A, ConstMatrixView T, const double* kdiag, double* var) {
  const index_t M = A.rows, B = A.cols;
  std::copy(kdiag, kdiag + B, var);
  for (index_t m = 0; m < M; ++m) {
    const double* a = A.row(m);
    const double* t = T.row(m);
    for (index_t n = 0; n < B; ++n) var[n] += t[n] * t[n] - a[n] * a[n];
  }
  for (index_t n = 0; n < B; ++n) var[n] = std::max(var[n], 0.0);
}

// Reverse mode of the Cholesky factorisation (Murray 2016): given Lbar = dE/dL (lower),
// returns in `out` the symmetric G with dE = sum_ij G_ij dA_ij:
//   G = L^-T sym(Phi(L^T Lbar)) L^-1, Phi = lower triangle with the diagonal halved.
void cholesky_reverse(ConstMatrixView L, MatrixView Lbar_in_G_out) {
  const index_t M = L.rows;
  MatrixView G = Lbar_in_G_out;
  blas::trmm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, L, G);  // L^T Lbar
  for (index_t i = 0; i < M; ++i) {
    G(i, i) *= 0.5;
    for (index_t j = 0; j < i; ++j) {
      const double v = 0.5 * G(i, j);
      G(i, j) = v;
      G(j, i) = v;
    }
  }
  blas::trsm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, L, G);
  blas::trsm(Side::Right, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, L, G);
  // Symmetrise away rounding.
  for (index_t i = 0; i < M; ++i)
    for (index_t j = 0; j < i; ++j) {
      const double v = 0.5 * (G(i, j) + G(j, i));
      G(i, j) = v;
      G(j, i) = v;
    }
}

double fixed_order_sum(const double* x, index_t n) {
  double s = 0.0;
  for (index_t i = 0; i < n; ++i) s += x[i];
  return s;
}

}  // namespace

Result elbo(const kernels::Kernel& kernel, const likelihoods::Likelihood& lik, const Variational& q,
            const Batch& batch, double jitter, Gradients* grads) {
  check_shapes(kernel, q, batch.X);
  require(batch.X.rows >= 1, "svgp: empty minibatch");
  require(std::isfinite(batch.scale) && batch.scale > 0, "svgp: scale (N/B) must be positive");
  require(jitter >= 0 && std::isfinite(jitter), "svgp: jitter must be >= 0");
  likelihoods::validate(lik);
  const index_t M = q.Z.rows, B = batch.X.rows, D = q.Z.cols;
  Result res;

  Buffer Lz;
  res.jitter = inducing_cholesky(kernel, q.Z, jitter, Lz);
  ConstMatrixView LzV(Lz.data(), M, M);

  // A = Lz^-1 K(Z, X)  [M, B];  kdiag = diag K(X, X)  [B]
  Buffer A(static_cast<std::size_t>(M * B)), kdiag(B);
  MatrixView AV(A.data(), M, B);
  kernel.K(q.Z, batch.X, false, AV);
  kernel.Kdiag(batch.X, kdiag.data());
  blas::trsm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, LzV, AV);

  Buffer mw, Lw;
  whitened_parameters(q, LzV, mw, Lw);
  ConstMatrixView LwV(Lw.data(), M, M);

  // Marginals: mu = A^T m_w, var = kdiag - |A_n|^2 + |L_w^T A_n|^2.
  Buffer mu(B), var(B), T(A);
  MatrixView TV(T.data(), M, B);
  blas::gemv(Trans::Yes, 1.0, AV, mw.data(), 0.0, mu.data());
  blas::trmm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, LwV, TV);
  marginal_variances(AV, TV, kdiag.data(), var.data());

  Buffer f(B), gmu(B), gvar(B), gpar(B);
  likelihoods::variational_expectations(lik, batch.y, mu.data(), var.data(), B, f.data(), gmu.data(),
                                        gvar.data(), gpar.data());
  res.expected_log_lik = batch.scale * fixed_order_sum(f.data(), B);

  double trace = 0.0, logdet = 0.0;
  for (index_t i = 0; i < M; ++i) {
    for (index_t j = 0; j <= i; ++j) trace += Lw[i * M + j] * Lw[i * M + j];
    logdet += 2.0 * std::log(std::fabs(Lw[i * M + i]));
  }
  res.kl = 0.5 * (trace + blas::dot(M, mw.data(), mw.data()) - static_cast<double>(M) - logdet);
  res.elbo = res.expected_log_lik - res.kl;
  if (grads == nullptr) return res;

  for (index_t n = 0; n < B; ++n) {
    gmu[n] *= batch.scale;
    gvar[n] *= batch.scale;
  }

  // d/dm_w = A gmu - m_w
  Buffer dmw(M);
  blas::gemv(Trans::No, 1.0, AV, gmu.data(), 0.0, dmw.data());
  for (index_t i = 0; i < M; ++i) dmw[i] -= mw[i];

  // Ag = A diag(gvar), Tg = T diag(gvar)
  Buffer Ag(static_cast<std::size_t>(M * B)), Tg(static_cast<std::size_t>(M * B));
  for (index_t m = 0; m < M; ++m)
    for (index_t n = 0; n < B; ++n) {
      Ag[m * B + n] = A[m * B + n] * gvar[n];
      Tg[m * B + n] = T[m * B + n] * gvar[n];
    }
  MatrixView AgV(Ag.data(), M, B), TgV(Tg.data(), M, B);

  // d/dL_w = tril(2 A diag(gvar) T^T - L_w + diag(1 / L_w,ii))   (T^T = A^T L_w)
  Buffer dLw(static_cast<std::size_t>(M * M));
  MatrixView dLwV(dLw.data(), M, M);
  blas::gemm(Trans::No, Trans::Yes, 2.0, AgV, TV, 0.0, dLwV);
  for (index_t i = 0; i < M; ++i) {
    for (index_t j = 0; j < i; ++j) dLwV(i, j) -= Lw[i * M + j];
    dLwV(i, i) += 1.0 / Lw[i * M + i] - Lw[i * M + i];
    for (index_t j = i + 1; j < M; ++j) dLwV(i, j) = 0.0;
  }

  // d/dA = m_w gmu^T + 2 (L_w T - A) diag(gvar), accumulated in Tg; then d/dKzx = Lz^-T d/dA.
  blas::trmm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 2.0, LwV, TgV);
  for (std::size_t i = 0; i < Tg.size(); ++i) Tg[i] -= 2.0 * Ag[i];
  blas::ger(1.0, mw.data(), gmu.data(), TgV);
  blas::trsm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, LzV, TgV);
  MatrixView& dKzx = TgV;

  // d/dLz from A = Lz^-1 Kzx: -tril(dKzx A^T)
  Buffer dLz(static_cast<std::size_t>(M * M));
  MatrixView dLzV(dLz.data(), M, M);
  blas::gemm(Trans::No, Trans::Yes, -1.0, dKzx, AV, 0.0, dLzV);

  if (q.whiten) {
    std::copy(dmw.begin(), dmw.end(), grads->q_mu);
    for (index_t i = 0; i < M; ++i)
      for (index_t j = 0; j < M; ++j) grads->q_sqrt(i, j) = dLwV(i, j);
  } else {
    // m_w = Lz^-1 m:  dm = Lz^-T dm_w,  dLz -= dm m_w^T
    std::copy(dmw.begin(), dmw.end(), grads->q_mu);
    blas::trsv(Uplo::Lower, Trans::Yes, Diag::NonUnit, LzV, grads->q_mu);
    blas::ger(-1.0, grads->q_mu, mw.data(), dLzV);
    // L_w = Lz^-1 L:  W = Lz^-T tril(dL_w),  dL = tril(W),  dLz -= W L_w^T
    blas::trsm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, LzV, dLwV);
    blas::gemm(Trans::No, Trans::Yes, -1.0, dLwV, LwV, 1.0, dLzV);
    for (index_t i = 0; i < M; ++i)
      for (index_t j = 0; j < M; ++j) grads->q_sqrt(i, j) = j <= i ? dLwV(i, j) : 0.0;
  }
  for (index_t i = 0; i < M; ++i)
    for (index_t j = i + 1; j < M; ++j) dLzV(i, j) = 0.0;
  cholesky_reverse(LzV, dLzV);  // dLz now holds d/dKzz (symmetric)

  // Kernel: through Kzx, Kzz and diag K(X).
  const index_t P = kernel.num_params();
  std::fill(grads->kernel, grads->kernel + P, 0.0);
  for (index_t i = 0; i < M; ++i)
    for (index_t d = 0; d < D; ++d) grads->Z(i, d) = 0.0;
  Buffer dZ2(static_cast<std::size_t>(M * D), 0.0);
  MatrixView dZ2V(dZ2.data(), M, D);
  kernel.K_vjp(q.Z, batch.X, false, dKzx, grads->kernel, &grads->Z, nullptr);
  kernel.K_vjp(q.Z, q.Z, true, dLzV, grads->kernel, &dZ2V, &dZ2V);
  for (index_t i = 0; i < M; ++i)
    for (index_t d = 0; d < D; ++d) grads->Z(i, d) += dZ2[i * D + d];
  kernel.Kdiag_vjp(batch.X, gvar.data(), grads->kernel);

  if (grads->likelihood_variance != nullptr)
    *grads->likelihood_variance = batch.scale * fixed_order_sum(gpar.data(), B);
  return res;
}

double predict_f(const kernels::Kernel& kernel, const Variational& q, ConstMatrixView Xnew,
                 double jitter, double* mean, double* var) {
  check_shapes(kernel, q, Xnew);
  const index_t M = q.Z.rows, T = Xnew.rows;
  Buffer Lz;
  const double extra = inducing_cholesky(kernel, q.Z, jitter, Lz);
  ConstMatrixView LzV(Lz.data(), M, M);
  Buffer mw, Lw;
  whitened_parameters(q, LzV, mw, Lw);
  ConstMatrixView LwV(Lw.data(), M, M);
  // Chunks of test points bound the memory at 2 M x chunk doubles.
  const index_t chunk = std::max<index_t>(1, std::min<index_t>(T, (1 << 22) / std::max<index_t>(M, 1)));
  Buffer A, Tm, kdiag;
  for (index_t start = 0; start < T; start += chunk) {
    const index_t n = std::min(chunk, T - start);
    ConstMatrixView Xc(Xnew.row(start), n, Xnew.cols, Xnew.ld);
    A.resize(static_cast<std::size_t>(M * n));
    kdiag.resize(n);
    MatrixView AV(A.data(), M, n);
    kernel.K(q.Z, Xc, false, AV);
    kernel.Kdiag(Xc, kdiag.data());
    blas::trsm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, LzV, AV);
    blas::gemv(Trans::Yes, 1.0, AV, mw.data(), 0.0, mean + start);
    Tm = A;
    MatrixView TV(Tm.data(), M, n);
    blas::trmm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, LwV, TV);
    marginal_variances(AV, TV, kdiag.data(), var + start);
  }
  return extra;
}

}  // namespace pygpfast::svgp
