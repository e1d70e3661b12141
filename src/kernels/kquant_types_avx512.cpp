// AVX-512 (F/BW/VL/DQ/VNNI) K-quant x Q8_K dot products. Each step takes 64 elements: the
// unsigned quant codes are built in one zmm (variable per-half shifts with srlv_epi16), VNNI
// dpbusd forms the u8 x s8 products four at a time straight into int32 (no int16 stage, so no
// saturation to reason about), and mullo_epi32 applies the per-sub-block scales. Signed quants
// (Q3_K, Q6_K) are unsigned codes minus an offset, subtracted as a second dpbusd, so nothing
// relies on the activation's bsums. The integer sums equal the scalar reference's exactly and
// the float tail is the shared one from kquant_blocks.h, so the result has the same bits.
#include "kernels/avx512_intrinsics.h"

#include "kernels/f16c_load.h"
#include "kernels/kquant_blocks.h"
#include "kernels/prefetch.h"

namespace sluice::kquant {
namespace {

__m512i load512(const uint8_t* p) { return _mm512_loadu_si512((const void*)p); }
__m128i load128(const uint8_t* p) { return _mm_loadu_si128((const __m128i*)p); }
// The same 32 bytes in both 256-bit halves.
__m512i dup256(const uint8_t* p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)p)); }

// Shift every byte of the low 256 bits right by a and of the high 256 bits by b. The 16-bit
// shift is fine because callers mask to bits that came from the same byte.
__m512i srl_halves(__m512i v, int a, int b) {
  const __m512i counts = _mm512_inserti64x4(_mm512_set1_epi16((short)a), _mm256_set1_epi16((short)b), 1);
  return _mm512_srlv_epi16(v, counts);
}

// int32 scale vector for 64 elements starting at sub-block 4m (sub-blocks of 16 elements):
// lane t gets s[4m + t/4], s being the 16 scales widened to int32.
__m512i scales_for_chunk(__m512i s, int m) {
  const __m512i idx = _mm512_add_epi32(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                       _mm512_set1_epi32(4 * m));
  return _mm512_permutexvar_epi32(idx, s);
}

}  // namespace

float dot_q8_k_avx512(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i, x += q8k::kBytes, y += q8k::kBytes) {
    // s8 x s8: widen to int16 and use dpwssd (exact int16 pair products into int32).
    __m512i acc = _mm512_setzero_si512();
    for (int t = 0; t < 8; ++t) {
      const __m512i a = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(x + q8k::kQs + 32 * t)));
      const __m512i b = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(y + q8k::kQs + 32 * t)));
      acc = _mm512_dpwssd_epi32(acc, a, b);
    }
    sumf = q8k_tail(sumf, load_f32_at(y + q8k::kD), load_f32_at(x + q8k::kD), _mm512_reduce_add_epi32(acc));
  }
  return sumf;
}

float dot_q2_k_avx512(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  const __m512i m3 = _mm512_set1_epi8(3);
  const __m128i m15 = _mm_set1_epi8(15);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i, x += q2k::kBytes, y += q8k::kBytes) {
    prefetch_ahead(x, 128);  // 84 bytes a block
    const __m128i scb = load128(x + q2k::kScales);
    const __m512i sc = _mm512_cvtepu8_epi32(_mm_and_si128(scb, m15));
    const __m512i mins = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(scb, 4), m15));
    const __m512i bsums = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i*)(y + q8k::kBsums)));
    const int32_t summs = _mm512_reduce_add_epi32(_mm512_mullo_epi32(bsums, mins));
    __m512i acc = _mm512_setzero_si512();
    for (int m = 0; m < 4; ++m) {  // elements 64m..64m+63: h = m/2, j = 2(m%2) and 2(m%2)+1
      const int h = m / 2, j = 2 * (m % 2);
      const __m512i q = _mm512_and_si512(srl_halves(dup256(x + q2k::kQs + 32 * h), 2 * j, 2 * j + 2), m3);
      const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, load512(y + q8k::kQs + 64 * m));
      acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(p, scales_for_chunk(sc, m)));
    }
    sumf = q2k_tail(sumf, load_f32_at(y + q8k::kD), f16c_at(x + q2k::kD), f16c_at(x + q2k::kDmin),
                    _mm512_reduce_add_epi32(acc), summs);
  }
  return sumf;
}

float dot_q3_k_avx512(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  const __m512i m3 = _mm512_set1_epi8(3);
  const __m512i one = _mm512_set1_epi8(1);
  const __m512i four = _mm512_set1_epi8(4);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i, x += q3k::kBytes, y += q8k::kBytes) {
    int8_t s8[16];
    unpack_q3k_scales(x + q3k::kScales, s8);
    const __m512i sc = _mm512_cvtepi8_epi32(load128((const uint8_t*)s8));
    const __m512i hm = dup256(x + q3k::kHmask);
    __m512i acc = _mm512_setzero_si512();
    for (int m = 0; m < 4; ++m) {
      const int h = m / 2, j = 2 * (m % 2);
      const __m512i q2 = _mm512_and_si512(srl_halves(dup256(x + q3k::kQs + 32 * h), 2 * j, 2 * j + 2), m3);
      const __m512i hb = _mm512_and_si512(srl_halves(hm, 4 * h + j, 4 * h + j + 1), one);
      const __m512i u = _mm512_or_si512(q2, _mm512_slli_epi16(hb, 2));  // q + 4, 0..7
      const __m512i q8 = load512(y + q8k::kQs + 64 * m);
      const __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, q8),
                                         _mm512_dpbusd_epi32(_mm512_setzero_si512(), four, q8));
      acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(p, scales_for_chunk(sc, m)));
    }
    sumf = scaled_tail(sumf, load_f32_at(y + q8k::kD), f16c_at(x + q3k::kD), _mm512_reduce_add_epi32(acc));
  }
  return sumf;
}

float dot_q4_k_avx512(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  const __m512i m15 = _mm512_set1_epi8(15);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i, x += q4k::kBytes, y += q8k::kBytes) {
    uint8_t sc[8], m[8];
    unpack_q4k_scales(x + q4k::kScales, sc, m);
    const __m512i mins = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i*)m),
                                                                _mm_loadl_epi64((const __m128i*)m)));
    const __m512i bsums = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i*)(y + q8k::kBsums)));
    const int32_t sumi_min = _mm512_reduce_add_epi32(_mm512_mullo_epi32(bsums, mins));
    __m512i acc = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {  // elements 64c..64c+63: low nibbles of qs[32c..], then high
      const __m512i u = _mm512_and_si512(srl_halves(dup256(x + q4k::kQs + 32 * c), 0, 4), m15);
      const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, load512(y + q8k::kQs + 64 * c));
      const __m512i s = _mm512_inserti64x4(_mm512_set1_epi32(sc[2 * c]), _mm256_set1_epi32(sc[2 * c + 1]), 1);
      acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(p, s));
    }
    sumf = q4k_tail(sumf, load_f32_at(y + q8k::kD), f16c_at(x + q4k::kD), f16c_at(x + q4k::kDmin),
                    _mm512_reduce_add_epi32(acc), sumi_min);
  }
  return sumf;
}

float dot_q6_k_avx512(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  const __m512i m3 = _mm512_set1_epi8(3);
  const __m512i m15 = _mm512_set1_epi8(15);
  const __m512i off = _mm512_set1_epi8(32);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i, x += q6k::kBytes, y += q8k::kBytes) {
    const __m512i sc = _mm512_cvtepi8_epi32(load128(x + q6k::kScales));
    __m512i acc = _mm512_setzero_si512();
    for (int m = 0; m < 4; ++m) {
      // Elements 128h + 64half + (0..63), i.e. k = 2half and 2half+1: the low nibbles (half 0)
      // or high nibbles (half 1) of ql[64h..64h+63], high bits from qh[32h..] >> 2k.
      const int h = m / 2, half = m % 2;
      const __m512i ql = load512(x + q6k::kQl + 64 * h);
      const __m512i low4 = _mm512_and_si512(half ? _mm512_srli_epi16(ql, 4) : ql, m15);
      const __m512i high2 = _mm512_and_si512(srl_halves(dup256(x + q6k::kQh + 32 * h), 4 * half, 4 * half + 2), m3);
      const __m512i u = _mm512_or_si512(low4, _mm512_slli_epi16(high2, 4));  // q + 32, 0..63
      const __m512i q8 = load512(y + q8k::kQs + 64 * m);
      const __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u, q8),
                                         _mm512_dpbusd_epi32(_mm512_setzero_si512(), off, q8));
      acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(p, scales_for_chunk(sc, m)));
    }
    sumf = scaled_tail(sumf, load_f32_at(y + q8k::kD), f16c_at(x + q6k::kD), _mm512_reduce_add_epi32(acc));
  }
  return sumf;
}

}  // namespace sluice::kquant
