// Dense linear algebra on top of the BLAS table: Cholesky with jitter escalation,
// triangular solves, and rank-one Cholesky update/downdate.
#pragma once

#include "pygpfast/view.hpp"

namespace pygpfast::linalg {

struct CholeskyResult {
  double jitter = 0.0;  // added to the diagonal; 0 when A factorised as given
  int attempts = 1;     // factorisations tried
};

// Lower Cholesky factor of a symmetric positive-definite A, in place (row-major;
// only the lower triangle of A is read; on return the strict upper triangle is zero).
// If A is not numerically positive definite, retries with jitter * I added, starting at
// `initial_relative_jitter` x mean(diag A) and growing x10 up to `max_relative_jitter`
// x mean(diag A). Throws LinAlgError (naming the leading minor that failed and what to
// change) when no jitter helps, std::invalid_argument for non-finite input.
CholeskyResult cholesky_jitter(MatrixView A, double initial_relative_jitter = 1e-10,
                               double max_relative_jitter = 1e-4);

// Adds `relative` x mean(diag A) to the diagonal of a square A (a jitter in the matrix's own
// units, so that it means the same for a kernel of variance 1e-9 as for one of variance 1e9);
// returns the amount added. A zero diagonal (a kernel that vanishes at every input, e.g. a Linear
// kernel at inputs 0) has no scale to be relative to: LinAlgError naming `what` (the matrix) and
// `where` (its inputs).
double add_relative_jitter(MatrixView A, double relative, const char* what = "the kernel matrix",
                           const char* where = "the inputs");

// Reverse mode of add_relative_jitter: given G = dE/dA' for A' = A + c(A) I, c = relative x
// mean(diag A), makes G dE/dA by adding relative x trace(G) / n to its diagonal.
void add_relative_jitter_reverse(MatrixView G, double relative);

// Solve op(L) X = B in place for lower-triangular L (B is n x r).
void solve_lower(ConstMatrixView L, MatrixView B, bool transpose);

// Given lower L with L L^T = A, make L the factor of A + x x^T (in place, O(n^2)).
// x is overwritten (used as workspace).
void cholesky_update(MatrixView L, double* x);

// Given lower L with L L^T = A, make L the factor of A - x x^T (in place, O(n^2)).
// Throws LinAlgError when A - x x^T is not positive definite (L is then unchanged).
// x is overwritten (used as workspace).
void cholesky_downdate(MatrixView L, double* x);

// Copies the lower triangle of a square A onto its upper triangle (in cache-sized tiles).
void mirror_lower(MatrixView A);

// A <- (A + A^T) / 2 for a square A (in the same tiles).
void symmetrise(MatrixView A);

// x[0] + x[1] + ... + x[n-1] in that order (results do not depend on how x was computed in
// parallel).
double fixed_order_sum(const double* x, index_t n);

// log det(L L^T) = 2 sum log diag(L).
double logdet_from_cholesky(ConstMatrixView L);

// Reverse mode of the Cholesky factorisation A = L L^T (Murray 2016): given Lbar = dE/dL (lower
// triangle read), overwrite it with the symmetric G = dE/dA (both triangles written, with
// dE = sum_ij G_ij dA_ij), equal to L^-T sym(Phi(L^T Lbar)) L^-1 with Phi the lower triangle and
// the diagonal halved. Blocked, by GEMMs of about 2 M^3 / 3 flops in all.
void cholesky_reverse(ConstMatrixView L, MatrixView Lbar_in_G_out);

// G = beta G + A diag(g) A^T for A [M, K] and weights g [K] of either sign, in the lower
// triangle of G [M, M] (with its diagonal; the strict upper part is left as it was). One SYRK
// over the columns with g < 0 and one over those with g > 0, each scaled by sqrt|g| (a sign
// that does not occur costs nothing, zero weights drop out): M^2 K flops in all. W_scratch holds
// M * K doubles.
void weighted_gram(ConstMatrixView A, const double* g, double* W_scratch, MatrixView G, double beta = 0.0);

}  // namespace pygpfast::linalg
