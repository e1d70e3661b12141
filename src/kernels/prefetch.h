// Software prefetch for the GEMV weight streams. A row of a few KiB crosses a page every row or
// two, where the hardware prefetcher stops and restarts; asking for the bytes kAhead further on
// keeps the stream in flight (measured per kernel: Q8_0's head 0.54 -> 0.70-0.75 of the read
// bandwidth, IQ2_XXS and Q2_K per thread in bench_kernels). Integer arithmetic on the address:
// it may lie past the end of the buffer, which a prefetch never faults on but a pointer could
// not legally point to.
#pragma once
#include <xmmintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace sluice {

inline constexpr uintptr_t kPrefetchAhead = 2048;

// The cache lines of `bytes` bytes at p + kPrefetchAhead.
inline void prefetch_ahead(const void* p, unsigned bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) + kPrefetchAhead;
  for (uintptr_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(a + o), _MM_HINT_T0);
}

// The GEMM packers' variant: `bytes` from each of `rows` rows `stride` apart (the next tile's
// K-chunk). 16 streams a row apart are too many, too far apart for the hardware prefetcher, and
// at a few tokens per call the packing otherwise waits on memory.
inline void prefetch_rows(const void* base, size_t stride, int rows, size_t bytes) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(base);
  for (int r = 0; r < rows; ++r)
    for (size_t o = 0; o < bytes + 63; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(b + (size_t)r * stride + o), _MM_HINT_T0);
}

// The one-token kernels' variant: they read a tile of 16 rows in lock step, 16 short streams the
// hardware prefetcher picks up late (a 1,280-column Q8_0 matrix ran at half the read bandwidth),
// so each step of the current tile asks for its share of the next tile's bytes, into L2: `bytes`
// from each of `rows` rows `stride` apart, spread evenly over `steps` calls of step().
class TilePrefetch {
 public:
  // The next tile starts `offset` bytes after `tile` (it may lie past the buffer's end when rows
  // is 0, so the address is integer arithmetic).
  TilePrefetch(const void* tile, size_t offset, size_t stride, int rows, size_t bytes, int64_t steps)
      : row_(reinterpret_cast<uintptr_t>(tile) + offset), stride_(stride), row_lines_((bytes + 63) / 64),
        rows_left_(row_lines_ ? rows : 0),
        per_step_(steps > 0 ? ((size_t)rows * row_lines_ + (size_t)steps - 1) / (size_t)steps : 0) {}
  void step() {
    for (size_t k = 0; k < per_step_ && rows_left_ > 0; ++k) {
      _mm_prefetch(reinterpret_cast<const char*>(row_ + 64 * line_), _MM_HINT_T1);
      if (++line_ == row_lines_) line_ = 0, row_ += stride_, --rows_left_;
    }
  }

 private:
  uintptr_t row_;  // the row being prefetched
  size_t stride_, row_lines_;
  int rows_left_;
  size_t per_step_, line_ = 0;
};

}  // namespace sluice
