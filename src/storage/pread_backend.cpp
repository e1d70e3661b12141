// pread thread-pool backend: the fallback where io_uring is unavailable, and a second path the
// tests compare against. Each worker issues one pread at a time, so `threads` is the depth.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "storage/io_backend.h"

namespace sluice::storage {
namespace {

class PreadBackend final : public IoBackend {
 public:
  PreadBackend(uint32_t threads, ReadDone done) : done_(std::move(done)) {
    for (uint32_t i = 0; i < std::max(1u, threads); ++i) workers_.emplace_back([this] { work(); });
  }
  ~PreadBackend() override {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  const char* name() const override { return "pread"; }
  int start(const ReadOp& op) override {
    {
      std::lock_guard<std::mutex> g(mu_);
      queue_.push_back(op);
    }
    cv_.notify_one();
    return 0;
  }

 private:
  void work() {
    for (;;) {
      ReadOp op;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and nothing left
        op = queue_.front();
        queue_.pop_front();
      }
      ssize_t r;
      do {
        r = ::pread(op.fd, op.dst, op.len, (off_t)op.offset);
      } while (r < 0 && errno == EINTR);
      done_(op.tag, r < 0 ? -(int64_t)errno : (int64_t)r);
    }
  }

  ReadDone done_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ReadOp> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoBackend> make_pread_backend(uint32_t threads, ReadDone done) {
  return std::make_unique<PreadBackend>(threads, std::move(done));
}

}  // namespace sluice::storage
