#include "bind_common.hpp"

namespace pygpfast::bind {

void bind_kernels(py::module_&) {}

}  // namespace pygpfast::bind
