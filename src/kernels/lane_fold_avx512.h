// What the one-token kernels (gemm_q8_0_avx512.cpp's, gemv_*_avx512.cpp) share: the 16 rows of a
// tile and a gather of one dword per row, and the horizontal sums across the rows: 8 vectors of
// per-row int32 partial sums in, one vector with each row's total in its own lane out, so the
// float step that follows runs on 16 rows at once (each lane in the scalar's order) instead of
// row by row. Only included by files compiled with the AVX-512 flags; internal linkage (see
// kquant_blocks.h).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace sluice {
namespace {

// z[i] holds 8 partial sums of one row in its low half and 8 of another in its high half; the
// result's lane u is the total of: the low half of z[u] (u < 4), the high half of z[u - 4]
// (u = 4..7), the low half of z[u - 4] (u = 8..11), the high half of z[u - 8] (u = 12..15).
// So rows placed as z[i] = (row i | row 4 + i), z[4 + i] = (row 8 + i | row 12 + i) for i < 4
// come out in lane order. A transpose-and-add tree: 21 operations.
inline __m512i fold_rows16(const __m512i z[8]) {
  __m512i a[4];
  for (int i = 0; i < 4; ++i)
    a[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]), _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]));
  const __m512i c0 = _mm512_add_epi32(_mm512_unpacklo_epi64(a[0], a[1]), _mm512_unpackhi_epi64(a[0], a[1]));
  const __m512i c1 = _mm512_add_epi32(_mm512_unpacklo_epi64(a[2], a[3]), _mm512_unpackhi_epi64(a[2], a[3]));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(c0, c1, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(c0, c1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// A tile's rows [0, rv), `stride` bytes apart from base; row[r] for r >= rv repeats row rv - 1
// (computed, never stored).
struct RowTile16 {
  const uint8_t* base;
  const uint8_t* row[16];
  bool gather;   // a vpgatherdd's int32 offsets reach every row
  __m512i goff;  // row r's offset from base

  RowTile16(const uint8_t* b, size_t stride, int rv) : base(b), gather(16 * stride <= (size_t)INT_MAX) {
    alignas(64) int32_t off[16];
    for (int r = 0; r < 16; ++r) {
      row[r] = b + (size_t)std::min(r, rv - 1) * stride;
      off[r] = gather ? (int32_t)(row[r] - b) : 0;
    }
    goff = _mm512_load_si512(off);
  }
  // Lane r: the 4 bytes at row[r] + at (a block's scale bytes).
  __m512i dwords_at(size_t at) const {
    if (gather) return _mm512_i32gather_epi32(goff, base + at, 1);
    alignas(64) int32_t v[16];
    for (int r = 0; r < 16; ++r) std::memcpy(&v[r], row[r] + at, 4);
    return _mm512_load_si512(v);
  }
};

// Which row goes in the low / high half of z[i] for fold_rows16 to leave row r in lane r.
inline constexpr int kFoldLowRow[8] = {0, 1, 2, 3, 8, 9, 10, 11};
inline constexpr int kFoldHighRow[8] = {4, 5, 6, 7, 12, 13, 14, 15};

}  // namespace
}  // namespace sluice
