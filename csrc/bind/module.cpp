// pygpfast._core: thin bindings of the C++ core. No algorithm lives here.
#include "bind_common.hpp"
#include "pygpfast/errors.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "pygpfast compiled core (private; use the public pygpfast API)";

  // pygpfast::LinAlgError -> pygpfast.exceptions.LinAlgError (a numpy.linalg.LinAlgError).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const pygpfast::LinAlgError& e) {
      py::object cls = py::module_::import("pygpfast.exceptions").attr("LinAlgError");
      PyErr_SetString(cls.ptr(), e.what());
    }
  });

  pygpfast::bind::bind_blas(m);
  pygpfast::bind::bind_threads(m);
  pygpfast::bind::bind_linalg(m);
  pygpfast::bind::bind_kernels(m);
  pygpfast::bind::bind_likelihoods(m);
  pygpfast::bind::bind_svgp(m);
}
