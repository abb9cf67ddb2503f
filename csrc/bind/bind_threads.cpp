#include "bind_common.hpp"
#include "pygpfast/threads.hpp"

namespace pygpfast::bind {

void bind_threads(py::module_& m) {
  m.def("get_num_threads", &get_num_threads, "Threads used by the core's OpenMP loops.");
  m.def("set_num_threads", &set_num_threads, py::arg("n"),
        "Set the core's OpenMP thread count; n <= 0 restores the default.");
  m.def("enter_one_blas_thread", &enter_one_blas_thread,
        "Open a scope in which the BLAS runs on one thread (counted process-wide: the last to "
        "close restores the count); False, with nothing to leave, where the count cannot be set.");
  m.def("leave_one_blas_thread", &leave_one_blas_thread,
        "Close a scope opened by enter_one_blas_thread.");
  m.def("blas_threads", &blas_threads, "The BLAS's thread count, or 0 where it cannot be read.");
  m.def("openmp_enabled", &openmp_enabled, "Whether the core was compiled with OpenMP.");
}

}  // namespace pygpfast::bind
