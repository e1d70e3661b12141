// AVX-512 VNNI GEMM for IQ2_XXS weights x Q8_K activations (types.h GemmFn). Each 16-row tile is
// decoded once per K-chunk (iq2_xxs_avx512.h) into signed grid*sign bytes (|v| <= 43), offset by +128 so vpdpbusd
// can take them as its unsigned operand, in the layout of gemm_tile_avx512.h; every token of the
// call then reuses it. Per (row, token, block) the kernel forms the scalar reference's exact
// integer bsum = sum over the 8 sub-blocks of (2s+1) * sub-dot: the +128 offset is taken off each
// sub-dot as 128 * (sum of the token's 32 codes), computed from the codes themselves (not the
// stored bsums), and the sub-block multipliers are applied with vpmulld. The float step is
// step_iq2 on 16 rows at once, blocks in order, so every pair gets dot_iq2_xxs_scalar's bits.
// K-chunks keep the stack bounded: a pair's partial sumf waits in y between chunks.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "kernels/avx512_intrinsics.h"

#include <algorithm>
#include <cstring>

#include "kernels/gemm_tile_avx512.h"
#include "kernels/prefetch.h"
#include "kernels/iq2_xxs_avx512.h"
#include "kernels/iq_tables.h"
#include "kernels/iquant_types.h"
#include "kernels/types.h"

namespace sluice::iquant {
namespace {

constexpr int kChunk = 8;      // blocks per K-chunk
constexpr int kTokGroup = 64;  // tokens whose sub-block code sums are held at once
constexpr int kQ8 = kQ8_KBytes;

struct Iq2Tile {
  __m512i w[kChunk][64];           // +128-offset values, packed (gemm_tile_avx512.h)
  alignas(64) int32_t mult[kChunk][8][16];  // 2s+1 per block, sub-block, row
  alignas(64) float dx[kChunk][16];         // row scales
};
// -128 * (sum of the 32 codes of a sub-block) per token, block of the chunk, sub-block.
struct Iq2Corr {
  int32_t c[kTokGroup][kChunk][8];
};
static_assert(sizeof(Iq2Tile) + sizeof(Iq2Corr) + 16 * 256 + 16 * 64 * 2 < sluice::kGemmStackBytes - 2048);

// Decode blocks [0, nblk) of rn rows (rows past rn are zero weights) into t.
void pack_tile(const Iq2xxsDecoder& dec, const uint8_t* w, size_t w_stride, int rn, int nblk, Iq2Tile& t) {
  alignas(64) uint8_t rowv[16][256];
  for (int b = 0; b < nblk; ++b) {
    for (int r = 0; r < 16; ++r) {
      const uint8_t* x = w + (size_t)r * w_stride + (size_t)b * kIq2xxsBytes;
      if (r < rn) {
        __m512i v[4];
        dec.decode(x, v);
        for (int k = 0; k < 4; ++k) _mm512_store_si512(rowv[r] + 64 * k, v[k]);
        for (int sb = 0; sb < 8; ++sb) t.mult[b][sb][r] = (int32_t)(2 * ((uint32_t)gemm_ld32(x + 6 + 8 * sb) >> 28) + 1);
        t.dx[b][r] = _cvtsh_ss((unsigned short)gemm_ld32(x));
      } else {
        std::memset(rowv[r], 0x80, 256);
        for (int sb = 0; sb < 8; ++sb) t.mult[b][sb][r] = 0;
        t.dx[b][r] = 0.0f;
      }
    }
    for (int p = 0; p < 4; ++p) {
      __m512i v[16];
      for (int r = 0; r < 16; ++r) v[r] = _mm512_load_si512(rowv[r] + 64 * p);
      transpose16x16_epi32(v);
      for (int q = 0; q < 16; ++q) t.w[b][16 * p + q] = v[q];
    }
  }
}

// -128 * sum of each sub-block's codes, for nt tokens, blocks [0, nblk) from chunk offset a_off.
void token_corrections(const uint8_t* const* acts, int nt, size_t a_off, int nblk, Iq2Corr& c) {
  const __m512i bias = _mm512_set1_epi8((char)0x80);
  for (int t = 0; t < nt; ++t)
    for (int b = 0; b < nblk; ++b) {
      const uint8_t* q = acts[t] + a_off + (size_t)b * kQ8 + kQ8_KQs;
      alignas(64) uint64_t s[32];
      for (int k = 0; k < 4; ++k)  // each u64: sum of 8 codes + 128 each
        _mm512_store_si512(s + 8 * k, _mm512_sad_epu8(_mm512_xor_si512(_mm512_loadu_si512(q + 64 * k), bias),
                                                      _mm512_setzero_si512()));
      for (int sb = 0; sb < 8; ++sb) {
        const int64_t sum = (int64_t)(s[4 * sb] + s[4 * sb + 1] + s[4 * sb + 2] + s[4 * sb + 3]) - 32 * 128;
        c.c[t][b][sb] = (int32_t)(-128 * sum);
      }
    }
}

// T tokens (acts already at the chunk) against the packed tile; sumf[t] carries each token's sums.
template <int T, int C>
inline void tile_tokens(const Iq2Tile& tile, int nblk, const uint8_t* const* a, const int32_t (*corr)[kChunk][8],
                        __m512 sumf[T]) {
  for (int b = 0; b < nblk; ++b) {
    __m512i bsum[T];
    for (int t = 0; t < T; ++t) bsum[t] = _mm512_setzero_si512();
    for (int sb = 0; sb < 8; ++sb) {
      __m512i acc[T][C];
      for (int t = 0; t < T; ++t) {
        acc[t][0] = _mm512_set1_epi32(corr[t][b][sb]);
        for (int c = 1; c < C; ++c) acc[t][c] = _mm512_setzero_si512();
      }
      for (int k = 0; k < 8; k += C)
        for (int c = 0; c < C; ++c) {
          const __m512i wv = tile.w[b][8 * sb + k + c];
          for (int t = 0; t < T; ++t)
            acc[t][c] = _mm512_dpbusd_epi32(
                acc[t][c], wv, _mm512_set1_epi32(gemm_ld32(a[t] + (size_t)b * kQ8 + kQ8_KQs + 32 * sb + 4 * (k + c))));
        }
      const __m512i mv = _mm512_load_si512(tile.mult[b][sb]);
      for (int t = 0; t < T; ++t) {
        __m512i s = acc[t][0];
        for (int c = 1; c < C; ++c) s = _mm512_add_epi32(s, acc[t][c]);
        bsum[t] = _mm512_add_epi32(bsum[t], _mm512_mullo_epi32(s, mv));
      }
    }
    const __m512 dx = _mm512_load_ps(tile.dx[b]);
    for (int t = 0; t < T; ++t) {
      float dy;
      std::memcpy(&dy, a[t] + (size_t)b * kQ8, 4);
      // step_iq2: sumf + (dx * dy) * (float)bsum
      sumf[t] = _mm512_add_ps(sumf[t], _mm512_mul_ps(_mm512_mul_ps(dx, _mm512_set1_ps(dy)), _mm512_cvtepi32_ps(bsum[t])));
    }
  }
}

template <int T, int C>
void run_tokens(const Iq2Tile& tile, int nblk, const uint8_t* const* acts, size_t a_off, const int32_t (*corr)[kChunk][8],
                float* y, size_t ldy, __mmask16 mask, bool first, bool last) {
  const uint8_t* a[T];
  __m512 sumf[T];
  for (int t = 0; t < T; ++t) {
    a[t] = acts[t] + a_off;
    sumf[t] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, y + (size_t)t * ldy);
  }
  tile_tokens<T, C>(tile, nblk, a, corr, sumf);
  for (int t = 0; t < T; ++t) {
    const __m512 v = last ? _mm512_mul_ps(_mm512_set1_ps(0.125f), sumf[t]) : sumf[t];  // finish_iq2
    _mm512_mask_storeu_ps(y + (size_t)t * ldy, mask, v);
  }
}

}  // namespace

void gemm_iq2_xxs_avx512(const void* vw, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                         int64_t n, float* y, size_t ldy) {
  const uint8_t* w = static_cast<const uint8_t*>(vw);
  const int64_t nb = n / 256;
  if (nb == 0) {
    for (int64_t t = 0; t < nacts; ++t)
      for (int64_t r = 0; r < nrows; ++r) y[(size_t)t * ldy + (size_t)r] = finish_iq2(0.0f);
    return;
  }
  if (nacts == 1) {  // a decode step: nothing to reuse a decoded tile for
    gemv_iq2_xxs_avx512(w, w_stride, nrows, acts[0], n, y);
    return;
  }
  static const Iq2xxsDecoder dec(128);  // +128: vpdpbusd's unsigned operand
  Iq2Tile tile;
  Iq2Corr corr;
  for (int64_t c0 = 0; c0 < nb; c0 += kChunk) {
    const int nblk = (int)std::min<int64_t>(kChunk, nb - c0);
    const bool first = c0 == 0, last = c0 + nblk == nb;
    const size_t a_off = (size_t)c0 * kQ8;
    for (int64_t g0 = 0; g0 < nacts; g0 += kTokGroup) {
      const int ng = (int)std::min<int64_t>(kTokGroup, nacts - g0);
      token_corrections(acts + g0, ng, a_off, nblk, corr);
      for (int64_t r0 = 0; r0 < nrows; r0 += kGemmTileRows) {
        const int rn = (int)std::min<int64_t>(kGemmTileRows, nrows - r0);
        const __mmask16 mask = (__mmask16)((1u << rn) - 1);
        if (r0 + kGemmTileRows < nrows)
          prefetch_rows(w + (size_t)(r0 + kGemmTileRows) * w_stride + (size_t)c0 * kIq2xxsBytes, w_stride,
                        (int)std::min<int64_t>(kGemmTileRows, nrows - r0 - kGemmTileRows), (size_t)nblk * kIq2xxsBytes);
        pack_tile(dec, w + (size_t)r0 * w_stride + (size_t)c0 * kIq2xxsBytes, w_stride, rn, nblk, tile);
        int t = 0;
        for (; t + 4 <= ng; t += 4)
          run_tokens<4, 2>(tile, nblk, acts + g0 + t, a_off, corr.c + t, y + (size_t)(g0 + t) * ldy + (size_t)r0, ldy,
                           mask, first, last);
        const uint8_t* const* at = acts + g0 + t;
        float* yt = y + (size_t)(g0 + t) * ldy + (size_t)r0;
        switch (ng - t) {
          case 3: run_tokens<3, 2>(tile, nblk, at, a_off, corr.c + t, yt, ldy, mask, first, last); break;
          case 2: run_tokens<2, 4>(tile, nblk, at, a_off, corr.c + t, yt, ldy, mask, first, last); break;
          case 1: run_tokens<1, 4>(tile, nblk, at, a_off, corr.c + t, yt, ldy, mask, first, last); break;
          default: break;
        }
      }
    }
  }
}

}  // namespace sluice::iquant
