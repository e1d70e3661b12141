// Helpers shared by the AVX2 GEMM kernels (gemm_*_avx2.cpp): the 8x8 dword transpose that turns
// 8 rows' decoded data into the packed tile layout (ymm q holds dword q of every row, row r in
// dword lane r), and the unaligned 4-byte load a broadcast operand comes from. Only included by files compiled with the AVX2 flags; internal linkage so no
// ISA-flagged copy can be shared with other files (see kquant_blocks.h).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace sluice {
namespace {

// r[i] is row i; out[j] lane i = r[i] dword j.
inline void transpose8(const __m256i r[8], __m256i* out) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);  // cols 0 | 4
    u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);  // cols 1 | 5
    u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);  // cols 2 | 6
    u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);  // cols 3 | 7
  }
  for (int c = 0; c < 4; ++c) {
    out[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
    out[c + 4] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
  }
}

// 4 bytes at p (any alignment) as the int32 _mm256_set1_epi32 broadcasts.
inline int32_t gemm_ld32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace
}  // namespace sluice
