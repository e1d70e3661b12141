// Q8_0 x Q8_0 GEMM with AVX-512 VNNI (TypeTraits::gemm_avx512 of Q8_0, GemmFn contract in
// kernels/types.h): each (row, token) gets dot_q8_0_scalar's bits.
//
// A tile of 16 rows x a K-chunk of kChunkBlocks blocks is packed once (on the stack) so that one
// zmm holds the same 4 consecutive weight bytes of all 16 rows (dword lane r = row r), beside the
// 16 row scales as f32 and the rows' correction -128 * sum(w) per block. Each token's activation
// chunk is copied once per tile as y ^ 0x80 (y + 128, unsigned, which dpbusd wants; 64 bytes
// per op over the whole chunk) with its scales as f32 (16 per gather). Then, per block and token, 8 vpdpbusd starting from the correction give the 16
// exact integer block sums sum(w * y) (+128*sum(w) - 128*sum(w); exact for every byte pattern,
// -128 included, and dpbusd does not saturate), and the float step is step_q8_0's, lane-wise:
// sumf + (float)sumi * (dx * dy). Between K-chunks the partial sums wait in y, so every pair
// still sees its blocks in order from +0.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "kernels/gemm_q8_0.h"
#include "kernels/iquant_types.h"
#include "kernels/lane_fold_avx512.h"
#include "kernels/prefetch.h"
#include "kernels/types.h"

namespace sluice::iquant {
namespace {

constexpr int kRows = 16;          // rows per tile: one dword lane each
constexpr int kChunkBlocks = 32;   // K-chunk, in Q8_0 blocks (1024 columns)
constexpr int kTokens = 8;         // tokens sharing each loaded weight vector

struct alignas(64) PackedBlock {
  __m512i w[8];   // w[j] lane r = weight bytes 4j..4j+3 of row r's block (signed)
  __m512i corr;   // lane r = -128 * sum of row r's 32 codes
  __m512 dx;      // lane r = row r's scale
};

// A token group's activation chunk: the blocks' bytes as they are, but xor 0x80 (only the codes
// are read from here), and the block scales as f32.
struct ActChunk {
  alignas(64) uint8_t q[kTokens][kChunkBlocks * kQ8_0Bytes + 64];
  alignas(64) float d[kTokens][kChunkBlocks + 16];
};

static_assert(sizeof(PackedBlock) * kChunkBlocks + sizeof(ActChunk) + 4096 <= sluice::kGemmStackBytes);

inline uint16_t ld16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
inline uint32_t ld32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// Rows [0, rv) of the tile start at base + off[r]; lanes r >= rv repeat row rv - 1 (computed,
// never stored). `goff` holds the same offsets as int32 for the scale gather, or is unused when
// the tile spans more than 2 GiB.
void pack_tile(const uint8_t* base, const size_t off[kRows], __m512i goff, bool gather, int64_t b0, int nb,
               PackedBlock* out) {
  const __m512i lo_idx = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
  const __m512i hi_idx = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  const __m512i c128 = _mm512_set1_epi8((char)0x80);
  for (int b = 0; b < nb; ++b) {
    const size_t bo = (size_t)(b0 + b) * kQ8_0Bytes;
    __m512i z[8];
    for (int i = 0; i < 8; ++i)
      z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(load256(base + off[i] + bo + 2)),
                                load256(base + off[i + 8] + bo + 2), 1);
    // 8x8 dword transpose in each 256-bit half (rows 0-7 low, 8-15 high).
    __m512i t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
    for (int h = 0; h < 2; ++h) {  // rows 0-3 (h = 0) and 4-7 (h = 1) of each half
      u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h + 0], t[4 * h + 2]);  // cols 0 | 4
      u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h + 0], t[4 * h + 2]);  // cols 1 | 5
      u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);  // cols 2 | 6
      u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);  // cols 3 | 7
    }
    PackedBlock& p = out[b];
    __m512i s = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      p.w[c] = _mm512_permutex2var_epi64(u[c], lo_idx, u[4 + c]);
      p.w[c + 4] = _mm512_permutex2var_epi64(u[c], hi_idx, u[4 + c]);
      s = _mm512_dpbusd_epi32(s, c128, p.w[c]);
      s = _mm512_dpbusd_epi32(s, c128, p.w[c + 4]);
    }
    p.corr = _mm512_sub_epi32(_mm512_setzero_si512(), s);
    __m256i h;
    if (gather) {
      const __m512i g = _mm512_i32gather_epi32(_mm512_add_epi32(goff, _mm512_set1_epi32((int)bo)), base, 1);
      h = _mm512_cvtepi32_epi16(g);
    } else {
      alignas(32) uint16_t d[kRows];
      for (int r = 0; r < kRows; ++r) d[r] = ld16(base + off[r] + bo);
      h = _mm256_load_si256(reinterpret_cast<const __m256i*>(d));
    }
    p.dx = _mm512_cvtph_ps(h);
  }
}

void load_acts(const uint8_t* const* acts, int nt, int64_t b0, int nb, ActChunk& a) {
  const __m512i bias = _mm512_set1_epi8((char)0x80);
  const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                        _mm512_set1_epi32(kQ8_0Bytes));
  const int len = nb * kQ8_0Bytes;
  for (int t = 0; t < nt; ++t) {
    const uint8_t* src = acts[t] + (size_t)b0 * kQ8_0Bytes;
    // Masked loads: nothing past the chunk's last block is read.
    for (int o = 0; o < len; o += 64) {
      const __mmask64 m = len - o >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (len - o)) - 1);
      _mm512_store_si512(a.q[t] + o, _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, src + o), bias));
    }
    // Each gather lane reads a block's scale and its first two codes.
    for (int b = 0; b < nb; b += 16) {
      const __mmask16 m = nb - b >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nb - b)) - 1u);
      const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, at, src + (size_t)b * kQ8_0Bytes, 1);
      _mm512_store_ps(a.d[t] + b, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
    }
  }
}

// NT tokens of the group against the packed tile; sumf[t] holds 16 rows' partial sums.
template <int NT>
void tile_tokens(const PackedBlock* pk, int nb, const ActChunk& a, __m512 sumf[]) {
  for (int b = 0; b < nb; ++b) {
    const PackedBlock& p = pk[b];
    __m512i acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = p.corr;
    for (int j = 0; j < 8; ++j) {
      const __m512i w = p.w[j];
      for (int t = 0; t < NT; ++t)
        acc[t] = _mm512_dpbusd_epi32(acc[t], _mm512_set1_epi32((int)ld32(a.q[t] + b * kQ8_0Bytes + 2 + 4 * j)), w);
    }
    for (int t = 0; t < NT; ++t) {
      const __m512 prod = _mm512_mul_ps(p.dx, _mm512_set1_ps(a.d[t][b]));
      sumf[t] = _mm512_add_ps(sumf[t], _mm512_mul_ps(_mm512_cvtepi32_ps(acc[t]), prod));
    }
  }
}

void tile_group(const PackedBlock* pk, int nb, const ActChunk& a, int nt, __m512 sumf[]) {
  switch (nt) {
    case 1: tile_tokens<1>(pk, nb, a, sumf); break;
    case 2: tile_tokens<2>(pk, nb, a, sumf); break;
    case 3: tile_tokens<3>(pk, nb, a, sumf); break;
    case 4: tile_tokens<4>(pk, nb, a, sumf); break;
    case 5: tile_tokens<5>(pk, nb, a, sumf); break;
    case 6: tile_tokens<6>(pk, nb, a, sumf); break;
    case 7: tile_tokens<7>(pk, nb, a, sumf); break;
    default: tile_tokens<8>(pk, nb, a, sumf); break;
  }
}

// One token (a decode step): packing a tile costs more than it saves when each packed block is
// used once, so the rows are read in place. Per block, 8 vpdpbusd each take one block of two rows
// (x ^ 0x80 against the activation's codes in both halves) and leave 8 partial sums per row; a
// transpose-and-add tree folds them into one dword per row (lane r = row r), and 128 * sum(y),
// the same for every row, is taken off once. The float step is step_q8_0's, lane-wise, blocks in
// order from +0: the dot's bits, with 16 rows' chains in flight instead of one. Each block step
// also prefetches its share of the next tile (`next_rows` rows).
void gemv_rows(const uint8_t* base, size_t w_stride, int rv, const uint8_t* y, int64_t nblocks, float* out,
               int next_rows) {
  const __m512i bias = _mm512_set1_epi8((char)0x80);
  const __m512i zero = _mm512_setzero_si512();
  const RowTile16 rows(base, w_stride, rv);
  const uint8_t* lo[8];
  const uint8_t* hi[8];
  for (int i = 0; i < 8; ++i) lo[i] = rows.row[kFoldLowRow[i]] + 2, hi[i] = rows.row[kFoldHighRow[i]] + 2;
  TilePrefetch prefetch(base, (size_t)kRows * w_stride, w_stride, next_rows, w_stride, nblocks);
  __m512 sumf = _mm512_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b) {
    const size_t bo = (size_t)b * kQ8_0Bytes;
    prefetch.step();
    const __m512i yv = _mm512_broadcast_i64x4(load256(y + bo + 2));
    __m512i z[8];
    for (int i = 0; i < 8; ++i) {
      const __m512i xv = _mm512_inserti64x4(_mm512_castsi256_si512(load256(lo[i] + bo)), load256(hi[i] + bo), 1);
      z[i] = _mm512_dpbusd_epi32(zero, _mm512_xor_si512(xv, bias), yv);
    }
    __m512i s = fold_rows16(z);
    // 128 * sum(y): the offset every row's sum carries from x ^ 0x80 = x + 128.
    const __m256i yc = _mm512_castsi512_si256(_mm512_dpbusd_epi32(zero, bias, yv));
    __m128i q = _mm_add_epi32(_mm256_castsi256_si128(yc), _mm256_extracti128_si256(yc, 1));
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0x4e));
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0xb1));
    s = _mm512_sub_epi32(s, _mm512_broadcastd_epi32(q));
    const __m256i h = _mm512_cvtepi32_epi16(rows.dwords_at(bo));  // the rows' scales (low halves)
    const __m512 dy = _mm512_set1_ps(_cvtsh_ss(ld16(y + bo)));
    sumf = _mm512_add_ps(sumf, _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(_mm512_cvtph_ps(h), dy)));
  }
  _mm512_mask_storeu_ps(out, (__mmask16)((1u << rv) - 1u), sumf);
}

}  // namespace

void gemm_q8_0_avx512(const void* vw, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                      int64_t n, float* y, size_t ldy) {
  const uint8_t* w = static_cast<const uint8_t*>(vw);
  const int64_t nblocks = n / kQ8_0Elems;
  PackedBlock pk[kChunkBlocks];
  ActChunk a;
  if (nblocks == 0) {  // the scalar's empty sum: +0
    for (int64_t t = 0; t < nacts; ++t) std::fill_n(y + (size_t)t * ldy, nrows, 0.0f);
    return;
  }
  if (nacts == 1) {
    for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
      const int next = (int)std::clamp<int64_t>(nrows - r0 - kRows, 0, kRows);  // rows of the next tile
      gemv_rows(w + (size_t)r0 * w_stride, w_stride, (int)std::min<int64_t>(kRows, nrows - r0), acts[0], nblocks, y + r0,
                next);
    }
    return;
  }
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    const int rv = (int)std::min<int64_t>(kRows, nrows - r0);
    const __mmask16 mask = (__mmask16)((1u << rv) - 1u);
    const uint8_t* base = w + (size_t)r0 * w_stride;
    size_t off[kRows];
    alignas(64) int32_t goff[kRows];
    const bool gather = (size_t)kRows * w_stride <= (size_t)INT_MAX;
    for (int r = 0; r < kRows; ++r) {
      off[r] = (size_t)std::min(r, rv - 1) * w_stride;
      goff[r] = gather ? (int32_t)off[r] : 0;
    }
    const __m512i gv = _mm512_load_si512(goff);
    for (int64_t b0 = 0; b0 < nblocks; b0 += kChunkBlocks) {
      const int nb = (int)std::min<int64_t>(kChunkBlocks, nblocks - b0);
      pack_tile(base, off, gv, gather, b0, nb, pk);
      for (int64_t t0 = 0; t0 < nacts; t0 += kTokens) {
        const int nt = (int)std::min<int64_t>(kTokens, nacts - t0);
        load_acts(acts + t0, nt, b0, nb, a);
        __m512 sumf[kTokens];
        for (int t = 0; t < nt; ++t)
          sumf[t] = b0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, y + (size_t)(t0 + t) * ldy + r0);
        tile_group(pk, nb, a, nt, sumf);
        for (int t = 0; t < nt; ++t) _mm512_mask_storeu_ps(y + (size_t)(t0 + t) * ldy + r0, mask, sumf[t]);
      }
    }
  }
}

}  // namespace sluice::iquant
