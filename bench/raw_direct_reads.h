// The physical baseline the expert-store benchmarks compare against: random aligned 1 MiB
// O_DIRECT reads of a file range through io_uring at a fixed queue depth, for a fixed time.
#pragma once
#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "storage/store_stats.h"
#include "util/error.h"

namespace sluice::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct RawResult {
  double gbps = 0, iops = 0, lat_mean_us = 0, lat_p50_us = 0, lat_p99_us = 0;
  uint64_t bytes = 0;
};

inline RawResult raw_direct_reads(const std::string& file, uint64_t begin, uint64_t end, uint32_t queue_depth,
                                  double seconds, uint64_t seed) {
  constexpr uint32_t kBlock = 1u << 20;
  const int fd = ::open(file.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) throw Error("raw: O_DIRECT open of " + file + " failed: " + std::strerror(errno));
  io_uring ring;
  if (io_uring_queue_init(queue_depth, &ring, 0) < 0) throw Error("raw: io_uring unavailable");
  void* mem = nullptr;
  if (::posix_memalign(&mem, 4096, (size_t)kBlock * queue_depth) != 0) throw Error("raw: out of memory");
  auto* bufs = static_cast<uint8_t*>(mem);
  const uint64_t first = (begin + 4095) / 4096 * 4096, blocks = (end - first) / kBlock;
  if (blocks == 0) throw Error("raw: range smaller than one block");
  std::mt19937_64 rng(seed);
  std::vector<double> started(queue_depth);
  storage::LatencyStats lat;
  auto submit = [&](uint32_t slot) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    const uint64_t off = first + (rng() % blocks) * kBlock;
    io_uring_prep_read(sqe, fd, bufs + (size_t)slot * kBlock, kBlock, off);
    io_uring_sqe_set_data64(sqe, slot);
    started[slot] = now_s();
  };
  const double t0 = now_s();
  for (uint32_t s = 0; s < queue_depth; ++s) submit(s);
  io_uring_submit(&ring);
  uint64_t done = 0, bytes = 0;
  uint32_t in_flight = queue_depth;
  while (in_flight > 0) {
    io_uring_cqe* cqe;
    if (io_uring_wait_cqe(&ring, &cqe) < 0) continue;
    const uint32_t slot = (uint32_t)io_uring_cqe_get_data64(cqe);
    if (cqe->res < 0) throw Error(std::string("raw: read failed: ") + std::strerror(-cqe->res));
    bytes += (uint64_t)cqe->res;
    io_uring_cqe_seen(&ring, cqe);
    lat.add((uint64_t)((now_s() - started[slot]) * 1e9));
    ++done;
    --in_flight;
    if (now_s() - t0 < seconds) {
      submit(slot);
      io_uring_submit(&ring);
      ++in_flight;
    }
  }
  const double dt = now_s() - t0;
  io_uring_queue_exit(&ring);
  std::free(mem);
  ::close(fd);
  RawResult r;
  r.bytes = bytes;
  r.gbps = (double)bytes / dt / 1e9;
  r.iops = (double)done / dt;
  r.lat_mean_us = lat.mean_us();
  r.lat_p50_us = lat.quantile_us(0.5);
  r.lat_p99_us = lat.quantile_us(0.99);
  return r;
}

}  // namespace sluice::bench
