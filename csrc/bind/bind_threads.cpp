#include "bind_common.hpp"
#include "pygpfast/threads.hpp"

namespace pygpfast::bind {

void bind_threads(py::module_& m) {
  m.def("get_num_threads", &get_num_threads, "Threads used by the core's OpenMP loops.");
  m.def("set_num_threads", &set_num_threads, py::arg("n"),
        "Set the core's OpenMP thread count; n <= 0 restores the default.");
  m.def("set_blas_threads_local", &set_blas_threads_local, py::arg("n"),
        "Set the calling thread's BLAS thread count (n <= 0: the BLAS's default) where the BLAS "
        "has a per-thread setting; returns the count before, or 0 where it has none.");
  m.def("openmp_enabled", &openmp_enabled, "Whether the core was compiled with OpenMP.");
}

}  // namespace pygpfast::bind
