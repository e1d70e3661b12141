// AVX2 GEMM for Q2_K weights x Q8_K activations (types.h GemmFn): the AVX-512 kernel's scheme
// (gemm_q2_k_avx512.cpp) on 8-row tiles without VNNI. Each tile is decoded once per K-chunk with
// every element already multiplied by its sub-block scale, q * (sc & 15) <= 45, and transposed so
// that ymm k of a block holds bytes 4k..4k+3 of all 8 rows (dword lane r = row r). Per token,
// maddubs multiplies those unsigned bytes by 4 broadcast activation bytes into int16 pairs; two
// such results are added in int16 before madd widens them: |45 * 128 * 4| = 23,040 < 32,767, so
// no step saturates and isum = sum_k (sc_k & 15) * dot16_k is the reference's exactly. summs =
// sum_k (sc_k >> 4) * bsum_k pairs the mins with the activation's stored bsums in one madd per
// two sub-blocks, as the scalar reads them. The float tail is q2k_tail lane-wise, blocks in
// order, so every (row, token) gets dot_q2_k_scalar's bits; between K-chunks a pair's partial
// sumf waits in y.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/f16c_load.h"
#include "kernels/gemm_tile_avx2.h"
#include "kernels/kquant_blocks.h"
#include "kernels/prefetch.h"
#include "kernels/types.h"

namespace sluice::kquant {
namespace {

constexpr int kRows = 8;   // rows per tile: one dword lane each
constexpr int kChunk = 8;  // blocks per K-chunk

struct Q2kTile {
  __m256i w[kChunk][64];    // w[b][k] lane r: row r's elements 4k..4k+3 of block b, times their scale
  __m256i mins[kChunk][8];  // lane r: (sc_2j >> 4) | (sc_2j+1 >> 4) << 16 of row r
  __m256 xd[kChunk], xdmin[kChunk];
};
static_assert(sizeof(Q2kTile) + 8192 < kGemmStackBytes);

// Elements 128h + 32j .. +31 of one block, each times its sub-block scale: (qs[32h + l] >> 2j) & 3
// looked up in a per-lane table (0, s, 2s, 3s), the low 128-bit lane for sub-block 8h + 2j, the
// high one for 8h + 2j + 1.
inline __m256i decode32(const uint8_t* x, int h, int j) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + q2k::kQs + 32 * h));
  const __m256i q = _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), _mm256_set1_epi8(3));
  const uint32_t s0 = x[q2k::kScales + 8 * h + 2 * j] & 15u, s1 = x[q2k::kScales + 8 * h + 2 * j + 1] & 15u;
  const __m256i lut = _mm256_setr_m128i(_mm_set1_epi32((int)(s0 * 0x03020100u)), _mm_set1_epi32((int)(s1 * 0x03020100u)));
  return _mm256_shuffle_epi8(lut, q);
}

void pack_tile(const uint8_t* w, size_t w_stride, int rn, int nblk, Q2kTile& t) {
  for (int b = 0; b < nblk; ++b) {
    __m256i rows[8][kRows], mins[kRows];  // rows[c][r]: chunk c = 4h + j of row r
    alignas(32) float xd[kRows], xdmin[kRows];
    for (int r = 0; r < kRows; ++r) {
      if (r < rn) {
        const uint8_t* x = w + (size_t)r * w_stride + (size_t)b * q2k::kBytes;
        const __m128i scb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + q2k::kScales));
        mins[r] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(scb, 4), _mm_set1_epi8(15)));
        for (int h = 0; h < 2; ++h)
          for (int j = 0; j < 4; ++j) rows[4 * h + j][r] = decode32(x, h, j);
        xd[r] = f16c_at(x + q2k::kD);
        xdmin[r] = f16c_at(x + q2k::kDmin);
      } else {
        mins[r] = _mm256_setzero_si256();
        for (int c = 0; c < 8; ++c) rows[c][r] = _mm256_setzero_si256();
        xd[r] = xdmin[r] = 0.0f;
      }
    }
    for (int c = 0; c < 8; ++c) transpose8(rows[c], &t.w[b][8 * c]);  // chunk c holds dwords 8c .. 8c + 7
    transpose8(mins, t.mins[b]);
    t.xd[b] = _mm256_load_ps(xd);
    t.xdmin[b] = _mm256_load_ps(xdmin);
  }
}

template <int T>
inline void tile_tokens(const Q2kTile& tile, int nblk, const uint8_t* const* a, __m256 sumf[T]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int b = 0; b < nblk; ++b) {
    const size_t boff = (size_t)b * q8k::kBytes;
    __m256i acc[T], sm[T];
    for (int t = 0; t < T; ++t) acc[t] = sm[t] = _mm256_setzero_si256();
    for (int k = 0; k < 64; k += 2) {
      const __m256i w0 = tile.w[b][k], w1 = tile.w[b][k + 1];
      for (int t = 0; t < T; ++t) {
        const uint8_t* q = a[t] + boff + q8k::kQs + 4 * k;
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w0, _mm256_set1_epi32(gemm_ld32(q))),
                                           _mm256_maddubs_epi16(w1, _mm256_set1_epi32(gemm_ld32(q + 4))));
        acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(p, ones));
      }
    }
    for (int j = 0; j < 8; ++j) {
      const __m256i mv = tile.mins[b][j];
      for (int t = 0; t < T; ++t)
        sm[t] = _mm256_add_epi32(sm[t], _mm256_madd_epi16(mv, _mm256_set1_epi32(gemm_ld32(a[t] + boff + q8k::kBsums + 4 * j))));
    }
    for (int t = 0; t < T; ++t) {
      const __m256 yd = _mm256_set1_ps(load_f32_at(a[t] + boff + q8k::kD));
      // q2k_tail: dall = yd*xd, dmin = yd*xdmin, sumf + (dall*isum - dmin*summs)
      const __m256 dall = _mm256_mul_ps(yd, tile.xd[b]), dmin = _mm256_mul_ps(yd, tile.xdmin[b]);
      sumf[t] = _mm256_add_ps(sumf[t], _mm256_sub_ps(_mm256_mul_ps(dall, _mm256_cvtepi32_ps(acc[t])),
                                                     _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(sm[t]))));
    }
  }
}

template <int T>
void run_tokens(const Q2kTile& tile, int nblk, const uint8_t* const* acts, size_t a_off, float* y, size_t ldy,
                __m256i mask, bool first) {
  const uint8_t* a[T];
  __m256 sumf[T];
  for (int t = 0; t < T; ++t) {
    a[t] = acts[t] + a_off;
    sumf[t] = first ? _mm256_setzero_ps() : _mm256_maskload_ps(y + (size_t)t * ldy, mask);
  }
  tile_tokens<T>(tile, nblk, a, sumf);
  for (int t = 0; t < T; ++t) _mm256_maskstore_ps(y + (size_t)t * ldy, mask, sumf[t]);
}

}  // namespace

void gemm_q2_k_avx2(const void* vw, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                    int64_t n, float* y, size_t ldy) {
  const uint8_t* w = static_cast<const uint8_t*>(vw);
  const int64_t nb = n / kQK;
  if (nb == 0) {
    for (int64_t t = 0; t < nacts; ++t)
      for (int64_t r = 0; r < nrows; ++r) y[(size_t)t * ldy + (size_t)r] = 0.0f;
    return;
  }
  Q2kTile tile;
  for (int64_t c0 = 0; c0 < nb; c0 += kChunk) {
    const int nblk = (int)std::min<int64_t>(kChunk, nb - c0);
    const bool first = c0 == 0;
    const size_t a_off = (size_t)c0 * q8k::kBytes;
    for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
      const int rn = (int)std::min<int64_t>(kRows, nrows - r0);
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(rn), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      if (r0 + kRows < nrows)
        prefetch_rows(w + (size_t)(r0 + kRows) * w_stride + (size_t)c0 * q2k::kBytes, w_stride,
                      (int)std::min<int64_t>(kRows, nrows - r0 - kRows), (size_t)nblk * q2k::kBytes);
      pack_tile(w + (size_t)r0 * w_stride + (size_t)c0 * q2k::kBytes, w_stride, rn, nblk, tile);
      int64_t t = 0;
      for (; t + 4 <= nacts; t += 4) run_tokens<4>(tile, nblk, acts + t, a_off, y + (size_t)t * ldy + (size_t)r0, ldy, mask, first);
      const uint8_t* const* at = acts + t;
      float* yt = y + (size_t)t * ldy + (size_t)r0;
      switch (nacts - t) {
        case 3: run_tokens<3>(tile, nblk, at, a_off, yt, ldy, mask, first); break;
        case 2: run_tokens<2>(tile, nblk, at, a_off, yt, ldy, mask, first); break;
        case 1: run_tokens<1>(tile, nblk, at, a_off, yt, ldy, mask, first); break;
        default: break;
      }
    }
  }
}

}  // namespace sluice::kquant
