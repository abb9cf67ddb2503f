// Thread policy of the core.
//
// One level of parallelism at a time: per-point loops use OpenMP with BLAS left
// alone inside them (the loops call no BLAS); big products use BLAS threads with no
// OpenMP region around them. Small loops run on one thread: on a shared 2-core machine
// a parallel region whose second thread is descheduled stalls at its barrier, so a
// loop is split only when each thread gets at least `min_per_thread` items.
#pragma once

#include <atomic>
#include <type_traits>

#include "pygpfast/region_errors.hpp"
#include "pygpfast/view.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

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
// BLAS's thread count cannot be set (OpenBLAS before 0.3.27), since each of several threads
// would then start the whole BLAS pool on every call; that loop runs on one thread and its BLAS
// calls use the BLAS's own threads.
int threads_for_blas_calls(index_t items, index_t min_per_thread);

// While at least one is open, anywhere in the process, the BLAS runs on one thread; the last to
// close restores the count from before the first opened. (OpenBLAS's
// openblas_set_num_threads_local, the setting used, is process-wide: pthreads builds call the
// global setter. Set-and-restore pairs on several threads, the OpenMP threads of one parallel
// region or fits in several Python threads, restored in the wrong order and left the BLAS on
// one thread for the rest of the process.) enter returns false, and nothing is to be left,
// where the BLAS's count cannot be set.
bool enter_one_blas_thread();
void leave_one_blas_thread();

// The BLAS on one thread while it exists (enter_one_blas_thread/leave_one_blas_thread), the
// core's OpenMP loops on their usual count: for code whose BLAS calls are too short to pay for
// the BLAS's threads on a shared machine, whose per-point loops are not. `active` false: a scope
// that does nothing (for code whose calls are short only at small sizes).
class OneBlasThreadScope {
 public:
  explicit OneBlasThreadScope(bool active = true) : entered_(active && enter_one_blas_thread()) {}
  ~OneBlasThreadScope() {
    if (entered_) leave_one_blas_thread();
  }
  OneBlasThreadScope(const OneBlasThreadScope&) = delete;
  OneBlasThreadScope& operator=(const OneBlasThreadScope&) = delete;

 private:
  bool entered_;
};

// The BLAS's thread count, or 0 where it cannot be read.
int blas_threads();

// True when the core was compiled with OpenMP.
bool openmp_enabled();

// body(i) for every i in [0, n), on threads_for(n, min_per_thread) threads, each over one
// contiguous range of i (as schedule(static)). Bodies write per-index outputs, so results do
// not depend on the thread count. An exception from body(i) ends its thread's range and is
// rethrown after the loop: that of the lowest failed i, as on one thread (region_errors.hpp).
// On one thread the loop runs without an OpenMP region: GNU OpenMP's region with an if(false)
// clause still allocates a team and makes a futex system call (about a microsecond, 15 of them
// in a small SVGP step).
template <class Body>
void parallel_for(index_t n, index_t min_per_thread, const Body& body) {
  [[maybe_unused]] const int nt = threads_for(n, min_per_thread);
  if (nt == 1) {
    for (index_t i = 0; i < n; ++i) body(i);
    return;
  }
  // (A range's rank is its first index: the ranges are ordered, and one that fails stops.)
  RegionErrors errors;
#ifdef _OPENMP  // (without it threads_for answers 1)
#pragma omp parallel num_threads(nt)
  {
    const index_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const index_t begin = n * t / T, end = n * (t + 1) / T;
    errors.run(begin, [&] {
      for (index_t i = begin; i < end; ++i) body(i);
    });
  }
#endif
  errors.rethrow();
}

// While one exists (when `active`), the calling thread runs the core on one thread: its OpenMP
// loops (threads_for returns 1) and, where the BLAS's count can be set, its BLAS calls (and so
// every thread's: see enter_one_blas_thread).
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
  bool blas_ = false;
};

// For a loop whose tasks call BLAS: body(t) (or body(t, state)) for every t in [0, count), the
// tasks taken in turn by `threads` OpenMP threads (one shared counter, as schedule(dynamic, 1)),
// each thread inside a SingleThreadScope (its BLAS calls and the core's loops on one thread) and
// with its own State (default-constructed once per thread: scratch its tasks reuse). Pass
// threads_for_blas_calls(count, ...), or 1. A task's arithmetic does not depend on the thread
// that runs it. An exception is rethrown after the loop: that of the lowest rank(t) among the
// failed tasks, as in rank order (region_errors.hpp). On one thread, no OpenMP region (see
// parallel_for).
struct NoTaskState {};
struct TaskIndex {
  index_t operator()(index_t t) const { return t; }
};
template <class State = NoTaskState, class Body, class Rank = TaskIndex>
void for_each_blas_task(index_t count, int threads, const Body& body, const Rank& rank = Rank()) {
  RegionErrors errors;
  std::atomic<index_t> next{0};
  auto worker = [&] {
    const SingleThreadScope one_thread(true);
    State state;
    for (index_t t; (t = next.fetch_add(1)) < count;)
      errors.run(rank(t), [&] {
        if constexpr (std::is_invocable_v<const Body&, index_t>) body(t);
        else body(t, state);
      });
  };
  if (threads <= 1) {
    worker();
  } else {
#ifdef _OPENMP  // (without it threads_for_blas_calls answers 1)
#pragma omp parallel num_threads(threads)
    worker();
#endif
  }
  errors.rethrow();
}

}  // namespace pygpfast
