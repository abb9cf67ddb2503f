// Fill the core's BLAS/LAPACK table from scipy.linalg.cython_blas / cython_lapack, so
// the extension uses the BLAS (and thread pool) that numpy/scipy already loaded.
#include <string>

#if defined(__linux__) && __has_include(<dlfcn.h>)
#include <dlfcn.h>
#define PYGPFAST_HAVE_DLADDR 1
#endif

#include "bind_common.hpp"
#include "pygpfast/blas.hpp"

namespace pygpfast::bind {
namespace {

void* capsule_pointer(const py::dict& capi, const char* module, const char* name) {
  if (!capi.contains(name))
    throw std::runtime_error(std::string("pygpfast: ") + module + " has no routine '" + name +
                             "'; pygpfast needs a scipy built with BLAS/LAPACK (scipy >= 1.9)");
  py::object cap = capi[name];
  void* p = PyCapsule_GetPointer(cap.ptr(), PyCapsule_GetName(cap.ptr()));
  if (p == nullptr) throw py::error_already_set();
  return p;
}

// OpenBLAS's openblas_set_num_threads_local, looked up in the library that provides scipy's BLAS
// (the capsule points into scipy's cython_blas module, whose dependencies include it); null
// when that BLAS has none.
blas::set_num_threads_local_t find_set_num_threads_local(void* routine) {
#ifdef PYGPFAST_HAVE_DLADDR
  Dl_info info;
  if (dladdr(routine, &info) == 0 || info.dli_fname == nullptr) return nullptr;
  void* handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return nullptr;
  void* symbol = dlsym(handle, "openblas_set_num_threads_local");
  dlclose(handle);  // (drops only the reference taken by RTLD_NOLOAD)
  return reinterpret_cast<blas::set_num_threads_local_t>(symbol);
#else
  (void)routine;
  return nullptr;
#endif
}

}  // namespace

void bind_blas(py::module_& m) {
  const py::dict b = py::module_::import("scipy.linalg.cython_blas").attr("__pyx_capi__");
  const py::dict l = py::module_::import("scipy.linalg.cython_lapack").attr("__pyx_capi__");
  const char* bm = "scipy.linalg.cython_blas";
  const char* lm = "scipy.linalg.cython_lapack";
  blas::Table t;
  t.dgemm = reinterpret_cast<blas::dgemm_t>(capsule_pointer(b, bm, "dgemm"));
  t.dsyrk = reinterpret_cast<blas::dsyrk_t>(capsule_pointer(b, bm, "dsyrk"));
  t.dsymm = reinterpret_cast<blas::dsymm_t>(capsule_pointer(b, bm, "dsymm"));
  t.dtrsm = reinterpret_cast<blas::dtrsm_t>(capsule_pointer(b, bm, "dtrsm"));
  t.dtrmm = reinterpret_cast<blas::dtrmm_t>(capsule_pointer(b, bm, "dtrmm"));
  t.dgemv = reinterpret_cast<blas::dgemv_t>(capsule_pointer(b, bm, "dgemv"));
  t.dtrsv = reinterpret_cast<blas::dtrsv_t>(capsule_pointer(b, bm, "dtrsv"));
  t.dsymv = reinterpret_cast<blas::dsymv_t>(capsule_pointer(b, bm, "dsymv"));
  t.dger = reinterpret_cast<blas::dger_t>(capsule_pointer(b, bm, "dger"));
  t.dsyr = reinterpret_cast<blas::dsyr_t>(capsule_pointer(b, bm, "dsyr"));
  t.ddot = reinterpret_cast<blas::ddot_t>(capsule_pointer(b, bm, "ddot"));
  t.daxpy = reinterpret_cast<blas::daxpy_t>(capsule_pointer(b, bm, "daxpy"));
  t.dpotrf = reinterpret_cast<blas::dpotrf_t>(capsule_pointer(l, lm, "dpotrf"));
  t.dpotri = reinterpret_cast<blas::dpotri_t>(capsule_pointer(l, lm, "dpotri"));
  t.dtrtri = reinterpret_cast<blas::dtrtri_t>(capsule_pointer(l, lm, "dtrtri"));
  t.dlauum = reinterpret_cast<blas::dlauum_t>(capsule_pointer(l, lm, "dlauum"));
  t.set_num_threads_local = find_set_num_threads_local(reinterpret_cast<void*>(t.dgemm));
  blas::set_table(t);
  m.attr("thread_control") = t.set_num_threads_local != nullptr;
  m.attr("source") = "scipy.linalg.cython_blas/cython_lapack";

  m.def(
      "gemm",
      [](const py::array& a, const py::array& b, bool trans_a, bool trans_b) {
        auto A = as_matrix(a, "A");
        auto B = as_matrix(b, "B");
        const index_t rows = trans_a ? A.cols : A.rows;
        const index_t cols = trans_b ? B.rows : B.cols;
        auto out = new_matrix(rows, cols);
        auto C = view_of(out);
        {
          py::gil_scoped_release release;
          blas::gemm(trans_a ? blas::Trans::Yes : blas::Trans::No,
                     trans_b ? blas::Trans::Yes : blas::Trans::No, 1.0, A, B, 0.0, C);
        }
        return out;
      },
      py::arg("A"), py::arg("B"), py::arg("trans_a") = false, py::arg("trans_b") = false,
      "op(A) @ op(B) through the core's BLAS table (for tests and benchmarks).");
}

}  // namespace pygpfast::bind
