#include "pygpfast/linalg.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "pygpfast/blas.hpp"
#include "pygpfast/errors.hpp"

namespace pygpfast::linalg {

CholeskyResult cholesky_jitter(MatrixView A, double initial_relative_jitter,
                               double max_relative_jitter) {
  require(A.rows == A.cols, "cholesky: matrix must be square, got ", A.rows, "x", A.cols);
  const index_t n = A.rows;
  CholeskyResult result;
  if (n == 0) return result;

  double mean_diag = 0.0;
  for (index_t i = 0; i < n; ++i) {
    for (index_t j = 0; j <= i; ++j)
      if (!std::isfinite(A(i, j)))  // (the message is built only on failure)
        throw std::invalid_argument("cholesky: matrix has a non-finite entry at (" +
                                    std::to_string(i) + ", " + std::to_string(j) + ")");
    mean_diag += A(i, i);
  }
  mean_diag /= static_cast<double>(n);
  if (!(mean_diag > 0.0))
    throw LinAlgError("cholesky", 1,
                      "the matrix is not positive definite: its mean diagonal is " +
                          std::to_string(mean_diag) + " (check the kernel variance)");

  // Keep the lower triangle so that a failed attempt can be retried from the original.
  std::vector<double> original(static_cast<std::size_t>(n * (n + 1) / 2));
  for (index_t i = 0, k = 0; i < n; ++i)
    for (index_t j = 0; j <= i; ++j) original[k++] = A(i, j);
  auto restore = [&](double jitter) {
    for (index_t i = 0, k = 0; i < n; ++i) {
      for (index_t j = 0; j <= i; ++j) A(i, j) = original[k++];
      A(i, i) += jitter;
    }
  };

  int info = blas::potrf_lower(A);
  int first_info = info;
  double jitter = initial_relative_jitter * mean_diag;
  const double max_jitter = max_relative_jitter * mean_diag;
  while (info != 0) {
    if (info < 0) throw LinAlgError("dpotrf", info, "illegal argument (internal error)");
    if (jitter > max_jitter * (1.0 + 1e-12))
      throw LinAlgError(
          "dpotrf", first_info,
          "the matrix is not positive definite: the leading minor of order " +
              std::to_string(first_info) + " failed, even with jitter up to " +
              std::to_string(max_jitter) +
              " added to the diagonal. Remove duplicate inputs, increase the noise/white "
              "variance, or increase the lengthscale's lower bound");
    restore(jitter);
    info = blas::potrf_lower(A);
    ++result.attempts;
    result.jitter = jitter;
    jitter *= 10.0;
  }
  for (index_t i = 0; i < n; ++i)
    for (index_t j = i + 1; j < n; ++j) A(i, j) = 0.0;
  return result;
}

void solve_lower(ConstMatrixView L, MatrixView B, bool transpose) {
  require(L.rows == L.cols, "solve_lower: L must be square");
  require(B.rows == L.rows, "solve_lower: B must have as many rows as L");
  blas::trsm(blas::Side::Left, blas::Uplo::Lower, transpose ? blas::Trans::Yes : blas::Trans::No,
             blas::Diag::NonUnit, 1.0, L, B);
}

void cholesky_update(MatrixView L, double* x) {
  require(L.rows == L.cols, "cholesky_update: L must be square");
  const index_t n = L.rows;
  // Givens-style sweep: column k of L absorbs x, rows below are updated.
  for (index_t k = 0; k < n; ++k) {
    const double lkk = L(k, k);
    const double r = std::hypot(lkk, x[k]);
    const double c = r / lkk, s = x[k] / lkk;
    L(k, k) = r;
    for (index_t i = k + 1; i < n; ++i) {
      L(i, k) = (L(i, k) + s * x[i]) / c;
      x[i] = c * x[i] - s * L(i, k);
    }
  }
}

void cholesky_downdate(MatrixView L, double* x) {
  require(L.rows == L.cols, "cholesky_downdate: L must be square");
  const index_t n = L.rows;
  // Check feasibility first: A - x x^T is PD iff ||L^{-1} x|| < 1.
  std::vector<double> p(x, x + n);
  blas::trsv(blas::Uplo::Lower, blas::Trans::No, blas::Diag::NonUnit, L, p.data());
  double norm2 = 0.0;
  for (index_t i = 0; i < n; ++i) norm2 += p[i] * p[i];
  if (!(norm2 < 1.0 - 1e-14))
    throw LinAlgError("cholesky_downdate", 1,
                      "the downdated matrix A - x x^T is not positive definite (||L^-1 x||^2 = " +
                          std::to_string(norm2) + " >= 1)");
  for (index_t k = 0; k < n; ++k) {
    const double lkk = L(k, k);
    const double r = std::sqrt((lkk - x[k]) * (lkk + x[k]));
    const double c = r / lkk, s = x[k] / lkk;
    L(k, k) = r;
    for (index_t i = k + 1; i < n; ++i) {
      L(i, k) = (L(i, k) - s * x[i]) / c;
      x[i] = c * x[i] - s * L(i, k);
    }
  }
}

double logdet_from_cholesky(ConstMatrixView L) {
  double s = 0.0;
  for (index_t i = 0; i < L.rows; ++i) s += std::log(L(i, i));
  return 2.0 * s;
}

namespace {
// LAPACK's dsygst runs its diagonal blocks (64 wide) with level-2 BLAS; below this size two
// triangular products (2 M^3 flops, level 3) take less time than its M^3 (measured with
// OpenBLAS).
constexpr index_t kCongruenceBySygst = 512;
}  // namespace

void mirror_lower(MatrixView A) {
  constexpr index_t t = 32;  // tiles that stay in cache
  const index_t n = A.rows;
  for (index_t i0 = 0; i0 < n; i0 += t)
    for (index_t j0 = 0; j0 <= i0; j0 += t)
      for (index_t i = i0; i < std::min(i0 + t, n); ++i)
        for (index_t j = j0; j < std::min(j0 + t, i); ++j) A(j, i) = A(i, j);
}

double fixed_order_sum(const double* x, index_t n) {
  double s = 0.0;
  for (index_t i = 0; i < n; ++i) s += x[i];
  return s;
}

void cholesky_reverse(ConstMatrixView L, MatrixView G, const double* Linv) {
  const index_t M = L.rows;
  require(L.cols == M && G.rows == M && G.cols == M, "cholesky_reverse: L and Lbar must be [M, M]");
  if (M == 0) return;
  // X = lower triangle of L^T Lbar: row panel [i0, i0 + nb) of X is L[i0:, panel]^T Lbar[i0:, :i0 + nb]
  // (rows of L and Lbar above i0 are zero in those columns).
  std::vector<double> X(static_cast<std::size_t>(M * M));
  const MatrixView XV(X.data(), M, M);
  constexpr index_t nb = 64;
  for (index_t i0 = 0; i0 < M; i0 += nb) {
    const index_t rows = std::min(nb, M - i0), below = M - i0;
    blas::gemm(blas::Trans::Yes, blas::Trans::No, 1.0, ConstMatrixView(L.row(i0) + i0, below, rows, L.ld),
               ConstMatrixView(G.row(i0), below, i0 + rows, G.ld), 0.0, MatrixView(XV.row(i0), rows, i0 + rows, M));
  }
  // P = sym(Phi(X)) in G's lower triangle, then G = L^-T P L^-1.
  for (index_t i = 0; i < M; ++i) {
    for (index_t j = 0; j < i; ++j) G(i, j) = 0.5 * XV(i, j);
    G(i, i) = 0.5 * XV(i, i);
  }
  if (M >= kCongruenceBySygst) {
    std::vector<double> Y_own;
    if (Linv == nullptr) {
      Y_own.assign(static_cast<std::size_t>(M * M), 0.0);
      for (index_t i = 0; i < M; ++i)
        for (index_t j = 0; j <= i; ++j) Y_own[i * M + j] = L(i, j);
      if (blas::trtri_lower(MatrixView(Y_own.data(), M, M)) != 0)
        throw LinAlgError("trtri", 1, "cholesky_reverse: the Cholesky factor is singular");
      Linv = Y_own.data();
    }
    if (blas::congruence_lower(G, ConstMatrixView(Linv, M, M)) != 0)
      throw LinAlgError("sygst", 1, "cholesky_reverse: bad argument to the congruence");
  } else {
    using blas::Diag;
    using blas::Side;
    using blas::Trans;
    using blas::Uplo;
    mirror_lower(G);
    if (Linv != nullptr) {
      const ConstMatrixView Y(Linv, M, M);
      blas::trmm(Side::Right, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, Y, G);
      blas::trmm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, Y, G);
    } else {
      blas::trsm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, L, G);
      blas::trsm(Side::Right, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, L, G);
    }
  }
  mirror_lower(G);  // (exactly symmetric: the products above are so only up to rounding)
}

void weighted_gram(ConstMatrixView A, const double* g, double* W_scratch, MatrixView G, double beta) {
  const index_t M = A.rows, K = A.cols;
  require(G.rows == M && G.cols == M, "weighted_gram: G must be [M, M] for A [M, K]");
  bool any_positive = false;
  for (index_t k = 0; k < K; ++k) any_positive |= g[k] > 0.0;
  std::vector<double> root(static_cast<std::size_t>(K));
  MatrixView W(W_scratch, M, K);
  for (const double sign : {-1.0, 1.0}) {
    if (sign > 0 && !any_positive) break;
    for (index_t k = 0; k < K; ++k) root[k] = std::sqrt(std::max(sign * g[k], 0.0));
    for (index_t m = 0; m < M; ++m) {
      const double* a = A.row(m);
      double* w = W.row(m);
#pragma omp simd
      for (index_t k = 0; k < K; ++k) w[k] = a[k] * root[k];
    }
    blas::syrk(blas::Uplo::Lower, blas::Trans::No, sign, W, sign < 0 ? beta : 1.0, G);
  }
  mirror_lower(G);
}

}  // namespace pygpfast::linalg
