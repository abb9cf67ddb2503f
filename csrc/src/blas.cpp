#include "pygpfast/blas.hpp"

#include <climits>
#include <stdexcept>

#include "pygpfast/errors.hpp"

namespace pygpfast::blas {
namespace {

Table& mutable_table() {
  static Table t;
  return t;
}
bool& installed() {
  static bool b = false;
  return b;
}

int to_int(index_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw std::invalid_argument(std::string(what) + " exceeds the 32-bit BLAS integer range");
  return static_cast<int>(v);
}
// Leading dimension of a row-major view as seen by column-major BLAS (never 0).
int ld_of(const ConstMatrixView& A) { return to_int(A.ld > 0 ? A.ld : 1, "leading dimension"); }
int ld_of(const MatrixView& A) { return to_int(A.ld > 0 ? A.ld : 1, "leading dimension"); }

char flip_trans(Trans t) { return t == Trans::No ? 'T' : 'N'; }
char keep_trans(Trans t) { return t == Trans::No ? 'N' : 'T'; }
char flip_uplo(Uplo u) { return u == Uplo::Lower ? 'U' : 'L'; }
char flip_side(Side s) { return s == Side::Left ? 'R' : 'L'; }
char diag_char(Diag d) { return d == Diag::Unit ? 'U' : 'N'; }

void check(bool ok, const char* routine, const char* what) {
  if (!ok) throw std::invalid_argument(std::string(routine) + ": " + what);
}

}  // namespace

const std::vector<std::string>& routine_names() {
  static const std::vector<std::string> names = {
      "dgemm", "dsyrk", "dsymm",  "dtrsm",  "dtrmm",  "dgemv", "dtrsv", "dsymv",
      "dger",  "dsyr",  "ddot",   "daxpy",  "dpotrf", "dpotri", "dtrtri", "dlauum"};
  return names;
}

void set_table(const Table& t) {
  const void* ptrs[] = {
      reinterpret_cast<const void*>(t.dgemm),
      reinterpret_cast<const void*>(t.dsyrk),
      reinterpret_cast<const void*>(t.dsymm),
      reinterpret_cast<const void*>(t.dtrsm),
      reinterpret_cast<const void*>(t.dtrmm),
      reinterpret_cast<const void*>(t.dgemv),
      reinterpret_cast<const void*>(t.dtrsv),
      reinterpret_cast<const void*>(t.dsymv),
      reinterpret_cast<const void*>(t.dger),
      reinterpret_cast<const void*>(t.dsyr),
      reinterpret_cast<const void*>(t.ddot),
      reinterpret_cast<const void*>(t.daxpy),
      reinterpret_cast<const void*>(t.dpotrf),
      reinterpret_cast<const void*>(t.dpotri),
      reinterpret_cast<const void*>(t.dtrtri),
      reinterpret_cast<const void*>(t.dlauum),
  };
  std::string missing;
  for (std::size_t i = 0; i < routine_names().size(); ++i)
    if (ptrs[i] == nullptr) missing += (missing.empty() ? "" : ", ") + routine_names()[i];
  if (!missing.empty())
    throw std::runtime_error("pygpfast: the BLAS/LAPACK table lacks " + missing);
  mutable_table() = t;
  installed() = true;
}

const Table& table() {
  if (!installed())
    throw std::runtime_error("pygpfast: no BLAS/LAPACK table installed (call blas::set_table first)");
  return mutable_table();
}

bool has_table() { return installed(); }

void gemm(Trans ta, Trans tb, double alpha, ConstMatrixView A, ConstMatrixView B, double beta,
          MatrixView C) {
  const index_t m = C.rows, n = C.cols;
  const index_t k = ta == Trans::No ? A.cols : A.rows;
  check((ta == Trans::No ? A.rows : A.cols) == m, "gemm", "rows of op(A) != rows of C");
  check((tb == Trans::No ? B.rows : B.cols) == k, "gemm", "inner dimensions differ");
  check((tb == Trans::No ? B.cols : B.rows) == n, "gemm", "cols of op(B) != cols of C");
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (index_t i = 0; i < m; ++i)
      for (index_t j = 0; j < n; ++j) C(i, j) = beta == 0.0 ? 0.0 : beta * C(i, j);
    return;
  }
  // Row-major C = op(A) op(B)  <=>  column-major C^T = op(B)^T op(A)^T.
  char tB = keep_trans(tb), tA = keep_trans(ta);
  int im = to_int(n, "gemm"), in = to_int(m, "gemm"), ik = to_int(k, "gemm");
  int lb = ld_of(B), la = ld_of(A), lc = ld_of(C);
  table().dgemm(&tB, &tA, &im, &in, &ik, &alpha, const_cast<double*>(B.data), &lb,
                const_cast<double*>(A.data), &la, &beta, C.data, &lc);
}

void syrk(Uplo uplo, Trans t, double alpha, ConstMatrixView A, double beta, MatrixView C) {
  const index_t n = C.rows;
  check(C.cols == n, "syrk", "C must be square");
  const index_t k = t == Trans::No ? A.cols : A.rows;
  check((t == Trans::No ? A.rows : A.cols) == n, "syrk", "op(A) rows != size of C");
  if (n == 0) return;
  // Row-major C = A A^T (A n x k) is column-major C = (A^T)^T (A^T) with A^T (k x n): 'T'.
  char ul = flip_uplo(uplo), tr = flip_trans(t);
  int in = to_int(n, "syrk"), ik = to_int(k, "syrk");
  int la = ld_of(A), lc = ld_of(C);
  if (k == 0) {
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < n; ++j)
        if ((uplo == Uplo::Lower) ? j <= i : j >= i) C(i, j) = beta == 0.0 ? 0.0 : beta * C(i, j);
    return;
  }
  table().dsyrk(&ul, &tr, &in, &ik, &alpha, const_cast<double*>(A.data), &la, &beta, C.data, &lc);
}

void symm(Side side, Uplo uplo, double alpha, ConstMatrixView A, ConstMatrixView B, double beta,
          MatrixView C) {
  check(A.rows == A.cols, "symm", "A must be square");
  check(B.rows == C.rows && B.cols == C.cols, "symm", "B and C must have the same shape");
  check((side == Side::Left ? C.rows : C.cols) == A.rows, "symm", "sizes of A and B differ");
  if (C.rows == 0 || C.cols == 0) return;
  // Row-major C = A B is column-major C^T = B^T A (A symmetric): the side and the stored
  // triangle flip.
  char sd = flip_side(side), ul = flip_uplo(uplo);
  int im = to_int(C.cols, "symm"), in = to_int(C.rows, "symm");
  int la = ld_of(A), lb = ld_of(B), lc = ld_of(C);
  table().dsymm(&sd, &ul, &im, &in, &alpha, const_cast<double*>(A.data), &la,
                const_cast<double*>(B.data), &lb, &beta, C.data, &lc);
}

namespace {
void tr_mm_sm(bool solve, Side side, Uplo uplo, Trans t, Diag d, double alpha, ConstMatrixView A,
              MatrixView B) {
  const char* name = solve ? "trsm" : "trmm";
  check(A.rows == A.cols, name, "A must be square");
  check((side == Side::Left ? B.rows : B.cols) == A.rows, name, "sizes of A and B differ");
  if (B.rows == 0 || B.cols == 0) return;
  // Row-major B is column-major B^T: op(A) B = X  <=>  B^T op(A)^T = X^T, and row-major A
  // is column-major A^T (lower <-> upper). op(A)^T in terms of A^T keeps the trans flag.
  char sd = flip_side(side), ul = flip_uplo(uplo), tr = keep_trans(t), dg = diag_char(d);
  int im = to_int(B.cols, name), in = to_int(B.rows, name);
  int la = ld_of(A), lb = ld_of(B);
  auto fn = solve ? table().dtrsm : table().dtrmm;
  fn(&sd, &ul, &tr, &dg, &im, &in, &alpha, const_cast<double*>(A.data), &la, B.data, &lb);
}
}  // namespace

void trsm(Side side, Uplo uplo, Trans t, Diag d, double alpha, ConstMatrixView A, MatrixView B) {
  tr_mm_sm(true, side, uplo, t, d, alpha, A, B);
}

void trmm(Side side, Uplo uplo, Trans t, Diag d, double alpha, ConstMatrixView A, MatrixView B) {
  tr_mm_sm(false, side, uplo, t, d, alpha, A, B);
}

void gemv(Trans t, double alpha, ConstMatrixView A, const double* x, double beta, double* y) {
  const index_t rows_out = t == Trans::No ? A.rows : A.cols;
  if (rows_out == 0) return;
  if (A.rows == 0 || A.cols == 0) {
    for (index_t i = 0; i < rows_out; ++i) y[i] = beta == 0.0 ? 0.0 : beta * y[i];
    return;
  }
  char tr = flip_trans(t);
  int im = to_int(A.cols, "gemv"), in = to_int(A.rows, "gemv"), la = ld_of(A), one = 1;
  table().dgemv(&tr, &im, &in, &alpha, const_cast<double*>(A.data), &la, const_cast<double*>(x),
                &one, &beta, y, &one);
}

void trsv(Uplo uplo, Trans t, Diag d, ConstMatrixView A, double* x) {
  check(A.rows == A.cols, "trsv", "A must be square");
  if (A.rows == 0) return;
  // Column-major view is A^T: solving op(A) x = b is solving op'(A^T) x = b with the
  // trans flag flipped.
  char ul = flip_uplo(uplo), tr = flip_trans(t), dg = diag_char(d);
  int in = to_int(A.rows, "trsv"), la = ld_of(A), one = 1;
  table().dtrsv(&ul, &tr, &dg, &in, const_cast<double*>(A.data), &la, x, &one);
}

void symv(Uplo uplo, double alpha, ConstMatrixView A, const double* x, double beta, double* y) {
  check(A.rows == A.cols, "symv", "A must be square");
  if (A.rows == 0) return;
  char ul = flip_uplo(uplo);
  int in = to_int(A.rows, "symv"), la = ld_of(A), one = 1;
  table().dsymv(&ul, &in, &alpha, const_cast<double*>(A.data), &la, const_cast<double*>(x), &one,
                &beta, y, &one);
}

void ger(double alpha, const double* x, const double* y, MatrixView A) {
  if (A.rows == 0 || A.cols == 0) return;
  // Row-major A += x y^T  <=>  column-major A^T += y x^T.
  int im = to_int(A.cols, "ger"), in = to_int(A.rows, "ger"), la = ld_of(A), one = 1;
  table().dger(&im, &in, &alpha, const_cast<double*>(y), &one, const_cast<double*>(x), &one,
               A.data, &la);
}

void syr(Uplo uplo, double alpha, const double* x, MatrixView A) {
  check(A.rows == A.cols, "syr", "A must be square");
  if (A.rows == 0) return;
  char ul = flip_uplo(uplo);
  int in = to_int(A.rows, "syr"), la = ld_of(A), one = 1;
  table().dsyr(&ul, &in, &alpha, const_cast<double*>(x), &one, A.data, &la);
}

double dot(index_t n, const double* x, const double* y) {
  if (n == 0) return 0.0;
  int in = to_int(n, "dot"), one = 1;
  return table().ddot(&in, const_cast<double*>(x), &one, const_cast<double*>(y), &one);
}

void axpy(index_t n, double alpha, const double* x, double* y) {
  if (n == 0) return;
  int in = to_int(n, "axpy"), one = 1;
  table().daxpy(&in, &alpha, const_cast<double*>(x), &one, y, &one);
}

int potrf_lower(MatrixView A) {
  check(A.rows == A.cols, "potrf", "A must be square");
  if (A.rows == 0) return 0;
  char ul = 'U';  // row-major lower == column-major upper
  int in = to_int(A.rows, "potrf"), la = ld_of(A), info = 0;
  table().dpotrf(&ul, &in, A.data, &la, &info);
  return info;
}

int trtri_lower(MatrixView L, Diag d) {
  check(L.rows == L.cols, "trtri", "L must be square");
  if (L.rows == 0) return 0;
  char ul = 'U', dg = diag_char(d);
  int in = to_int(L.rows, "trtri"), la = ld_of(L), info = 0;
  table().dtrtri(&ul, &dg, &in, L.data, &la, &info);
  return info;
}

int potri_lower(MatrixView L) {
  check(L.rows == L.cols, "potri", "L must be square");
  if (L.rows == 0) return 0;
  char ul = 'U';
  int in = to_int(L.rows, "potri"), la = ld_of(L), info = 0;
  table().dpotri(&ul, &in, L.data, &la, &info);
  return info;
}

int lauum_lower(MatrixView L) {
  check(L.rows == L.cols, "lauum", "L must be square");
  if (L.rows == 0) return 0;
  // Row-major lower L is column-major upper U = L^T, and dlauum('U') forms U U^T = L^T L.
  char ul = 'U';
  int in = to_int(L.rows, "lauum"), la = ld_of(L), info = 0;
  table().dlauum(&ul, &in, L.data, &la, &info);
  return info;
}

}  // namespace pygpfast::blas
