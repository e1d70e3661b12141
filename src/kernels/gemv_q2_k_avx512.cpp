// Q2_K weights x one Q8_K activation row (a decode step), 16 rows at a time; gemm_q2_k_avx512
// hands it every one-token call. Each row's block keeps the dot's integer work (the scaled-code
// table of q2_k_avx512.h, four vpdpbusd), but the rest is shared by the 16 rows:
//  - the activation is rearranged once per call so that one shift of all 64 code bytes lines up
//    with one 64-byte load of it (shift group j: elements 32j.. and 128 + 32j..), which saves the
//    dot's per-row multishifts and duplicated loads;
//  - the 16 rows' partial sums are folded by one transpose-and-add tree (lane_fold_avx512.h) and
//    q2k_tail runs lane-wise, 16 rows per vector, blocks in order from +0: each row gets
//    dot_q2_k_scalar's bits, with none of the dot's per-row horizontal sums and scalar tail.
// In cache on Zen 4, one thread: 23.3 -> 17.5 cycles a block (rows of 2,304 columns).
#include "kernels/avx512_intrinsics.h"

#include <algorithm>
#include <cstring>

#include "kernels/kquant_blocks.h"
#include "kernels/lane_fold_avx512.h"
#include "kernels/prefetch.h"
#include "kernels/q2_k_avx512.h"

namespace sluice::kquant {
namespace {

constexpr int kRows = 16;
constexpr int kYBlocks = 32;  // activation blocks rearranged per K-chunk (10 KiB of stack)

// One Q8_K block, rearranged: q[j] = elements 32j..32j+31 then 128+32j..128+32j+31.
struct alignas(64) YBlock {
  int8_t q[4][64];
  uint8_t bsums[32];
  float d;
};

void arrange(const uint8_t* y, int nb, YBlock* out) {
  for (int b = 0; b < nb; ++b, y += q8k::kBytes) {
    for (int j = 0; j < 4; ++j) {
      std::memcpy(out[b].q[j], y + q8k::kQs + 32 * j, 32);
      std::memcpy(out[b].q[j] + 32, y + q8k::kQs + 128 + 32 * j, 32);
    }
    std::memcpy(out[b].bsums, y + q8k::kBsums, 32);
    std::memcpy(&out[b].d, y + q8k::kD, 4);
  }
}

// One row's block: the code sums in 16 int32 lanes (acc), the min sums in 8 (mp).
inline void block_sums(const Q2kConstants& k, const uint8_t* x, const YBlock& y, __m512i& acc, __m256i& mp) {
  const __m128i scb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + q2k::kScales));
  const __m512i table = q2k_scaled_code_table(k, scb);
  mp = q2k_min_sums(k, scb, y.bsums);
  const __m512i v = _mm512_loadu_si512(x + q2k::kQs);
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  for (int j = 0; j < 4; ++j) {
    const __m512i c = j == 0 ? v : _mm512_srli_epi16(v, 2 * j);  // bits from within each byte: masked below
    const __m512i sq = _mm512_permutexvar_epi8(_mm512_ternarylogic_epi32(c, k.m3, k.group_base[j], 0xEA), table);
    if (j % 2 == 0) a0 = _mm512_dpbusd_epi32(a0, sq, _mm512_load_si512(y.q[j]));
    else a1 = _mm512_dpbusd_epi32(a1, sq, _mm512_load_si512(y.q[j]));
  }
  acc = _mm512_add_epi32(a0, a1);
}

// Rows [0, rv) at base (lanes >= rv repeat row rv - 1, computed, never stored) against the nb
// rearranged blocks; sumf carries each lane's partial sum in and out.
void tile(const Q2kConstants& k, const uint8_t* base, size_t w_stride, int rv, const YBlock* y, int nb,
          __m512& sumf, TilePrefetch& prefetch) {
  const RowTile16 rows(base, w_stride, rv);
  for (int b = 0; b < nb; ++b) {
    prefetch.step();
    const size_t bo = (size_t)b * q2k::kBytes;
    __m512i zr[8], zm[8];
    for (int i = 0; i < 8; ++i) {
      __m512i lo, hi;
      __m256i mlo, mhi;
      block_sums(k, rows.row[kFoldLowRow[i]] + bo, y[b], lo, mlo);
      block_sums(k, rows.row[kFoldHighRow[i]] + bo, y[b], hi, mhi);
      // Each row's 16 code partials to 8 (lo's in the low half, hi's in the high half).
      zr[i] = _mm512_add_epi32(_mm512_shuffle_i32x4(lo, hi, _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_i32x4(lo, hi, _MM_SHUFFLE(3, 2, 3, 2)));
      zm[i] = _mm512_inserti64x4(_mm512_castsi256_si512(mlo), mhi, 1);
    }
    const __m512i isum = fold_rows16(zr), summs = fold_rows16(zm);
    const __m512i dd = rows.dwords_at(bo + q2k::kD);  // d and dmin, adjacent fp16s
    const __m512 xd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
    const __m512 xdmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
    // q2k_tail, lane-wise: sumf + (dall * isum - dmin * summs).
    const __m512 yd = _mm512_set1_ps(y[b].d);
    const __m512 dall = _mm512_mul_ps(yd, xd), dmin = _mm512_mul_ps(yd, xdmin);
    sumf = _mm512_add_ps(sumf, _mm512_sub_ps(_mm512_mul_ps(dall, _mm512_cvtepi32_ps(isum)),
                                             _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(summs))));
  }
}

}  // namespace

void gemv_q2_k_avx512(const void* vw, size_t w_stride, int64_t nrows, const uint8_t* act, int64_t n, float* y) {
  static_assert(q2k::kDmin == q2k::kD + 2, "d and dmin are read as one dword");
  const uint8_t* w = static_cast<const uint8_t*>(vw);
  const int64_t nb = n / kQK;
  const Q2kConstants k;
  YBlock ya[kYBlocks];
  if (nb == 0) std::fill_n(y, nrows, 0.0f);  // the scalar's empty sum: +0
  // K-chunks outer (a row's partial sum waits in y between them), tiles inner.
  for (int64_t c0 = 0; c0 < nb; c0 += kYBlocks) {
    const int nc = (int)std::min<int64_t>(kYBlocks, nb - c0);
    arrange(act + (size_t)c0 * q8k::kBytes, nc, ya);
    for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
      const int rv = (int)std::min<int64_t>(kRows, nrows - r0);
      const __mmask16 mask = (__mmask16)((1u << rv) - 1u);
      const uint8_t* base = w + (size_t)r0 * w_stride + (size_t)c0 * q2k::kBytes;
      TilePrefetch prefetch(base, kRows * w_stride, w_stride, (int)std::clamp<int64_t>(nrows - r0 - kRows, 0, kRows),
                            (size_t)nc * q2k::kBytes, nc);
      __m512 sumf = c0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, y + r0);
      tile(k, base, w_stride, rv, ya, nc, sumf, prefetch);
      _mm512_mask_storeu_ps(y + r0, mask, sumf);
    }
  }
}

}  // namespace sluice::kquant
