#include "pygpfast/svgp.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
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

// Lz with Lz Lz^T = K(Z, Z) + jitter I, and K(Z, Z) itself in `Kzz` when not null. Returns the
// extra jitter escalation needed.
double inducing_cholesky(const kernels::Kernel& kernel, ConstMatrixView Z, double jitter,
                         Buffer& Lz, Buffer* Kzz = nullptr) {
  const index_t M = Z.rows;
  Lz.resize(static_cast<std::size_t>(M * M));
  MatrixView L(Lz.data(), M, M);
  kernel.K(Z, Z, true, L);
  if (Kzz != nullptr) *Kzz = Lz;
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

// out[n] += sum_m A[m, n] B[m, n].
void add_column_dots(ConstMatrixView A, ConstMatrixView B, double* out) {
  for (index_t m = 0; m < A.rows; ++m) {
    const double* a = A.row(m);
    const double* b = B.row(m);
#pragma omp simd
    for (index_t n = 0; n < A.cols; ++n) out[n] += a[n] * b[n];
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

void zero_strict_upper(MatrixView A) {
  for (index_t i = 0; i < A.rows; ++i) std::fill(A.row(i) + i + 1, A.row(i) + A.cols, 0.0);
}

void mirror_lower(MatrixView A) {
  for (index_t i = 0; i < A.rows; ++i)
    for (index_t j = 0; j < i; ++j) A(j, i) = A(i, j);
}

void symmetrise(MatrixView A) {
  for (index_t i = 0; i < A.rows; ++i)
    for (index_t j = 0; j < i; ++j) A(i, j) = A(j, i) = 0.5 * (A(i, j) + A(j, i));
}

double fixed_order_sum(const double* x, index_t n) {
  double s = 0.0;
  for (index_t i = 0; i < n; ++i) s += x[i];
  return s;
}

// What the forward pass needs and the reverse pass produces, shared by both paths. All
// gradients are of the (scaled) expected log-likelihood alone, in whitened coordinates.
struct Problem {
  index_t M, B, L;
  ConstMatrixView Lz;   // [M, M]
  ConstMatrixView Kzx;  // [M, B]
  const double* kdiag;  // [B]
  const Buffer& mw;     // [M, L]
  const Buffer& Lw;     // [L, M, M]
  ConstMatrixView Lw_of(index_t l) const { return ConstMatrixView(Lw.data() + l * M * M, M, M); }
};

struct Reverse {
  // in: d ELL / d mu, d ELL / d var, [B, L] each (already scaled by N / B)
  const double* gmu = nullptr;
  const double* gvar = nullptr;
  // which outputs are wanted
  bool want_dLw = true;   // d ELL / d L_w
  bool want_dSw = false;  // d ELL / d S_w (natural gradients)
  // out
  Buffer dmw;             // [M, L]
  Buffer dLw;             // [L, M, M] lower (if want_dLw)
  Buffer dSw;             // [L, M, M] symmetric (if want_dSw)
  Buffer dLz;             // [M, M] lower: through the marginals' dependence on Lz
  MatrixView dKzx;        // [M, B], in a buffer owned by the path
};

// B-vector of latent function l's entries of a [B, L] array.
void latent_column(const double* a, index_t B, index_t L, index_t l, double* out) {
  for (index_t n = 0; n < B; ++n) out[n] = a[n * L + l];
}

// ---- Path::Solve: A = Lz^-1 Kzx, T_l = L_w,l^T A --------------------------------------------

class SolvePath {
 public:
  explicit SolvePath(const Problem& p) : p_(p), A_(p.M * p.B), T_(p.L * p.M * p.B) {}

  void marginals(double* mu, double* var) {
    const index_t M = p_.M, B = p_.B, L = p_.L;
    const MatrixView A(A_.data(), M, B);
    std::copy(p_.Kzx.data, p_.Kzx.data + M * B, A.data);
    blas::trsm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, p_.Lz, A);
    if (L == 1)  // (a GEMM with one column runs far below GEMV's speed in OpenBLAS)
      blas::gemv(Trans::Yes, 1.0, A, p_.mw.data(), 0.0, mu);
    else
      blas::gemm(Trans::Yes, Trans::No, 1.0, A, ConstMatrixView(p_.mw.data(), M, L), 0.0,
                 MatrixView(mu, B, L));
    Buffer a2(B), t2(B);
    column_sums_of_squares(A, a2.data());
    for (index_t l = 0; l < L; ++l) {
      const MatrixView Tl = T_of(l);
      std::copy(A.data, A.data + M * B, Tl.data);
      blas::trmm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, p_.Lw_of(l), Tl);
      column_sums_of_squares(Tl, t2.data());
      for (index_t n = 0; n < B; ++n) var[n * L + l] = std::max(p_.kdiag[n] - a2[n] + t2[n], 0.0);
    }
  }

  // d/dm_w = A gmu; d/dS_w,l = A diag(g_l) A^T; d/dL_w,l = 2 tril(A diag(g_l) T_l^T);
  // d/dA = sum_l 2 L_w,l T_l diag(g_l) - 2 A diag(sum_l g_l) + m_w gmu^T;
  // d/dKzx = Lz^-T d/dA; d/dLz = -tril(d/dKzx A^T).
  void reverse(Reverse& r) {
    const index_t M = p_.M, B = p_.B, L = p_.L;
    const MatrixView A(A_.data(), M, B);
    r.dmw.resize(static_cast<std::size_t>(M * L));
    if (L == 1)
      blas::gemv(Trans::No, 1.0, A, r.gmu, 0.0, r.dmw.data());
    else
      blas::gemm(Trans::No, Trans::No, 1.0, A, ConstMatrixView(r.gmu, B, L), 0.0,
                 MatrixView(r.dmw.data(), M, L));
    if (r.want_dLw) r.dLw.resize(static_cast<std::size_t>(L * M * M));
    if (r.want_dSw) r.dSw.resize(static_cast<std::size_t>(L * M * M));
    Buffer gsum(B, 0.0), gl(B);
    std::unique_ptr<Scratch> W;
    for (index_t l = 0; l < L; ++l) {
      latent_column(r.gvar, B, L, l, gl.data());
      for (index_t n = 0; n < B; ++n) gsum[n] += gl[n];
      if (r.want_dSw) {
        if (!W) W = std::make_unique<Scratch>(M * B);
        linalg::weighted_gram(A, gl.data(), W->data(), MatrixView(r.dSw.data() + l * M * M, M, M));
      }
      const MatrixView Tl = T_of(l);
      for (index_t m = 0; m < M; ++m) {
        double* t = Tl.row(m);
#pragma omp simd
        for (index_t n = 0; n < B; ++n) t[n] *= gl[n];
      }
      if (r.want_dLw) gemm_nt_lower(2.0, A, Tl, MatrixView(r.dLw.data() + l * M * M, M, M));
      blas::trmm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 2.0, p_.Lw_of(l), Tl);
      if (l > 0) blas::axpy(M * B, 1.0, Tl.data, T_.data());
    }
    const MatrixView dA = T_of(0);
    for (index_t m = 0; m < M; ++m) {
      double* d = dA.row(m);
      const double* a = A.row(m);
#pragma omp simd
      for (index_t n = 0; n < B; ++n) d[n] -= 2.0 * a[n] * gsum[n];
    }
    if (L == 1)
      blas::ger(1.0, p_.mw.data(), r.gmu, dA);
    else
      blas::gemm(Trans::No, Trans::Yes, 1.0, ConstMatrixView(p_.mw.data(), M, L), ConstMatrixView(r.gmu, B, L),
                 1.0, dA);
    blas::trsm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, p_.Lz, dA);
    r.dKzx = dA;
    r.dLz.resize(static_cast<std::size_t>(M * M));
    gemm_nt_lower(-1.0, dA, A, MatrixView(r.dLz.data(), M, M));
  }

 private:
  MatrixView T_of(index_t l) const { return MatrixView(T_.data() + l * p_.M * p_.B, p_.M, p_.B); }

  const Problem& p_;
  Scratch A_, T_;
};

// ---- Path::Precomputed: Sigma_l = Lz^-T (S_w,l - I) Lz^-1, C_l = Sigma_l Kzx ------------------

class PrecomputedPath {
 public:
  explicit PrecomputedPath(const Problem& p)
      : p_(p), Y_(static_cast<std::size_t>(p.M * p.M)), W_(static_cast<std::size_t>(p.L * p.M * p.M)),
        Sigma_(static_cast<std::size_t>(p.L * p.M * p.M)), beta_(static_cast<std::size_t>(p.M * p.L)),
        C_(p.L * p.M * p.B) {}

  // Y = Lz^-1; W_l = Y^T L_w,l; Sigma_l = W_l W_l^T - Y^T Y (= Y^T (S_w,l - I) Y); beta = Y^T m_w;
  // C_l = Sigma_l Kzx; mu = Kzx^T beta; var_l = kdiag + colsum(Kzx o C_l).
  void marginals(double* mu, double* var) {
    const index_t M = p_.M, B = p_.B, L = p_.L;
    const MatrixView Y(Y_.data(), M, M);
    for (index_t i = 0; i < M; ++i)
      for (index_t j = 0; j < M; ++j) Y(i, j) = j <= i ? p_.Lz(i, j) : 0.0;
    if (blas::trtri_lower(Y) != 0)  // (Lz has a positive diagonal: cannot happen)
      throw LinAlgError("trtri", 1, "the Cholesky factor of Kzz is singular");
    Buffer Q(Y_);
    const MatrixView QV(Q.data(), M, M);
    blas::lauum_lower(QV);  // Y^T Y (lower triangle)
    for (index_t l = 0; l < L; ++l) {
      const MatrixView Wl = W_of(l), Sl = Sigma_of(l);
      for (index_t i = 0; i < M; ++i)
        for (index_t j = 0; j < M; ++j) Wl(i, j) = p_.Lw_of(l)(i, j);
      blas::trmm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, Y, Wl);
      blas::syrk(Uplo::Lower, Trans::No, 1.0, Wl, 0.0, Sl);
      for (index_t i = 0; i < M; ++i)
        for (index_t j = 0; j <= i; ++j) Sl(i, j) -= QV(i, j);
      mirror_lower(Sl);
    }
    std::copy(p_.mw.begin(), p_.mw.end(), beta_.begin());
    const MatrixView betaV(beta_.data(), M, L);
    blas::trmm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, Y, betaV);
    if (L == 1)
      blas::gemv(Trans::Yes, 1.0, p_.Kzx, beta_.data(), 0.0, mu);
    else
      blas::gemm(Trans::Yes, Trans::No, 1.0, p_.Kzx, betaV, 0.0, MatrixView(mu, B, L));
    Buffer vl(B);
    for (index_t l = 0; l < L; ++l) {
      const MatrixView Cl = C_of(l);
      blas::symm(Side::Left, Uplo::Lower, 1.0, Sigma_of(l), p_.Kzx, 0.0, Cl);
      std::copy(p_.kdiag, p_.kdiag + B, vl.begin());
      add_column_dots(p_.Kzx, Cl, vl.data());
      for (index_t n = 0; n < B; ++n) var[n * L + l] = std::max(vl[n], 0.0);
    }
  }

  // The precomputed form loses about log10(cond(Kzz)) digits (see svgp.hpp). Recompute the
  // variances of the `count` points with the largest |k_n|^2 / var_n by triangular solves;
  // true when all agree with `var` to 1e-8 relative (1e-12 of kxx_n absolute).
  bool variances_accurate(const double* var, index_t count) const {
    const index_t M = p_.M, B = p_.B, L = p_.L;
    Buffer k2(B);
    column_sums_of_squares(p_.Kzx, k2.data());
    std::vector<index_t> order(static_cast<std::size_t>(B));
    std::iota(order.begin(), order.end(), index_t{0});
    auto exposure = [&](index_t n) {
      double v = var[n * L];
      for (index_t l = 1; l < L; ++l) v = std::min(v, var[n * L + l]);
      return k2[n] / std::max(v, 1e-300);
    };
    count = std::min(count, B);
    std::partial_sort(order.begin(), order.begin() + count, order.end(),
                      [&](index_t a, index_t b) { return exposure(a) > exposure(b); });
    Buffer a(M), t(M);
    for (index_t c = 0; c < count; ++c) {
      const index_t n = order[c];
      for (index_t m = 0; m < M; ++m) a[m] = p_.Kzx(m, n);
      blas::trsv(Uplo::Lower, Trans::No, Diag::NonUnit, p_.Lz, a.data());
      double a2 = 0.0;
      for (index_t m = 0; m < M; ++m) a2 += a[m] * a[m];
      for (index_t l = 0; l < L; ++l) {
        const ConstMatrixView Ll = p_.Lw_of(l);  // t = L_w,l^T a
        std::fill(t.begin(), t.end(), 0.0);
        for (index_t i = 0; i < M; ++i)
          for (index_t j = 0; j <= i; ++j) t[j] += Ll(i, j) * a[i];
        double t2 = 0.0;
        for (index_t m = 0; m < M; ++m) t2 += t[m] * t[m];
        const double exact = std::max(p_.kdiag[n] - a2 + t2, 0.0);
        if (std::fabs(var[n * L + l] - exact) > 1e-8 * exact + 1e-12 * std::fabs(p_.kdiag[n])) return false;
      }
    }
    return true;
  }

  // d/dSigma_l = Kzx diag(g_l) Kzx^T; d/dbeta = Kzx gmu; d/dKzx = sum_l 2 C_l diag(g_l) + beta gmu^T;
  // then through Sigma_l = W_l W_l^T - Y^T Y, W_l = Y^T L_w,l, beta = Y^T m_w and Y = Lz^-1:
  //   d/dW_l = 2 dSigma_l W_l,  d/dL_w,l = tril(Y d/dW_l),  d/dS_w,l = Y dSigma_l Y^T,
  //   d/dY = sum_l L_w,l dW_l^T - 2 Y sum_l dSigma_l + m_w dbeta^T,  d/dm_w = Y dbeta,
  //   d/dLz = -tril(Y^T dY Y^T).
  void reverse(Reverse& r) {
    const index_t M = p_.M, B = p_.B, L = p_.L;
    const ConstMatrixView Y(Y_.data(), M, M);
    Buffer dSigma(static_cast<std::size_t>(L * M * M)), gl(B);
    {
      Scratch Wk(M * B);
      for (index_t l = 0; l < L; ++l) {
        latent_column(r.gvar, B, L, l, gl.data());
        linalg::weighted_gram(p_.Kzx, gl.data(), Wk.data(), MatrixView(dSigma.data() + l * M * M, M, M));
      }
    }
    Buffer dbeta(static_cast<std::size_t>(M * L));
    const MatrixView dbetaV(dbeta.data(), M, L);
    if (L == 1)
      blas::gemv(Trans::No, 1.0, p_.Kzx, r.gmu, 0.0, dbeta.data());
    else
      blas::gemm(Trans::No, Trans::No, 1.0, p_.Kzx, ConstMatrixView(r.gmu, B, L), 0.0, dbetaV);

    // d/dKzx, in place of C_0.
    const MatrixView dK = C_of(0);
    for (index_t l = 0; l < L; ++l) {
      latent_column(r.gvar, B, L, l, gl.data());
      const MatrixView Cl = C_of(l);
      for (index_t m = 0; m < M; ++m) {
        double* c = Cl.row(m);
        double* d = dK.row(m);
        if (l == 0) {
#pragma omp simd
          for (index_t n = 0; n < B; ++n) d[n] = 2.0 * c[n] * gl[n];
        } else {
#pragma omp simd
          for (index_t n = 0; n < B; ++n) d[n] += 2.0 * c[n] * gl[n];
        }
      }
    }
    if (L == 1)
      blas::ger(1.0, beta_.data(), r.gmu, dK);
    else
      blas::gemm(Trans::No, Trans::Yes, 1.0, ConstMatrixView(beta_.data(), M, L), ConstMatrixView(r.gmu, B, L),
                 1.0, dK);
    r.dKzx = dK;

    r.dmw = dbeta;
    blas::trmm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, Y, MatrixView(r.dmw.data(), M, L));
    if (r.want_dLw) r.dLw.resize(static_cast<std::size_t>(L * M * M));
    if (r.want_dSw) r.dSw.resize(static_cast<std::size_t>(L * M * M));

    Buffer dY(static_cast<std::size_t>(M * M), 0.0), dSigma_sum(static_cast<std::size_t>(M * M), 0.0),
        dW(static_cast<std::size_t>(M * M));
    const MatrixView dYV(dY.data(), M, M), dWV(dW.data(), M, M);
    for (index_t l = 0; l < L; ++l) {
      const ConstMatrixView dSl(dSigma.data() + l * M * M, M, M);
      for (index_t i = 0; i < M * M; ++i) dSigma_sum[i] += dSigma[l * M * M + i];
      if (r.want_dSw) {
        const MatrixView out(r.dSw.data() + l * M * M, M, M);
        std::copy(dSl.data, dSl.data + M * M, out.data);
        blas::trmm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, Y, out);
        blas::trmm(Side::Right, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, Y, out);
        symmetrise(out);
      }
      blas::symm(Side::Left, Uplo::Lower, 2.0, dSl, W_of(l), 0.0, dWV);
      if (r.want_dLw) {
        const MatrixView out(r.dLw.data() + l * M * M, M, M);
        std::copy(dW.begin(), dW.end(), out.data);
        blas::trmm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, Y, out);
        zero_strict_upper(out);
      }
      // dY += L_w,l dW_l^T = (dW_l L_w,l^T)^T
      blas::trmm(Side::Right, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, p_.Lw_of(l), dWV);
      for (index_t i = 0; i < M; ++i)
        for (index_t j = 0; j < M; ++j) dYV(i, j) += dWV(j, i);
    }
    // dY -= 2 Y sum_l dSigma_l
    const MatrixView dSsum(dSigma_sum.data(), M, M);
    blas::trmm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, -2.0, Y, dSsum);
    for (index_t i = 0; i < M * M; ++i) dY[i] += dSigma_sum[i];
    // dY += m_w dbeta^T
    blas::gemm(Trans::No, Trans::Yes, 1.0, ConstMatrixView(p_.mw.data(), M, L), dbetaV, 1.0, dYV);
    // dLz = -tril(Y^T dY Y^T)
    blas::trmm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, -1.0, Y, dYV);
    blas::trmm(Side::Right, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, Y, dYV);
    zero_strict_upper(dYV);
    r.dLz = std::move(dY);
  }

 private:
  MatrixView W_of(index_t l) { return MatrixView(W_.data() + l * p_.M * p_.M, p_.M, p_.M); }

 public:
  const double* Linv() const { return Y_.data(); }

 private:
  MatrixView Sigma_of(index_t l) { return MatrixView(Sigma_.data() + l * p_.M * p_.M, p_.M, p_.M); }
  MatrixView C_of(index_t l) const { return MatrixView(C_.data() + l * p_.M * p_.B, p_.M, p_.B); }

  const Problem& p_;
  Buffer Y_, W_, Sigma_, beta_;
  Scratch C_;
};

// Flop counts of the two paths (svgp.hpp), triangular BLAS-3 weighted at 1 / 0.7.
double path_cost(Path path, index_t M, index_t B, index_t L) {
  const double bm2 = static_cast<double>(B) * M * M, m3 = static_cast<double>(M) * M * M;
  return path == Path::Solve ? (4.0 + 4.0 * L) * bm2 + 2.0 * m3 : 3.1 * L * bm2 + (5.0 + 7.3 * L) * m3;
}

Path cheaper_path(index_t M, index_t B, index_t L) {
  return path_cost(Path::Precomputed, M, B, L) < path_cost(Path::Solve, M, B, L) ? Path::Precomputed
                                                                                    : Path::Solve;
}

// An evaluation below this many flop-equivalents (~0.7 ms on one core) runs on one thread
// (threads.hpp): its BLAS calls and loops are too small to gain from a second one, which costs
// a wake-up per call and, on a shared machine, a wait at every barrier (measured: at M = 64,
// B = 256 two threads were slower than one even on an idle machine).
constexpr double kSingleThreadWork = 3e7;

// Points whose variances the precomputed path double-checks by triangular solves.
constexpr index_t kCheckedPoints = 4;

}  // namespace

Result elbo(const kernels::Kernel& kernel, const likelihoods::Likelihood& lik, const Variational& q,
            const Batch& batch, double jitter, Gradients* grads, Path path) {
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
  if (path == Path::Auto) path = cheaper_path(M, B, L);
  const double work = path_cost(path, M, B, L) + 30.0 * M * B + 50.0 * B * L * lik.n_gh;
  const SingleThreadScope single(work < kSingleThreadWork);

  Buffer Lz, Kzz;
  res.jitter = inducing_cholesky(kernel, q.Z, jitter, Lz, grads != nullptr ? &Kzz : nullptr);
  const ConstMatrixView LzV(Lz.data(), M, M);
  Scratch Kzx(M * B);
  Buffer kdiag(B);
  kernel.K(q.Z, batch.X, false, MatrixView(Kzx.data(), M, B));
  kernel.Kdiag(batch.X, kdiag.data());
  Buffer mw, Lw;
  whitened_parameters(q, LzV, mw, Lw);
  const Problem problem{M, B, L, LzV, ConstMatrixView(Kzx.data(), M, B), kdiag.data(), mw, Lw};

  // Marginals: mu, var [B, L].
  Buffer mu(static_cast<std::size_t>(B * L)), var(static_cast<std::size_t>(B * L));
  std::unique_ptr<PrecomputedPath> precomputed;
  std::unique_ptr<SolvePath> solve;
  if (path == Path::Precomputed) {
    precomputed = std::make_unique<PrecomputedPath>(problem);
    precomputed->marginals(mu.data(), var.data());
    if (!precomputed->variances_accurate(var.data(), kCheckedPoints)) {
      precomputed.reset();
      path = Path::Solve;
    }
  }
  if (path == Path::Solve) {
    solve = std::make_unique<SolvePath>(problem);
    solve->marginals(mu.data(), var.data());
  }
  res.path = path;

  Buffer f(B), gmu(static_cast<std::size_t>(B * L)), gvar(static_cast<std::size_t>(B * L)), gpar(B);
  likelihoods::variational_expectations(lik, batch.y, mu.data(), var.data(), B, f.data(), gmu.data(),
                                        gvar.data(), gpar.data());
  res.expected_log_lik = batch.scale * fixed_order_sum(f.data(), B);

  double kl = 0.0;
  for (index_t l = 0; l < L; ++l) {
    const ConstMatrixView Ll = problem.Lw_of(l);
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
  Reverse r;
  r.gmu = gmu.data();
  r.gvar = gvar.data();
  // d/dL_w is needed for q_sqrt's gradient and, unwhitened, for Lz's (through L_w = Lz^-1 L).
  r.want_dLw = grads->q_sqrt != nullptr || !q.whiten;
  r.want_dSw = grads->ell_q_cov != nullptr;
  if (precomputed)
    precomputed->reverse(r);
  else
    solve->reverse(r);
  MatrixView dLzV(r.dLz.data(), M, M);

  // Natural-gradient outputs: d ELL / d m_w and d ELL / d S_w per latent function; in u-space
  // (u = Lz v) they are Lz^-T (.) and Lz^-T (.) Lz^-1.
  if (grads->ell_q_mu != nullptr) {
    const MatrixView out(grads->ell_q_mu, M, L);
    for (index_t i = 0; i < M; ++i)
      for (index_t l = 0; l < L; ++l) out(i, l) = r.dmw[i * L + l];
    if (!q.whiten) blas::trsm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, LzV, out);
  }
  if (grads->ell_q_cov != nullptr) {
    for (index_t l = 0; l < L; ++l) {
      const MatrixView G(grads->ell_q_cov + l * M * M, M, M);
      std::copy(r.dSw.data() + l * M * M, r.dSw.data() + (l + 1) * M * M, G.data);
      if (!q.whiten) {
        blas::trsm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, LzV, G);
        blas::trsm(Side::Right, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, LzV, G);
        symmetrise(G);
      }
    }
  }

  // The KL's gradients: d/dm_w = -m_w, d/dL_w = -L_w + diag(1 / L_w,ii) (lower).
  Buffer& dmw = r.dmw;
  for (std::size_t i = 0; i < dmw.size(); ++i) dmw[i] -= mw[i];
  const MatrixView dmwV(dmw.data(), M, L);
  if (r.want_dLw)
    for (index_t l = 0; l < L; ++l) {
      const ConstMatrixView Ll = problem.Lw_of(l);
      const MatrixView dLl(r.dLw.data() + l * M * M, M, M);
      for (index_t i = 0; i < M; ++i) {
        for (index_t j = 0; j < i; ++j) dLl(i, j) -= Ll(i, j);
        dLl(i, i) += 1.0 / Ll(i, i) - Ll(i, i);
      }
    }

  if (q.whiten) {
    if (grads->q_mu.data != nullptr)
      for (index_t i = 0; i < M; ++i)
        for (index_t l = 0; l < L; ++l) grads->q_mu(i, l) = dmwV(i, l);
    if (grads->q_sqrt != nullptr) std::copy(r.dLw.begin(), r.dLw.end(), grads->q_sqrt);
  } else {
    // m_w = Lz^-1 m:  dm = Lz^-T dm_w,  dLz -= dm m_w^T
    blas::trsm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, LzV, dmwV);
    if (grads->q_mu.data != nullptr)
      for (index_t i = 0; i < M; ++i)
        for (index_t l = 0; l < L; ++l) grads->q_mu(i, l) = dmwV(i, l);
    blas::gemm(Trans::No, Trans::Yes, -1.0, dmwV, ConstMatrixView(mw.data(), M, L), 1.0, dLzV);
    // L_w = Lz^-1 L:  W = Lz^-T tril(dL_w),  dL = tril(W),  dLz -= W L_w^T
    for (index_t l = 0; l < L; ++l) {
      const MatrixView W(r.dLw.data() + l * M * M, M, M);
      blas::trsm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, LzV, W);
      blas::gemm(Trans::No, Trans::Yes, -1.0, W, problem.Lw_of(l), 1.0, dLzV);
      if (grads->q_sqrt == nullptr) continue;
      double* out = grads->q_sqrt + l * M * M;
      for (index_t i = 0; i < M; ++i)
        for (index_t j = 0; j < M; ++j) out[i * M + j] = j <= i ? W(i, j) : 0.0;
    }
  }
  zero_strict_upper(dLzV);
  linalg::cholesky_reverse(LzV, dLzV, precomputed ? precomputed->Linv() : nullptr);  // now d/dKzz

  // Kernel: through Kzx, Kzz and diag K(X) (which enters every latent function's variance).
  const index_t P = kernel.num_params();
  std::fill(grads->kernel, grads->kernel + P, 0.0);
  for (index_t i = 0; i < M; ++i)
    for (index_t d = 0; d < D; ++d) grads->Z(i, d) = 0.0;
  Buffer dZ2(static_cast<std::size_t>(M * D), 0.0);
  MatrixView dZ2V(dZ2.data(), M, D);
  kernel.K_vjp(q.Z, batch.X, false, r.dKzx, problem.Kzx, grads->kernel, &grads->Z, nullptr);
  kernel.K_vjp(q.Z, q.Z, true, dLzV, ConstMatrixView(Kzz.data(), M, M), grads->kernel, &dZ2V, &dZ2V);
  for (index_t i = 0; i < M; ++i)
    for (index_t d = 0; d < D; ++d) grads->Z(i, d) += dZ2[i * D + d];
  Buffer gsum(B, 0.0);
  for (index_t n = 0; n < B; ++n)
    for (index_t l = 0; l < L; ++l) gsum[n] += gvar[n * L + l];
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
