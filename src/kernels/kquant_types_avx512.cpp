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
#include "kernels/q2_k_avx512.h"

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

// Q2_K (the scaled-code table of q2_k_avx512.h; a multishift moves the codes into place, since
// the dot reads the activation as it is, 32 bytes per shift pair). Four (or two) blocks
// share one horizontal reduction of their code and min sums and one vector tail: the same float
// operations, in the same order, as q2k_tail's. In cache on Zen 4: 31 -> 22.6 cycles a block.
namespace {

// One block's integer sums, still in vectors: the codes' sum folded to 8 lanes (r), the mins'
// (bsums x mins) in 8 (mp).
inline void q2k_block_sums(const Q2kConstants& k, const uint8_t* x, const uint8_t* y, __m256i& r, __m256i& mp) {
  prefetch_ahead(x, 128);  // 84 bytes a block
  const __m128i scb = load128(x + q2k::kScales);
  const __m512i table = q2k_scaled_code_table(k, scb);
  mp = q2k_min_sums(k, scb, y + q8k::kBsums);
  __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
  for (int m = 0; m < 4; ++m) {  // elements 64m..64m+63: h = m/2, j = 2(m%2) and 2(m%2)+1
    const int h = m / 2;
    // Every byte shifted right by 2j (low half) and 2j + 2 (high half): one multishift.
    const __m512i codes = _mm512_multishift_epi64_epi8(k.shift_ctl[m % 2], dup256(x + q2k::kQs + 32 * h));
    const __m512i sq = _mm512_permutexvar_epi8(_mm512_ternarylogic_epi32(codes, k.m3, k.lane_base[m], 0xEA), table);
    if (m % 2 == 0) acc0 = _mm512_dpbusd_epi32(acc0, sq, load512(y + q8k::kQs + 64 * m));
    else acc1 = _mm512_dpbusd_epi32(acc1, sq, load512(y + q8k::kQs + 64 * m));
  }
  const __m512i acc = _mm512_add_epi32(acc0, acc1);
  r = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
}

// [y.d * d, y.d * dmin]: q2k_tail's dall and dmin (d and dmin are adjacent fp16s).
inline __m128 q2k_factors(const uint8_t* x, const uint8_t* y) {
  int32_t dd;
  std::memcpy(&dd, x + q2k::kD, 4);
  return _mm_mul_ps(_mm_set1_ps(load_f32_at(y + q8k::kD)), _mm_cvtph_ps(_mm_cvtsi32_si128(dd)));
}

}  // namespace

float dot_q2_k_avx512(const void* vx, const void* vy, int64_t n) {
  static_assert(q2k::kDmin == q2k::kD + 2, "q2k_factors loads d and dmin together");
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  const Q2kConstants k;
  const int64_t nb = n / kQK;
  float sumf = 0.0f;
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4, x += 4 * q2k::kBytes, y += 4 * q8k::kBytes) {
    __m256i r[4], mp[4];
    for (int b = 0; b < 4; ++b) q2k_block_sums(k, x + b * q2k::kBytes, y + b * q8k::kBytes, r[b], mp[b]);
    const __m256i g01 = _mm256_hadd_epi32(_mm256_hadd_epi32(r[0], mp[0]), _mm256_hadd_epi32(r[1], mp[1]));
    const __m256i g23 = _mm256_hadd_epi32(_mm256_hadd_epi32(r[2], mp[2]), _mm256_hadd_epi32(r[3], mp[3]));
    const __m256i u = _mm256_add_epi32(_mm256_permute2x128_si256(g01, g23, 0x20),
                                       _mm256_permute2x128_si256(g01, g23, 0x31));  // [Ra, Ma, Rb, Mb, Rc, Mc, Rd, Md]
    const __m256 f = _mm256_set_m128(
        _mm_movelh_ps(q2k_factors(x + 2 * q2k::kBytes, y + 2 * q8k::kBytes), q2k_factors(x + 3 * q2k::kBytes, y + 3 * q8k::kBytes)),
        _mm_movelh_ps(q2k_factors(x, y), q2k_factors(x + q2k::kBytes, y + q8k::kBytes)));
    const __m256 p = _mm256_mul_ps(f, _mm256_cvtepi32_ps(u));
    const __m256 d = _mm256_hsub_ps(p, p);  // [a, b, a, b, c, d, c, d]
    const __m128 ab = _mm256_castps256_ps128(d), cd = _mm256_extractf128_ps(d, 1);
    sumf += _mm_cvtss_f32(ab);
    sumf += _mm_cvtss_f32(_mm_movehdup_ps(ab));
    sumf += _mm_cvtss_f32(cd);
    sumf += _mm_cvtss_f32(_mm_movehdup_ps(cd));
  }
  for (; i + 2 <= nb; i += 2, x += 2 * q2k::kBytes, y += 2 * q8k::kBytes) {
    __m256i ra, ma, rb, mb;
    q2k_block_sums(k, x, y, ra, ma);
    q2k_block_sums(k, x + q2k::kBytes, y + q8k::kBytes, rb, mb);
    const __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(ra, ma), _mm256_hadd_epi32(rb, mb));
    const __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));  // [Ra, Ma, Rb, Mb]
    const __m128 f = _mm_movelh_ps(q2k_factors(x, y), q2k_factors(x + q2k::kBytes, y + q8k::kBytes));
    const __m128 p = _mm_mul_ps(f, _mm_cvtepi32_ps(u));
    const __m128 d = _mm_hsub_ps(p, p);  // [dall_a*Ra - dmin_a*Ma, dall_b*Rb - dmin_b*Mb, ..]
    sumf += _mm_cvtss_f32(d);
    sumf += _mm_cvtss_f32(_mm_movehdup_ps(d));
  }
  for (; i < nb; ++i, x += q2k::kBytes, y += q8k::kBytes) {
    __m256i r, mp;
    q2k_block_sums(k, x, y, r, mp);
    const __m256i t = _mm256_hadd_epi32(r, mp);
    const __m128i u0 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    const __m128i u = _mm_hadd_epi32(u0, u0);
    sumf = q2k_tail(sumf, load_f32_at(y + q8k::kD), f16c_at(x + q2k::kD), f16c_at(x + q2k::kDmin),
                    _mm_cvtsi128_si32(u), _mm_extract_epi32(u, 1));
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
