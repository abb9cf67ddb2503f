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

  // out [N, M] = K(X, X2). `same` tells that X2 is X (White contributes then).
  void K(ConstMatrixView X, ConstMatrixView X2, bool same, MatrixView out) const;
  // out [N] = diag K(X, X).
  void Kdiag(ConstMatrixView X, double* out) const;

  // Vector-Jacobian products with an adjoint G [N, M]: for every parameter p,
  //   dparams[p] += sum_ij G_ij dK_ij/dtheta_p,
  // and, when not null, dX [N, D] += sum_j G_ij dK_ij/dX_i and dX2 [M, D] += sum_i G_ij dK_ij/dX2_j.
  // (For K(Z, Z) with `same`, the gradient wrt Z is dX + dX2.)
  void K_vjp(ConstMatrixView X, ConstMatrixView X2, bool same, ConstMatrixView G, double* dparams,
             MatrixView* dX, MatrixView* dX2) const;
  // The same, given the forward pass's K(X, X2) (`values`, [N, M]; an empty view means none):
  // kernels whose gradients follow from their values (a single RBF: dk/d(r^2) = -k/2) skip
  // evaluating the distances and exps again; the others compute the vjp as above.
  void K_vjp(ConstMatrixView X, ConstMatrixView X2, bool same, ConstMatrixView G, ConstMatrixView values,
             double* dparams, MatrixView* dX, MatrixView* dX2) const;
  // dparams[p] += sum_i g_i d diag(K)_i / dtheta_p.
  void Kdiag_vjp(ConstMatrixView X, const double* g, double* dparams) const;

 private:
  std::unique_ptr<Node> root_;
  index_t num_params_ = 0;
  index_t input_dim_ = 0;
};

}  // namespace pygpfast::kernels
