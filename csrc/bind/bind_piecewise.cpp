#include "bind_common.hpp"
#include "pygpfast/piecewise.hpp"

namespace pygpfast::bind {

void bind_piecewise(py::module_& m) {
  m.def(
      "expected_bound",
      [](const py::array& knots, const py::array& a, const py::array& b, const py::array& c,
         const py::array& mean, const py::array& var) {
        const piecewise::Bound bound = make_piecewise_bound(knots, a, b, c);
        const double* mv = as_vector(mean, "m");
        const index_t n = mean.shape(0);
        const double* vv = as_vector(var, "v", n);
        auto value = new_vector(n), dm = new_vector(n), dv = new_vector(n);
        {
          py::gil_scoped_release release;
          piecewise::expected_bound(bound, mv, vv, n, value.mutable_data(), dm.mutable_data(),
                                    dv.mutable_data());
        }
        return py::make_tuple(value, dm, dv);
      },
      py::arg("knots"), py::arg("a"), py::arg("b"), py::arg("c"), py::arg("m"), py::arg("v"),
      "E[B(x)] for x ~ N(m, v) per point, B the piecewise quadratic a x^2 + b x + c on "
      "[knots[r], knots[r + 1]) (knots [R + 1] from -inf to +inf; a, b, c [R]). "
      "Returns (value, dm, dv), each [N]: the expectation and its derivatives in m and v.");
}

}  // namespace pygpfast::bind
