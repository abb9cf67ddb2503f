#include "bind_common.hpp"

namespace pygpfast::bind {

void bind_likelihoods(py::module_&) {}

}  // namespace pygpfast::bind
