#include "blas_linked.hpp"

#include "pygpfast/blas.hpp"

extern "C" {
void dgemm_(char*, char*, int*, int*, int*, double*, double*, int*, double*, int*, double*, double*,
            int*);
void dsyrk_(char*, char*, int*, int*, double*, double*, int*, double*, double*, int*);
void dsymm_(char*, char*, int*, int*, double*, double*, int*, double*, int*, double*, double*,
            int*);
void dtrsm_(char*, char*, char*, char*, int*, int*, double*, double*, int*, double*, int*);
void dtrmm_(char*, char*, char*, char*, int*, int*, double*, double*, int*, double*, int*);
void dgemv_(char*, int*, int*, double*, double*, int*, double*, int*, double*, double*, int*);
void dtrsv_(char*, char*, char*, int*, double*, int*, double*, int*);
void dsymv_(char*, int*, double*, double*, int*, double*, int*, double*, double*, int*);
void dger_(int*, int*, double*, double*, int*, double*, int*, double*, int*);
void dsyr_(char*, int*, double*, double*, int*, double*, int*);
double ddot_(int*, double*, int*, double*, int*);
void daxpy_(int*, double*, double*, int*, double*, int*);
void dpotrf_(char*, int*, double*, int*, int*);
void dpotri_(char*, int*, double*, int*, int*);
void dtrtri_(char*, char*, int*, double*, int*, int*);
void dlauum_(char*, int*, double*, int*, int*);
// Present from OpenBLAS 0.3.27 on; weak, so older BLAS still link.
int openblas_set_num_threads_local(int) __attribute__((weak));
// Any OpenBLAS (weak: absent from other BLAS).
void openblas_set_num_threads(int) __attribute__((weak));
}

namespace pygpfast::blas {
namespace {

bool openblas_without_local_setting() {
  return openblas_set_num_threads_local == nullptr && openblas_set_num_threads != nullptr;
}

}  // namespace

void install_linked_blas() {
  Table t;
  t.dgemm = dgemm_;
  t.dsyrk = dsyrk_;
  t.dsymm = dsymm_;
  t.dtrsm = dtrsm_;
  t.dtrmm = dtrmm_;
  t.dgemv = dgemv_;
  t.dtrsv = dtrsv_;
  t.dsymv = dsymv_;
  t.dger = dger_;
  t.dsyr = dsyr_;
  t.ddot = ddot_;
  t.daxpy = daxpy_;
  t.dpotrf = dpotrf_;
  t.dpotri = dpotri_;
  t.dtrtri = dtrtri_;
  t.dlauum = dlauum_;
  t.set_num_threads_local = openblas_set_num_threads_local;  // (null if absent)
  // Without openblas_set_num_threads_local, BLAS calls made by the core's OpenMP threads each start
  // the whole BLAS thread pool (an SVGP step at M = 256, B = 256 with two OpenMP threads and
  // Debian's OpenBLAS 0.3.21: 52 ms instead of 6.6 ms); BLAS runs on one thread instead.
  // The core's setting is then a no-op that reports one thread.
  if (openblas_without_local_setting()) {
    openblas_set_num_threads(1);
    t.set_num_threads_local = [](int) { return 1; };
  }
  set_table(t);
}

std::string linked_blas_name() {
#ifdef PYGPFAST_LINKED_BLAS_NAME
  std::string name = PYGPFAST_LINKED_BLAS_NAME;
#else
  std::string name = "system BLAS";
#endif
  if (openblas_without_local_setting())
    name += ", one thread (an OpenBLAS without openblas_set_num_threads_local)";
  return name;
}

}  // namespace pygpfast::blas
