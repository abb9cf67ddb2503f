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

  // One submodule per building block and per model family (pygpfast._core.svgp, ...), as the
  // Python package is laid out; the stubs in src/pygpfast/_core/ mirror them.
  auto sub = [&m](const char* name, const char* doc) { return m.def_submodule(name, doc); };
  auto blas = sub("blas", "The core's BLAS/LAPACK table (filled from scipy's at import)");
  auto threads = sub("threads", "OpenMP and BLAS thread counts");
  auto linalg = sub("linalg", "Cholesky with jitter escalation, triangular solves, rank-one updates");
  auto kernels = sub("kernels", "Kernel matrices and their vector-Jacobian products");
  auto likelihoods = sub("likelihoods", "Quadrature, variational expectations, predictive densities");
  auto piecewise = sub("piecewise", "Expectations of piecewise bounds on log(1 + e^x)");
  auto svgp = sub("svgp", "Sparse variational GP: ELBO with gradients, predictions, the mean-field bound");
  auto cvi = sub("cvi", "Concave variational inference for full GPs");
  auto ivm = sub("ivm", "Informative vector machine: greedy active-set selection, ADF sites, predictions, the bound");
  auto moe = sub("moe", "IS-MOE experts: per-block evidence, fits and predictions on OpenMP threads");
  pygpfast::bind::bind_blas(blas);
  pygpfast::bind::bind_threads(threads);
  pygpfast::bind::bind_linalg(linalg);
  pygpfast::bind::bind_kernels(kernels);
  pygpfast::bind::bind_likelihoods(likelihoods);
  pygpfast::bind::bind_piecewise(piecewise);
  pygpfast::bind::bind_svgp(svgp);
  pygpfast::bind::bind_svgp_mf(svgp);
  pygpfast::bind::bind_cvi(cvi);
  pygpfast::bind::bind_ivm_binary(ivm);
  pygpfast::bind::bind_ivm_multiclass(ivm);
  pygpfast::bind::bind_moe(moe);
}
