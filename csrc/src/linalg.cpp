#include "pygpfast/linalg.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "pygpfast/blas.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/threads.hpp"
#include "pygpfast/workspace.hpp"

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
  if (mean_diag == std::numeric_limits<double>::infinity()) {  // the sum overflowed: sum d_i / n
    mean_diag = 0.0;
    for (index_t i = 0; i < n; ++i) mean_diag += A(i, i) / static_cast<double>(n);
  }
  if (!(mean_diag > 0.0))
    throw LinAlgError("cholesky", 1,
                      "the matrix is not positive definite: its mean diagonal is " +
                          format_value(mean_diag) + " (check the kernel variance)");

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
    // (jitter is 0 when mean_diag * initial_relative_jitter underflows: growing it would not end)
    if (jitter > max_jitter * (1.0 + 1e-12) || !(jitter > 0.0))
      throw LinAlgError(
          "dpotrf", first_info,
          "the matrix is not positive definite: the leading minor of order " +
              std::to_string(first_info) + " failed, even with jitter up to " +
              format_value(max_jitter) +
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

namespace {

// solve_lower's recursion: below kSolveLeafRows rows of L, or kSolveLeafColumns columns of B,
// the BLAS's TRSM solves directly.
constexpr index_t kSolveLeafRows = 32, kSolveLeafColumns = 256;

void solve_lower_recursive(ConstMatrixView L, MatrixView B, bool transpose) {
  const index_t n = L.rows;
  if (n <= kSolveLeafRows || B.cols < kSolveLeafColumns) {
    blas::trsm(blas::Side::Left, blas::Uplo::Lower, transpose ? blas::Trans::Yes : blas::Trans::No,
               blas::Diag::NonUnit, 1.0, L, B);
    return;
  }
  // L = [L11 0; L21 L22], B = [B1; B2]; the halves split at a multiple of 8 rows.
  const index_t h = (n / 2 + 7) / 8 * 8;
  const ConstMatrixView L11(L.data, h, h, L.ld), L21(L.row(h), n - h, h, L.ld), L22(L.row(h) + h, n - h, n - h, L.ld);
  const MatrixView B1(B.data, h, B.cols, B.ld), B2(B.row(h), n - h, B.cols, B.ld);
  if (!transpose) {  // X1 = L11^-1 B1, X2 = L22^-1 (B2 - L21 X1)
    solve_lower_recursive(L11, B1, false);
    blas::gemm(blas::Trans::No, blas::Trans::No, -1.0, L21, B1, 1.0, B2);
    solve_lower_recursive(L22, B2, false);
  } else {  // X2 = L22^-T B2, X1 = L11^-T (B1 - L21^T X2)
    solve_lower_recursive(L22, B2, true);
    blas::gemm(blas::Trans::Yes, blas::Trans::No, -1.0, L21, B2, 1.0, B1);
    solve_lower_recursive(L11, B1, true);
  }
}

}  // namespace

// Recursive halving puts all but the leaves' flops into GEMMs: a TRSM of this library's BLAS
// with a 400 x 400 L and 4000 right-hand sides ran at ~40% of its GEMM rate on two threads.
void solve_lower(ConstMatrixView L, MatrixView B, bool transpose) {
  require(L.rows == L.cols, "solve_lower: L must be square");
  require(B.rows == L.rows, "solve_lower: B must have as many rows as L");
  solve_lower_recursive(L, B, transpose);
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
    const double r2 = (lkk - x[k]) * (lkk + x[k]);
    // When r2 overflows or underflows (factors beyond ~1e154 or below ~1e-154), r in units of lkk.
    const double r = r2 >= std::numeric_limits<double>::min() && r2 <= std::numeric_limits<double>::max()
                         ? std::sqrt(r2)
                         : std::fabs(lkk) * std::sqrt((1.0 - x[k] / lkk) * (1.0 + x[k] / lkk));
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

// visit(i, j) for every i > j of an [n, n] matrix, in 32 x 32 tiles so that the entries
// (i, j) and (j, i) a visit touches stay in cache; rows of tiles go to threads for large n
// (a row of tiles holds about 16 n entries).
template <class Visit>
void visit_strict_lower(index_t n, const Visit& visit) {
  constexpr index_t t = 32;
  const index_t tile_rows = (n + t - 1) / t;
  parallel_for(tile_rows, std::max<index_t>(1, (index_t{1} << 16) / std::max<index_t>(t * n / 2, 1)),
               [&](index_t r) {
                 const index_t i0 = r * t;
                 for (index_t j0 = 0; j0 <= i0; j0 += t)
                   for (index_t i = i0; i < std::min(i0 + t, n); ++i)
                     for (index_t j = j0; j < std::min(j0 + t, i); ++j) visit(i, j);
               });
}

}  // namespace

void mirror_lower(MatrixView A) {
  visit_strict_lower(A.rows, [&](index_t i, index_t j) { A(j, i) = A(i, j); });
}

void symmetrise(MatrixView A) {
  visit_strict_lower(A.rows, [&](index_t i, index_t j) { A(i, j) = A(j, i) = 0.5 * (A(i, j) + A(j, i)); });
}

double add_relative_jitter(MatrixView A, double relative, const char* what, const char* where) {
  double mean_diag = 0.0;
  for (index_t i = 0; i < A.rows; ++i) mean_diag += A(i, i) / static_cast<double>(A.rows);
  if (A.rows > 0 && mean_diag == 0.0)  // (NaN goes on to cholesky_jitter's finiteness check)
    throw LinAlgError("cholesky", 1,
                      std::string(what) + " is zero on its diagonal: the kernel vanishes at " + where +
                          " (a Linear kernel at 0?), so no jitter relative to its scale can make it "
                          "positive definite; move " + where +
                          " away from where the kernel vanishes, or add a Constant or White kernel");
  const double jitter = relative * mean_diag;
  for (index_t i = 0; i < A.rows; ++i) A(i, i) += jitter;
  return jitter;
}

void add_relative_jitter_reverse(MatrixView G, double relative) {
  double trace = 0.0;
  for (index_t i = 0; i < G.rows; ++i) trace += G(i, i);
  const double d = relative * trace / static_cast<double>(G.rows);
  for (index_t i = 0; i < G.rows; ++i) G(i, i) += d;
}

double fixed_order_sum(const double* x, index_t n) {
  double s = 0.0;
  for (index_t i = 0; i < n; ++i) s += x[i];
  return s;
}

namespace {

// One diagonal block of cholesky_reverse: Dbar (lower triangle read) becomes the lower-only
// gradient with respect to D0 = D D^T: the symmetric L^-T sym(Phi(D^T Dbar)) L^-1 (Murray's
// eq. 10, 3 w^3 flops in triangular BLAS-3) folded onto the lower triangle.
void cholesky_reverse_block(ConstMatrixView D, MatrixView Dbar, workspace::Buffer& work) {
  using namespace blas;
  const index_t w = D.rows;
  work.resize(static_cast<std::size_t>(w * w));
  const MatrixView P(work.data(), w, w);
  for (index_t i = 0; i < w; ++i)
    for (index_t j = 0; j < w; ++j) P(i, j) = j <= i ? Dbar(i, j) : 0.0;
  trmm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, D, P);  // D^T Dbar
  for (index_t i = 0; i < w; ++i) {
    for (index_t j = 0; j < i; ++j) P(j, i) = P(i, j) *= 0.5;
    P(i, i) *= 0.5;
  }
  trsm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, D, P);
  trsm(Side::Right, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, D, P);
  for (index_t i = 0; i < w; ++i) {
    for (index_t j = 0; j < i; ++j) Dbar(i, j) = P(i, j) + P(j, i);
    Dbar(i, i) = P(i, i);
  }
}

// Murray's blocked algorithm (2016, section 4), run backwards over the column blocks of width
// nb of the left-looking blocked Cholesky: with D = L[j:k, j:k], R = L[j:k, :j],
// C = L[k:, j:k] and B = L[k:, :j] (and their bars in G), where C = (A[k:, j:k] - B R^T) D^-T,
//   Cbar <- Cbar D^-1,  Bbar -= Cbar R,  Rbar -= Cbar^T B,  Dbar -= tril(Cbar^T C),
//   Dbar <- the block's own reverse,  Rbar -= (Dbar + Dbar^T) R.
// The block's own reverse is the same pass with blocks of kInnerBlock, whose diagonal blocks
// take cholesky_reverse_block: its 3 w^3 flops of triangular BLAS-3 on 64-wide blocks cost
// more than the pass itself (measured, one thread: M = 64 50 -> 24 us, M = 128 167 -> 114 us,
// M = 256 690 -> 583 us against a one-level pass with 64-wide blocks). Leaves the lower-only
// gradient (entries below the diagonal twice their symmetric value) in G's lower triangle.
constexpr index_t kOuterBlock = 64, kInnerBlock = 16;

void cholesky_reverse_pass(ConstMatrixView L, MatrixView G, index_t nb, workspace::Buffer& work,
                           workspace::Buffer& S) {
  using namespace blas;
  const index_t M = L.rows;
  for (index_t j = ((M - 1) / nb) * nb; j >= 0; j -= nb) {
    const index_t k = std::min(j + nb, M), w = k - j, below = M - k;
    const ConstMatrixView D(L.row(j) + j, w, w, L.ld), R(L.row(j), w, j, L.ld);
    const MatrixView Dbar(G.row(j) + j, w, w, G.ld), Rbar(G.row(j), w, j, G.ld);
    if (below > 0) {
      const ConstMatrixView C(L.row(k) + j, below, w, L.ld), B(L.row(k), below, j, L.ld);
      const MatrixView Cbar(G.row(k) + j, below, w, G.ld), Bbar(G.row(k), below, j, G.ld);
      trsm(Side::Right, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, D, Cbar);
      gemm(Trans::Yes, Trans::No, -1.0, Cbar, C, 1.0, Dbar);  // (the upper triangle is not read)
      if (j > 0) {
        gemm(Trans::No, Trans::No, -1.0, Cbar, R, 1.0, Bbar);
        gemm(Trans::Yes, Trans::No, -1.0, Cbar, B, 1.0, Rbar);
      }
    }
    if (nb > kInnerBlock && w > kInnerBlock)
      cholesky_reverse_pass(D, Dbar, kInnerBlock, work, S);
    else
      cholesky_reverse_block(D, Dbar, work);
    if (j > 0) {
      // Dbar + Dbar^T, stored in its lower triangle.
      S.assign(static_cast<std::size_t>(w * w), 0.0);
      const MatrixView SV(S.data(), w, w);
      for (index_t i = 0; i < w; ++i) {
        for (index_t c = 0; c < i; ++c) SV(i, c) = Dbar(i, c);
        SV(i, i) = 2.0 * Dbar(i, i);
      }
      symm(Side::Left, Uplo::Lower, -1.0, SV, R, 1.0, Rbar);
    }
  }
}

}  // namespace

void cholesky_reverse(ConstMatrixView L, MatrixView G) {
  const index_t M = L.rows;
  require(L.cols == M && G.rows == M && G.cols == M, "cholesky_reverse: L and Lbar must be [M, M]");
  if (M == 0) return;
  workspace::Buffer work, S;
  cholesky_reverse_pass(L, G, kOuterBlock, work, S);
  // Lower-only gradient to the symmetric one: off-diagonal entries are shared by two.
  visit_strict_lower(M, [&](index_t i, index_t j) { G(j, i) = G(i, j) *= 0.5; });
}

void weighted_gram(ConstMatrixView A, const double* g, double* W_scratch, MatrixView G, double beta) {
  const index_t M = A.rows, K = A.cols;
  require(G.rows == M && G.cols == M, "weighted_gram: G must be [M, M] for A [M, K]");
  // The columns of each sign, gathered and scaled by sqrt|g|: one SYRK per sign that occurs, over
  // only its columns (zero weights drop out).
  std::vector<index_t> negative, positive;
  for (index_t k = 0; k < K; ++k) {
    if (g[k] < 0.0) negative.push_back(k);
    else if (g[k] > 0.0) positive.push_back(k);
  }
  std::vector<double> root(static_cast<std::size_t>(K));
  for (index_t k = 0; k < K; ++k) root[k] = std::sqrt(std::abs(g[k]));
  bool first = true;
  for (const double sign : {-1.0, 1.0}) {
    const std::vector<index_t>& cols = sign < 0 ? negative : positive;
    const index_t k_sign = static_cast<index_t>(cols.size());
    if (k_sign == 0) continue;
    MatrixView W(W_scratch, M, k_sign);
    for (index_t m = 0; m < M; ++m) {
      const double* a = A.row(m);
      double* w = W.row(m);
      for (index_t t = 0; t < k_sign; ++t) w[t] = a[cols[t]] * root[cols[t]];
    }
    blas::syrk(blas::Uplo::Lower, blas::Trans::No, sign, W, first ? beta : 1.0, G);
    first = false;
  }
  if (first) {  // all weights 0: G = beta G (lower triangle)
    for (index_t m = 0; m < M; ++m)
      for (index_t l = 0; l <= m; ++l) G(m, l) = beta == 0.0 ? 0.0 : beta * G(m, l);
  }
}

}  // namespace pygpfast::linalg
