#include "pygpfast/threads.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>

#include "pygpfast/blas.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define PYGPFAST_HAVE_ATFORK 1
#endif

namespace pygpfast {
namespace {

// OpenMP's count for the calling thread, read at every call: OMP_NUM_THREADS (else all cores),
// or a limit set since on this thread (threadpoolctl's threadpool_limits, omp_set_num_threads),
// as scikit-learn's n_threads=None reads it.
int default_threads() {
#ifdef _OPENMP
  return std::max(1, omp_get_max_threads());
#else
  return 1;
#endif
}

// set_num_threads's n, or 0 for the default.
std::atomic<int> thread_setting{0};

// Depth of SingleThreadScope objects alive on this thread.
thread_local int single_thread_depth = 0;

// GNU OpenMP is not fork-safe: a child forked after the parent ran a team of threads inherits
// the pool's bookkeeping but not its threads, and its next team waits for them forever (an
// SVGP fit in a multiprocessing 'fork' worker hung after one in the parent). So a team started
// here marks the process, and a child forked after that runs the core on one thread.
std::atomic<bool> team_started{false};
std::atomic<bool> forked_after_team{false};

#ifdef PYGPFAST_HAVE_ATFORK
void on_fork_in_child() {
  if (team_started.load(std::memory_order_relaxed))
    forked_after_team.store(true, std::memory_order_relaxed);
}
const int atfork_registered = pthread_atfork(nullptr, nullptr, on_fork_in_child);
#endif

}  // namespace

int get_num_threads() {
  if (forked_after_team.load(std::memory_order_relaxed)) return 1;
  const int n = thread_setting.load(std::memory_order_relaxed);
  return n >= 1 ? n : default_threads();
}

void set_num_threads(int n) {
#ifdef _OPENMP
  thread_setting.store(std::max(n, 0), std::memory_order_relaxed);
#else
  (void)n;
  thread_setting.store(1, std::memory_order_relaxed);
#endif
}

int threads_for(index_t items, index_t min_per_thread) {
  if (single_thread_depth > 0) return 1;
  const int n = get_num_threads();
  const index_t useful = min_per_thread > 0 ? items / min_per_thread : n;
  const int threads = static_cast<int>(std::max<index_t>(1, std::min<index_t>(n, useful)));
  if (threads > 1) team_started.store(true, std::memory_order_relaxed);
  return threads;
}

int threads_for_blas_calls(index_t items, index_t min_per_thread) {
  if (!blas::has_table() || blas::table().set_num_threads_local == nullptr) return 1;
  return threads_for(items, min_per_thread);
}

namespace {

// enter_one_blas_thread's scopes open in the process, and the BLAS's count before the first.
struct BlasScopes {
  std::mutex mutex;
  int open = 0;
  int threads_before = 0;
};

// Never destroyed (scopes may close during static destruction). The fork handlers take the
// mutex around a fork, so that a child forked while another thread held it gets it unlocked.
BlasScopes& blas_scopes() {
  static BlasScopes* scopes = [] {
#ifdef PYGPFAST_HAVE_ATFORK
    pthread_atfork([] { blas_scopes().mutex.lock(); }, [] { blas_scopes().mutex.unlock(); },
                   [] { blas_scopes().mutex.unlock(); });
#endif
    return new BlasScopes();
  }();
  return *scopes;
}

blas::set_num_threads_local_t blas_setting() {
  return blas::has_table() ? blas::table().set_num_threads_local : nullptr;
}

}  // namespace

bool enter_one_blas_thread() {
  const auto set = blas_setting();
  if (set == nullptr) return false;
  BlasScopes& scopes = blas_scopes();
  const std::lock_guard<std::mutex> lock(scopes.mutex);
  if (scopes.open++ == 0) scopes.threads_before = set(1);
  return true;
}

void leave_one_blas_thread() {
  const auto set = blas_setting();
  if (set == nullptr) return;
  BlasScopes& scopes = blas_scopes();
  const std::lock_guard<std::mutex> lock(scopes.mutex);
  if (--scopes.open == 0 && scopes.threads_before > 0) set(scopes.threads_before);
}

int blas_threads() {
  const auto set = blas_setting();
  if (set == nullptr) return 0;
  BlasScopes& scopes = blas_scopes();
  const std::lock_guard<std::mutex> lock(scopes.mutex);
  const int n = set(1);
  set(n);
  return n;
}

SingleThreadScope::SingleThreadScope(bool active) : active_(active) {
  if (!active_) return;
  ++single_thread_depth;
  blas_ = enter_one_blas_thread();
}

SingleThreadScope::~SingleThreadScope() {
  if (!active_) return;
  --single_thread_depth;
  if (blas_) leave_one_blas_thread();
}

bool openmp_enabled() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

}  // namespace pygpfast
