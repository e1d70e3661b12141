// Software prefetch for the GEMV weight streams. A row of a few KiB crosses a page every row or
// two, where the hardware prefetcher stops and restarts; asking for the bytes kAhead further on
// keeps the stream in flight (measured per kernel: Q8_0's head 0.54 -> 0.70-0.75 of the read
// bandwidth, IQ2_XXS and Q2_K per thread in bench_kernels). Integer arithmetic on the address:
// it may lie past the end of the buffer, which a prefetch never faults on but a pointer could
// not legally point to.
#pragma once
#include <xmmintrin.h>

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

}  // namespace sluice
