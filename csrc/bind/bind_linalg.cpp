#include "bind_common.hpp"
#include "pygpfast/linalg.hpp"

namespace pygpfast::bind {

void bind_linalg(py::module_& m) {
  m.def(
      "cholesky",
      [](const py::array& a, double initial_relative_jitter, double max_relative_jitter) {
        auto A = as_matrix(a, "A");
        auto out = new_matrix(A.rows, A.cols);
        auto L = view_of(out);
        for (index_t i = 0; i < A.rows; ++i)
          for (index_t j = 0; j < A.cols; ++j) L(i, j) = A(i, j);
        linalg::CholeskyResult r;
        {
          py::gil_scoped_release release;
          r = linalg::cholesky_jitter(L, initial_relative_jitter, max_relative_jitter);
        }
        return py::make_tuple(out, r.jitter);
      },
      py::arg("A"), py::arg("initial_relative_jitter") = 1e-10,
      py::arg("max_relative_jitter") = 1e-4,
      "Lower Cholesky factor with jitter escalation. Returns (L [n, n], jitter).");

  m.def(
      "solve_lower",
      [](const py::array& l, const py::array& b, bool transpose) {
        auto L = as_matrix(l, "L");
        auto B = as_matrix(b, "B");
        auto out = new_matrix(B.rows, B.cols);
        auto X = view_of(out);
        for (index_t i = 0; i < B.rows; ++i)
          for (index_t j = 0; j < B.cols; ++j) X(i, j) = B(i, j);
        {
          py::gil_scoped_release release;
          linalg::solve_lower(L, X, transpose);
        }
        return out;
      },
      py::arg("L"), py::arg("B"), py::arg("transpose") = false,
      "Solve L X = B (or L^T X = B) for lower-triangular L [n, n], B [n, r].");

  auto rank_one = [](bool downdate) {
    return [downdate](const py::array& l, const py::array& x) {
      auto L0 = as_matrix(l, "L");
      if (L0.rows != L0.cols) throw std::invalid_argument("L must be square");
      const double* xv = as_vector(x, "x", L0.rows);
      auto out = new_matrix(L0.rows, L0.cols);
      auto L = view_of(out);
      // Only the lower triangle is read (as by solve_lower); the result's upper triangle is 0.
      for (index_t i = 0; i < L0.rows; ++i)
        for (index_t j = 0; j < L0.cols; ++j) L(i, j) = j <= i ? L0(i, j) : 0.0;
      std::vector<double> work(xv, xv + L0.rows);
      {
        py::gil_scoped_release release;
        if (downdate)
          linalg::cholesky_downdate(L, work.data());
        else
          linalg::cholesky_update(L, work.data());
      }
      return out;
    };
  };
  m.def("cholesky_update", rank_one(false), py::arg("L"), py::arg("x"),
        "Factor of L L^T + x x^T (returns a new array).");
  m.def("cholesky_downdate", rank_one(true), py::arg("L"), py::arg("x"),
        "Factor of L L^T - x x^T (returns a new array); LinAlgError if not PD.");
}

}  // namespace pygpfast::bind
