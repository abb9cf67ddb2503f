#include "pygpfast/threads.hpp"

#include <algorithm>
#include <atomic>

#include "pygpfast/blas.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace pygpfast {
namespace {

int default_threads() {
#ifdef _OPENMP
  return std::max(1, omp_get_max_threads());  // honours OMP_NUM_THREADS
#else
  return 1;
#endif
}

std::atomic<int>& thread_setting() {
  static std::atomic<int> n{default_threads()};
  return n;
}

// Depth of SingleThreadScope objects alive on this thread.
thread_local int single_thread_depth = 0;

}  // namespace

int get_num_threads() { return thread_setting().load(std::memory_order_relaxed); }

void set_num_threads(int n) {
#ifdef _OPENMP
  thread_setting().store(n >= 1 ? n : default_threads(), std::memory_order_relaxed);
#else
  (void)n;
  thread_setting().store(1, std::memory_order_relaxed);
#endif
}

int threads_for(index_t items, index_t min_per_thread) {
  if (single_thread_depth > 0) return 1;
  const int n = get_num_threads();
  if (n <= 1 || min_per_thread <= 0) return std::max(1, n);
  const index_t useful = items / min_per_thread;
  return static_cast<int>(std::max<index_t>(1, std::min<index_t>(n, useful)));
}

int threads_for_blas_calls(index_t items, index_t min_per_thread) {
  if (!blas::has_table() || blas::table().set_num_threads_local == nullptr) return 1;
  return threads_for(items, min_per_thread);
}

int set_blas_threads_local(int n) {
  if (!blas::has_table() || blas::table().set_num_threads_local == nullptr) return 0;
  return blas::table().set_num_threads_local(n);
}

SingleThreadScope::SingleThreadScope(bool active) : active_(active) {
  if (!active_) return;
  ++single_thread_depth;
  previous_blas_ = set_blas_threads_local(1);
}

SingleThreadScope::~SingleThreadScope() {
  if (!active_) return;
  --single_thread_depth;
  if (previous_blas_ > 0) set_blas_threads_local(previous_blas_);
}

bool openmp_enabled() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

}  // namespace pygpfast
