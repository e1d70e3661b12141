#include "storage/raw_read_bandwidth.h"

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "storage/store_stats.h"
#include "util/error.h"
#include "util/unique_fd.h"

namespace sluice::storage {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Ring {
  io_uring ring{};
  bool live = false;
  ~Ring() { if (live) io_uring_queue_exit(&ring); }
};

}  // namespace

RawReadResult raw_direct_reads(const std::string& file, uint64_t begin, uint64_t end, uint32_t queue_depth,
                               double seconds, uint64_t seed) {
  constexpr uint32_t kBlock = 1u << 20;
  if (queue_depth == 0 || queue_depth > 1024) throw Error("raw reads: queue depth must be in 1..1024");
  UniqueFd f;
  f.fd = ::open(file.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (f.fd < 0) throw Error("raw reads: O_DIRECT open of " + file + " failed: " + std::strerror(errno));
  Ring r;
  if (const int rc = io_uring_queue_init(queue_depth, &r.ring, 0); rc < 0)
    throw Error(std::string("raw reads: io_uring unavailable: ") + std::strerror(-rc));
  r.live = true;
  void* mem = nullptr;
  if (::posix_memalign(&mem, 4096, (size_t)kBlock * queue_depth) != 0) throw Error("raw reads: out of memory");
  const std::unique_ptr<void, decltype(&std::free)> hold(mem, &std::free);
  auto* bufs = static_cast<uint8_t*>(mem);
  const uint64_t first = (begin + 4095) / 4096 * 4096;
  const uint64_t blocks = end > first ? (end - first) / kBlock : 0;
  if (blocks == 0) throw Error("raw reads: the range of " + file + " is smaller than one 1 MiB block");
  std::mt19937_64 rng(seed);
  std::vector<double> started(queue_depth);
  LatencyStats lat;
  auto submit = [&](uint32_t slot) {
    io_uring_sqe* sqe = io_uring_get_sqe(&r.ring);
    const uint64_t off = first + (rng() % blocks) * kBlock;
    io_uring_prep_read(sqe, f.fd, bufs + (size_t)slot * kBlock, kBlock, off);
    io_uring_sqe_set_data64(sqe, slot);
    started[slot] = now_s();
  };
  const double t0 = now_s();
  for (uint32_t s = 0; s < queue_depth; ++s) submit(s);
  io_uring_submit(&r.ring);
  uint64_t done = 0, bytes = 0;
  uint32_t in_flight = queue_depth;
  std::string failure;
  while (in_flight > 0) {
    io_uring_cqe* cqe;
    if (io_uring_wait_cqe(&r.ring, &cqe) < 0) continue;
    const uint32_t slot = (uint32_t)io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(&r.ring, cqe);
    --in_flight;
    // A failed read ends the run, but only after every read in flight has landed: the buffers
    // are freed on return and the kernel must not write into them afterwards.
    if (res < 0) {
      if (failure.empty()) failure = std::strerror(-res);
      continue;
    }
    bytes += (uint64_t)res;
    lat.add((uint64_t)((now_s() - started[slot]) * 1e9));
    ++done;
    if (failure.empty() && now_s() - t0 < seconds) {
      submit(slot);
      io_uring_submit(&r.ring);
      ++in_flight;
    }
  }
  if (!failure.empty()) throw Error("raw reads: a read of " + file + " failed: " + failure);
  const double dt = now_s() - t0;
  RawReadResult out;
  out.bytes = bytes;
  out.gbps = (double)bytes / dt / 1e9;
  out.iops = (double)done / dt;
  out.lat_mean_us = lat.mean_us();
  out.lat_p50_us = lat.quantile_us(0.5);
  out.lat_p99_us = lat.quantile_us(0.99);
  return out;
}

}  // namespace sluice::storage
