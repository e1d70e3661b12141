// IQ2_XXS blocks decoded with AVX-512 VBMI byte permutes instead of per-group table loads, shared by
// the GEMV dot (iquant_types_avx512.cpp) and the GEMM tile packer (gemm_iq2_xxs_avx512.cpp). Only
// included by files compiled with the AVX-512 flags; internal linkage (see kquant_blocks.h).
//
// A block is d (fp16) and, per sub-block of 32, four grid index bytes and a dword holding four 7-bit
// sign indices and a 4-bit scale: bytes 2..65 are one 64-byte load, qword sb = sub-block sb. Every
// grid byte is 8, 25 or 43, so a grid row is eight 2-bit codes (16 bits): two 256-entry byte tables
// (codes of elements 0-3, of 4-7), each looked up for all 32 indices by two vpermi2b (128 entries
// each) and a blend on the index's top bit. The sign bytes come from ksigns_iq2xs (128 entries, one
// vpermi2b) indexed by the 7-bit fields vpmultishiftqb cuts out of the sign dwords. One vpermi2b per
// 64 output elements then gathers each group's (codes, signs) into its own qword, two
// vpmultishiftqb move element j's code to bits 0-1 and its sign to bit 2 of byte j, and a 64-entry
// vpermb maps that to the signed value (+128 for the GEMM's unsigned operand). About 32 vector
// operations per 256 elements, against two table loads and six scalar operations per 8.
#pragma once
#include "kernels/avx512_intrinsics.h"

#include <cstdint>

#include "kernels/iq_tables.h"

namespace sluice {
namespace {

struct Iq2xxsDecoder {
  __m512i lo[4], hi[4];  // 2-bit codes of grid entry e: elements 0-3 (lo[e / 64] byte e % 64), 4-7
  __m512i ks[2];         // ksigns_iq2xs
  __m512i sign_ctl;      // vpmultishiftqb: the four 7-bit sign fields of a qword's high dword
  __m512i gather[4];     // vpermi2b (LH, S): output qword q of vector k = group 8k + q
  __m512i code_ctl, sign_bit_ctl;
  __m512i value;         // 64-entry: bits 0-1 code, bit 2 sign -> signed value (+ offset)

  // offset: added to every value (0, or 128 for an unsigned vpdpbusd operand; mod 256).
  explicit Iq2xxsDecoder(int offset) {
    alignas(64) uint8_t lo_t[256], hi_t[256], b[64];
    for (int e = 0; e < 256; ++e) {
      unsigned code = 0;
      for (int j = 0; j < 8; ++j) {
        const unsigned g = (unsigned)(iq2xxs_grid[e] >> (8 * j)) & 0xff;
        code |= (g == 0x08 ? 0u : g == 0x19 ? 1u : 2u) << (2 * j);
      }
      lo_t[e] = (uint8_t)code;
      hi_t[e] = (uint8_t)(code >> 8);
    }
    for (int i = 0; i < 4; ++i) {
      lo[i] = _mm512_load_si512(lo_t + 64 * i);
      hi[i] = _mm512_load_si512(hi_t + 64 * i);
    }
    ks[0] = _mm512_loadu_si512(ksigns_iq2xs);
    ks[1] = _mm512_loadu_si512(ksigns_iq2xs + 64);
    for (int q = 0; q < 8; ++q)
      for (int j = 0; j < 8; ++j) b[8 * q + j] = j < 4 ? (uint8_t)(32 + 7 * j) : 0;
    sign_ctl = _mm512_load_si512(b);
    for (int k = 0; k < 4; ++k) {
      for (int q = 0; q < 8; ++q) {
        const int g = 8 * k + q, sb = g / 4, l = g % 4;
        for (int j = 0; j < 8; ++j) b[8 * q + j] = 0;
        b[8 * q + 0] = (uint8_t)(8 * sb + l);           // LH: codes of elements 0-3
        b[8 * q + 1] = (uint8_t)(8 * sb + 4 + l);       // LH: codes of elements 4-7
        b[8 * q + 2] = (uint8_t)(64 + 8 * sb + l);      // S: sign byte
      }
      gather[k] = _mm512_load_si512(b);
    }
    for (int q = 0; q < 8; ++q)
      for (int j = 0; j < 8; ++j) b[8 * q + j] = (uint8_t)(2 * j);
    code_ctl = _mm512_load_si512(b);
    for (int q = 0; q < 8; ++q)
      for (int j = 0; j < 8; ++j) b[8 * q + j] = (uint8_t)(14 + j);  // bit 16 + j lands on bit 2
    sign_bit_ctl = _mm512_load_si512(b);
    static constexpr int kMag[4] = {8, 25, 43, 0};
    for (int e = 0; e < 64; ++e) {
      const int g = kMag[e & 3];
      b[e] = (uint8_t)(((e & 4) ? -g : g) + offset);
    }
    value = _mm512_load_si512(b);
  }

  // The 256 values of the block at x (its first byte, d), in element order: v[k] = elements
  // 64k..64k+63 (sub-blocks 2k, 2k+1). Also returns bytes 2..65 (qword sb = sub-block sb).
  inline __m512i decode(const uint8_t* x, __m512i v[4]) const {
    const __m512i in = _mm512_loadu_si512(x + 2);
    const __mmask64 top = _mm512_movepi8_mask(in);
    const __m512i lo_c = _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(lo[0], in, lo[1]),
                                                _mm512_permutex2var_epi8(lo[2], in, lo[3]));
    const __m512i hi_c = _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(hi[0], in, hi[1]),
                                                _mm512_permutex2var_epi8(hi[2], in, hi[3]));
    // Qword sb: bytes 0-3 the element 0-3 codes of groups 0-3, bytes 4-7 their element 4-7 codes.
    const __m512i lh = _mm512_mask_blend_epi8(0xf0f0f0f0f0f0f0f0ull, lo_c, _mm512_slli_epi64(hi_c, 32));
    // Qword sb: bytes 0-3 the sign bytes of groups 0-3 (vpermi2b reads only bits 0-6 of each field).
    const __m512i s = _mm512_permutex2var_epi8(ks[0], _mm512_multishift_epi64_epi8(sign_ctl, in), ks[1]);
    const __m512i code_mask = _mm512_set1_epi8(3);
    for (int k = 0; k < 4; ++k) {
      const __m512i g = _mm512_permutex2var_epi8(lh, gather[k], s);  // qword: codes lo, hi, signs
      const __m512i c = _mm512_multishift_epi64_epi8(code_ctl, g);
      const __m512i sg = _mm512_multishift_epi64_epi8(sign_bit_ctl, g);
      // bits 0-1 from c, the rest from sg (bit 2 the sign, bits 3-5 ignored by the 64-entry lookup)
      v[k] = _mm512_permutexvar_epi8(_mm512_ternarylogic_epi32(code_mask, c, sg, 0xca), value);
    }
    return in;
  }
};

}  // namespace
}  // namespace sluice
