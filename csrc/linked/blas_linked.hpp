// Fill the core's BLAS/LAPACK table from a BLAS linked at build time (C++ tests and
// microbenchmarks; the Python extension uses scipy's instead).
#pragma once

#include <string>

namespace pygpfast::blas {

void install_linked_blas();
// A short description of the linked BLAS (for benchmark records).
std::string linked_blas_name();

}  // namespace pygpfast::blas
