// Q2_K blocks with AVX-512 VBMI, shared by the dot (kquant_types_avx512.cpp) and the one-token
// GEMM path (gemv_q2_k_avx512.cpp). Only included by files compiled with the AVX-512 flags;
// internal linkage (see kquant_blocks.h).
//
// A block's 16 sub-block scales s and its 2-bit codes q meet in two VBMI byte permutes: once per
// block a 64-entry table T[4k + q] = s_k * q (<= 45) is looked up from the constant products table,
// then per 64 elements one permute picks T[4k + q] for each element's sub-block k and code q, so
// dpbusd forms s*q*y straight into the accumulator. Zen 4 runs the variable word shifts
// (srlv_epi16) and the per-lane scale multiplies of the other K-quant dots slowly; these kernels
// use neither. The tables are built at compile time so that a call (a row of as few as 9 blocks)
// only loads them.
#pragma once
#include "kernels/avx512_intrinsics.h"

#include <cstdint>

#include "kernels/kquant_blocks.h"

namespace sluice::kquant {
namespace {

struct Q2kTables {
  alignas(64) uint8_t products[64];       // [16q + s] = s * q
  alignas(64) uint8_t spread[64];         // [4k + q] = k
  alignas(64) uint8_t lane_base[4][64];   // the dot's chunk m, lane l (sub-block 4m + l): 4(4m + l)
  alignas(64) uint8_t shift_ctl[2][64];   // vpmultishiftqb: bits from 8b + 2j (low half), 8b + 2j + 2
  alignas(64) uint8_t group_base[4][64];  // all 64 code bytes shifted by 2j: byte b's sub-block, times 4
};
constexpr Q2kTables make_q2k_tables() {
  Q2kTables t{};
  for (int i = 0; i < 64; ++i) {
    t.products[i] = (uint8_t)((i % 16) * (i / 16));
    t.spread[i] = (uint8_t)(i / 4);
    for (int m = 0; m < 4; ++m) t.lane_base[m][i] = (uint8_t)(4 * (4 * m + i / 16));
    for (int j = 0; j < 2; ++j) t.shift_ctl[j][i] = (uint8_t)(8 * (i % 8) + 4 * j + (i >= 32 ? 2 : 0));
    // Code byte i, bits 2j..2j+1: element 128(i / 32) + 32j + i % 32, sub-block 8(i / 32) + 2j + (i % 32) / 16.
    for (int j = 0; j < 4; ++j) t.group_base[j][i] = (uint8_t)(4 * (8 * (i / 32) + 2 * j + (i % 32) / 16));
  }
  return t;
}
alignas(64) constexpr Q2kTables kQ2kTables = make_q2k_tables();

struct Q2kConstants {
  __m512i products, spread, code_rows, m15, m3, lane_base[4], shift_ctl[2], group_base[4];
  __m128i m15x;
  Q2kConstants() {
    const Q2kTables& t = kQ2kTables;
    products = _mm512_load_si512((const void*)t.products);
    spread = _mm512_load_si512((const void*)t.spread);
    for (int m = 0; m < 4; ++m) lane_base[m] = _mm512_load_si512((const void*)t.lane_base[m]);
    for (int j = 0; j < 2; ++j) shift_ctl[j] = _mm512_load_si512((const void*)t.shift_ctl[j]);
    for (int j = 0; j < 4; ++j) group_base[j] = _mm512_load_si512((const void*)t.group_base[j]);
    code_rows = _mm512_set1_epi32(0x30201000);  // [4k + q] = 16q
    m15 = _mm512_set1_epi8(15);
    m3 = _mm512_set1_epi8(3);
    m15x = _mm_set1_epi8(15);
  }
};

// T[4k + q] = (sc_k & 15) * q from the block's 16 scale bytes.
inline __m512i q2k_scaled_code_table(const Q2kConstants& k, __m128i scb) {
  const __m512i spread_scales = _mm512_permutexvar_epi8(k.spread, _mm512_castsi128_si512(scb));
  return _mm512_permutexvar_epi8(_mm512_ternarylogic_epi32(spread_scales, k.m15, k.code_rows, 0xEA), k.products);  // (a & b) | c
}

// summs = sum_k (sc_k >> 4) * bsums_k, in 8 int32 lanes (the activation's stored bsums, as the
// scalar uses them).
inline __m256i q2k_min_sums(const Q2kConstants& k, __m128i scb, const uint8_t* bsums) {
  const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(scb, 4), k.m15x));
  return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i*)bsums), mins);
}

}  // namespace
}  // namespace sluice::kquant
