#include "pygpfast/workspace.hpp"

#include <cstdlib>
#include <mutex>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

namespace pygpfast::workspace {
namespace {

constexpr std::size_t kAlignment = 64;

std::size_t rounded(std::size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

struct Entry {
  std::size_t bytes;
  void* p;
};

// Released arrays, oldest first (evicted first when the cache is full).
struct Pool {
  std::mutex mutex;
  std::vector<Entry> entries;
  std::size_t bytes = 0;
};

// Never destroyed, so that scratch arrays released during static destruction still find it
// (the memory it holds goes back to the system with the process). A fork() while another
// thread holds the mutex would leave it locked for good in the child (Python's os.fork and
// multiprocessing's default start method on Linux can do this while a fit runs in a thread):
// the fork handlers take the mutex around the fork, so the child gets it unlocked and the
// list consistent.
Pool& pool() {
  static Pool* p = [] {
#if defined(__unix__) || defined(__APPLE__)
    // (the handlers run only at a fork, after p is set)
    pthread_atfork([] { pool().mutex.lock(); }, [] { pool().mutex.unlock(); },
                   [] { pool().mutex.unlock(); });
#endif
    return new Pool();
  }();
  return *p;
}

}  // namespace

void* acquire(std::size_t bytes) {
  const std::size_t size = rounded(bytes == 0 ? 1 : bytes);
  if (size >= kSmallestCached && size <= kLargestCached) {
    Pool& pl = pool();
    const std::lock_guard<std::mutex> lock(pl.mutex);
    for (std::size_t i = pl.entries.size(); i-- > 0;) {
      if (pl.entries[i].bytes != size) continue;
      void* p = pl.entries[i].p;
      pl.entries.erase(pl.entries.begin() + static_cast<std::ptrdiff_t>(i));
      pl.bytes -= size;
      return p;
    }
  }
  void* p = std::aligned_alloc(kAlignment, size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void release(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  const std::size_t size = rounded(bytes == 0 ? 1 : bytes);
  if (size < kSmallestCached || size > kLargestCached) {
    std::free(p);
    return;
  }
  Pool& pl = pool();
  const std::lock_guard<std::mutex> lock(pl.mutex);
  try {
    pl.entries.push_back({size, p});
  } catch (...) {  // (no memory for the list: give the array back instead)
    std::free(p);
    return;
  }
  pl.bytes += size;
  std::size_t drop = 0;
  while (pl.bytes > kCachedBytes) pl.bytes -= pl.entries[drop++].bytes;
  for (std::size_t i = 0; i < drop; ++i) std::free(pl.entries[i].p);
  pl.entries.erase(pl.entries.begin(), pl.entries.begin() + static_cast<std::ptrdiff_t>(drop));
}

std::size_t cached_bytes() {
  Pool& pl = pool();
  const std::lock_guard<std::mutex> lock(pl.mutex);
  return pl.bytes;
}

void trim() {
  Pool& pl = pool();
  const std::lock_guard<std::mutex> lock(pl.mutex);
  for (const Entry& e : pl.entries) std::free(e.p);
  pl.entries.clear();
  pl.bytes = 0;
}

}  // namespace pygpfast::workspace
