#include "pygpfast/svgp.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
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

// Uninitialised scratch: large [M, B] blocks are written in full before they are read, so
// they skip std::vector's zero-fill pass.
class Scratch {
 public:
  explicit Scratch(index_t n) : p_(new double[static_cast<std::size_t>(std::max<index_t>(n, 1))]) {}
  double* data() const { return p_.get(); }

 private:
  std::unique_ptr<double[]> p_;
};

void check_shapes(const kernels::Kernel& kernel, const Variational& q, ConstMatrixView X) {
  const index_t M = q.Z.rows, L = q.num_latent();
  require(M >= 1, "svgp: need at least one inducing point");
  require(L >= 1, "svgp: need at least one latent function (q_mu has no columns)");
  require(q.Z.cols == kernel.input_dim(), "svgp: Z has " + std::to_string(q.Z.cols) +
                                              " columns but the kernel expects " +
                                              std::to_string(kernel.input_dim()));
  require(X.cols == q.Z.cols, "svgp: X has " + std::to_string(X.cols) + " columns but Z has " +
                                  std::to_string(q.Z.cols));
  require(q.q_mu.rows == M, "svgp: q_mu must have M = " + std::to_string(M) + " rows");
  require(q.q_sqrt != nullptr, "svgp: q_sqrt is missing");
  for (index_t l = 0; l < L; ++l)
    for (index_t i = 0; i < M; ++i)
      if (q.q_sqrt[(l * M + i) * M + i] == 0.0)
        throw std::invalid_argument("svgp: q_sqrt[" + std::to_string(l) + "] has a zero on its diagonal (row " +
                                    std::to_string(i) + "); S = L L^T must be positive definite");
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

// Whitened parameters: mw [M, L] and Lw [L, M, M] are (q_mu, tril q_sqrt) when whitened, else
// (Lz^-1 q_mu, Lz^-1 tril q_sqrt).
void whitened_parameters(const Variational& q, ConstMatrixView Lz, Buffer& mw, Buffer& Lw) {
  const index_t M = q.Z.rows, L = q.num_latent();
  mw.resize(static_cast<std::size_t>(M * L));
  for (index_t i = 0; i < M; ++i)
    for (index_t l = 0; l < L; ++l) mw[i * L + l] = q.q_mu(i, l);
  Lw.assign(static_cast<std::size_t>(L * M * M), 0.0);
  for (index_t l = 0; l < L; ++l)
    for (index_t i = 0; i < M; ++i)
      for (index_t j = 0; j <= i; ++j) Lw[(l * M + i) * M + j] = q.q_sqrt[(l * M + i) * M + j];
  if (!q.whiten) {
    blas::trsm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, Lz, MatrixView(mw.data(), M, L));
    for (index_t l = 0; l < L; ++l)
      blas::trsm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, Lz,
                 MatrixView(Lw.data() + l * M * M, M, M));
  }
}

// out[n] = sum_m A[m, n]^2 (column sums of squares of an [M, B] block), row by row so the
// inner loop runs over contiguous memory.
void column_sums_of_squares(ConstMatrixView A, double* out) {
  std::fill(out, out + A.cols, 0.0);
  for (index_t m = 0; m < A.rows; ++m) {
    const double* a = A.row(m);
#pragma omp simd
    for (index_t n = 0; n < A.cols; ++n) out[n] += a[n] * a[n];
  }
}

// The lower triangle (with the diagonal) of C = alpha X Y^T for X, Y [M, K], in row blocks
// so that the GEMMs skip all but ~M nb / 2 of the M^2 / 2 entries above the diagonal; the
// strict upper triangle is set to 0.
void gemm_nt_lower(double alpha, ConstMatrixView X, ConstMatrixView Y, MatrixView C) {
  const index_t M = X.rows;
  const index_t nb = std::max<index_t>(32, (M + 7) / 8);
  for (index_t i0 = 0; i0 < M; i0 += nb) {
    const index_t rows = std::min(nb, M - i0), cols = i0 + rows;
    blas::gemm(Trans::No, Trans::Yes, alpha, ConstMatrixView(X.row(i0), rows, X.cols, X.ld),
               ConstMatrixView(Y.data, cols, Y.cols, Y.ld), 0.0, MatrixView(C.row(i0), rows, cols, C.ld));
  }
  for (index_t i = 0; i < M; ++i) std::fill(C.row(i) + i + 1, C.row(i) + M, 0.0);
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
  const index_t M = q.Z.rows, B = batch.X.rows, D = q.Z.cols, L = q.num_latent();
  require(likelihoods::latent_dim(lik) == L,
          "svgp: the likelihood needs " + std::to_string(likelihoods::latent_dim(lik)) +
              " latent functions but q_mu has " + std::to_string(L) + " columns");
  Result res;

  Buffer Lz;
  res.jitter = inducing_cholesky(kernel, q.Z, jitter, Lz);
  ConstMatrixView LzV(Lz.data(), M, M);

  // A = Lz^-1 K(Z, X)  [M, B];  kdiag = diag K(X, X)  [B]
  Scratch A(M * B);
  MatrixView AV(A.data(), M, B);
  Buffer kdiag(B);
  kernel.K(q.Z, batch.X, false, AV);
  kernel.Kdiag(batch.X, kdiag.data());
  blas::trsm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, LzV, AV);

  Buffer mw, Lw;
  whitened_parameters(q, LzV, mw, Lw);
  ConstMatrixView mwV(mw.data(), M, L);
  auto Lw_of = [&](index_t l) { return MatrixView(Lw.data() + l * M * M, M, M); };

  // Marginals: mu = A^T m_w [B, L];  var[:, l] = kdiag - |A_n|^2 + |T_l[:, n]|^2, T_l = L_l^T A.
  Buffer mu(static_cast<std::size_t>(B * L)), var(static_cast<std::size_t>(B * L));
  if (L == 1)  // (a GEMM with one column runs far below GEMV's speed in OpenBLAS)
    blas::gemv(Trans::Yes, 1.0, AV, mw.data(), 0.0, mu.data());
  else
    blas::gemm(Trans::Yes, Trans::No, 1.0, AV, mwV, 0.0, MatrixView(mu.data(), B, L));
  Buffer a2(B), t2(B);
  column_sums_of_squares(AV, a2.data());
  Scratch T(L * M * B);
  auto T_of = [&](index_t l) { return MatrixView(T.data() + l * M * B, M, B); };
  for (index_t l = 0; l < L; ++l) {
    const MatrixView Tl = T_of(l);
    std::copy(A.data(), A.data() + M * B, Tl.data);
    blas::trmm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, Lw_of(l), Tl);
    column_sums_of_squares(Tl, t2.data());
    for (index_t n = 0; n < B; ++n) var[n * L + l] = std::max(kdiag[n] - a2[n] + t2[n], 0.0);
  }

  Buffer f(B), gmu(static_cast<std::size_t>(B * L)), gvar(static_cast<std::size_t>(B * L)), gpar(B);
  likelihoods::variational_expectations(lik, batch.y, mu.data(), var.data(), B, f.data(), gmu.data(),
                                        gvar.data(), gpar.data());
  res.expected_log_lik = batch.scale * fixed_order_sum(f.data(), B);

  double kl = 0.0;
  for (index_t l = 0; l < L; ++l) {
    const MatrixView Ll = Lw_of(l);
    double trace = 0.0, logdet = 0.0, mm = 0.0;
    for (index_t i = 0; i < M; ++i) {
      for (index_t j = 0; j <= i; ++j) trace += Ll(i, j) * Ll(i, j);
      logdet += 2.0 * std::log(std::fabs(Ll(i, i)));
      mm += mw[i * L + l] * mw[i * L + l];
    }
    kl += 0.5 * (trace + mm - static_cast<double>(M) - logdet);
  }
  res.kl = kl;
  res.elbo = res.expected_log_lik - res.kl;
  if (grads == nullptr) return res;

  for (std::size_t i = 0; i < gmu.size(); ++i) {
    gmu[i] *= batch.scale;
    gvar[i] *= batch.scale;
  }
  ConstMatrixView gmuV(gmu.data(), B, L);

  // d/dm_w = A gmu - m_w   [M, L]
  Buffer dmw(static_cast<std::size_t>(M * L));
  MatrixView dmwV(dmw.data(), M, L);
  if (L == 1)
    blas::gemv(Trans::No, 1.0, AV, gmu.data(), 0.0, dmw.data());
  else
    blas::gemm(Trans::No, Trans::No, 1.0, AV, gmuV, 0.0, dmwV);

  // Natural-gradient outputs: d ELL / d m_w = A gmu and d ELL / d S_w = A diag(gvar) A^T per
  // latent function; in u-space (u = Lz v) they are Lz^-T (.) and Lz^-T (.) Lz^-1.
  if (grads->ell_q_mu != nullptr) {
    MatrixView out(grads->ell_q_mu, M, L);
    for (index_t i = 0; i < M; ++i)
      for (index_t l = 0; l < L; ++l) out(i, l) = dmwV(i, l);
    if (!q.whiten) blas::trsm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, LzV, out);
  }
  if (grads->ell_q_cov != nullptr) {
    Scratch W(M * B);
    Buffer gl(B);
    for (index_t l = 0; l < L; ++l) {
      for (index_t n = 0; n < B; ++n) gl[n] = gvar[n * L + l];
      MatrixView G(grads->ell_q_cov + l * M * M, M, M);
      linalg::weighted_gram(AV, gl.data(), W.data(), G);
      if (!q.whiten) {
        blas::trsm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, LzV, G);
        blas::trsm(Side::Right, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, LzV, G);
        for (index_t i = 0; i < M; ++i)  // symmetric up to rounding: make it exactly so
          for (index_t j = 0; j < i; ++j) G(j, i) = G(i, j) = 0.5 * (G(i, j) + G(j, i));
      }
    }
  }
  for (std::size_t i = 0; i < dmw.size(); ++i) dmw[i] -= mw[i];

  // Per latent function, with Tg_l = T_l diag(gvar_l) (in place):
  //   d/dL_l = tril(2 A Tg_l^T - L_l + diag(1 / L_l,ii)),
  // then T_l <- 2 L_l Tg_l, and d/dA = sum_l T_l - 2 A diag(sum_l gvar_l) + m_w gmu^T, kept in T_0.
  Buffer dLw(static_cast<std::size_t>(L * M * M)), gsum(B, 0.0), gl(B);
  for (index_t l = 0; l < L; ++l) {
    const MatrixView Tl = T_of(l), Ll = Lw_of(l), dLl(dLw.data() + l * M * M, M, M);
    for (index_t n = 0; n < B; ++n) {
      gl[n] = gvar[n * L + l];
      gsum[n] += gl[n];
    }
    for (index_t m = 0; m < M; ++m) {
      double* t = Tl.row(m);
#pragma omp simd
      for (index_t n = 0; n < B; ++n) t[n] *= gl[n];
    }
    gemm_nt_lower(2.0, AV, Tl, dLl);
    for (index_t i = 0; i < M; ++i) {
      for (index_t j = 0; j < i; ++j) dLl(i, j) -= Ll(i, j);
      dLl(i, i) += 1.0 / Ll(i, i) - Ll(i, i);
    }
    blas::trmm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 2.0, Ll, Tl);
    if (l > 0) blas::axpy(M * B, 1.0, Tl.data, T.data());
  }
  const MatrixView dA = T_of(0);
  for (index_t m = 0; m < M; ++m) {
    double* d = dA.row(m);
    const double* a = AV.row(m);
#pragma omp simd
    for (index_t n = 0; n < B; ++n) d[n] -= 2.0 * a[n] * gsum[n];
  }
  if (L == 1)
    blas::ger(1.0, mw.data(), gmu.data(), dA);
  else
    blas::gemm(Trans::No, Trans::Yes, 1.0, mwV, gmuV, 1.0, dA);

  // d/dKzx = Lz^-T d/dA (in place), and d/dLz from A = Lz^-1 Kzx: -tril(dKzx A^T).
  blas::trsm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, LzV, dA);
  const MatrixView& dKzx = dA;
  Buffer dLz(static_cast<std::size_t>(M * M));
  MatrixView dLzV(dLz.data(), M, M);
  gemm_nt_lower(-1.0, dKzx, AV, dLzV);

  if (q.whiten) {
    if (grads->q_mu.data != nullptr)
      for (index_t i = 0; i < M; ++i)
        for (index_t l = 0; l < L; ++l) grads->q_mu(i, l) = dmwV(i, l);
    if (grads->q_sqrt != nullptr) std::copy(dLw.begin(), dLw.end(), grads->q_sqrt);
  } else {
    // m_w = Lz^-1 m:  dm = Lz^-T dm_w,  dLz -= dm m_w^T
    blas::trsm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, LzV, dmwV);
    if (grads->q_mu.data != nullptr)
      for (index_t i = 0; i < M; ++i)
        for (index_t l = 0; l < L; ++l) grads->q_mu(i, l) = dmwV(i, l);
    blas::gemm(Trans::No, Trans::Yes, -1.0, dmwV, mwV, 1.0, dLzV);
    // L_w = Lz^-1 L:  W = Lz^-T tril(dL_w),  dL = tril(W),  dLz -= W L_w^T
    for (index_t l = 0; l < L; ++l) {
      const MatrixView W(dLw.data() + l * M * M, M, M);
      blas::trsm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, LzV, W);
      blas::gemm(Trans::No, Trans::Yes, -1.0, W, Lw_of(l), 1.0, dLzV);
      if (grads->q_sqrt == nullptr) continue;
      double* out = grads->q_sqrt + l * M * M;
      for (index_t i = 0; i < M; ++i)
        for (index_t j = 0; j < M; ++j) out[i * M + j] = j <= i ? W(i, j) : 0.0;
    }
  }
  for (index_t i = 0; i < M; ++i)
    for (index_t j = i + 1; j < M; ++j) dLzV(i, j) = 0.0;
  cholesky_reverse(LzV, dLzV);  // dLz now holds d/dKzz (symmetric)

  // Kernel: through Kzx, Kzz and diag K(X) (which enters every latent function's variance).
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
  kernel.Kdiag_vjp(batch.X, gsum.data(), grads->kernel);

  if (grads->likelihood_variance != nullptr)
    *grads->likelihood_variance = batch.scale * fixed_order_sum(gpar.data(), B);
  return res;
}

double predict_f(const kernels::Kernel& kernel, const Variational& q, ConstMatrixView Xnew,
                 double jitter, MatrixView mean, MatrixView var) {
  check_shapes(kernel, q, Xnew);
  const index_t M = q.Z.rows, T = Xnew.rows, L = q.num_latent();
  require(mean.rows == T && mean.cols == L && var.rows == T && var.cols == L,
          "svgp: predict_f outputs must be [T, L]");
  Buffer Lz;
  const double extra = inducing_cholesky(kernel, q.Z, jitter, Lz);
  ConstMatrixView LzV(Lz.data(), M, M);
  Buffer mw, Lw;
  whitened_parameters(q, LzV, mw, Lw);
  // Chunks of test points bound the memory at 2 M x chunk doubles.
  const index_t chunk = std::max<index_t>(1, std::min<index_t>(T, (1 << 22) / std::max<index_t>(M, 1)));
  Buffer kdiag, a2, t2;
  for (index_t start = 0; start < T; start += chunk) {
    const index_t n = std::min(chunk, T - start);
    ConstMatrixView Xc(Xnew.row(start), n, Xnew.cols, Xnew.ld);
    Scratch A(M * n), Tm(M * n);
    kdiag.resize(n);
    a2.resize(n);
    t2.resize(n);
    MatrixView AV(A.data(), M, n), TV(Tm.data(), M, n);
    kernel.K(q.Z, Xc, false, AV);
    kernel.Kdiag(Xc, kdiag.data());
    blas::trsm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, LzV, AV);
    if (L == 1)
      blas::gemv(Trans::Yes, 1.0, AV, mw.data(), 0.0, mean.row(start));
    else
      blas::gemm(Trans::Yes, Trans::No, 1.0, AV, ConstMatrixView(mw.data(), M, L), 0.0,
                 MatrixView(mean.row(start), n, L, mean.ld));
    column_sums_of_squares(AV, a2.data());
    for (index_t l = 0; l < L; ++l) {
      std::copy(A.data(), A.data() + M * n, Tm.data());
      blas::trmm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0,
                 ConstMatrixView(Lw.data() + l * M * M, M, M), TV);
      column_sums_of_squares(TV, t2.data());
      for (index_t i = 0; i < n; ++i) var(start + i, l) = std::max(kdiag[i] - a2[i] + t2[i], 0.0);
    }
  }
  return extra;
}

}  // namespace pygpfast::svgp
