// Helpers shared by the AVX-512 GEMM kernels (gemm_*_avx512.cpp): the packed tile layout and its
// 16x16 dword transpose. Only included by files compiled with the AVX-512 flags; internal
// linkage so no ISA-flagged copy can be shared with other files (see kquant_blocks.h).
//
// Packed layout (one K-chunk of a 16-row tile): zmm q of a block holds bytes 4q..4q+3 of every
// row, row r in dword lane r. Broadcasting 4 activation bytes and one vpdpbusd then gives the 4
// products of all 16 rows at once, their sums landing in the lane of their row.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace sluice {
namespace {

constexpr int kGemmTileRows = 16;

// v[r] holds 16 dwords of row r; afterwards v[q] holds dword q of every row (lane r = row r).
inline void transpose16x16_epi32(__m512i v[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  // v[4i + c], 128-bit lane L: dword 4L + c of rows 4i..4i+3.
  for (int i = 0; i < 4; ++i) {
    v[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    v[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    v[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    v[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i a = _mm512_shuffle_i32x4(v[c], v[4 + c], 0x88);
    const __m512i b = _mm512_shuffle_i32x4(v[c], v[4 + c], 0xdd);
    const __m512i e = _mm512_shuffle_i32x4(v[8 + c], v[12 + c], 0x88);
    const __m512i f = _mm512_shuffle_i32x4(v[8 + c], v[12 + c], 0xdd);
    t[c] = _mm512_shuffle_i32x4(a, e, 0x88);
    t[8 + c] = _mm512_shuffle_i32x4(a, e, 0xdd);
    t[4 + c] = _mm512_shuffle_i32x4(b, f, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(b, f, 0xdd);
  }
  for (int i = 0; i < 16; ++i) v[i] = t[i];
}

inline int32_t gemm_ld32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace
}  // namespace sluice
