#include "backend/thread_pool.h"

#include <algorithm>

namespace sluice {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
inline void part_range(size_t n, size_t parts, size_t i, size_t& b, size_t& e) {
  b = n * i / parts;
  e = n * (i + 1) / parts;
}
}  // namespace

void ThreadPool::worker(int id) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(size_t, size_t)>* job;
    size_t n, parts;
    {
      std::unique_lock<std::mutex> lk(mu_);
      start_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = n_;
      parts = parts_;
    }
    if ((size_t)id < parts) {
      size_t b, e;
      part_range(n, parts, (size_t)id, b, e);
      try {
        if (b < e) (*job)(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
    std::lock_guard<std::mutex> lk(mu_);
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn,
                              size_t min_per_thread) {
  if (n == 0) return;
  const size_t want = std::max<size_t>(1, n / std::max<size_t>(1, min_per_thread));
  const size_t parts = std::min<size_t>((size_t)size(), want);
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    n_ = n;
    parts_ = parts;
    pending_ = (int)workers_.size();
    error_ = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  size_t b, e;
  part_range(n, parts, 0, b, e);
  std::exception_ptr mine;
  try {
    fn(b, e);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return pending_ == 0; });
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

}  // namespace sluice
