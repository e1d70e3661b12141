// AVX-512 kernels of the FLOAT group. One __m512 accumulator holds the 16 lanes of the canonical
// dot (float_types.cpp); the tail uses zero-filling masked loads, which is exactly the zero
// padding the scalar reference walks.
#include "kernels/avx512_intrinsics.h"

#include <cstdint>
#include <cstring>

#include "kernels/engram_row.h"

namespace sluice {
namespace {

// acc[i] += acc[i+8], acc[i] += acc[i+4], acc[i] += acc[i+2], acc[0] + acc[1]: same operand
// order as the scalar reference (it matters only for NaN payloads, but costs nothing).
inline float reduce16(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// e8m0_to_f32 (fp.h) restated here: an inline function from a shared header, if the compiler
// did not inline it, would be emitted with this file's ISA flags and could be the copy the
// linker keeps for the scalar code too. Everything in this file has internal linkage instead.
inline float e8m0_scale(uint8_t e) {
  const uint32_t bits = e == 0 ? 0x00400000u : e == 0xff ? 0x7fc00000u : (uint32_t)e << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline __mmask16 tail_mask(int64_t left) { return (__mmask16)((1u << left) - 1u); }

inline __m512 bf16_to_ps(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// e4m3_to_f32 for 16 codes. Normal codes are rebiased in the integer domain and subnormal codes
// computed as m * 2^-9, so no step depends on the denormals-are-zero mode.
inline __m512 e4m3_to_ps(__m128i bytes) {
  const __m512i c = _mm512_cvtepu8_epi32(bytes);
  const __m512i mag = _mm512_and_si512(c, _mm512_set1_epi32(0x7f));
  const __m512 normal =
      _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23)));
  const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(c, _mm512_set1_epi32(7))),
                                   _mm512_set1_ps(0x1p-9f));
  const __mmask16 is_sub = _mm512_testn_epi32_mask(c, _mm512_set1_epi32(0x78));
  __m512 v = _mm512_mask_mov_ps(normal, is_sub, sub);
  v = _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_castps_si512(v), _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24)));
  const __mmask16 is_nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7f));
  return _mm512_mask_mov_ps(v, is_nan, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
}

// round_bf16 (f32_to_bf16 then back) for 16 floats.
inline __m512 round_bf16_ps(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
  const __m512i rounded =
      _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), hi);
  const __m512i quiet = _mm512_and_si512(_mm512_or_si512(x, _mm512_set1_epi32(0x00400000)), hi);
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                   _mm512_set1_epi32(0x7f800000));
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(rounded, is_nan, quiet));
}

}  // namespace

float dot_f32_avx512(const void* w, const void* x, int64_t n) {
  const auto* pw = static_cast<const float*>(w);
  const auto* px = static_cast<const float*>(x);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(pw + i), _mm512_loadu_ps(px + i), acc);
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, pw + i), _mm512_maskz_loadu_ps(m, px + i), acc);
  }
  return reduce16(acc);
}

float dot_f16_avx512(const void* w, const void* x, int64_t n) {
  const auto* pw = static_cast<const uint16_t*>(w);
  const auto* px = static_cast<const float*>(x);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 wv = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pw + i)));
    acc = _mm512_fmadd_ps(wv, _mm512_loadu_ps(px + i), acc);
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 wv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, pw + i));
    acc = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, px + i), acc);
  }
  return reduce16(acc);
}

float dot_bf16_avx512(const void* w, const void* x, int64_t n) {
  const auto* pw = static_cast<const uint16_t*>(w);
  const auto* px = static_cast<const float*>(x);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 wv = bf16_to_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pw + i)));
    acc = _mm512_fmadd_ps(wv, _mm512_loadu_ps(px + i), acc);
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    acc = _mm512_fmadd_ps(bf16_to_ps(_mm256_maskz_loadu_epi16(m, pw + i)), _mm512_maskz_loadu_ps(m, px + i), acc);
  }
  return reduce16(acc);
}

// n = head_dim, a multiple of 32, so there is no tail: each scale covers two 16-lane steps.
float dot_engram_avx512(const void* w, const void* x, int64_t n) {
  const auto* codes = static_cast<const uint8_t*>(w);
  const uint8_t* scales = codes + n;
  const auto* px = static_cast<const float*>(x);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < n / kEngramBlock; ++b) {
    const __m512 s = _mm512_set1_ps(e8m0_scale(scales[b]));
    for (int half = 0; half < 2; ++half) {
      const int64_t i = b * kEngramBlock + half * 16;
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
      const __m512 wv = round_bf16_ps(_mm512_mul_ps(e4m3_to_ps(c), s));
      acc = _mm512_fmadd_ps(wv, _mm512_loadu_ps(px + i), acc);
    }
  }
  return reduce16(acc);
}

}  // namespace sluice
