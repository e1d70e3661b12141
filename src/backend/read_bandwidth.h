// The CPU's memory read bandwidth, measured: the physical limit a decode token (which reads
// every resident weight once) is held against by `sluice bench`. Threads sum disjoint parts of
// one buffer much larger than the last-level cache, the way the GEMV kernels stream weights.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/thread_pool.h"

namespace sluice {

struct ReadBandwidth {
  double median_gbps = 0, min_gbps = 0, max_gbps = 0;
  uint64_t bytes = 0;  // per pass
  int passes = 0;
};

// `bytes` is allocated here (and counted by the caller's budget) and freed on return; one
// untimed pass first (page faults, frequency), then `passes` timed ones.
ReadBandwidth measure_read_bandwidth(ThreadPool& pool, uint64_t bytes, int passes);

}  // namespace sluice
