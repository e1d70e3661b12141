// Engram rows straight from the GGUF (spec 4.4, 4.6; docs/numerics.md 8): the tables are never
// mapped or loaded. The rows a chunk needs are deduplicated, sorted and read with pread into a
// bounded staging buffer, batch by batch, then decoded to BF16 values. Rows held by an
// EngramRowCache are copied from it instead of read, and rows read are added to it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "format/gguf.h"

namespace sluice {

constexpr size_t kEngramStagingBytes = 384 * 1024;  // ds4's bound (spec 4.6)

struct EngramReadStats {
  uint64_t requested = 0;  // row references
  uint64_t unique = 0;     // distinct rows read
  uint64_t reads = 0;      // pread calls (runs of consecutive rows are coalesced)
  uint64_t batches = 0;
  uint64_t hits = 0;       // distinct rows found in the row cache (not read)
  uint64_t bytes = 0;      // bytes read from the file
  EngramReadStats& operator+=(const EngramReadStats& o) {
    requested += o.requested, unique += o.unique, reads += o.reads, batches += o.batches, hits += o.hits,
        bytes += o.bytes;
    return *this;
  }
};

class EngramRowCache;

// rows: n_tok x cols row ids (token-major). out: n_tok x cols x head_dim floats, the decoded row
// of each reference. Throws Error naming the table and row on an out-of-range row, a NaN E4M3
// code or an E8M0 of 255. cache (may be null): rows of its table `cache_table` are taken from it
// and those read are added to it; the values are the same either way.
EngramReadStats engram_gather(const gguf::File& f, const gguf::TensorInfo& table, uint32_t head_dim,
                              std::span<const uint64_t> rows, float* out,
                              size_t staging_bytes = kEngramStagingBytes, EngramRowCache* cache = nullptr,
                              uint32_t cache_table = 0);

}  // namespace sluice
