// Core linear algebra against hand-computed references, with a linked system BLAS.
#include <random>
#include <utility>
#include <vector>

#include "check.hpp"
#include "pygpfast/blas.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/linalg.hpp"

using namespace pygpfast;

namespace {

std::vector<double> random_spd(index_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> g;
  std::vector<double> B(n * n), A(n * n, 0.0);
  for (auto& b : B) b = g(rng);
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (index_t k = 0; k < n; ++k) s += B[i * n + k] * B[j * n + k];
      A[i * n + j] = s + (i == j ? n : 0.0);
    }
  return A;
}

double max_abs_diff_llt(const std::vector<double>& L, const std::vector<double>& A, index_t n) {
  double err = 0.0;
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j <= i; ++j) {
      double s = 0.0;
      for (index_t k = 0; k < n; ++k) s += L[i * n + k] * L[j * n + k];
      err = std::max(err, std::fabs(s - A[i * n + j]));
    }
  return err;
}

}  // namespace

PYGPFAST_TEST(gemm_matches_loops) {
  const index_t m = 7, k = 5, n = 4;
  std::vector<double> A(m * k), B(k * n), C(m * n, 0.0);
  for (index_t i = 0; i < m * k; ++i) A[i] = 0.1 * i - 1.0;
  for (index_t i = 0; i < k * n; ++i) B[i] = 0.3 * i + 0.5;
  blas::gemm(blas::Trans::No, blas::Trans::No, 1.0, ConstMatrixView(A.data(), m, k),
             ConstMatrixView(B.data(), k, n), 0.0, MatrixView(C.data(), m, n));
  for (index_t i = 0; i < m; ++i)
    for (index_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (index_t p = 0; p < k; ++p) s += A[i * k + p] * B[p * n + j];
      CHECK_NEAR(C[i * n + j], s, 1e-12);
    }
}

PYGPFAST_TEST(cholesky_factorises_spd) {
  const index_t n = 40;
  auto A = random_spd(n, 1);
  auto L = A;
  auto r = linalg::cholesky_jitter(MatrixView(L.data(), n, n));
  CHECK(r.jitter == 0.0);
  CHECK(max_abs_diff_llt(L, A, n) < 1e-10);
  for (index_t i = 0; i < n; ++i)
    for (index_t j = i + 1; j < n; ++j) CHECK(L[i * n + j] == 0.0);
}

PYGPFAST_TEST(cholesky_adds_jitter_to_singular_matrix) {
  const index_t n = 6;
  std::vector<double> A(n * n, 1.0);  // rank one
  auto r = linalg::cholesky_jitter(MatrixView(A.data(), n, n));
  CHECK(r.jitter > 0.0);
  CHECK(r.attempts > 1);
}

PYGPFAST_TEST(cholesky_raises_on_indefinite_matrix) {
  const index_t n = 3;
  std::vector<double> A = {1, 0, 0, 0, -1, 0, 0, 0, 1};
  CHECK_THROWS(linalg::cholesky_jitter(MatrixView(A.data(), n, n)), LinAlgError);
  std::vector<double> B = {1, 0, 0, NAN, 1, 0, 0, 0, 1};
  CHECK_THROWS(linalg::cholesky_jitter(MatrixView(B.data(), n, n)), std::invalid_argument);
}

PYGPFAST_TEST(rank_one_update_and_downdate_round_trip) {
  const index_t n = 30;
  auto A = random_spd(n, 2);
  auto L = A;
  linalg::cholesky_jitter(MatrixView(L.data(), n, n));
  std::vector<double> x(n);
  for (index_t i = 0; i < n; ++i) x[i] = std::sin(1.0 + i);
  auto Aplus = A;
  for (index_t i = 0; i < n; ++i)
    for (index_t j = 0; j < n; ++j) Aplus[i * n + j] += x[i] * x[j];
  auto work = x;
  linalg::cholesky_update(MatrixView(L.data(), n, n), work.data());
  CHECK(max_abs_diff_llt(L, Aplus, n) < 1e-9);
  work = x;
  linalg::cholesky_downdate(MatrixView(L.data(), n, n), work.data());
  CHECK(max_abs_diff_llt(L, A, n) < 1e-9);
}

PYGPFAST_TEST(downdate_refuses_to_lose_definiteness) {
  const index_t n = 2;
  std::vector<double> L = {1, 0, 0, 1};
  std::vector<double> x = {2, 0};
  CHECK_THROWS(linalg::cholesky_downdate(MatrixView(L.data(), n, n), x.data()), LinAlgError);
}

PYGPFAST_TEST(triangular_solve_inverts_trmm) {
  // (9 x 3: the BLAS's TRSM; 300 x 300 and 301 x 257, in a B with a row stride over its width:
  // solve_lower's recursive halving, down to its leaves)
  for (const auto& [n, r] : {std::pair<index_t, index_t>{9, 3}, {300, 300}, {301, 257}}) {
    const index_t ld = r + 5;
    auto A = random_spd(n, 3);
    linalg::cholesky_jitter(MatrixView(A.data(), n, n));
    for (index_t i = 0; i < n; ++i)
      for (index_t j = i + 1; j < n; ++j) A[i * n + j] = 1e300;  // (the upper triangle is not read)
    std::vector<double> L = A;
    for (index_t i = 0; i < n; ++i)
      for (index_t j = i + 1; j < n; ++j) L[i * n + j] = 0.0;
    std::vector<double> B(n * ld);
    for (index_t i = 0; i < n * ld; ++i) B[i] = std::cos(0.7 * i);
    for (bool t : {false, true}) {
      auto X = B;
      linalg::solve_lower(ConstMatrixView(A.data(), n, n), MatrixView(X.data(), n, r, ld), t);
      blas::trmm(blas::Side::Left, blas::Uplo::Lower, t ? blas::Trans::Yes : blas::Trans::No,
                 blas::Diag::NonUnit, 1.0, ConstMatrixView(L.data(), n, n), MatrixView(X.data(), n, r, ld));
      for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < ld; ++j) CHECK_NEAR(X[i * ld + j], B[i * ld + j], 1e-10);
    }
  }
}

PYGPFAST_TEST(weighted_gram_handles_both_signs) {
  const index_t M = 5, K = 13;
  std::vector<double> A(M * K), W(M * K);
  for (index_t i = 0; i < M * K; ++i) A[i] = std::sin(1.3 * i + 0.2);
  // weights all negative, mixed, all positive, with zeros, all zero; beta 0 and 0.5
  for (int kind = 0; kind < 5; ++kind)
    for (const double beta : {0.0, 0.5}) {
      std::vector<double> g(K), G(M * M, -7.0);
      for (index_t k = 0; k < K; ++k) {
        const double v = 0.5 + 0.1 * k;
        g[k] = kind == 0 ? -v : kind == 1 ? (k % 3 == 0 ? v : -v) : kind == 2 ? v : kind == 3 ? (k % 2 ? 0.0 : v) : 0.0;
      }
      linalg::weighted_gram(ConstMatrixView(A.data(), M, K), g.data(), W.data(), MatrixView(G.data(), M, M), beta);
      for (index_t i = 0; i < M; ++i)
        for (index_t j = 0; j < M; ++j) {
          double s = -7.0 * beta;
          for (index_t k = 0; k < K; ++k) s += A[i * K + k] * g[k] * A[j * K + k];
          CHECK_NEAR(G[i * M + j], j <= i ? s : -7.0, 1e-13);  // (the lower triangle only)
        }
    }
}

PYGPFAST_TEST(cholesky_reverse_matches_the_unblocked_formula) {
  for (const index_t n : {1, 7, 64, 65, 150, 256, 300}) {  // (one block, block edges, ragged last block)
    auto A = random_spd(n, 11);
    linalg::cholesky_jitter(MatrixView(A.data(), n, n));  // L (lower)
    std::vector<double> Lbar(n * n, 0.0), Y(n * n, 0.0);
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j <= i; ++j) Lbar[i * n + j] = std::cos(0.3 * i + 1.1 * j);
    // Y = L^-1 by forward substitution, column by column.
    for (index_t c = 0; c < n; ++c)
      for (index_t i = c; i < n; ++i) {
        double s = i == c ? 1.0 : 0.0;
        for (index_t k = c; k < i; ++k) s -= A[i * n + k] * Y[k * n + c];
        Y[i * n + c] = s / A[i * n + i];
      }
    // Reference: P = sym(Phi(L^T Lbar)), G = Y^T P Y.
    std::vector<double> X(n * n, 0.0), P(n * n), Gref(n * n, 0.0), T(n * n, 0.0);
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < n; ++j)
        for (index_t k = 0; k < n; ++k) X[i * n + j] += A[k * n + i] * Lbar[k * n + j];
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < n; ++j)
        P[i * n + j] = i == j ? 0.5 * X[i * n + i] : 0.5 * (i > j ? X[i * n + j] : X[j * n + i]);
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < n; ++j)
        for (index_t k = 0; k < n; ++k) T[i * n + j] += P[i * n + k] * Y[k * n + j];
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < n; ++j)
        for (index_t k = 0; k < n; ++k) Gref[i * n + j] += Y[k * n + i] * T[k * n + j];
    double scale = 0.0;
    for (double v : Gref) scale = std::max(scale, std::fabs(v));
    auto G = Lbar;
    for (index_t i = 0; i < n; ++i)
      for (index_t j = i + 1; j < n; ++j) G[i * n + j] = 1e3;  // (not read)
    linalg::cholesky_reverse(ConstMatrixView(A.data(), n, n), MatrixView(G.data(), n, n));
    for (index_t i = 0; i < n * n; ++i) CHECK_NEAR(G[i], Gref[i], 1e-12 * scale);
  }
}

PYGPFAST_TEST_MAIN
