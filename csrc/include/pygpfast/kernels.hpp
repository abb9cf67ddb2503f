// Covariance functions evaluated from a declarative description.
//
// A kernel is described by two flat arrays that the Python kernel objects produce:
//   codes  (int32), the expression tree in prefix order, two entries per node:
//            leaf:       [type, n_params]      (its parameters are the next n_params of `params`)
//            Sum/Product [type, n_children]    (followed by its children)
//   params (float64), the leaves' positive hyperparameters in the same prefix order:
//            RBF, Matern12/32/52: [variance, lengthscale_1..lengthscale_k], k = 1 (isotropic) or D
//            Linear:              [variance_1..variance_k],              k = 1 or D
//            Constant, White:     [variance]
// Gradients are returned with respect to these positive parameters, in the same layout.
//
// Conventions (GPflow's glossary): X [N, D], X2 [M, D], K(X, X2) [N, M].
// White(X, X2) is variance * I when `same` is true (X2 is X) and 0 otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "pygpfast/view.hpp"

namespace pygpfast::kernels {

enum class KernelType : std::int32_t {
  RBF = 0,
  Matern12 = 1,
  Matern32 = 2,
  Matern52 = 3,
  Linear = 4,
  Constant = 5,
  White = 6,
  Sum = 7,
  Product = 8,
};

struct Node;  // defined in kernels.cpp

// The median-distance heuristic's per-dimension spread: out[d] = the median of |r_id - o_jd| over
// the pairs (i, j) of rows [R, D] and others [P, D] whose difference in dimension d is nonzero
// (NaN differences left out), 1 where there is none or the median is not finite. The median of
// an even count is the mean of the two middle values, as numpy's. Dimensions on threads.
void dimension_spread(ConstMatrixView rows, ConstMatrixView others, double* out);

// The squared Euclidean distances |x_i - x2_j|^2 between the rows of X [N, D] and X2 [M, D]
// (two different matrices: not K(X, X)), computed once for several kernels on the same inputs:
// the per-class kernels of an IVM, a kernel's value and then its vector-Jacobian product. An
// isotropic stationary leaf (RBF, Matern with one lengthscale l) reads r^2 / l^2 from here in
// one pass over [N, M] instead of scaling both inputs and running its own GEMM (or, for one
// point, its own pass over the other matrix). Leaves that cannot use them (ARD lengthscales,
// input gradients asked for, or inputs so far from their mean in units of l that the GEMM
// expansion would lose digits) compute as they would without.
// With N = 1 or M = 1 the distances are summed directly (exact to rounding); otherwise from the
// expansion |a|^2 + |b|^2 - 2 a.b of the inputs centred on the mean of X, clamped at 0.
class SquaredDistances {
 public:
  // Keeps the views (X and X2 must outlive this); the distances are computed when a leaf first
  // asks (none when no leaf can use them). Leaves on several threads may share one: the first
  // to ask computes them, the others wait for it.
  SquaredDistances(ConstMatrixView X, ConstMatrixView X2);
  // Distances computed earlier for the same X and X2 (values() and max_norm() of one built as
  // above), for a caller that evaluates kernels on the same inputs many times: `values` [N, M]
  // is read, not copied, and must outlive this; null: as the constructor above.
  SquaredDistances(ConstMatrixView X, ConstMatrixView X2, const double* values, double max_norm);
  index_t rows() const { return X_.rows; }
  index_t cols() const { return X2_.rows; }
  // Whether a leaf with 1 / l^2 = inv_lengthscale_sq can read these: it loses no more to the
  // expansion than its own GEMM path would (kernels.cpp, kExpansionNormLimit). Computes them
  // on the first call.
  bool usable(double inv_lengthscale_sq) const;
  const double* row(index_t i) const { return values_ + i * X2_.rows; }
  // The distances [N, M] and the largest squared norm of a centred input row (0 when they were
  // summed directly), computed on the first call.
  const double* values() const;
  double max_norm() const;

 private:
  void compute() const;
  ConstMatrixView X_, X2_;
  mutable std::once_flag computed_;
  mutable double max_norm_ = 0.0;
  mutable std::vector<double> r2_;
  mutable const double* values_ = nullptr;  // r2_, or the values given
};

class Kernel {
 public:
  // Parses and validates the description (throws std::invalid_argument with a clear
  // message: unknown type, wrong parameter count, non-positive parameter, ...).
  Kernel(const std::int32_t* codes, index_t n_codes, const double* params, index_t n_params,
         index_t input_dim);
  ~Kernel();
  Kernel(Kernel&&) noexcept;
  Kernel& operator=(Kernel&&) noexcept;

  index_t num_params() const;
  index_t input_dim() const;

  // out [N, M] = K(X, X2). `same` tells that X2 is X (White contributes then). `distances`,
  // when given, holds the squared distances between X and X2 (not with `same`).
  void K(ConstMatrixView X, ConstMatrixView X2, bool same, MatrixView out,
         const SquaredDistances* distances = nullptr) const;
  // out [N] = diag K(X, X).
  void Kdiag(ConstMatrixView X, double* out) const;

  // Vector-Jacobian products with an adjoint G [N, M]: for every parameter p,
  //   dparams[p] += sum_ij G_ij dK_ij/dtheta_p,
  // and, when not null, dX [N, D] += sum_j G_ij dK_ij/dX_i and dX2 [M, D] += sum_i G_ij dK_ij/dX2_j.
  // (For K(Z, Z) with `same`, the gradient wrt Z is dX + dX2.)
  void K_vjp(ConstMatrixView X, ConstMatrixView X2, bool same, ConstMatrixView G, double* dparams,
             MatrixView* dX, MatrixView* dX2, const SquaredDistances* distances = nullptr) const;
  // The same, given the forward pass's K(X, X2) (`values`, [N, M]; an empty view means none):
  // kernels whose gradients follow from their values (a single RBF: dk/d(r^2) = -k/2) skip
  // evaluating the distances and exps again; the others compute the vjp as above.
  void K_vjp(ConstMatrixView X, ConstMatrixView X2, bool same, ConstMatrixView G, ConstMatrixView values,
             double* dparams, MatrixView* dX, MatrixView* dX2, const SquaredDistances* distances = nullptr) const;
  // dparams[p] += sum_i g_i d diag(K)_i / dtheta_p.
  void Kdiag_vjp(ConstMatrixView X, const double* g, double* dparams) const;

 private:
  std::unique_ptr<Node> root_;
  index_t num_params_ = 0;
  index_t input_dim_ = 0;
};

}  // namespace pygpfast::kernels
