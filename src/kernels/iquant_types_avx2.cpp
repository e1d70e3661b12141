// AVX2 dot products of the iquant group. Integer sums are computed with vectors; the float part
// of every block is the shared step function of iquant_types.h, in block order, so the result is
// bit for bit the scalar reference's. The integer products are exact for EVERY byte pattern
// (including int8 -128 on either side), not only for the codes a quantizer would produce.
#include <immintrin.h>

#include <cstring>

#include "kernels/iq_tables.h"
#include "kernels/iquant_types.h"
#include "kernels/prefetch.h"

namespace sluice::iquant {
namespace {

inline const uint8_t* bytes(const void* p) { return static_cast<const uint8_t*>(p); }
inline uint16_t ld16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
inline uint32_t ld32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
inline uint64_t ld64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }
inline float ldf(const uint8_t* p) { float v; std::memcpy(&v, p, 4); return v; }
inline float f16(const uint8_t* p) { return _cvtsh_ss(ld16(p)); }
inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline int32_t hsum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// The four horizontal sums of a, b, c, d (8 int32 lanes each), in that order.
inline void hsum4(__m256i a, __m256i b, __m256i c, __m256i d, int32_t out[4]) {
  const __m256i abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), s);
}

// Signed int8 x signed int8 over 32 bytes, as 8 int32 partial sums. Widening to int16 first keeps
// it exact for -128 * -128 (maddubs would saturate there).
inline __m256i dot32_i8(__m256i a, __m256i b) {
  const __m256i al = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(a));
  const __m256i ah = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(a, 1));
  const __m256i bl = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(b));
  const __m256i bh = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(b, 1));
  return _mm256_add_epi32(_mm256_madd_epi16(al, bl), _mm256_madd_epi16(ah, bh));
}

// Small signed values w (|w| <= 127) times any int8 y, as 16 int16 pair sums: abs(y) is a valid
// unsigned operand even for -128 (0x80 = 128), and w takes y's sign, which never wraps.
inline __m256i dot32_small(__m256i w, __m256i y) {
  return _mm256_maddubs_epi16(_mm256_abs_epi8(y), _mm256_sign_epi8(w, y));
}

// Grid magnitudes of one sub-block (four 8-element groups) with the signs applied: 32 signed
// bytes, |value| <= 43. Sign masks come from a table (one load per group), like the grid.
inline __m256i signed_grid(const uint64_t* grid, uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3,
                           uint32_t s0, uint32_t s1, uint32_t s2, uint32_t s3) {
  const __m256i g = _mm256_setr_epi64x((long long)grid[i0], (long long)grid[i1], (long long)grid[i2],
                                       (long long)grid[i3]);
  const __m256i m = _mm256_setr_epi64x((long long)ksigns_mask_iq2xs[s0], (long long)ksigns_mask_iq2xs[s1],
                                       (long long)ksigns_mask_iq2xs[s2], (long long)ksigns_mask_iq2xs[s3]);
  return _mm256_sub_epi8(_mm256_xor_si256(g, m), m);
}

// The 32 two-bit codes of 8 Q2_0 bytes, in element order (element 4b+l = bits 2l..2l+1 of byte b).
inline __m256i q2_0_codes(__m128i src16, int half) {
  const __m256i spread0 = _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,  //
                                           4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
  const __m256i spread = _mm256_add_epi8(spread0, _mm256_set1_epi8((char)(8 * half)));
  // Every dword now holds one source byte four times; byte l of it keeps bits 2l..2l+1.
  const __m256i d = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(src16), spread);
  __m256i c = _mm256_and_si256(d, _mm256_set1_epi32(0x00000003));
  c = _mm256_or_si256(c, _mm256_and_si256(_mm256_srli_epi32(d, 2), _mm256_set1_epi32(0x00000300)));
  c = _mm256_or_si256(c, _mm256_and_si256(_mm256_srli_epi32(d, 4), _mm256_set1_epi32(0x00030000)));
  return _mm256_or_si256(c, _mm256_and_si256(_mm256_srli_epi32(d, 6), _mm256_set1_epi32(0x03000000)));
}

}  // namespace

float dot_q8_0_avx2(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = bytes(vx);
  const uint8_t* y = bytes(vy);
  const int64_t nb = n / kQ8_0Elems;
  float sumf = 0.0f;
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    prefetch_ahead(x, 192);  // the next four blocks (136 bytes)
    __m256i s[4];
    for (int k = 0; k < 4; ++k)
      s[k] = dot32_i8(load256(x + kQ8_0Bytes * k + 2), load256(y + kQ8_0Bytes * k + 2));
    int32_t sumi[4];
    hsum4(s[0], s[1], s[2], s[3], sumi);
    for (int k = 0; k < 4; ++k, x += kQ8_0Bytes, y += kQ8_0Bytes)
      sumf = step_q8_0(sumf, sumi[k], f16(x), f16(y));
  }
  for (; i < nb; ++i, x += kQ8_0Bytes, y += kQ8_0Bytes)
    sumf = step_q8_0(sumf, hsum8(dot32_i8(load256(x + 2), load256(y + 2))), f16(x), f16(y));
  return sumf;
}

float dot_q2_0_avx2(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = bytes(vx);
  const uint8_t* y = bytes(vy);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i one8 = _mm256_set1_epi8(1);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQ2_0Elems; ++i, x += kQ2_0Bytes, y += 2 * kQ8_0Bytes) {
    const __m128i src = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 2));
    __m256i s[2];
    for (int k = 0; k < 2; ++k) {
      const __m256i w = _mm256_sub_epi8(q2_0_codes(src, k), one8);  // q - 1 in -1..2
      s[k] = _mm256_madd_epi16(dot32_small(w, load256(y + kQ8_0Bytes * k + 2)), ones);
    }
    // hadd pairs the two blocks' lanes: after two rounds the low lanes hold the sums.
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_setzero_si256());
    const __m128i t = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    sumf = step_q2_0(sumf, _mm_cvtsi128_si32(t), _mm_extract_epi32(t, 1), f16(x), f16(y),
                     f16(y + kQ8_0Bytes));
  }
  return sumf;
}

float dot_iq2_xxs_avx2(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = bytes(vx);
  const uint8_t* y = bytes(vy);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / 256; ++i, x += kIq2xxsBytes, y += kQ8_KBytes) {
    __m256i acc = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t w0 = ld32(x + 2 + 8 * ib), w1 = ld32(x + 6 + 8 * ib);
      const __m256i w = signed_grid(iq2xxs_grid, w0 & 255, (w0 >> 8) & 255, (w0 >> 16) & 255, w0 >> 24,
                                    w1 & 127, (w1 >> 7) & 127, (w1 >> 14) & 127, (w1 >> 21) & 127);
      const __m256i p = dot32_small(w, load256(y + kQ8_KQs + 32 * ib));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16((short)(2 * (w1 >> 28) + 1))));
    }
    sumf = step_iq2(sumf, hsum8(acc), f16(x), ldf(y));
  }
  return finish_iq2(sumf);
}

float dot_iq2_xs_avx2(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = bytes(vx);
  const uint8_t* y = bytes(vy);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / 256; ++i, x += kIq2xsBytes, y += kQ8_KBytes) {
    __m256i acc = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      // Four 16-bit entries: grid index in bits 0-8, sign index in bits 9-15.
      const uint64_t u = ld64(x + 2 + 8 * ib);
      const __m256i w = signed_grid(iq2xs_grid, (uint32_t)u & 511, (uint32_t)(u >> 16) & 511,
                                    (uint32_t)(u >> 32) & 511, (uint32_t)(u >> 48) & 511,
                                    (uint32_t)(u >> 9) & 127, (uint32_t)(u >> 25) & 127,
                                    (uint32_t)(u >> 41) & 127, (uint32_t)(u >> 57));
      const __m256i p = dot32_small(w, load256(y + kQ8_KQs + 32 * ib));
      // Low 128-bit lane = groups 0,1 (low nibble), high lane = groups 2,3 (high nibble).
      const int sc = x[kIq2xsScales + ib];
      const __m256i scale = _mm256_set_m128i(_mm_set1_epi16((short)(2 * (sc >> 4) + 1)),
                                             _mm_set1_epi16((short)(2 * (sc & 15) + 1)));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale));
    }
    sumf = step_iq2(sumf, hsum8(acc), f16(x), ldf(y));
  }
  return finish_iq2(sumf);
}

float dot_tq2_0_avx2(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = bytes(vx);
  const uint8_t* y = bytes(vy);
  const __m256i three = _mm256_set1_epi8(3);
  const __m256i one8 = _mm256_set1_epi8(1);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / 256; ++i, x += kTq2_0Bytes, y += kQ8_KBytes) {
    // int16 lanes: 8 terms of |(q-1)*y pair| <= 2*2*128 each, at most 4096: no overflow.
    __m256i acc16 = _mm256_setzero_si256();
    for (int c = 0; c < 2; ++c) {
      const __m256i v = load256(x + 32 * c);
      for (int l = 0; l < 4; ++l) {
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(v, 2 * l), three);
        const __m256i yv = load256(y + kQ8_KQs + 128 * c + 32 * l);
        acc16 = _mm256_add_epi16(acc16, dot32_small(_mm256_sub_epi8(q, one8), yv));
      }
    }
    sumf = step_tq2_0(sumf, hsum8(_mm256_madd_epi16(acc16, _mm256_set1_epi16(1))), f16(x + kTq2_0D), ldf(y));
  }
  return sumf;
}

}  // namespace sluice::iquant
