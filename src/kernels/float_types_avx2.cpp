// AVX2 kernels of the FLOAT group. Two __m256 accumulators hold lanes 0-7 and 8-15 of the
// canonical dot (float_types.cpp). The tail (< 16 elements) is copied into a zero-filled
// 16-element buffer: the same zero padding the scalar reference walks.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/engram_row.h"

namespace sluice {
namespace {

// e8m0_to_f32 (fp.h) restated here: an inline function from a shared header, if the compiler
// did not inline it, would be emitted with this file's ISA flags and could be the copy the
// linker keeps for the scalar code too. Everything in this file has internal linkage instead.
inline float e8m0_scale(uint8_t e) {
  const uint32_t bits = e == 0 ? 0x00400000u : e == 0xff ? 0x7fc00000u : (uint32_t)e << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct Acc {
  __m256 lo = _mm256_setzero_ps();  // lanes 0-7
  __m256 hi = _mm256_setzero_ps();  // lanes 8-15
  void add16(__m256 w0, __m256 w1, const float* x) {
    lo = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), lo);
    hi = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 8), hi);
  }
  // acc[i] += acc[i+8], acc[i] += acc[i+4], acc[i] += acc[i+2], acc[0] + acc[1].
  float reduce() const {
    const __m256 s8 = _mm256_add_ps(lo, hi);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
  }
};

// Copies the last `left` (< 16) weights/activations into zero-filled buffers.
template <class T>
void pad_tail(const T* w, const float* x, int64_t left, T (&wbuf)[16], float (&xbuf)[16]) {
  std::memset(wbuf, 0, sizeof wbuf);
  std::memset(xbuf, 0, sizeof xbuf);
  std::memcpy(wbuf, w, (size_t)left * sizeof(T));
  std::memcpy(xbuf, x, (size_t)left * sizeof(float));
}

inline __m256 f16x8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

inline __m256 bf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// e4m3_to_f32 for 8 codes; see float_types_avx512.cpp for why subnormals take a separate path.
inline __m256 e4m3x8(const uint8_t* p) {
  const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7f));
  const __m256 normal =
      _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23)));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(c, _mm256_set1_epi32(7))),
                                   _mm256_set1_ps(0x1p-9f));
  const __m256 is_sub = _mm256_castsi256_ps(
      _mm256_cmpeq_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x78)), _mm256_setzero_si256()));
  __m256 v = _mm256_blendv_ps(normal, sub, is_sub);
  v = _mm256_or_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24)));
  const __m256 is_nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f)));
  return _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), is_nan);
}

// round_bf16 (f32_to_bf16 then back) for 8 floats.
inline __m256 round_bf16x8(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
  const __m256i rounded =
      _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), hi);
  const __m256i quiet = _mm256_and_si256(_mm256_or_si256(x, _mm256_set1_epi32(0x00400000)), hi);
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                            _mm256_set1_epi32(0x7f800000));
  return _mm256_castsi256_ps(_mm256_blendv_epi8(rounded, quiet, is_nan));
}

}  // namespace

float dot_f32_avx2(const void* w, const void* x, int64_t n) {
  const auto* pw = static_cast<const float*>(w);
  const auto* px = static_cast<const float*>(x);
  Acc acc;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc.add16(_mm256_loadu_ps(pw + i), _mm256_loadu_ps(pw + i + 8), px + i);
  if (i < n) {
    float wb[16], xb[16];
    pad_tail(pw + i, px + i, n - i, wb, xb);
    acc.add16(_mm256_loadu_ps(wb), _mm256_loadu_ps(wb + 8), xb);
  }
  return acc.reduce();
}

float dot_f16_avx2(const void* w, const void* x, int64_t n) {
  const auto* pw = static_cast<const uint16_t*>(w);
  const auto* px = static_cast<const float*>(x);
  Acc acc;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc.add16(f16x8(pw + i), f16x8(pw + i + 8), px + i);
  if (i < n) {
    uint16_t wb[16];
    float xb[16];
    pad_tail(pw + i, px + i, n - i, wb, xb);
    acc.add16(f16x8(wb), f16x8(wb + 8), xb);
  }
  return acc.reduce();
}

float dot_bf16_avx2(const void* w, const void* x, int64_t n) {
  const auto* pw = static_cast<const uint16_t*>(w);
  const auto* px = static_cast<const float*>(x);
  Acc acc;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) acc.add16(bf16x8(pw + i), bf16x8(pw + i + 8), px + i);
  if (i < n) {
    uint16_t wb[16];
    float xb[16];
    pad_tail(pw + i, px + i, n - i, wb, xb);
    acc.add16(bf16x8(wb), bf16x8(wb + 8), xb);
  }
  return acc.reduce();
}

// n = head_dim, a multiple of 32: each scale covers two 16-lane steps, no tail.
float dot_engram_avx2(const void* w, const void* x, int64_t n) {
  const auto* codes = static_cast<const uint8_t*>(w);
  const uint8_t* scales = codes + n;
  const auto* px = static_cast<const float*>(x);
  Acc acc;
  for (int64_t b = 0; b < n / kEngramBlock; ++b) {
    const __m256 s = _mm256_set1_ps(e8m0_scale(scales[b]));
    for (int half = 0; half < 2; ++half) {
      const int64_t i = b * kEngramBlock + half * 16;
      acc.add16(round_bf16x8(_mm256_mul_ps(e4m3x8(codes + i), s)),
                round_bf16x8(_mm256_mul_ps(e4m3x8(codes + i + 8), s)), px + i);
    }
  }
  return acc.reduce();
}

}  // namespace sluice
