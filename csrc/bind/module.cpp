// pygpfast._core: thin bindings of the C++ core. No algorithm lives here.
#include <cstdlib>  // defines __GLIBC__ on glibc systems
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "bind_common.hpp"
#include "pygpfast/errors.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "pygpfast compiled core (private; use the public pygpfast API)";

#if defined(__GLIBC__)
  // Model steps allocate and free the same [M, B] workspaces every call. By default glibc
  // serves such blocks with fresh mmaps (or trims the heap after them), so every step pays
  // page faults and zero-filling of new pages (measured: ~20% of a step at M = B = 256).
  // Serving blocks up to 32 MiB from the heap and not trimming it below 1 GiB keeps the pages.
  mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024);
#endif

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
  pygpfast::bind::bind_piecewise(m);
  pygpfast::bind::bind_svgp_mf(m);
  pygpfast::bind::bind_cvi(m);
}
