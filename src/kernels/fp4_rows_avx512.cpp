// AVX-512 unpacking of packed FP4 cache rows: bit-identical to fp4_unpack_row (the scalar
// reference). Per block the 16 possible values q * s are computed in f32 and narrowed to BF16 by
// dropping the low half (exact: q * s has at most 6 significant bits; a NaN scale gives
// kBf16Nan, as in the reference), then one 16-bit permute maps the codes to their values.
#include "kernels/avx512_intrinsics.h"

#include <cstring>

#include "kernels/fp.h"
#include "kernels/fp4_rows.h"

namespace sluice {

namespace {

// A constant table, not a namespace-scope __m512: that one is built by a static initializer, and
// running it executes AVX-512 at program start on every machine, with or without AVX-512 (the
// build's isa_initializers test keeps ISA-specific files free of static initializers).
alignas(64) constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// The block's 16 values as BF16 words (kBf16Nan for a NaN scale, as the reference).
inline __m256i block_lut(float s) {
  if (s != s) return _mm256_set1_epi16((short)kBf16Nan);
  const __m512 v = _mm512_mul_ps(_mm512_load_ps(kE2m1), _mm512_set1_ps(s));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16));
}

// 16 bytes of codes -> 32 word indices in element order (low nibble first).
inline __m512i codes32(const uint8_t* q) {
  const __m128i b = _mm_loadu_si128((const __m128i*)q);
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  const __m256i bytes = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
  return _mm512_cvtepu8_epi16(bytes);
}

}  // namespace

void fp4_unpack_row_avx512(Fp4Grid g, const uint8_t* in, size_t n, uint16_t* bf16) {
  const uint8_t* scales = in + n / 2;
  if (g == Fp4Grid::Mxfp4) {  // one block of 32 per step
    for (size_t b = 0; b < n; b += 32) {
      const __m512i lut = _mm512_castsi256_si512(block_lut(e8m0_to_f32(scales[b / 32])));
      _mm512_storeu_si512((void*)(bf16 + b), _mm512_permutexvar_epi16(codes32(in + b / 2), lut));
    }
    return;
  }
  // Nvfp4: two blocks of 16 per step (the second block's codes index words 16..31).
  size_t b = 0;
  for (; b + 32 <= n; b += 32) {
    const __m512i lut = _mm512_inserti64x4(_mm512_castsi256_si512(block_lut(e4m3_to_f32(scales[b / 16]))),
                                           block_lut(e4m3_to_f32(scales[b / 16 + 1])), 1);
    const __m512i idx = _mm512_add_epi16(codes32(in + b / 2),
                                         _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(16), 1));
    _mm512_storeu_si512((void*)(bf16 + b), _mm512_permutexvar_epi16(idx, lut));
  }
  if (b < n) {  // a last single block of 16
    uint8_t q[16] = {};
    std::memcpy(q, in + b / 2, 8);
    const __m512i lut = _mm512_castsi256_si512(block_lut(e4m3_to_f32(scales[b / 16])));
    const __m512i v = _mm512_permutexvar_epi16(codes32(q), lut);
    _mm256_storeu_si256((__m256i*)(bf16 + b), _mm512_castsi512_si256(v));
  }
}

}  // namespace sluice
