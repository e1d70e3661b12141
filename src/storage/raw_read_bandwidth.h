// The physical baseline expert streaming is compared against: random aligned 1 MiB O_DIRECT
// reads of a file range through io_uring at a fixed queue depth, for a fixed time (what the
// disk gives a reader that keeps it busy, with no cache, no store and no compute in the way).
#pragma once
#include <cstdint>
#include <string>

namespace sluice::storage {

struct RawReadResult {
  double gbps = 0, iops = 0, lat_mean_us = 0, lat_p50_us = 0, lat_p99_us = 0;
  uint64_t bytes = 0;
};

// Reads [begin, end) of `file` (at least 1 MiB after aligning begin to 4 KiB) at random 1 MiB
// offsets for `seconds`; queue_depth 1..1024 buffers of 1 MiB (allocated here, freed on return).
// Throws Error naming the cause (O_DIRECT refused, io_uring unavailable, a failed read).
RawReadResult raw_direct_reads(const std::string& file, uint64_t begin, uint64_t end, uint32_t queue_depth,
                               double seconds, uint64_t seed);

}  // namespace sluice::storage
