// A fixed pool of worker threads for data-parallel loops. parallel_for splits [0, n) into
// contiguous ranges, one per thread; callers make each output element depend on one index only,
// so results never depend on the thread count.
#pragma once
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
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t n_ = 0, parts_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace sluice
