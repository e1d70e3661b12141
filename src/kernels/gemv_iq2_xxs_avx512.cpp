// IQ2_XXS weights x one Q8_K activation row (a decode step), 16 rows at a time; gemm_iq2_xxs_avx512
// hands it every one-token call. Each row's block is decoded as the dot decodes it (VBMI permutes,
// iq2_xxs_avx512.h), but what depends only on the activation is done once per block for all 16
// rows (the +128 offset's correction, 128 * sum of each 4 codes, starts every row's vpdpbusd), and
// the rows' sums are folded into lanes (lane_fold_avx512.h) so step_iq2 runs lane-wise, blocks in
// order from +0, then finish_iq2's scale: each row gets dot_iq2_xxs_scalar's bits.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "kernels/avx512_intrinsics.h"

#include <algorithm>
#include <cstring>

#include "kernels/iq2_xxs_avx512.h"
#include "kernels/iquant_types.h"
#include "kernels/lane_fold_avx512.h"
#include "kernels/prefetch.h"

namespace sluice::iquant {
namespace {

constexpr int kRows = 16;

// One row's block: its exact integer bsum's 16 dword partials (the sub-dots times 2s+1), each
// vpdpbusd started from the activation's correction.
inline __m512i block_partials(const Iq2xxsDecoder& dec, const uint8_t* x, const __m512i yv[4], const __m512i corr[4]) {
  const __m512i one = _mm512_set1_epi64(1);
  // Vector k holds sub-blocks 2k (low half) and 2k + 1: their multipliers sit in dwords 4k, 4k + 2.
  const __m512i mult_at[4] = {_mm512_inserti64x4(_mm512_set1_epi32(0), _mm256_set1_epi32(2), 1),
                              _mm512_inserti64x4(_mm512_set1_epi32(4), _mm256_set1_epi32(6), 1),
                              _mm512_inserti64x4(_mm512_set1_epi32(8), _mm256_set1_epi32(10), 1),
                              _mm512_inserti64x4(_mm512_set1_epi32(12), _mm256_set1_epi32(14), 1)};
  __m512i v[4];
  const __m512i in = dec.decode(x, v);
  const __m512i mult = _mm512_or_si512(_mm512_slli_epi64(_mm512_srli_epi64(in, 60), 1), one);  // 2s+1
  __m512i acc = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k)
    acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(_mm512_dpbusd_epi32(corr[k], v[k], yv[k]),
                                                   _mm512_permutexvar_epi32(mult_at[k], mult)));
  return acc;
}

void tile(const Iq2xxsDecoder& dec, const uint8_t* base, size_t w_stride, int rv, const uint8_t* y, int64_t nb,
          float* out, int next_rows) {
  const RowTile16 rows(base, w_stride, rv);
  const __m512i bias = _mm512_set1_epi8((char)0x80);
  TilePrefetch prefetch(base, kRows * w_stride, w_stride, next_rows, w_stride, nb);
  __m512 sumf = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    prefetch.step();
    const size_t bo = (size_t)b * kIq2xxsBytes;
    const uint8_t* yb = y + (size_t)b * kQ8_KBytes;
    __m512i yv[4], corr[4];
    for (int k = 0; k < 4; ++k) {
      yv[k] = _mm512_loadu_si512(yb + kQ8_KQs + 64 * k);
      corr[k] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, yv[k]));
    }
    __m512i z[8];
    for (int i = 0; i < 8; ++i) {
      const __m512i lo = block_partials(dec, rows.row[kFoldLowRow[i]] + bo, yv, corr);
      const __m512i hi = block_partials(dec, rows.row[kFoldHighRow[i]] + bo, yv, corr);
      z[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(lo, hi, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_i32x4(lo, hi, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    const __m512i bsum = fold_rows16(z);
    const __m256i h = _mm512_cvtepi32_epi16(rows.dwords_at(bo));  // the rows' d (low halves)
    float dy;
    std::memcpy(&dy, yb, 4);
    // step_iq2, lane-wise: sumf + (dx * dy) * (float)bsum.
    sumf = _mm512_add_ps(sumf, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(dy)),
                                             _mm512_cvtepi32_ps(bsum)));
  }
  _mm512_mask_storeu_ps(out, (__mmask16)((1u << rv) - 1u), _mm512_mul_ps(_mm512_set1_ps(0.125f), sumf));  // finish_iq2
}

}  // namespace

void gemv_iq2_xxs_avx512(const void* vw, size_t w_stride, int64_t nrows, const uint8_t* act, int64_t n, float* y) {
  static const Iq2xxsDecoder dec(128);  // +128: vpdpbusd's unsigned operand
  const uint8_t* w = static_cast<const uint8_t*>(vw);
  const int64_t nb = n / 256;
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows)
    tile(dec, w + (size_t)r0 * w_stride, w_stride, (int)std::min<int64_t>(kRows, nrows - r0), act, nb, y + r0,
         (int)std::clamp<int64_t>(nrows - r0 - kRows, 0, kRows));
}

}  // namespace sluice::iquant
