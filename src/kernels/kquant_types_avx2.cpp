// AVX2 K-quant x Q8_K dot products. The integer sums are formed with maddubs (u8 x s8 pairs
// into int16) and madd (int16 x int16 pairs into int32); the signed quants of Q3_K and Q6_K
// are handled as unsigned codes minus an offset, Σ q8*(u - o) = maddubs(u,q8) - maddubs(o,q8),
// so neither relies on the activation's bsums and the sums equal the scalar reference's exactly.
// The float tail is the shared one from kquant_blocks.h, so the result has the same bits.
//
// int16 saturation cannot happen: maddubs pairs are at most 2*63*128 = 16128 (Q6_K codes) and
// the difference of two pair sums is at most 2*32*128 = 8192.
#include <immintrin.h>

#include "kernels/f16c_load.h"
#include "kernels/kquant_blocks.h"
#include "kernels/prefetch.h"

namespace sluice::kquant {
namespace {

int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

__m256i load256(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
__m128i load128(const uint8_t* p) { return _mm_loadu_si128((const __m128i*)p); }

// Per-byte right shift by a run-time count: a 16-bit shift is fine because callers mask the
// result to bits that came from the same byte.
__m256i srl_bytes(__m256i v, int count) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(count)); }

// For a 32-element chunk c covering sub-blocks 2c and 2c+1 of 16: the int16 scale vector
// (sub-block 2c in the low 8 lanes, 2c+1 in the high 8), sign-extended from the 16 scale bytes
// held in both 128-bit lanes of sc2. Each int16 gets the byte twice; the arithmetic shift keeps
// one copy with its sign.
__m256i scale_pair(__m256i sc2, int c) {
  const __m256i ctrl = _mm256_set_m128i(_mm_set1_epi8((char)(2 * c + 1)), _mm_set1_epi8((char)(2 * c)));
  return _mm256_srai_epi16(_mm256_shuffle_epi8(sc2, ctrl), 8);
}

}  // namespace

float dot_q8_k_avx2(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i, x += q8k::kBytes, y += q8k::kBytes) {
    // s8 x s8: widen to int16 (exact for -128 too, unlike the sign/maddubs trick).
    __m256i acc = _mm256_setzero_si256();
    for (int t = 0; t < 16; ++t) {
      const __m256i a = _mm256_cvtepi8_epi16(load128(x + q8k::kQs + 16 * t));
      const __m256i b = _mm256_cvtepi8_epi16(load128(y + q8k::kQs + 16 * t));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
    }
    sumf = q8k_tail(sumf, load_f32_at(y + q8k::kD), load_f32_at(x + q8k::kD), hsum_i32(acc));
  }
  return sumf;
}

float dot_q2_k_avx2(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m128i m15 = _mm_set1_epi8(15);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i, x += q2k::kBytes, y += q8k::kBytes) {
    prefetch_ahead(x, 128);  // 84 bytes a block
    const __m128i scb = load128(x + q2k::kScales);
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(scb, 4), m15));
    const int32_t summs = hsum_i32(_mm256_madd_epi16(load256(y + q8k::kBsums), mins));
    const __m256i sc2 = _mm256_broadcastsi128_si256(_mm_and_si128(scb, m15));
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i qbytes = load256(x + q2k::kQs + 32 * h);
      for (int j = 0; j < 4; ++j) {  // elements 128h + 32j + (0..31)
        const __m256i q = _mm256_and_si256(srl_bytes(qbytes, 2 * j), m3);
        const __m256i q8 = load256(y + q8k::kQs + 128 * h + 32 * j);
        const __m256i p = _mm256_maddubs_epi16(q, q8);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale_pair(sc2, 4 * h + j)));
      }
    }
    sumf = q2k_tail(sumf, load_f32_at(y + q8k::kD), f16c_at(x + q2k::kD), f16c_at(x + q2k::kDmin),
                    hsum_i32(acc), summs);
  }
  return sumf;
}

float dot_q3_k_avx2(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i one = _mm256_set1_epi8(1);
  const __m256i four = _mm256_set1_epi8(4);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i, x += q3k::kBytes, y += q8k::kBytes) {
    int8_t s[16];
    unpack_q3k_scales(x + q3k::kScales, s);
    const __m256i sc2 = _mm256_broadcastsi128_si256(load128((const uint8_t*)s));
    const __m256i hm = load256(x + q3k::kHmask);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i qbytes = load256(x + q3k::kQs + 32 * h);
      for (int j = 0; j < 4; ++j) {
        // code u = q2 + 4*hbit in 0..7, and q = u - 4.
        const __m256i q2 = _mm256_and_si256(srl_bytes(qbytes, 2 * j), m3);
        const __m256i hb = _mm256_and_si256(srl_bytes(hm, 4 * h + j), one);
        const __m256i u = _mm256_or_si256(q2, _mm256_slli_epi16(hb, 2));
        const __m256i q8 = load256(y + q8k::kQs + 128 * h + 32 * j);
        const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(u, q8), _mm256_maddubs_epi16(four, q8));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale_pair(sc2, 4 * h + j)));
      }
    }
    sumf = scaled_tail(sumf, load_f32_at(y + q8k::kD), f16c_at(x + q3k::kD), hsum_i32(acc));
  }
  return sumf;
}

float dot_q4_k_avx2(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  const __m256i m15 = _mm256_set1_epi8(15);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i, x += q4k::kBytes, y += q8k::kBytes) {
    uint8_t sc[8], m[8];
    unpack_q4k_scales(x + q4k::kScales, sc, m);
    // bsums j pairs with min j/2: widen the mins to int16 and duplicate each.
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i*)m));
    const __m256i mins = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
    const int32_t sumi_min = hsum_i32(_mm256_madd_epi16(load256(y + q8k::kBsums), mins));
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {  // elements 64c + (0..31) low nibbles, 64c + (32..63) high
      const __m256i qbytes = load256(x + q4k::kQs + 32 * c);
      const __m256i lo = _mm256_and_si256(qbytes, m15);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qbytes, 4), m15);
      const __m256i plo = _mm256_maddubs_epi16(lo, load256(y + q8k::kQs + 64 * c));
      const __m256i phi = _mm256_maddubs_epi16(hi, load256(y + q8k::kQs + 64 * c + 32));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(plo, _mm256_set1_epi16(sc[2 * c])));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(phi, _mm256_set1_epi16(sc[2 * c + 1])));
    }
    sumf = q4k_tail(sumf, load_f32_at(y + q8k::kD), f16c_at(x + q4k::kD), f16c_at(x + q4k::kDmin),
                    hsum_i32(acc), sumi_min);
  }
  return sumf;
}

float dot_q6_k_avx2(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i m15 = _mm256_set1_epi8(15);
  const __m256i off = _mm256_set1_epi8(32);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i, x += q6k::kBytes, y += q8k::kBytes) {
    const __m256i sc2 = _mm256_broadcastsi128_si256(load128(x + q6k::kScales));
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load256(x + q6k::kQl + 64 * h);
      const __m256i ql1 = load256(x + q6k::kQl + 64 * h + 32);
      const __m256i qh = load256(x + q6k::kQh + 32 * h);
      for (int k = 0; k < 4; ++k) {  // elements 128h + 32k + (0..31)
        const __m256i ql = (k & 1) ? ql1 : ql0;
        const __m256i low4 = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(ql, 4) : ql, m15);
        const __m256i high2 = _mm256_and_si256(srl_bytes(qh, 2 * k), m3);
        const __m256i u = _mm256_or_si256(low4, _mm256_slli_epi16(high2, 4));  // q + 32, 0..63
        const __m256i q8 = load256(y + q8k::kQs + 128 * h + 32 * k);
        const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(u, q8), _mm256_maddubs_epi16(off, q8));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale_pair(sc2, 4 * h + k)));
      }
    }
    sumf = scaled_tail(sumf, load_f32_at(y + q8k::kD), f16c_at(x + q6k::kD), hsum_i32(acc));
  }
  return sumf;
}

}  // namespace sluice::kquant
