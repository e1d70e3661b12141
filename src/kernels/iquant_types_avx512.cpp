// AVX-512 (F/BW/VL/DQ/VNNI) dot products of the iquant group. As in the AVX2 file, vectors only
// produce the exact integer sums; each block's float part is the shared step function of
// iquant_types.h (Q8_0 does step_q8_0's two products for eight blocks lane by lane, the same
// operations in the same order, and only its sum block by block), so the result is the scalar
// reference's bit for bit, for every byte pattern.
// GCC 12's AVX-512 intrinsic headers seed results with _mm512_undefined_*(), which -O3 inlining
// reports as maybe-uninitialized (a known false positive); silence it for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "kernels/avx512_intrinsics.h"

#include <cstring>

#include "kernels/iq2_xxs_avx512.h"
#include "kernels/iq_tables.h"
#include "kernels/iquant_types.h"
#include "kernels/prefetch.h"

namespace sluice::iquant {
namespace {

inline const uint8_t* bytes(const void* p) { return static_cast<const uint8_t*>(p); }
inline uint16_t ld16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
inline uint64_t ld64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }
inline float ldf(const uint8_t* p) { float v; std::memcpy(&v, p, 4); return v; }
inline float f16(const uint8_t* p) { return _cvtsh_ss(ld16(p)); }
inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m512i load512(const uint8_t* p) { return _mm512_loadu_si512(p); }
// Two separate 32-byte runs as one vector (low half = a).
inline __m512i load2x256(const uint8_t* a, const uint8_t* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load256(a)), load256(b), 1);
}

inline int32_t hsum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// Signed int8 x signed int8 over 32 bytes as 8 int32 partial sums, with VNNI. dpbusd wants an
// unsigned operand, so a is offset to a + 128 (a xor 0x80) and 128 * sum(b) is taken off again:
// exact for every byte pattern, -128 included, and dpbusd does not saturate.
inline __m256i dot32_i8(__m256i a, __m256i b) {
  const __m256i bias = _mm256_set1_epi8((char)0x80);
  const __m256i zero = _mm256_setzero_si256();
  return _mm256_sub_epi32(_mm256_dpbusd_epi32(zero, _mm256_xor_si256(a, bias), b),
                          _mm256_dpbusd_epi32(zero, bias, b));
}

// Two IQ2 sub-blocks (64 elements): grid magnitudes g (unsigned, <= 43), their sign masks m (0xff =
// negated, from ksigns_mask_iq2xs), activations y, and per-half multipliers (2s+1 as int16).
// The product's sign is the grid sign xor the sign of y; it is applied to the grid bytes (which
// never wraps), and |y| is a valid unsigned operand even for -128 (0x80 = 128).
inline __m512i iq2_accumulate(__m512i acc, __m512i g, __m512i m, __m512i yv, __m512i mult) {
  const __mmask64 neg = _mm512_movepi8_mask(_mm512_xor_si512(m, yv));
  const __m512i w = _mm512_mask_sub_epi8(g, neg, _mm512_setzero_si512(), g);
  const __m512i p = _mm512_maddubs_epi16(_mm512_abs_epi8(yv), w);  // |pair| <= 2*43*128
  return _mm512_dpwssd_epi32(acc, p, mult);
}

// Eight table entries (grid rows or sign masks) as one vector.
inline __m512i gather8(const uint64_t* t, const uint32_t i[8]) {
  return _mm512_setr_epi64((long long)t[i[0]], (long long)t[i[1]], (long long)t[i[2]], (long long)t[i[3]],
                           (long long)t[i[4]], (long long)t[i[5]], (long long)t[i[6]], (long long)t[i[7]]);
}


}  // namespace

float dot_q8_0_avx512(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = bytes(vx);
  const uint8_t* y = bytes(vy);
  const int64_t nb = n / kQ8_0Elems;
  const __m512i bias = _mm512_set1_epi8((char)0x80);
  const __m512i zero = _mm512_setzero_si512();
  float sumf = 0.0f;
  int64_t i = 0;
  // The eight blocks' scales, 34 bytes apart (each gather lane reads d and two codes of its block).
  const __m256i scale_at = _mm256_setr_epi32(0, 34, 68, 102, 136, 170, 204, 238);
  // Block k's sum ends up in dword 4 * (k & 3) + (k >> 2) of the reduction below.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  // Eight blocks per step, two per zmm (block 2k in the low half of s[k], 2k + 1 in the high
  // half); each block's 8 partial sums stay in their own lanes until the reduction.
  for (; i + 8 <= nb; i += 8) {
    prefetch_ahead(x, 320);  // the next eight blocks (272 bytes); the activations stay in cache
    __m512i s[4];
    for (int k = 0; k < 4; ++k) {
      const uint8_t* xk = x + kQ8_0Bytes * 2 * k + 2;
      const uint8_t* yk = y + kQ8_0Bytes * 2 * k + 2;
      const __m512i yv = load2x256(yk, yk + kQ8_0Bytes);
      const __m512i xv = _mm512_xor_si512(load2x256(xk, xk + kQ8_0Bytes), bias);
      s[k] = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, xv, yv), _mm512_dpbusd_epi32(zero, bias, yv));
    }
    // 128-bit lane k of p0 = 4 partial sums of block k, of p1 = of block 4 + k.
    const __m512i p0 = _mm512_add_epi32(_mm512_shuffle_i32x4(s[0], s[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_i32x4(s[0], s[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i p1 = _mm512_add_epi32(_mm512_shuffle_i32x4(s[2], s[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_i32x4(s[2], s[3], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i q = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
    const __m512i r = _mm512_add_epi32(q, _mm512_shuffle_epi32(q, _MM_PERM_BADC));
    const __m256i sumi = _mm512_castsi512_si256(_mm512_permutexvar_epi32(order, r));
    // step_q8_0's two products for the eight blocks, lane by lane (the same IEEE operations on
    // the same operands, so the same bits); only its sum runs block by block, in order.
    const __m256 dx = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_i32gather_epi32((const int*)x, scale_at, 1)));
    const __m256 dy = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_i32gather_epi32((const int*)y, scale_at, 1)));
    alignas(32) float term[8];
    _mm256_store_ps(term, _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dx, dy)));
    for (int k = 0; k < 8; ++k) sumf = sumf + term[k];
    x += 8 * kQ8_0Bytes;
    y += 8 * kQ8_0Bytes;
  }
  for (; i < nb; ++i, x += kQ8_0Bytes, y += kQ8_0Bytes)
    sumf = step_q8_0(sumf, hsum8(dot32_i8(load256(x + 2), load256(y + 2))), f16(x), f16(y));
  return sumf;
}

float dot_q2_0_avx512(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = bytes(vx);
  const uint8_t* y = bytes(vy);
  // 128-bit lane i takes source bytes 4i..4i+3, each four times: dword b = source byte b.
  const __m512i spread = _mm512_set_epi32(0x0f0f0f0f, 0x0e0e0e0e, 0x0d0d0d0d, 0x0c0c0c0c,  //
                                          0x0b0b0b0b, 0x0a0a0a0a, 0x09090909, 0x08080808,  //
                                          0x07070707, 0x06060606, 0x05050505, 0x04040404,  //
                                          0x03030303, 0x02020202, 0x01010101, 0x00000000);
  const __m512i one8 = _mm512_set1_epi8(1);
  const __m512i zero = _mm512_setzero_si512();
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQ2_0Elems; ++i, x += kQ2_0Bytes, y += 2 * kQ8_0Bytes) {
    // pshufb indexes within each 128-bit lane, so broadcast the 16 source bytes to every lane.
    const __m512i d = _mm512_shuffle_epi8(
        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 2))), spread);
    // Byte l of every dword keeps bits 2l..2l+1 of its source byte: codes in element order.
    __m512i c = _mm512_and_si512(d, _mm512_set1_epi32(0x00000003));
    c = _mm512_or_si512(c, _mm512_and_si512(_mm512_srli_epi32(d, 2), _mm512_set1_epi32(0x00000300)));
    c = _mm512_or_si512(c, _mm512_and_si512(_mm512_srli_epi32(d, 4), _mm512_set1_epi32(0x00030000)));
    c = _mm512_or_si512(c, _mm512_and_si512(_mm512_srli_epi32(d, 6), _mm512_set1_epi32(0x03000000)));
    const __m512i yv = load2x256(y + 2, y + kQ8_0Bytes + 2);
    // sum (q-1)*y = sum q*y - sum y; q <= 3 is unsigned, so dpbusd is exact.
    const __m512i s = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, c, yv), _mm512_dpbusd_epi32(zero, one8, yv));
    sumf = step_q2_0(sumf, hsum8(_mm512_castsi512_si256(s)), hsum8(_mm512_extracti64x4_epi64(s, 1)), f16(x),
                     f16(y), f16(y + kQ8_0Bytes));
  }
  return sumf;
}

float dot_iq2_xxs_avx512(const void* vx, const void* vy, int64_t n) {
  static const Iq2xxsDecoder dec(128);  // values + 128: vpdpbusd's unsigned operand
  const uint8_t* x = bytes(vx);
  const uint8_t* y = bytes(vy);
  const __m512i bias = _mm512_set1_epi8((char)0x80);
  const __m512i one = _mm512_set1_epi64(1);
  const __m512i zero = _mm512_setzero_si512();
  // Vector k holds sub-blocks 2k (low half) and 2k + 1: their multipliers sit in dwords 4k, 4k + 2.
  const __m512i mult_at[4] = {_mm512_inserti64x4(_mm512_set1_epi32(0), _mm256_set1_epi32(2), 1),
                              _mm512_inserti64x4(_mm512_set1_epi32(4), _mm256_set1_epi32(6), 1),
                              _mm512_inserti64x4(_mm512_set1_epi32(8), _mm256_set1_epi32(10), 1),
                              _mm512_inserti64x4(_mm512_set1_epi32(12), _mm256_set1_epi32(14), 1)};
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / 256; ++i, x += kIq2xxsBytes, y += kQ8_KBytes) {
    prefetch_ahead(x, 128);  // a block is 66 bytes: two lines cover it
    __m512i v[4];
    const __m512i in = dec.decode(x, v);
    const __m512i mult = _mm512_or_si512(_mm512_slli_epi64(_mm512_srli_epi64(in, 60), 1), one);  // 2s+1
    __m512i acc = zero;
    for (int k = 0; k < 4; ++k) {
      // sum (v + 128) * y - 128 * sum y per 4 elements: the exact signed sub-dot partials.
      const __m512i yv = load512(y + kQ8_KQs + 64 * k);
      const __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, v[k], yv), _mm512_dpbusd_epi32(zero, bias, yv));
      acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(p, _mm512_permutexvar_epi32(mult_at[k], mult)));
    }
    sumf = step_iq2(sumf, _mm512_reduce_add_epi32(acc), f16(x), ldf(y));
  }
  return finish_iq2(sumf);
}

float dot_iq2_xs_avx512(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = bytes(vx);
  const uint8_t* y = bytes(vy);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / 256; ++i, x += kIq2xsBytes, y += kQ8_KBytes) {
    __m512i acc = _mm512_setzero_si512();
    for (int ib = 0; ib < 8; ib += 2) {
      // Eight 16-bit entries: grid index in bits 0-8, sign index in bits 9-15.
      const uint64_t u0 = ld64(x + 2 + 8 * ib), u1 = ld64(x + 10 + 8 * ib);
      const uint32_t gidx[8] = {(uint32_t)u0 & 511, (uint32_t)(u0 >> 16) & 511, (uint32_t)(u0 >> 32) & 511,
                                (uint32_t)(u0 >> 48) & 511, (uint32_t)u1 & 511, (uint32_t)(u1 >> 16) & 511,
                                (uint32_t)(u1 >> 32) & 511, (uint32_t)(u1 >> 48) & 511};
      const uint32_t sidx[8] = {(uint32_t)(u0 >> 9) & 127, (uint32_t)(u0 >> 25) & 127, (uint32_t)(u0 >> 41) & 127,
                                (uint32_t)(u0 >> 57), (uint32_t)(u1 >> 9) & 127, (uint32_t)(u1 >> 25) & 127,
                                (uint32_t)(u1 >> 41) & 127, (uint32_t)(u1 >> 57)};
      const int s0 = x[kIq2xsScales + ib], s1 = x[kIq2xsScales + ib + 1];
      const __m512i mult = _mm512_inserti32x8(
          _mm512_castsi256_si512(_mm256_set_m128i(_mm_set1_epi16((short)(2 * (s0 >> 4) + 1)),
                                                  _mm_set1_epi16((short)(2 * (s0 & 15) + 1)))),
          _mm256_set_m128i(_mm_set1_epi16((short)(2 * (s1 >> 4) + 1)), _mm_set1_epi16((short)(2 * (s1 & 15) + 1))),
          1);
      acc = iq2_accumulate(acc, gather8(iq2xs_grid, gidx), gather8(ksigns_mask_iq2xs, sidx),
                           load512(y + kQ8_KQs + 32 * ib), mult);
    }
    sumf = step_iq2(sumf, _mm512_reduce_add_epi32(acc), f16(x), ldf(y));
  }
  return finish_iq2(sumf);
}

float dot_tq2_0_avx512(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = bytes(vx);
  const uint8_t* y = bytes(vy);
  const __m512i three = _mm512_set1_epi8(3);
  const __m512i one8 = _mm512_set1_epi8(1);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / 256; ++i, x += kTq2_0Bytes, y += kQ8_KBytes) {
    // Low half: qs[0..31] (elements 0..127), high half: qs[32..63] (elements 128..255).
    const __m512i v = load512(x);
    __m512i acc = _mm512_setzero_si512(), ysum = _mm512_setzero_si512();
    for (int l = 0; l < 4; ++l) {
      const __m512i q = _mm512_and_si512(_mm512_srli_epi16(v, 2 * l), three);
      const uint8_t* yq = y + kQ8_KQs + 32 * l;
      const __m512i yv = load2x256(yq, yq + 128);
      acc = _mm512_dpbusd_epi32(acc, q, yv);        // sum q*y, q <= 3 unsigned: exact
      ysum = _mm512_dpbusd_epi32(ysum, one8, yv);   // sum y, taken off below: (q-1)*y
    }
    sumf = step_tq2_0(sumf, _mm512_reduce_add_epi32(_mm512_sub_epi32(acc, ysum)), f16(x + kTq2_0D), ldf(y));
  }
  return sumf;
}

}  // namespace sluice::iquant
