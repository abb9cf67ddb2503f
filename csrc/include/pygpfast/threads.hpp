// Thread policy of the core.
//
// One level of parallelism at a time: per-point loops use OpenMP with BLAS left
// alone inside them (the loops call no BLAS); big products use BLAS threads with no
// OpenMP region around them. Small loops run on one thread: on a shared 2-core machine
// a parallel region whose second thread is descheduled stalls at its barrier, so a
// loop is split only when each thread gets at least `min_per_thread` items.
#pragma once

#include "pygpfast/view.hpp"

namespace pygpfast {

// Number of threads the core's OpenMP loops may use (>= 1).
int get_num_threads();

// n >= 1 sets it; n <= 0 restores the default: OpenMP's count for the calling thread when the
// core runs (OMP_NUM_THREADS, else all cores; a threadpoolctl limit while one is active).
void set_num_threads(int n);

// Threads to use for `items` independent work items when each thread should get at
// least `min_per_thread` of them: 1 for small loops, get_num_threads() for big ones.
int threads_for(index_t items, index_t min_per_thread);

// The same for a loop whose items call BLAS, each thread inside a SingleThreadScope: 1 when the
// BLAS has no per-thread setting (OpenBLAS before 0.3.27), since each of several threads would
// then start the whole BLAS pool on every call; that loop runs on one thread and its BLAS calls
// use the BLAS's own threads.
int threads_for_blas_calls(index_t items, index_t min_per_thread);

// Sets the calling thread's BLAS thread count to n (n <= 0: the BLAS's own default) where the
// BLAS has a per-thread setting (OpenBLAS >= 0.3.27); returns the count before, or 0 (and
// changes nothing) where it has none.
int set_blas_threads_local(int n);

// True when the core was compiled with OpenMP.
bool openmp_enabled();

// body(i) for every i in [0, n), on threads_for(n, min_per_thread) threads with a static
// schedule. Bodies write per-index outputs, so results do not depend on the thread count.
// The body must not throw (validate before the loop).
template <class Body>
void parallel_for(index_t n, index_t min_per_thread, const Body& body) {
  [[maybe_unused]] const int nt = threads_for(n, min_per_thread);
#ifdef _OPENMP  // (without it the pragma would draw -Wunknown-pragmas)
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
  for (index_t i = 0; i < n; ++i) body(i);
}

// While one exists (when `active`), the calling thread runs the core on one thread: its OpenMP
// loops (threads_for returns 1) and, where the BLAS has a per-thread setting, its BLAS calls.
// For work too small to pay for a second thread: waking one costs more than it saves, and on a
// shared machine every barrier waits for a thread the scheduler may have paused.
class SingleThreadScope {
 public:
  explicit SingleThreadScope(bool active);
  ~SingleThreadScope();
  SingleThreadScope(const SingleThreadScope&) = delete;
  SingleThreadScope& operator=(const SingleThreadScope&) = delete;

 private:
  bool active_;
  int previous_blas_ = 0;
};

}  // namespace pygpfast
