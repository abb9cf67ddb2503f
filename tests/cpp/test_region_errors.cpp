// Failures inside OpenMP regions (region_errors.hpp): an exception thrown by a work item arrives
// after the region as one C++ exception, the one a run in serial order would have thrown,
// instead of std::terminate.
#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.hpp"
#include "pygpfast/region_errors.hpp"
#include "pygpfast/threads.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace pygpfast;

namespace {

// The message of the std::runtime_error that fn throws, or "" if it throws none.
template <class Fn>
std::string error_of(const Fn& fn) {
  try {
    fn();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

PYGPFAST_TEST(ranks_decide_which_failure_is_kept_and_what_is_skipped) {
  RegionErrors errors;
  std::vector<int> ran;
  errors.run(5, [&] { throw std::runtime_error("rank 5"); });
  errors.run(3, [&] { throw std::runtime_error("rank 3"); });
  errors.run(2, [&] { ran.push_back(2); });  // below the failures: runs
  errors.run(3, [&] { ran.push_back(3); });  // a later step of failed rank 3: skipped
  errors.run(4, [&] { ran.push_back(4); });  // above: skipped
  CHECK(ran == std::vector<int>{2});
  CHECK(error_of([&] { errors.rethrow(); }) == "rank 3");
  const RegionErrors none;
  CHECK(error_of([&] { none.rethrow(); }).empty());
}

PYGPFAST_TEST(a_failing_parallel_loop_throws_its_lowest_failure_on_any_thread_count) {
  constexpr index_t n = 4000;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<int> thread_of(n, -1);
    parallel_for(n, 1, [&](index_t i) {
#ifdef _OPENMP
      thread_of[i] = omp_get_thread_num();
#endif
    });
    if (threads == 2 && openmp_enabled()) CHECK(thread_of[n - 1] == 1);  // (really on two threads)
    // Items 1000, 2500 and 3999 fail: with two threads each half holds a failure, and the second
    // half's (2500, which ends that thread's range) may be thrown first, or that half skipped
    // when the first thread fails before the second starts.
    std::vector<int> done(n, 0);
    const std::string message = error_of([&] {
      parallel_for(n, 1, [&](index_t i) {
        if (i == 1000 || i == 2500 || i == n - 1) throw std::runtime_error("item " + std::to_string(i));
        done[i] = 1;
      });
    });
    CHECK(message == "item 1000");
    for (index_t i = 0; i < 1000; ++i) CHECK(done[i] == 1);  // everything before the failure ran
  }
  set_num_threads(0);
}

PYGPFAST_TEST(a_bad_alloc_inside_a_loop_arrives_as_bad_alloc) {
  set_num_threads(2);
  bool caught = false;
  try {
    parallel_for(64, 1, [&](index_t i) {
      if (i == 40) throw std::bad_alloc();
    });
  } catch (const std::bad_alloc&) {
    caught = true;
  }
  CHECK(caught);
  set_num_threads(0);
}

PYGPFAST_TEST_MAIN
