// Thread policy (threads.hpp): loops whose items call BLAS stay on one thread when the BLAS
// thread count cannot be set.
#include "blas_linked.hpp"
#include "check.hpp"
#include "pygpfast/blas.hpp"
#include "pygpfast/threads.hpp"

using namespace pygpfast;

PYGPFAST_TEST(blas_calling_loops_need_the_per_thread_setting) {
  blas::install_linked_blas();
  const blas::Table linked = blas::table();
  set_num_threads(2);
  const int expected = openmp_enabled() ? 2 : 1;
  CHECK(threads_for(8, 1) == expected);
  if (linked.set_num_threads_local != nullptr) {  // (any OpenBLAS: its own, or install's stand-in)
    CHECK(threads_for_blas_calls(8, 1) == expected);
    CHECK(threads_for_blas_calls(8, 8) == 1);  // (small loops as threads_for)
  }

  blas::Table without = linked;
  without.set_num_threads_local = nullptr;
  blas::set_table(without);
  CHECK(threads_for(8, 1) == expected);   // loops without BLAS calls are unaffected
  CHECK(threads_for_blas_calls(8, 1) == 1);
  {
    const SingleThreadScope scope(true);  // (nothing to set, nothing to restore)
    CHECK(threads_for(8, 1) == 1);
  }
  blas::set_table(linked);
  set_num_threads(0);
}

PYGPFAST_TEST_MAIN
