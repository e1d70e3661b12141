// AVX2 unpacking of packed FP4 cache rows: bit-identical to fp4_unpack_row (the scalar
// reference). As in the AVX-512 kernel, a block's 16 values q * s are computed in f32 and
// narrowed to BF16 by dropping the low half (exact); without a 16-bit permute, the codes then
// look up the values' low and high bytes with two byte shuffles.
#include <immintrin.h>

#include "kernels/fp.h"
#include "kernels/fp4_rows.h"

namespace sluice {

namespace {

struct ByteTables {
  __m128i lo, hi;  // byte 0 / byte 1 of the 16 BF16 values, indexed by code
};

inline ByteTables block_tables(float s) {
  if (s != s) return {_mm_set1_epi8((char)(kBf16Nan & 0xff)), _mm_set1_epi8((char)(kBf16Nan >> 8))};  // as the reference
  const __m256 vs = _mm256_set1_ps(s);
  const __m256 a = _mm256_mul_ps(_mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f), vs);
  const __m256 b = _mm256_mul_ps(_mm256_setr_ps(-0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f), vs);
  // packus works per 128-bit lane: words [a0-3, b0-3 | a4-7, b4-7], reordered to a0-7, b0-7.
  __m256i w = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(a), 16),
                                  _mm256_srli_epi32(_mm256_castps_si256(b), 16));
  w = _mm256_permute4x64_epi64(w, 0xd8);
  // Per lane: its 8 low bytes, then its 8 high bytes.
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  w = _mm256_shuffle_epi8(w, split);
  const __m128i l0 = _mm256_castsi256_si128(w), l1 = _mm256_extracti128_si256(w, 1);
  return {_mm_unpacklo_epi64(l0, l1), _mm_unpackhi_epi64(l0, l1)};
}

}  // namespace

void fp4_unpack_row_avx2(Fp4Grid g, const uint8_t* in, size_t n, uint16_t* bf16) {
  const uint8_t* scales = in + n / 2;
  const __m128i m = _mm_set1_epi8(0x0f);
  if (g == Fp4Grid::Mxfp4) {  // a block of 32 per step
    for (size_t b = 0; b < n; b += 32) {
      const ByteTables t = block_tables(e8m0_to_f32(scales[b / 32]));
      const __m128i q = _mm_loadu_si128((const __m128i*)(in + b / 2));
      const __m128i lo = _mm_and_si128(q, m), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
      const __m256i idx = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));  // e0-15 | e16-31
      const __m256i L = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(t.lo), idx);
      const __m256i H = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(t.hi), idx);
      const __m256i w1 = _mm256_unpacklo_epi8(L, H), w2 = _mm256_unpackhi_epi8(L, H);  // e0-7,e16-23 | e8-15,e24-31
      _mm256_storeu_si256((__m256i*)(bf16 + b), _mm256_permute2x128_si256(w1, w2, 0x20));
      _mm256_storeu_si256((__m256i*)(bf16 + b + 16), _mm256_permute2x128_si256(w1, w2, 0x31));
    }
    return;
  }
  for (size_t b = 0; b < n; b += 16) {  // Nvfp4: a block of 16 per step
    const ByteTables t = block_tables(e4m3_to_f32(scales[b / 16]));
    const __m128i q = _mm_loadl_epi64((const __m128i*)(in + b / 2));
    const __m128i lo = _mm_and_si128(q, m), hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
    const __m128i idx = _mm_unpacklo_epi8(lo, hi);  // e0-15
    const __m128i L = _mm_shuffle_epi8(t.lo, idx), H = _mm_shuffle_epi8(t.hi, idx);
    _mm_storeu_si128((__m128i*)(bf16 + b), _mm_unpacklo_epi8(L, H));
    _mm_storeu_si128((__m128i*)(bf16 + b + 8), _mm_unpackhi_epi8(L, H));
  }
}

}  // namespace sluice
