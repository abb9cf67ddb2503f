// BLAS/LAPACK dispatch table and row-major wrappers.
//
// The core calls BLAS/LAPACK only through the function pointers in one table. The
// Python extension fills it at import from the BLAS that scipy already loaded
// (scipy.linalg.cython_blas / cython_lapack), so the process holds one BLAS with one
// thread pool. C++ tests and microbenchmarks fill it from a linked BLAS instead
// (csrc/linked/blas_linked.cpp). The pointer types follow the Fortran ABI used by both
// (all arguments by pointer, 32-bit integers, no hidden string lengths).
//
// The wrappers take row-major views (numpy's layout) and translate to column-major
// calls: a row-major matrix is its transpose in column-major terms.
#pragma once

#include <string>
#include <vector>

#include "pygpfast/view.hpp"

namespace pygpfast::blas {

using dgemm_t = void (*)(char*, char*, int*, int*, int*, double*, double*, int*, double*, int*,
                         double*, double*, int*);
using dsyrk_t = void (*)(char*, char*, int*, int*, double*, double*, int*, double*, double*, int*);
using dsymm_t = void (*)(char*, char*, int*, int*, double*, double*, int*, double*, int*, double*,
                         double*, int*);
using dtrsm_t = void (*)(char*, char*, char*, char*, int*, int*, double*, double*, int*, double*,
                         int*);
using dtrmm_t = dtrsm_t;
using dgemv_t = void (*)(char*, int*, int*, double*, double*, int*, double*, int*, double*,
                         double*, int*);
using dtrsv_t = void (*)(char*, char*, char*, int*, double*, int*, double*, int*);
using dsymv_t = void (*)(char*, int*, double*, double*, int*, double*, int*, double*, double*,
                         int*);
using dger_t = void (*)(int*, int*, double*, double*, int*, double*, int*, double*, int*);
using dsyr_t = void (*)(char*, int*, double*, double*, int*, double*, int*);
using ddot_t = double (*)(int*, double*, int*, double*, int*);
using daxpy_t = void (*)(int*, double*, double*, int*, double*, int*);
using dpotrf_t = void (*)(char*, int*, double*, int*, int*);
using dpotri_t = dpotrf_t;
using dtrtri_t = void (*)(char*, char*, int*, double*, int*, int*);
using dlauum_t = void (*)(char*, int*, double*, int*, int*);
// OpenBLAS's openblas_set_num_threads_local (>= 0.3.27): sets the BLAS thread count (for the
// whole process, whatever its name); returns the previous one.
using set_num_threads_local_t = int (*)(int);

struct Table {
  dgemm_t dgemm = nullptr;
  dsyrk_t dsyrk = nullptr;
  dsymm_t dsymm = nullptr;
  dtrsm_t dtrsm = nullptr;
  dtrmm_t dtrmm = nullptr;
  dgemv_t dgemv = nullptr;
  dtrsv_t dtrsv = nullptr;
  dsymv_t dsymv = nullptr;
  dger_t dger = nullptr;
  dsyr_t dsyr = nullptr;
  ddot_t ddot = nullptr;
  daxpy_t daxpy = nullptr;
  dpotrf_t dpotrf = nullptr;
  dpotri_t dpotri = nullptr;
  dtrtri_t dtrtri = nullptr;
  dlauum_t dlauum = nullptr;
  // Optional (null when the BLAS has no such setting): see threads.hpp.
  set_num_threads_local_t set_num_threads_local = nullptr;
};

// Names of the routines in Table, in declaration order (for filling and diagnostics).
const std::vector<std::string>& routine_names();

// Install a table. Throws std::runtime_error naming every missing routine (all but the
// optional set_num_threads_local).
void set_table(const Table& table);
const Table& table();  // throws std::runtime_error if no table was installed
bool has_table();

// ---- Row-major wrappers. All matrices are row-major views; sizes are checked. ----
enum class Trans { No, Yes };
enum class Side { Left, Right };
enum class Uplo { Lower, Upper };
enum class Diag { NonUnit, Unit };

// C = alpha * op(A) op(B) + beta * C
void gemm(Trans ta, Trans tb, double alpha, ConstMatrixView A, ConstMatrixView B, double beta,
          MatrixView C);
// C = alpha * op(A) op(A)^T + beta * C, only the `uplo` triangle of C is referenced/written.
// Trans::No: A is n x k, C = A A^T. Trans::Yes: A is k x n, C = A^T A.
void syrk(Uplo uplo, Trans t, double alpha, ConstMatrixView A, double beta, MatrixView C);
// C = alpha * A B + beta * C (Side::Left) or alpha * B A + beta * C (Side::Right), A symmetric
// with only its `uplo` triangle referenced.
void symm(Side side, Uplo uplo, double alpha, ConstMatrixView A, ConstMatrixView B, double beta,
          MatrixView C);
// B = alpha * op(A)^{-1} B (Side::Left) or alpha * B op(A)^{-1} (Side::Right); A triangular.
void trsm(Side side, Uplo uplo, Trans t, Diag d, double alpha, ConstMatrixView A, MatrixView B);
// B = alpha * op(A) B (Side::Left) or alpha * B op(A) (Side::Right); A triangular.
void trmm(Side side, Uplo uplo, Trans t, Diag d, double alpha, ConstMatrixView A, MatrixView B);
// y = alpha * op(A) x + beta * y (contiguous vectors)
void gemv(Trans t, double alpha, ConstMatrixView A, const double* x, double beta, double* y);
// x = op(A)^{-1} x, A triangular (contiguous vector)
void trsv(Uplo uplo, Trans t, Diag d, ConstMatrixView A, double* x);
// y = alpha * A x + beta * y, A symmetric with its `uplo` triangle referenced
void symv(Uplo uplo, double alpha, ConstMatrixView A, const double* x, double beta, double* y);
// A += alpha * x y^T
void ger(double alpha, const double* x, const double* y, MatrixView A);
// A += alpha * x x^T on the `uplo` triangle of the symmetric A (contiguous x)
void syr(Uplo uplo, double alpha, const double* x, MatrixView A);
double dot(index_t n, const double* x, const double* y);
void axpy(index_t n, double alpha, const double* x, double* y);

// LAPACK. Return LAPACK's info (0 = success) instead of throwing.
// In-place Cholesky A = L L^T of the lower triangle; the strict upper triangle is untouched.
int potrf_lower(MatrixView A);
// In-place inverse of a lower-triangular matrix.
int trtri_lower(MatrixView L, Diag d = Diag::NonUnit);
// In-place A^{-1} from its lower Cholesky factor (lower triangle written).
int potri_lower(MatrixView L);
// In place, the lower triangle of L^T L for a lower-triangular L (dlauum, M^3 / 3 flops).
int lauum_lower(MatrixView L);

}  // namespace pygpfast::blas
