// AVX-512 VNNI GEMM for Q2_K weights x Q8_K activations (types.h GemmFn). Each 16-row tile is
// decoded once per K-chunk in the layout of gemm_tile_avx512.h, every element already
// multiplied by its sub-block scale: q * (sc & 15) <= 3 * 15 fits an unsigned byte, so one
// vpdpbusd chain per (row, token) gives the reference's isum = sum_k (sc_k & 15) * dot16_k exactly,
// with no per-sub-block multiply. summs = sum_k (sc_k >> 4) * bsum_k uses the activation's stored
// bsums, as the scalar does, paired as int16 for vpdpwssd. The float tail is q2k_tail on 16 rows
// at once, blocks in order, so every pair gets dot_q2_k_scalar's bits. K-chunks keep the stack
// bounded: a pair's partial sumf waits in y between chunks.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cstring>

#include "kernels/gemm_tile_avx512.h"
#include "kernels/f16c_load.h"
#include "kernels/kquant_blocks.h"
#include "kernels/prefetch.h"
#include "kernels/types.h"

namespace sluice::kquant {
namespace {

constexpr int kChunk = 8;  // blocks per K-chunk

struct Q2kTile {
  __m512i w[kChunk][64];                    // q * (sc & 15), packed (gemm_tile_avx512.h)
  alignas(64) int32_t mins[kChunk][8][16];  // (sc_2j >> 4) | (sc_2j+1 >> 4) << 16 per row
  alignas(64) float xd[kChunk][16];
  alignas(64) float xdmin[kChunk][16];
};
static_assert(sizeof(Q2kTile) + 16 * 64 * 2 < kGemmStackBytes - 4096);

// Elements 64m..64m+63 of one row's block, each times its sub-block scale. lut holds, per
// sub-block k, the dword (0, s, 2s, 3s) with s = sc_k & 15.
inline __m512i decode_quarter(const uint8_t* x, __m512i lut, int m) {
  const int h = m / 2, shift = 4 * (m % 2);  // low half: j = 2(m%2), high half: j + 1
  const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(x + q2k::kQs + 32 * h)));
  const __m512i counts = _mm512_inserti64x4(_mm512_set1_epi16((short)shift), _mm256_set1_epi16((short)(shift + 2)), 1);
  const __m512i q = _mm512_and_si512(_mm512_srlv_epi16(v, counts), _mm512_set1_epi8(3));
  // 128-bit lane i covers sub-block 4m + i: give every lane its table, then look q up in it.
  const __m512i idx = _mm512_add_epi32(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                       _mm512_set1_epi32(4 * m));
  return _mm512_shuffle_epi8(_mm512_permutexvar_epi32(idx, lut), q);
}

void pack_tile(const uint8_t* w, size_t w_stride, int rn, int nblk, Q2kTile& t) {
  for (int b = 0; b < nblk; ++b) {
    __m512i lut[16];
    for (int r = 0; r < 16; ++r) {
      if (r < rn) {
        const uint8_t* x = w + (size_t)r * w_stride + (size_t)b * q2k::kBytes;
        const __m128i scb = _mm_loadu_si128((const __m128i*)(x + q2k::kScales));
        const __m512i s = _mm512_cvtepu8_epi32(_mm_and_si128(scb, _mm_set1_epi8(15)));
        lut[r] = _mm512_mullo_epi32(s, _mm512_set1_epi32(0x03020100));  // no carries: 3 * 15 < 256
        alignas(32) int32_t mp[8];
        _mm256_store_si256((__m256i*)mp, _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(scb, 4), _mm_set1_epi8(15))));
        for (int j = 0; j < 8; ++j) t.mins[b][j][r] = mp[j];
        t.xd[b][r] = f16c_at(x + q2k::kD);
        t.xdmin[b][r] = f16c_at(x + q2k::kDmin);
      } else {
        lut[r] = _mm512_setzero_si512();
        for (int j = 0; j < 8; ++j) t.mins[b][j][r] = 0;
        t.xd[b][r] = t.xdmin[b][r] = 0.0f;
      }
    }
    for (int m = 0; m < 4; ++m) {
      __m512i v[16];
      for (int r = 0; r < 16; ++r)
        v[r] = r < rn ? decode_quarter(w + (size_t)r * w_stride + (size_t)b * q2k::kBytes, lut[r], m)
                      : _mm512_setzero_si512();
      transpose16x16_epi32(v);
      for (int q = 0; q < 16; ++q) t.w[b][16 * m + q] = v[q];
    }
  }
}

template <int T, int C>
inline void tile_tokens(const Q2kTile& tile, int nblk, const uint8_t* const* a, __m512 sumf[T]) {
  for (int b = 0; b < nblk; ++b) {
    const size_t boff = (size_t)b * q8k::kBytes;
    __m512i acc[T][C], sm[T];
    for (int t = 0; t < T; ++t) {
      sm[t] = _mm512_setzero_si512();
      for (int c = 0; c < C; ++c) acc[t][c] = _mm512_setzero_si512();
    }
    for (int k = 0; k < 64; k += C)
      for (int c = 0; c < C; ++c) {
        const __m512i wv = tile.w[b][k + c];
        for (int t = 0; t < T; ++t)
          acc[t][c] = _mm512_dpbusd_epi32(acc[t][c], wv,
                                          _mm512_set1_epi32(gemm_ld32(a[t] + boff + q8k::kQs + 4 * (k + c))));
      }
    for (int j = 0; j < 8; ++j) {
      const __m512i mv = _mm512_load_si512(tile.mins[b][j]);
      for (int t = 0; t < T; ++t)
        sm[t] = _mm512_dpwssd_epi32(sm[t], mv, _mm512_set1_epi32(gemm_ld32(a[t] + boff + q8k::kBsums + 4 * j)));
    }
    const __m512 xd = _mm512_load_ps(tile.xd[b]), xdmin = _mm512_load_ps(tile.xdmin[b]);
    for (int t = 0; t < T; ++t) {
      __m512i isum = acc[t][0];
      for (int c = 1; c < C; ++c) isum = _mm512_add_epi32(isum, acc[t][c]);
      const __m512 yd = _mm512_set1_ps(load_f32_at(a[t] + boff + q8k::kD));
      // q2k_tail: dall = yd*xd, dmin = yd*xdmin, sumf + (dall*isum - dmin*summs)
      const __m512 dall = _mm512_mul_ps(yd, xd), dmin = _mm512_mul_ps(yd, xdmin);
      sumf[t] = _mm512_add_ps(sumf[t], _mm512_sub_ps(_mm512_mul_ps(dall, _mm512_cvtepi32_ps(isum)),
                                                     _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(sm[t]))));
    }
  }
}

template <int T, int C>
void run_tokens(const Q2kTile& tile, int nblk, const uint8_t* const* acts, size_t a_off, float* y, size_t ldy,
                __mmask16 mask, bool first) {
  const uint8_t* a[T];
  __m512 sumf[T];
  for (int t = 0; t < T; ++t) {
    a[t] = acts[t] + a_off;
    sumf[t] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, y + (size_t)t * ldy);
  }
  tile_tokens<T, C>(tile, nblk, a, sumf);
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + (size_t)t * ldy, mask, sumf[t]);
}

}  // namespace

void gemm_q2_k_avx512(const void* vw, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                      int64_t n, float* y, size_t ldy) {
  const uint8_t* w = static_cast<const uint8_t*>(vw);
  const int64_t nb = n / kQK;
  if (nb == 0) {
    for (int64_t t = 0; t < nacts; ++t)
      for (int64_t r = 0; r < nrows; ++r) y[(size_t)t * ldy + (size_t)r] = 0.0f;
    return;
  }
  if (nacts == 1) {  // a decode step: nothing to reuse a decoded tile for
    gemv_q2_k_avx512(w, w_stride, nrows, acts[0], n, y);
    return;
  }
  Q2kTile tile;
  for (int64_t c0 = 0; c0 < nb; c0 += kChunk) {
    const int nblk = (int)std::min<int64_t>(kChunk, nb - c0);
    const bool first = c0 == 0;
    const size_t a_off = (size_t)c0 * q8k::kBytes;
    for (int64_t r0 = 0; r0 < nrows; r0 += kGemmTileRows) {
      const int rn = (int)std::min<int64_t>(kGemmTileRows, nrows - r0);
      const __mmask16 mask = (__mmask16)((1u << rn) - 1);
      if (r0 + kGemmTileRows < nrows)
        prefetch_rows(w + (size_t)(r0 + kGemmTileRows) * w_stride + (size_t)c0 * q2k::kBytes, w_stride,
                      (int)std::min<int64_t>(kGemmTileRows, nrows - r0 - kGemmTileRows), (size_t)nblk * q2k::kBytes);
      pack_tile(w + (size_t)r0 * w_stride + (size_t)c0 * q2k::kBytes, w_stride, rn, nblk, tile);
      int64_t t = 0;
      for (; t + 4 <= nacts; t += 4)
        run_tokens<4, 2>(tile, nblk, acts + t, a_off, y + (size_t)t * ldy + (size_t)r0, ldy, mask, first);
      const uint8_t* const* at = acts + t;
      float* yt = y + (size_t)t * ldy + (size_t)r0;
      switch (nacts - t) {
        case 3: run_tokens<3, 2>(tile, nblk, at, a_off, yt, ldy, mask, first); break;
        case 2: run_tokens<2, 4>(tile, nblk, at, a_off, yt, ldy, mask, first); break;
        case 1: run_tokens<1, 4>(tile, nblk, at, a_off, yt, ldy, mask, first); break;
        default: break;
      }
    }
  }
}

}  // namespace sluice::kquant
