// The scratch-memory cache (workspace.hpp): reuse, alignment, its bounds, and use from
// several threads.
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "check.hpp"
#include "pygpfast/workspace.hpp"

#if defined(__unix__)
#include <sys/wait.h>
#include <unistd.h>
#endif

using namespace pygpfast;

PYGPFAST_TEST(released_arrays_are_reused_for_the_same_size) {
  workspace::trim();
  CHECK(workspace::cached_bytes() == 0);
  const std::size_t bytes = std::size_t{256} * 256 * sizeof(double);
  void* p = workspace::acquire(bytes);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
  static_cast<double*>(p)[bytes / sizeof(double) - 1] = 1.0;  // the whole array is usable
  workspace::release(p, bytes);
  CHECK(workspace::cached_bytes() == bytes);
  void* other_size = workspace::acquire(bytes + 4096);  // not served from the cache
  CHECK(other_size != p);
  CHECK(workspace::cached_bytes() == bytes);
  void* q = workspace::acquire(bytes);
  CHECK(q == p);
  CHECK(workspace::cached_bytes() == 0);
  workspace::release(q, bytes);
  workspace::release(other_size, bytes + 4096);
  workspace::trim();
  CHECK(workspace::cached_bytes() == 0);
}

PYGPFAST_TEST(small_and_huge_arrays_are_not_cached) {
  workspace::trim();
  for (std::size_t bytes : {std::size_t{0}, std::size_t{8}, workspace::kSmallestCached - 64,
                            workspace::kLargestCached + 64}) {
    void* p = workspace::acquire(bytes);
    CHECK(p != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
    workspace::release(p, bytes);
    CHECK(workspace::cached_bytes() == 0);
  }
  workspace::release(nullptr, 1 << 20);  // (no-op)
  CHECK(workspace::cached_bytes() == 0);
}

PYGPFAST_TEST(the_cache_stays_within_its_bound_oldest_evicted_first) {
  workspace::trim();
  const std::size_t bytes = workspace::kLargestCached;
  const std::size_t fit = workspace::kCachedBytes / bytes;
  std::vector<void*> arrays;
  for (std::size_t i = 0; i < fit + 2; ++i) arrays.push_back(workspace::acquire(bytes));
  for (void* p : arrays) workspace::release(p, bytes);
  CHECK(workspace::cached_bytes() == fit * bytes);
  // The two released first were evicted: the newest is handed out first.
  void* p = workspace::acquire(bytes);
  CHECK(p == arrays.back());
  workspace::release(p, bytes);
  workspace::trim();
  CHECK(workspace::cached_bytes() == 0);
}

PYGPFAST_TEST(buffers_and_scratch_from_several_threads) {
  workspace::trim();
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t, &ok] {
      bool good = true;
      for (int rep = 0; rep < 200; ++rep) {
        workspace::Buffer b(static_cast<std::size_t>(4096 + 512 * (rep % 3)), 0.0);
        for (double v : b) good = good && v == 0.0;  // zero-initialised, also when reused
        for (double& v : b) v = t + 1.0;
        workspace::Scratch s(8192);
        s.data()[8191] = 2.0;
        workspace::Scratch moved(std::move(s));
        good = good && s.data() == nullptr && moved.data()[8191] == 2.0;
      }
      ok[static_cast<std::size_t>(t)] = good ? 1 : 0;
    });
  for (auto& th : threads) th.join();
  for (int v : ok) CHECK(v == 1);
  CHECK(workspace::cached_bytes() <= workspace::kCachedBytes);
  workspace::trim();
}


#if defined(__unix__)
// A child forked while another thread is inside the cache can still use it: without the fork
// handlers some children would find the mutex locked forever (each child gives up after 5 s).
PYGPFAST_TEST(cache_usable_in_a_child_forked_while_another_thread_uses_it) {
  workspace::trim();
  const std::size_t bytes = std::size_t{32} << 10;
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop.load()) workspace::release(workspace::acquire(bytes), bytes);
  });
  int stuck = 0, failed = 0;
  for (int i = 0; i < 200; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(5);
      workspace::release(workspace::acquire(bytes), bytes);
      workspace::trim();
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) ++stuck;
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  stop = true;
  busy.join();
  CHECK(stuck == 0);
  CHECK(failed == 0);
  workspace::trim();
}
#endif

PYGPFAST_TEST_MAIN
