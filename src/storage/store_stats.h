// Counters of the expert store. Definitions (tests rely on these identities):
//   requests = hits + misses                 (demand lookups, one per expert per acquire)
//   joined <= misses                         (a miss whose load was already in flight, started by
//                                             hint() or by another leaseholder: not read twice)
//   bytes_demand = sum of load bytes of the (misses - joined) loads (plus partial bytes of loads
//                  that failed)
//   bytes_prefetch = sum of load bytes of prefetch_issued loads
// "Load bytes" are the expert's three aligned windows, clipped at end of file.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace sluice::storage {

// Read latency of single I/O requests (submission to completion).
struct LatencyStats {
  static constexpr int kBuckets = 20;  // bucket i: < 2^i microseconds (i < 19); last: the rest
  uint64_t count = 0, sum_ns = 0, max_ns = 0;
  std::array<uint64_t, kBuckets> buckets{};
  void add(uint64_t ns);
  void merge(const LatencyStats& o);
  double mean_us() const { return count ? (double)sum_ns / count / 1000.0 : 0.0; }
  // Upper bound of the bucket holding quantile q (0..1), in microseconds.
  double quantile_us(double q) const;
};

struct LayerStats {
  uint64_t requests = 0, hits = 0, misses = 0, joined = 0;
  uint64_t prefetch_issued = 0, prefetch_used = 0, prefetch_dropped = 0, prefetch_wasted = 0;
  uint64_t evictions = 0;
  uint64_t bytes_demand = 0, bytes_prefetch = 0;
  uint64_t reads = 0;           // I/O requests completed (either kind)
  uint64_t read_errors = 0;     // loads that failed (after the one EIO retry)
  uint64_t retries = 0;         // reads re-issued after EIO, short reads or EINTR
  uint64_t stall_ns = 0;        // time acquire() waited for reads
  LatencyStats latency;
  void merge(const LayerStats& o);
};

// Lookups and hits over every layer: what a peer's answers report (StoreStats::total's two fields).
struct RequestCounts {
  uint64_t requests = 0, hits = 0;
};

struct StoreStats {
  std::string backend;          // "io_uring" or "pread"
  std::string backend_note;     // why io_uring is not used, when it is not
  bool direct_io = true;        // false: buffered reads (O_DIRECT refused or disabled)
  std::string direct_io_note;   // why not
  std::string last_error;
  uint64_t slot_bytes = 0;
  uint32_t slots = 0, slots_used = 0;
  std::vector<LayerStats> layers;
  LayerStats total() const;
  // Multi-line human-readable summary.
  std::string summary() const;
};

}  // namespace sluice::storage
