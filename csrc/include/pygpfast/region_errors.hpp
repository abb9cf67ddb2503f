// Exceptions and OpenMP regions. An exception must not leave a parallel region (it would call
// std::terminate and take the Python process down), yet work inside one can throw: an
// allocation, a BLAS wrapper's argument check, a failed factorisation. So every parallel region
// in the core runs its work items through one RegionErrors and rethrows after the region.
//
// Each item has a rank: its position in the serial order (an index, or a phase of a multi-phase
// region). A failed item keeps its exception if no item of a lower rank has failed, and items
// ranked at or above a failure are skipped (so the later steps of one piece of work can share
// its rank). Every item ranked below the lowest failure has then run, so the exception rethrown
// is the one a run in rank order would have thrown, on any number of threads.
#pragma once

#include <atomic>
#include <exception>
#include <limits>
#include <mutex>

#include "pygpfast/view.hpp"

namespace pygpfast {

class RegionErrors {
 public:
  // item() unless an item ranked at or below `rank` has failed; an exception it throws is kept
  // (if its rank is the lowest failed so far), never passed on.
  template <class Item>
  void run(index_t rank, const Item& item) noexcept {
    if (lowest_failed_.load(std::memory_order_relaxed) <= rank) return;
    try {
      item();
    } catch (...) {
      keep(rank, std::current_exception());
    }
  }

  // Whether an item has failed (inside the region: so far).
  bool failed() const noexcept { return lowest_failed_.load(std::memory_order_relaxed) != kNone; }

  // After the region: throws the kept exception, if any.
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static constexpr index_t kNone = std::numeric_limits<index_t>::max();

  void keep(index_t rank, std::exception_ptr error) noexcept {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (rank >= lowest_failed_.load(std::memory_order_relaxed)) return;
    error_ = std::move(error);
    lowest_failed_.store(rank, std::memory_order_relaxed);
  }

  std::atomic<index_t> lowest_failed_{kNone};
  std::mutex mutex_;
  std::exception_ptr error_;
};

}  // namespace pygpfast
