// Fill the core's BLAS/LAPACK table from a BLAS linked at build time (C++ tests and
// microbenchmarks; the Python extension uses scipy's instead).
#pragma once

#include <string>

namespace pygpfast::blas {

// With an OpenBLAS older than 0.3.27 (no openblas_set_num_threads_local, so the core cannot
// keep its own threads' BLAS calls on one thread) this sets OpenBLAS to one thread for the
// whole process: the core's parallelism is then its OpenMP threads alone.
void install_linked_blas();
// A short description of the linked BLAS (for benchmark records).
std::string linked_blas_name();

}  // namespace pygpfast::blas
