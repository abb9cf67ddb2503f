// Plain loops for the C x C matrices of the multi-class IVM (C is a handful of classes: BLAS
// calls would cost more than the arithmetic). Row-major, no allocation, no exceptions, so that
// they can run inside OpenMP loops.
#pragma once

#include <cmath>

namespace pygpfast::ivm::small {

// Lower Cholesky factor L of a symmetric n x n A (lower triangle read); L's strict upper
// triangle is set to 0. False when a pivot is not positive and finite.
inline bool cholesky(int n, const double* A, double* L) {
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j <= i; ++j) {
      double s = A[i * n + j];
      for (int k = 0; k < j; ++k) s -= L[i * n + k] * L[j * n + k];
      if (i == j) {
        if (!(s > 0.0) || !std::isfinite(s)) return false;
        L[i * n + i] = std::sqrt(s);
      } else {
        L[i * n + j] = s / L[j * n + j];
      }
    }
    for (int j = i + 1; j < n; ++j) L[i * n + j] = 0.0;
  }
  return true;
}

// x <- L^{-1} x
inline void solve_lower(int n, const double* L, double* x) {
  for (int i = 0; i < n; ++i) {
    double s = x[i];
    for (int k = 0; k < i; ++k) s -= L[i * n + k] * x[k];
    x[i] = s / L[i * n + i];
  }
}

// x <- L^{-T} x
inline void solve_lower_transposed(int n, const double* L, double* x) {
  for (int i = n - 1; i >= 0; --i) {
    double s = x[i];
    for (int k = i + 1; k < n; ++k) s -= L[k * n + i] * x[k];
    x[i] = s / L[i * n + i];
  }
}

// x <- (L L^T)^{-1} x
inline void solve_cholesky(int n, const double* L, double* x) {
  solve_lower(n, L, x);
  solve_lower_transposed(n, L, x);
}

inline double logdet_cholesky(int n, const double* L) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += std::log(L[i * n + i]);
  return 2.0 * s;
}

// Ainv = (L L^T)^{-1}, full symmetric. col: n doubles of scratch.
inline void inverse_cholesky(int n, const double* L, double* Ainv, double* col) {
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < n; ++i) col[i] = i == j ? 1.0 : 0.0;
    solve_cholesky(n, L, col);
    for (int i = 0; i < n; ++i) Ainv[i * n + j] = col[i];
  }
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < i; ++j) Ainv[i * n + j] = Ainv[j * n + i] = 0.5 * (Ainv[i * n + j] + Ainv[j * n + i]);
}

// Reverse mode of A = L L^T for symmetric perturbations: given Lbar = dE/dL (lower triangle
// read; overwritten as scratch), G = L^{-T} sym(Phi(L^T Lbar)) L^{-1}, Phi = lower triangle with
// the diagonal halved, so that dE = sum_ij G_ij dA_ij. tmp: n * n doubles of scratch.
inline void cholesky_reverse(int n, const double* L, double* Lbar, double* G, double* tmp) {
  // tmp = Phi(L^T Lbar_lower)
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0.0;
      if (j <= i)
        for (int k = i; k < n; ++k) s += L[k * n + i] * Lbar[k * n + j];
      tmp[i * n + j] = j < i ? s : (j == i ? 0.5 * s : 0.0);
    }
  // G = sym(tmp)
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) G[i * n + j] = 0.5 * (tmp[i * n + j] + tmp[j * n + i]);
  // G <- L^{-T} G L^{-1}: columns then rows.
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < n; ++i) Lbar[i] = G[i * n + j];
    solve_lower_transposed(n, L, Lbar);
    for (int i = 0; i < n; ++i) G[i * n + j] = Lbar[i];
  }
  for (int i = 0; i < n; ++i) solve_lower_transposed(n, L, G + i * n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < i; ++j) G[i * n + j] = G[j * n + i] = 0.5 * (G[i * n + j] + G[j * n + i]);
}

}  // namespace pygpfast::ivm::small
