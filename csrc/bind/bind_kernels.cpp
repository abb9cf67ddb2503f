// Kernel evaluation: each call rebuilds the core Kernel from its flat description (cheap
// next to the evaluation) so that no state lives on the C++ side.
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "bind_common.hpp"
#include "pygpfast/kernels.hpp"
#include "pygpfast/threads.hpp"

namespace pygpfast::bind {
namespace {

// X2 = None means K(X, X): X2 is X and `same` is true.
struct Pair {
  ConstMatrixView X, X2;
  bool same;
};

Pair as_pair(const py::array& x, const std::optional<py::array>& x2) {
  const ConstMatrixView X = as_matrix(x, "X");
  if (!x2) return {X, X, true};
  return {X, as_matrix(*x2, "X2"), false};
}

py::array_t<double> zeros_matrix(index_t rows, index_t cols) {
  auto a = new_matrix(rows, cols);
  std::fill(a.mutable_data(), a.mutable_data() + a.size(), 0.0);
  return a;
}

py::array_t<double> zeros_vector(index_t n) {
  auto a = new_vector(n);
  std::fill(a.mutable_data(), a.mutable_data() + a.size(), 0.0);
  return a;
}

}  // namespace

void bind_kernels(py::module_& m) {
  m.def(
      "K",
      [](const py::array& codes, const py::array& params, const py::array& x,
         const std::optional<py::array>& x2, bool distances) {
        const Pair in = as_pair(x, x2);
        const auto kernel = make_kernel(codes, params, in.X.cols);
        auto out = new_matrix(in.X.rows, in.X2.rows);
        const MatrixView K = view_of(out);
        {
          py::gil_scoped_release release;
          std::optional<kernels::SquaredDistances> r2;
          if (distances) r2.emplace(in.X, in.X2);
          kernel.K(in.X, in.X2, in.same, K, r2 ? &*r2 : nullptr);
        }
        return out;
      },
      py::arg("codes"), py::arg("params"), py::arg("X"), py::arg("X2").none(true), py::kw_only(),
      py::arg("distances") = false,
      "K(X, X2) [N, M] of the kernel described by (codes int32, params float64); X2=None is "
      "K(X, X). distances=True passes the leaves the squared distances of X and X2 computed once "
      "(kernels::SquaredDistances, as callers sharing them across kernels do; not with X2=None).");

  m.def(
      "squared_distances",
      [](const py::array& x, const py::array& x2) {
        const ConstMatrixView X = as_matrix(x, "X"), X2 = as_matrix(x2, "X2");
        auto out = new_matrix(X.rows, X2.rows);
        double max_norm = 0.0;
        {
          py::gil_scoped_release release;
          // (the BLAS on one thread: its threaded GEMM's digits depend on the thread count, and a
          // search that computes these once per selection gives them to every evaluation)
          const OneBlasThreadScope one_blas_thread;
          const kernels::SquaredDistances r2(X, X2);
          std::copy(r2.values(), r2.values() + X.rows * X2.rows, out.mutable_data());
          max_norm = r2.max_norm();
        }
        return py::make_tuple(out, max_norm);
      },
      py::arg("X"), py::arg("X2"),
      "(r2 [N, M], max_norm): the squared distances of the rows of X [N, D] and X2 [M, D] as the "
      "leaves read them (kernels::SquaredDistances) and the largest squared norm of a centred row "
      "(which decides where a leaf can read them), for a caller that passes them to many "
      "evaluations on the same inputs (ivm.multiclass_bound's distances). The same digits on any "
      "thread count (the BLAS on one thread).");

  m.def(
      "Kdiag",
      [](const py::array& codes, const py::array& params, const py::array& x) {
        const ConstMatrixView X = as_matrix(x, "X");
        const auto kernel = make_kernel(codes, params, X.cols);
        auto out = new_vector(X.rows);
        double* d = out.mutable_data();
        {
          py::gil_scoped_release release;
          kernel.Kdiag(X, d);
        }
        return out;
      },
      py::arg("codes"), py::arg("params"), py::arg("X"), "diag K(X, X) [N].");

  m.def(
      "K_vjp",
      [](const py::array& codes, const py::array& params, const py::array& x,
         const std::optional<py::array>& x2, const py::array& g, bool want_dX, bool want_dX2,
         const std::optional<py::array>& values, bool distances) {
        const Pair in = as_pair(x, x2);
        const auto kernel = make_kernel(codes, params, in.X.cols);
        const ConstMatrixView G = as_matrix(g, "G");
        const ConstMatrixView Kv = values ? as_matrix(*values, "values") : ConstMatrixView();
        auto dparams = zeros_vector(kernel.num_params());
        py::object dX_out = py::none(), dX2_out = py::none();
        MatrixView dX, dX2;
        if (want_dX) {
          auto a = zeros_matrix(in.X.rows, in.X.cols);
          dX = view_of(a);
          dX_out = a;
        }
        if (want_dX2) {
          auto a = zeros_matrix(in.X2.rows, in.X2.cols);
          dX2 = view_of(a);
          dX2_out = a;
        }
        double* dp = dparams.mutable_data();
        {
          py::gil_scoped_release release;
          std::optional<kernels::SquaredDistances> r2;
          if (distances) r2.emplace(in.X, in.X2);
          const kernels::SquaredDistances* r2p = r2 ? &*r2 : nullptr;
          if (values)
            kernel.K_vjp(in.X, in.X2, in.same, G, Kv, dp, want_dX ? &dX : nullptr, want_dX2 ? &dX2 : nullptr, r2p);
          else
            kernel.K_vjp(in.X, in.X2, in.same, G, dp, want_dX ? &dX : nullptr, want_dX2 ? &dX2 : nullptr, r2p);
        }
        return py::make_tuple(dparams, dX_out, dX2_out);
      },
      py::arg("codes"), py::arg("params"), py::arg("X"), py::arg("X2").none(true), py::arg("G"),
      py::arg("want_dX") = false, py::arg("want_dX2") = false, py::arg("values") = py::none(), py::kw_only(),
      py::arg("distances") = false,
      "Vector-Jacobian products of sum(G * K(X, X2)): (dparams [P], dX [N, D] or None, "
      "dX2 [M, D] or None). With X2=None, dX and dX2 are the partial gradients through the "
      "first and second argument; the gradient wrt X is their sum. `values` = K(X, X2) from a "
      "forward pass lets kernels whose gradients follow from their values (a single RBF) skip "
      "evaluating it again; distances=True as for K.");

  m.def(
      "dimension_spread",
      [](const py::array& rows, const py::array& others) {
        const ConstMatrixView R = as_matrix(rows, "rows"), P = as_matrix(others, "others");
        auto out = new_vector(R.cols);
        double* o = out.mutable_data();
        {
          py::gil_scoped_release release;
          kernels::dimension_spread(R, P, o);
        }
        return out;
      },
      py::arg("rows"), py::arg("others"),
      "m [D]: per input dimension d, the median of |rows[i, d] - others[j, d]| over the pairs "
      "that differ in d (the mean of the two middle values for an even count), 1 where none "
      "does or the median is not finite.");

  m.def(
      "Kdiag_vjp",
      [](const py::array& codes, const py::array& params, const py::array& x, const py::array& g) {
        const ConstMatrixView X = as_matrix(x, "X");
        const auto kernel = make_kernel(codes, params, X.cols);
        const double* gv = as_vector(g, "g", X.rows);
        auto dparams = zeros_vector(kernel.num_params());
        double* dp = dparams.mutable_data();
        {
          py::gil_scoped_release release;
          kernel.Kdiag_vjp(X, gv, dp);
        }
        return dparams;
      },
      py::arg("codes"), py::arg("params"), py::arg("X"), py::arg("g"),
      "Gradient of sum(g * diag K(X, X)) wrt the parameters [P].");
}

}  // namespace pygpfast::bind
