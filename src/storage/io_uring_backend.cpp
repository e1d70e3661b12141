// io_uring read backend. The submitting threads and the one reaper thread share the ring: SQ
// access is serialised by a mutex; only the reaper touches the CQ, so completions never wait
// for a submitter.
#include <liburing.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include "storage/io_backend.h"

namespace sluice::storage {
namespace {

constexpr uint64_t kStopTag = ~0ull;

class UringBackend final : public IoBackend {
 public:
  UringBackend(uint32_t depth, ReadDone done) : done_(std::move(done)) { (void)depth; }
  int init(uint32_t depth) {
    // One extra entry for the NOP that stops the reaper.
    const int r = io_uring_queue_init(depth + 1, &ring_, 0);
    if (r < 0) return r;
    ready_ = true;
    reaper_ = std::thread([this] { reap(); });
    return 0;
  }
  ~UringBackend() override {
    if (!ready_) return;
    for (;;) {
      std::lock_guard<std::mutex> g(sq_mu_);
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) {
        io_uring_submit(&ring_);
        continue;
      }
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data64(sqe, kStopTag);
      io_uring_submit(&ring_);
      break;
    }
    reaper_.join();
    io_uring_queue_exit(&ring_);
  }
  const char* name() const override { return "io_uring"; }
  int start(const ReadOp& op) override {
    std::lock_guard<std::mutex> g(sq_mu_);
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (!sqe) return -EBUSY;  // the store never exceeds the depth; defensive only
    io_uring_prep_read(sqe, op.fd, op.dst, op.len, op.offset);
    io_uring_sqe_set_data64(sqe, op.tag);
    for (;;) {
      const int r = io_uring_submit(&ring_);
      if (r >= 0) return 0;
      if (r != -EINTR && r != -EAGAIN) return r;
    }
  }

 private:
  void reap() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      const int r = io_uring_wait_cqe(&ring_, &cqe);
      if (r < 0) {
        // EINTR/EAGAIN/ETIME are transient; nothing else is expected on a live ring, and
        // giving up would strand every waiting reader, so keep waiting.
        std::this_thread::yield();
        continue;
      }
      const uint64_t tag = io_uring_cqe_get_data64(cqe);
      const int64_t res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (tag == kStopTag) return;
      done_(tag, res);
    }
  }

  ReadDone done_;
  io_uring ring_{};
  bool ready_ = false;
  std::mutex sq_mu_;
  std::thread reaper_;
};

}  // namespace

std::unique_ptr<IoBackend> make_uring_backend(uint32_t depth, ReadDone done, std::string* why) {
  auto b = std::make_unique<UringBackend>(depth, std::move(done));
  const int r = b->init(depth);
  if (r < 0) {
    if (why) *why = std::string("io_uring unavailable: ") + std::strerror(-r);
    return nullptr;
  }
  return b;
}

}  // namespace sluice::storage
