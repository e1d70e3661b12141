// A fixed pool of worker threads for data-parallel loops. parallel_for splits [0, n) into
// contiguous ranges, one per thread; callers make each output element depend on one index only,
// so results never depend on the thread count.
//
// A decode token is a few hundred loops of 10-200 us each, back to back. Waking a worker through
// a condition variable costs a futex round trip (tens of us on a VM), so workers and the caller
// first spin on the generation and the pending count for a bounded time (kSpinRounds pauses,
// about 50-100 us) and only then block: between loops nobody sleeps, an idle pool sleeps.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sluice {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads <= 1: everything runs on the caller
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return (int)workers_.size() + 1; }
  // Runs fn(begin, end) over a partition of [0, n) and waits; rethrows the first exception.
  // Ranges smaller than min_per_thread are not split further. Not reentrant.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn,
                    size_t min_per_thread = 1);

 private:
  void worker(int id);
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  // Written by parallel_for before the release of generation_, read by workers after acquiring it.
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t n_ = 0, parts_ = 0;
  std::atomic<uint64_t> generation_{0};  // changed under mu_ (a blocked worker's predicate reads it)
  std::atomic<int> pending_{0};          // workers still running the current job
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;             // under mu_
};

}  // namespace sluice
