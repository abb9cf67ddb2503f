// Scratch memory that outlives a call: a process-wide cache of freed scratch arrays.
//
// The estimators call the core thousands of times with the same shapes, and each call needs
// scratch arrays of O(M^2) and O(M B) doubles. Taken from malloc and freed every call, arrays
// from 128 KiB up come from fresh mmap'ed (or, after glibc trims its heap, fresh sbrk'ed) pages,
// which the kernel faults in and zeroes on first touch, every call: the SVGP step (D = 8,
// B = 256, one thread, bench_core with glibc's mmap threshold fixed at 128 KiB) took 0.83 ms
// at M = 64 and 8.75 ms at M = 256 that way, 0.50 and 6.17 ms with the cache. Arrays released
// here are kept (up to kCachedBytes in all, each at most kLargestCached) and handed out again to
// a request of the same size, from any thread.
// Requests under kSmallestCached go to malloc directly (its own bins serve them well).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

#include "pygpfast/view.hpp"

namespace pygpfast::workspace {

constexpr std::size_t kSmallestCached = std::size_t{16} << 10;  // 16 KiB
constexpr std::size_t kLargestCached = std::size_t{16} << 20;   // 16 MiB
constexpr std::size_t kCachedBytes = std::size_t{64} << 20;     // 64 MiB

// `bytes` of memory aligned to 64 bytes (throws std::bad_alloc); release it with the same
// `bytes`.
void* acquire(std::size_t bytes);
void release(void* p, std::size_t bytes) noexcept;

// Bytes held in the cache now, and a way to return them all to the system.
std::size_t cached_bytes();
void trim();

// std::allocator replacement for scratch vectors.
template <class T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_alloc();
    return static_cast<T*>(acquire(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept { release(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const PoolAllocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const PoolAllocator<U>&) const noexcept { return false; }
};

// Zero-initialised (like std::vector) scratch array.
using Buffer = std::vector<double, PoolAllocator<double>>;

// Uninitialised scratch array for blocks that are written in full before they are read.
// resize() only grows (keeping nothing).
class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(index_t n) { resize(n); }
  ~Scratch() { reset(); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch(Scratch&& o) noexcept : p_(o.p_), size_(o.size_) {
    o.p_ = nullptr;
    o.size_ = 0;
  }
  Scratch& operator=(Scratch&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_;
      size_ = o.size_;
      o.p_ = nullptr;
      o.size_ = 0;
    }
    return *this;
  }
  void resize(index_t n) {
    if (n <= size_) return;
    reset();
    p_ = static_cast<double*>(acquire(static_cast<std::size_t>(n) * sizeof(double)));
    size_ = n;
  }
  double* data() const { return p_; }

 private:
  void reset() noexcept {
    if (p_ != nullptr) release(p_, static_cast<std::size_t>(size_) * sizeof(double));
    p_ = nullptr;
    size_ = 0;
  }
  double* p_ = nullptr;
  index_t size_ = 0;
};

}  // namespace pygpfast::workspace
