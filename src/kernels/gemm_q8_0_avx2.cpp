// Q8_0 x Q8_0 GEMM with AVX2 (TypeTraits::gemm_avx2 of Q8_0, GemmFn contract in kernels/types.h):
// each (row, token) gets dot_q8_0_scalar's bits.
//
// There is no VNNI here, and maddubs saturates int16 for some byte pairs (255 * 128 * 2), so the
// products are taken in int16 with madd (exact for every byte pattern, -128 included): a tile of
// 8 rows x a K-chunk is packed once, widened to int16, so that one ymm holds the same 2 elements
// of all 8 rows (dword lane r = row r), beside the row scales as f32. Each token's activation
// chunk is widened once per tile. Per block and token, 16 madds give the 8 exact integer block
// sums, then step_q8_0's float ops run lane-wise: sumf + (float)sumi * (dx * dy). Between
// K-chunks the partial sums wait in y, so every pair still sees its blocks in order from +0.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/gemm_q8_0.h"
#include "kernels/gemm_tile_avx2.h"
#include "kernels/iquant_types.h"
#include "kernels/types.h"

namespace sluice::iquant {
namespace {

constexpr int kRows = 8;          // rows per tile: one dword lane each
constexpr int kChunkBlocks = 32;  // K-chunk, in Q8_0 blocks (1024 columns)
constexpr int kTokens = 4;        // tokens sharing each loaded weight vector

struct alignas(32) PackedBlock {
  __m256i w[16];  // w[k] lane r = row r's elements 2k, 2k+1 as int16
  __m256 dx;      // lane r = row r's scale
};

struct ActChunk {
  alignas(32) int16_t q[kTokens][kChunkBlocks][32];
  float d[kTokens][kChunkBlocks];
};

static_assert(sizeof(PackedBlock) * kChunkBlocks + sizeof(ActChunk) + 4096 <= sluice::kGemmStackBytes);

inline uint16_t ld16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// Rows of the tile start at base + off[r] (lanes past the last row repeat it: computed, never stored).
void pack_tile(const uint8_t* base, const size_t off[kRows], int64_t b0, int nb, PackedBlock* out) {
  for (int b = 0; b < nb; ++b) {
    const size_t bo = (size_t)(b0 + b) * kQ8_0Bytes;
    __m256i lo[8], hi[8];
    alignas(16) uint16_t d[kRows];
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* p = base + off[r] + bo;
      lo[r] = _mm256_cvtepi8_epi16(load128(p + 2));
      hi[r] = _mm256_cvtepi8_epi16(load128(p + 18));
      d[r] = ld16(p);
    }
    transpose8(lo, out[b].w);
    transpose8(hi, out[b].w + 8);
    out[b].dx = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d)));
  }
}

void load_acts(const uint8_t* const* acts, int nt, int64_t b0, int nb, ActChunk& a) {
  for (int t = 0; t < nt; ++t)
    for (int b = 0; b < nb; ++b) {
      const uint8_t* p = acts[t] + (size_t)(b0 + b) * kQ8_0Bytes;
      _mm256_store_si256(reinterpret_cast<__m256i*>(a.q[t][b]), _mm256_cvtepi8_epi16(load128(p + 2)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(a.q[t][b] + 16), _mm256_cvtepi8_epi16(load128(p + 18)));
      a.d[t][b] = _cvtsh_ss(ld16(p));
    }
}

template <int NT>
void tile_tokens(const PackedBlock* pk, int nb, const ActChunk& a, __m256 sumf[]) {
  for (int b = 0; b < nb; ++b) {
    const PackedBlock& p = pk[b];
    __m256i acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_si256();
    for (int k = 0; k < 16; ++k) {
      const __m256i w = p.w[k];
      for (int t = 0; t < NT; ++t)
        acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(w, _mm256_set1_epi32(gemm_ld32(a.q[t][b] + 2 * k))));
    }
    for (int t = 0; t < NT; ++t) {
      const __m256 prod = _mm256_mul_ps(p.dx, _mm256_set1_ps(a.d[t][b]));
      sumf[t] = _mm256_add_ps(sumf[t], _mm256_mul_ps(_mm256_cvtepi32_ps(acc[t]), prod));
    }
  }
}

void tile_group(const PackedBlock* pk, int nb, const ActChunk& a, int nt, __m256 sumf[]) {
  switch (nt) {
    case 1: tile_tokens<1>(pk, nb, a, sumf); break;
    case 2: tile_tokens<2>(pk, nb, a, sumf); break;
    case 3: tile_tokens<3>(pk, nb, a, sumf); break;
    default: tile_tokens<4>(pk, nb, a, sumf); break;
  }
}

}  // namespace

void gemm_q8_0_avx2(const void* vw, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                    int64_t n, float* y, size_t ldy) {
  const uint8_t* w = static_cast<const uint8_t*>(vw);
  const int64_t nblocks = n / kQ8_0Elems;
  if (nblocks == 0) {  // the scalar's empty sum: +0
    for (int64_t t = 0; t < nacts; ++t) std::fill_n(y + (size_t)t * ldy, nrows, 0.0f);
    return;
  }
  PackedBlock pk[kChunkBlocks];
  ActChunk a;
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    const int rv = (int)std::min<int64_t>(kRows, nrows - r0);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(rv), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const uint8_t* base = w + (size_t)r0 * w_stride;
    size_t off[kRows];
    for (int r = 0; r < kRows; ++r) off[r] = (size_t)std::min(r, rv - 1) * w_stride;
    for (int64_t b0 = 0; b0 < nblocks; b0 += kChunkBlocks) {
      const int nb = (int)std::min<int64_t>(kChunkBlocks, nblocks - b0);
      pack_tile(base, off, b0, nb, pk);
      for (int64_t t0 = 0; t0 < nacts; t0 += kTokens) {
        const int nt = (int)std::min<int64_t>(kTokens, nacts - t0);
        load_acts(acts + t0, nt, b0, nb, a);
        __m256 sumf[kTokens];
        for (int t = 0; t < nt; ++t)
          sumf[t] = b0 == 0 ? _mm256_setzero_ps() : _mm256_maskload_ps(y + (size_t)(t0 + t) * ldy + r0, mask);
        tile_group(pk, nb, a, nt, sumf);
        for (int t = 0; t < nt; ++t) _mm256_maskstore_ps(y + (size_t)(t0 + t) * ldy + r0, mask, sumf[t]);
      }
    }
  }
}

}  // namespace sluice::iquant
