// AVX2 GEMM for IQ2_XXS weights x Q8_K activations (types.h GemmFn). Each 8-row tile is decoded
// once per K-chunk into int16 values already multiplied by their sub-block's 2s+1
// (|43 * 31| = 1,333), transposed so that ymm k of a block holds elements 2k, 2k+1 of all 8 rows
// (dword lane r = row r); every token of the call then reuses it. There is no unsigned operand to
// give maddubs without an offset that would saturate its int16 pairs, so the products are taken
// with madd on the token's codes widened to int16: each madd adds two exact products, and the
// int32 sum over the block, at most 256 * 1,333 * 128 in magnitude, is the scalar reference's
// bsum = sum over the sub-blocks of (2s+1) * sub-dot exactly (integer sums do not depend on their
// order). The float step is step_iq2 lane-wise, blocks in order, and finish_iq2 after the last
// K-chunk, so every (row, token) gets dot_iq2_xxs_scalar's bits. A pair's partial sumf waits in y
// between K-chunks.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/gemm_tile_avx2.h"
#include "kernels/iq_tables.h"
#include "kernels/iquant_types.h"
#include "kernels/prefetch.h"
#include "kernels/types.h"

namespace sluice::iquant {
namespace {

constexpr int kRows = 8;    // rows per tile: one dword lane each
constexpr int kChunk = 4;   // blocks per K-chunk
constexpr int kTokens = 4;  // tokens sharing each loaded weight vector

struct Iq2Tile {
  __m256i w[kChunk][128];  // w[b][k] lane r: row r's elements 2k, 2k+1 of block b as int16, times 2s+1
  __m256 dx[kChunk];       // lane r: row r's scale
};
struct ActChunk {
  alignas(32) int16_t q[kTokens][kChunk][256];
  float d[kTokens][kChunk];
};
static_assert(sizeof(Iq2Tile) + sizeof(ActChunk) + kRows * 256 * 2 + 8192 < sluice::kGemmStackBytes);

// One block's 256 values times their sub-block's 2s+1, as int16 in element order. A group of 8 is
// a grid row (8 magnitude bytes) with the 8 sign bits of ksigns_iq2xs: bit j set negates element j.
inline void decode_block(const uint8_t* x, int16_t* out) {
  const __m128i bit = _mm_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128);
  for (int sb = 0; sb < 8; ++sb) {
    const uint32_t w0 = (uint32_t)gemm_ld32(x + 2 + 8 * sb), w1 = (uint32_t)gemm_ld32(x + 6 + 8 * sb);
    const __m128i m = _mm_set1_epi16((short)(2 * (w1 >> 28) + 1));
    for (int l = 0; l < 4; ++l) {
      const __m128i mag = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)iq2xxs_grid[(w0 >> (8 * l)) & 255]));
      const __m128i neg = _mm_cmpeq_epi16(_mm_and_si128(_mm_set1_epi16(ksigns_iq2xs[(w1 >> (7 * l)) & 127]), bit), bit);
      const __m128i v = _mm_sub_epi16(_mm_xor_si128(mag, neg), neg);  // -mag where the sign bit is set
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 32 * sb + 8 * l), _mm_mullo_epi16(v, m));
    }
  }
}

// Blocks [0, nblk) of rn rows (rows past rn are zero weights) into t.
void pack_tile(const uint8_t* w, size_t w_stride, int rn, int nblk, Iq2Tile& t) {
  alignas(32) int16_t rowv[kRows][256];
  for (int b = 0; b < nblk; ++b) {
    alignas(32) float dx[kRows];
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* x = w + (size_t)r * w_stride + (size_t)b * kIq2xxsBytes;
      if (r < rn) {
        decode_block(x, rowv[r]);
        dx[r] = _cvtsh_ss((unsigned short)(gemm_ld32(x) & 0xffff));
      } else {
        std::memset(rowv[r], 0, sizeof rowv[r]);
        dx[r] = 0.0f;
      }
    }
    for (int c = 0; c < 16; ++c) {  // dwords 8c .. 8c + 7 of every row
      __m256i v[kRows];
      for (int r = 0; r < kRows; ++r) v[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(rowv[r] + 16 * c));
      transpose8(v, &t.w[b][8 * c]);
    }
    t.dx[b] = _mm256_load_ps(dx);
  }
}

// The codes of nt tokens, blocks [0, nblk) from chunk offset a_off, widened to int16, and their scales.
void load_acts(const uint8_t* const* acts, int nt, size_t a_off, int nblk, ActChunk& a) {
  for (int t = 0; t < nt; ++t)
    for (int b = 0; b < nblk; ++b) {
      const uint8_t* p = acts[t] + a_off + (size_t)b * kQ8_KBytes;
      std::memcpy(&a.d[t][b], p, 4);
      for (int k = 0; k < 16; ++k)
        _mm256_store_si256(reinterpret_cast<__m256i*>(a.q[t][b] + 16 * k),
                           _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kQ8_KQs + 16 * k))));
    }
}

template <int T>
void run_tokens(const Iq2Tile& tile, int nblk, const ActChunk& a, float* y, size_t ldy, __m256i mask, bool first,
                bool last) {
  __m256 sumf[T];
  for (int t = 0; t < T; ++t) sumf[t] = first ? _mm256_setzero_ps() : _mm256_maskload_ps(y + (size_t)t * ldy, mask);
  for (int b = 0; b < nblk; ++b) {
    __m256i acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_si256();
    for (int k = 0; k < 128; ++k) {
      const __m256i wv = tile.w[b][k];
      for (int t = 0; t < T; ++t)
        acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(wv, _mm256_set1_epi32(gemm_ld32(a.q[t][b] + 2 * k))));
    }
    for (int t = 0; t < T; ++t)  // step_iq2: sumf + (dx * dy) * (float)bsum
      sumf[t] = _mm256_add_ps(sumf[t], _mm256_mul_ps(_mm256_mul_ps(tile.dx[b], _mm256_set1_ps(a.d[t][b])),
                                                     _mm256_cvtepi32_ps(acc[t])));
  }
  for (int t = 0; t < T; ++t) {
    const __m256 v = last ? _mm256_mul_ps(_mm256_set1_ps(0.125f), sumf[t]) : sumf[t];  // finish_iq2
    _mm256_maskstore_ps(y + (size_t)t * ldy, mask, v);
  }
}

}  // namespace

void gemm_iq2_xxs_avx2(const void* vw, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                       int64_t n, float* y, size_t ldy) {
  const uint8_t* w = static_cast<const uint8_t*>(vw);
  const int64_t nb = n / 256;
  if (nb == 0) {
    for (int64_t t = 0; t < nacts; ++t)
      for (int64_t r = 0; r < nrows; ++r) y[(size_t)t * ldy + (size_t)r] = finish_iq2(0.0f);
    return;
  }
  Iq2Tile tile;
  ActChunk act;
  for (int64_t c0 = 0; c0 < nb; c0 += kChunk) {
    const int nblk = (int)std::min<int64_t>(kChunk, nb - c0);
    const bool first = c0 == 0, last = c0 + nblk == nb;
    const size_t a_off = (size_t)c0 * kQ8_KBytes;
    for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
      const int rn = (int)std::min<int64_t>(kRows, nrows - r0);
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(rn), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      if (r0 + kRows < nrows)
        prefetch_rows(w + (size_t)(r0 + kRows) * w_stride + (size_t)c0 * kIq2xxsBytes, w_stride,
                      (int)std::min<int64_t>(kRows, nrows - r0 - kRows), (size_t)nblk * kIq2xxsBytes);
      pack_tile(w + (size_t)r0 * w_stride + (size_t)c0 * kIq2xxsBytes, w_stride, rn, nblk, tile);
      for (int64_t t = 0; t < nacts; t += kTokens) {
        const int nt = (int)std::min<int64_t>(kTokens, nacts - t);
        load_acts(acts + t, nt, a_off, nblk, act);
        float* yt = y + (size_t)t * ldy + (size_t)r0;
        switch (nt) {
          case 4: run_tokens<4>(tile, nblk, act, yt, ldy, mask, first, last); break;
          case 3: run_tokens<3>(tile, nblk, act, yt, ldy, mask, first, last); break;
          case 2: run_tokens<2>(tile, nblk, act, yt, ldy, mask, first, last); break;
          default: run_tokens<1>(tile, nblk, act, yt, ldy, mask, first, last); break;
        }
      }
    }
  }
}

}  // namespace sluice::iquant
