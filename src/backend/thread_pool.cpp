#include "backend/thread_pool.h"

#include <algorithm>

namespace sluice {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
inline void part_range(size_t n, size_t parts, size_t i, size_t& b, size_t& e) {
  b = n * i / parts;
  e = n * (i + 1) / parts;
}

// About 50-100 us of pause instructions (a pause is ~40-140 cycles, by microarchitecture).
constexpr int kSpinRounds = 2000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// true as soon as done() holds, false after kSpinRounds rounds without it.
template <class Done>
bool spin_until(Done done) {
  for (int i = 0; i < kSpinRounds; ++i) {
    if (done()) return true;
    cpu_relax();
  }
  return done();
}
}  // namespace

void ThreadPool::worker(int id) {
  uint64_t seen = 0;
  for (;;) {
    const auto started = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(started)) {
      std::unique_lock<std::mutex> lk(mu_);
      start_cv_.wait(lk, started);
    }
    // Stable until this worker counts itself done: the caller waits for that before the next job.
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    const std::function<void(size_t, size_t)>* job = job_;
    const size_t n = n_, parts = parts_;
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
    // The last one out wakes a caller that stopped spinning; taking mu_ orders the notify after
    // the caller's check of its predicate, so the wakeup is not lost.
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lk(mu_);
      done_cv_.notify_one();
    }
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
  job_ = &fn;
  n_ = n;
  parts_ = parts;
  pending_.store((int)workers_.size(), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lk(mu_);
    error_ = nullptr;
    generation_.fetch_add(1, std::memory_order_release);
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
  if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  std::lock_guard<std::mutex> lk(mu_);
  if (error_) std::rethrow_exception(error_);
}

}  // namespace sluice
