// The thread pool's contract: every index of [0, n) runs exactly once per parallel_for, on back-to-back
// calls (the workers spinning) and on calls after an idle pause (the workers blocked), the first
// exception comes back to the caller and the pool stays usable, and a pool is destroyed cleanly
// whether its workers spin or sleep.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backend/thread_pool.h"

namespace sluice {
namespace {

// Runs parallel_for over n and checks each index was visited exactly once.
void expect_each_once(ThreadPool& pool, size_t n, size_t min_per_thread = 1) {
  std::vector<std::atomic<int>> hits(n);
  pool.parallel_for(n, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
  }, min_per_thread);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i << " of " << n;
}

TEST(ThreadPool, BackToBackCallsCoverEveryIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads < 1 ? 1 : threads);
    for (int k = 0; k < 3000; ++k) expect_each_once(pool, (size_t)(1 + k % 37));
    expect_each_once(pool, 100000, 1000);
  }
}

TEST(ThreadPool, CallsAfterTheWorkersSleptComplete) {
  ThreadPool pool(3);
  for (int k = 0; k < 20; ++k) {
    // Longer than the spin: the workers are blocked on the condition variable when the call comes.
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    expect_each_once(pool, 17);
  }
}

TEST(ThreadPool, ExceptionsReachTheCallerAndThePoolStaysUsable) {
  ThreadPool pool(3);
  for (int k = 0; k < 200; ++k) {
    const size_t bad = (size_t)(k % 30);  // in the caller's range or a worker's
    EXPECT_THROW(pool.parallel_for(30, [&](size_t b, size_t e) {
      if (bad >= b && bad < e) throw std::runtime_error("range with " + std::to_string(bad));
    }), std::runtime_error);
    expect_each_once(pool, 30);
  }
}

TEST(ThreadPool, DestroyedWhileSpinningOrSleeping) {
  for (int k = 0; k < 50; ++k) {
    ThreadPool pool(4);
    expect_each_once(pool, 64);
    if (k % 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ThreadPool never_used(4);
}

}  // namespace
}  // namespace sluice
