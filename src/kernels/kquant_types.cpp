// The K-quant group of the type table: Q8_K (the activation format, also given a row so it can
// be dequantized and inspected), Q2_K, Q3_K, Q4_K, Q6_K. Scalar reference dot products, exact
// dequantization (quant-formats.md 4.2-4.6), the Q8_K activation quantizer (3.3) and random
// valid blocks for tests and benchmarks. The SIMD dots live in kquant_types_avx2/avx512.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/fp.h"
#include "kernels/groups.h"
#include "kernels/kquant_blocks.h"

namespace sluice {
namespace kquant {

float kquant_f16(const uint8_t* p) { return f16_to_f32(load_u16(p)); }

namespace {

// ggml's nearest_int: adding 1.5*2^23 leaves round-to-nearest-even(v) in the low mantissa bits
// (exact for |v| < 2^22; the quantizer's values are within +-127). Non-finite v give 0 or
// -2^22, whose low byte is 0, so they store as 0 below.
int nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

// ---- Q8_K ------------------------------------------------------------------------------------

void quantize_block_q8_k(const float* x, uint8_t* out) {
  float amax = 0.0f, max = 0.0f;
  for (int e = 0; e < kQK; ++e) {
    const float ax = std::fabs(x[e]);
    if (ax > amax) {  // strict: the first value reaching amax wins, whatever its sign
      amax = ax;
      max = x[e];
    }
  }
  int8_t* qs = (int8_t*)(out + q8k::kQs);
  if (amax == 0.0f) {
    const float zero = 0.0f;
    std::memcpy(out + q8k::kD, &zero, 4);
    std::memset(out + q8k::kQs, 0, 256 + 32);  // qs and bsums
    return;
  }
  // -127/max: d = 1/iscale has the opposite sign of max (spec 3.3). If |max| is so small
  // (< ~3.7e-37) that iscale overflows to -+inf, every quant stores as 0 and d = -+0, as in ggml.
  const float iscale = -127.0f / max;
  for (int e = 0; e < kQK; ++e) qs[e] = (int8_t)std::min(127, nearest_int(iscale * x[e]));
  for (int j = 0; j < 16; ++j) {
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += qs[16 * j + i];
    const int16_t s16 = (int16_t)sum;
    std::memcpy(out + q8k::kBsums + 2 * j, &s16, 2);
  }
  const float d = 1.0f / iscale;
  std::memcpy(out + q8k::kD, &d, 4);
}

void dequant_q8_k(const void* src, float* dst, int64_t n) {
  const uint8_t* b = (const uint8_t*)src;
  for (int64_t i = 0; i < n / kQK; ++i, b += q8k::kBytes, dst += kQK) {
    const float d = load_f32_at(b + q8k::kD);
    const int8_t* qs = (const int8_t*)(b + q8k::kQs);
    for (int e = 0; e < kQK; ++e) dst[e] = d * (float)qs[e];
  }
}

float dot_q8_k_scalar(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i, x += q8k::kBytes, y += q8k::kBytes) {
    const int8_t* a = (const int8_t*)(x + q8k::kQs);
    const int8_t* b = (const int8_t*)(y + q8k::kQs);
    int32_t isum = 0;
    for (int e = 0; e < kQK; ++e) isum += a[e] * b[e];
    sumf = q8k_tail(sumf, load_f32_at(y + q8k::kD), load_f32_at(x + q8k::kD), isum);
  }
  return sumf;
}

// ---- Q2_K ------------------------------------------------------------------------------------

// 2-bit quant of element e (spec 4.2).
int q2k_quant(const uint8_t* qs, int e) {
  const int h = e / 128, j = (e % 128) / 32, l = e % 32;
  return (qs[32 * h + l] >> (2 * j)) & 3;
}

void dequant_q2_k(const void* src, float* dst, int64_t n) {
  const uint8_t* b = (const uint8_t*)src;
  for (int64_t i = 0; i < n / kQK; ++i, b += q2k::kBytes, dst += kQK) {
    const float d = kquant_f16(b + q2k::kD);
    const float dmin = kquant_f16(b + q2k::kDmin);
    for (int k = 0; k < 16; ++k) {
      const uint8_t sc = b[q2k::kScales + k];
      const float dl = d * (float)(sc & 15);
      const float ml = dmin * (float)(sc >> 4);
      for (int e = 16 * k; e < 16 * k + 16; ++e) dst[e] = dl * (float)q2k_quant(b + q2k::kQs, e) - ml;
    }
  }
}

float dot_q2_k_scalar(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i, x += q2k::kBytes, y += q8k::kBytes) {
    const uint8_t* sc = x + q2k::kScales;
    const int8_t* q8 = (const int8_t*)(y + q8k::kQs);
    int32_t summs = 0, isum = 0;
    for (int k = 0; k < 16; ++k) {
      summs += load_i16_at(y + q8k::kBsums + 2 * k) * (sc[k] >> 4);
      int32_t s = 0;
      for (int e = 16 * k; e < 16 * k + 16; ++e) s += q8[e] * q2k_quant(x + q2k::kQs, e);
      isum += (sc[k] & 15) * s;
    }
    sumf = q2k_tail(sumf, load_f32_at(y + q8k::kD), kquant_f16(x + q2k::kD), kquant_f16(x + q2k::kDmin),
                    isum, summs);
  }
  return sumf;
}

// ---- Q3_K ------------------------------------------------------------------------------------

// Signed 3-bit quant of element e, -4..3 (spec 4.3).
int q3k_quant(const uint8_t* blk, int e) {
  const int h = e / 128, j = (e % 128) / 32, l = e % 32;
  const int q2 = (blk[q3k::kQs + 32 * h + l] >> (2 * j)) & 3;
  const int hbit = (blk[q3k::kHmask + l] >> (4 * h + j)) & 1;
  return q2 - (hbit ? 0 : 4);
}

void dequant_q3_k(const void* src, float* dst, int64_t n) {
  const uint8_t* b = (const uint8_t*)src;
  for (int64_t i = 0; i < n / kQK; ++i, b += q3k::kBytes, dst += kQK) {
    const float d = kquant_f16(b + q3k::kD);
    int8_t s[16];
    unpack_q3k_scales(b + q3k::kScales, s);
    for (int k = 0; k < 16; ++k) {
      const float dl = d * (float)s[k];
      for (int e = 16 * k; e < 16 * k + 16; ++e) dst[e] = dl * (float)q3k_quant(b, e);
    }
  }
}

float dot_q3_k_scalar(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i, x += q3k::kBytes, y += q8k::kBytes) {
    const int8_t* q8 = (const int8_t*)(y + q8k::kQs);
    int8_t s[16];
    unpack_q3k_scales(x + q3k::kScales, s);
    int32_t isum = 0;
    for (int k = 0; k < 16; ++k) {
      int32_t t = 0;
      for (int e = 16 * k; e < 16 * k + 16; ++e) t += q8[e] * q3k_quant(x, e);
      isum += s[k] * t;
    }
    sumf = scaled_tail(sumf, load_f32_at(y + q8k::kD), kquant_f16(x + q3k::kD), isum);
  }
  return sumf;
}

// ---- Q4_K ------------------------------------------------------------------------------------

// 4-bit quant of element e, 0..15 (spec 4.4).
int q4k_quant(const uint8_t* qs, int e) {
  const int c = e / 64, l = e % 32;
  const uint8_t byte = qs[32 * c + l];
  return e % 64 < 32 ? (byte & 15) : (byte >> 4);
}

void dequant_q4_k(const void* src, float* dst, int64_t n) {
  const uint8_t* b = (const uint8_t*)src;
  for (int64_t i = 0; i < n / kQK; ++i, b += q4k::kBytes, dst += kQK) {
    const float d = kquant_f16(b + q4k::kD);
    const float dmin = kquant_f16(b + q4k::kDmin);
    uint8_t sc[8], m[8];
    unpack_q4k_scales(b + q4k::kScales, sc, m);
    for (int k = 0; k < 8; ++k) {
      const float dl = d * (float)sc[k];
      const float ml = dmin * (float)m[k];
      for (int e = 32 * k; e < 32 * k + 32; ++e) dst[e] = dl * (float)q4k_quant(b + q4k::kQs, e) - ml;
    }
  }
}

float dot_q4_k_scalar(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i, x += q4k::kBytes, y += q8k::kBytes) {
    const int8_t* q8 = (const int8_t*)(y + q8k::kQs);
    uint8_t sc[8], m[8];
    unpack_q4k_scales(x + q4k::kScales, sc, m);
    int32_t sumi_min = 0, isum = 0;
    for (int j = 0; j < 16; ++j) sumi_min += load_i16_at(y + q8k::kBsums + 2 * j) * m[j / 2];
    for (int k = 0; k < 8; ++k) {
      int32_t t = 0;
      for (int e = 32 * k; e < 32 * k + 32; ++e) t += q8[e] * q4k_quant(x + q4k::kQs, e);
      isum += sc[k] * t;
    }
    sumf = q4k_tail(sumf, load_f32_at(y + q8k::kD), kquant_f16(x + q4k::kD), kquant_f16(x + q4k::kDmin),
                    isum, sumi_min);
  }
  return sumf;
}

// ---- Q6_K ------------------------------------------------------------------------------------

// Signed 6-bit quant of element e, -32..31 (spec 4.6).
int q6k_quant(const uint8_t* blk, int e) {
  const int h = e / 128, r = e % 128, k = r / 32, l = r % 32;
  const uint8_t* ql = blk + q6k::kQl + 64 * h;
  const int low4 = ((k & 1 ? ql[32 + l] : ql[l]) >> (k >= 2 ? 4 : 0)) & 15;
  const int high2 = (blk[q6k::kQh + 32 * h + l] >> (2 * k)) & 3;
  return (low4 | high2 << 4) - 32;
}

void dequant_q6_k(const void* src, float* dst, int64_t n) {
  const uint8_t* b = (const uint8_t*)src;
  for (int64_t i = 0; i < n / kQK; ++i, b += q6k::kBytes, dst += kQK) {
    const float d = kquant_f16(b + q6k::kD);
    const int8_t* scales = (const int8_t*)(b + q6k::kScales);
    for (int k = 0; k < 16; ++k) {
      const float dl = d * (float)scales[k];
      for (int e = 16 * k; e < 16 * k + 16; ++e) dst[e] = dl * (float)q6k_quant(b, e);
    }
  }
}

float dot_q6_k_scalar(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = (const uint8_t*)vx;
  const uint8_t* y = (const uint8_t*)vy;
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i, x += q6k::kBytes, y += q8k::kBytes) {
    const int8_t* q8 = (const int8_t*)(y + q8k::kQs);
    const int8_t* scales = (const int8_t*)(x + q6k::kScales);
    int32_t isum = 0;
    for (int k = 0; k < 16; ++k) {
      int32_t t = 0;
      for (int e = 16 * k; e < 16 * k + 16; ++e) t += q8[e] * q6k_quant(x, e);
      isum += scales[k] * t;
    }
    sumf = scaled_tail(sumf, load_f32_at(y + q8k::kD), kquant_f16(x + q6k::kD), isum);
  }
  return sumf;
}

// ---- Random valid blocks ---------------------------------------------------------------------
// Every bit pattern of the quant and packed-scale bytes is a valid block, so those are uniform
// random bytes; only the fp16/f32 super-scales are chosen, from the expected rms of the decoded
// values under uniform fields (computed below per type), so that rms(decoded) ~ scale.

struct SplitMix64 {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  void fill(uint8_t* p, int n) {
    for (int i = 0; i < n; ++i) p[i] = (uint8_t)(next() >> 56);
  }
};

// fp16 of v, clamped to the largest finite fp16 so huge `scale` arguments stay finite.
void store_f16_scale(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(std::min(std::fabs(v), 65504.0f));
  std::memcpy(p, &h, 2);
}

void random_q8_k(void* dst, int64_t nblocks, uint64_t seed, float scale) {
  SplitMix64 rng{seed ^ 0x5138'4b00ull};
  uint8_t* b = (uint8_t*)dst;
  for (int64_t i = 0; i < nblocks; ++i, b += q8k::kBytes) {
    int8_t* qs = (int8_t*)(b + q8k::kQs);
    for (int e = 0; e < kQK; ++e) qs[e] = (int8_t)((int)(rng.next() % 255) - 127);  // the quantizer's range
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int t = 0; t < 16; ++t) sum += qs[16 * j + t];
      const int16_t s16 = (int16_t)sum;
      std::memcpy(b + q8k::kBsums + 2 * j, &s16, 2);
    }
    // rms of uniform -127..127 is sqrt(127*128/3) = 73.6; the quantizer's d has either sign.
    const float d = (rng.next() & 1 ? -scale : scale) / 73.6f;
    std::memcpy(b + q8k::kD, &d, 4);
  }
}

void random_q2_k(void* dst, int64_t nblocks, uint64_t seed, float scale) {
  SplitMix64 rng{seed ^ 0x5132'4b00ull};
  uint8_t* b = (uint8_t*)dst;
  for (int64_t i = 0; i < nblocks; ++i, b += q2k::kBytes) {
    rng.fill(b, 80);  // scales and qs
    // x = d*sc*q - dmin*m with sc, m uniform 0..15 (E = 7.5, E[.^2] = 77.5), q uniform 0..3
    // (1.5, 3.5); dmin = 1.5 d centres the values: E[x^2] = d^2 (77.5*3.5 - 3*7.5*1.5*7.5 +
    // 2.25*77.5) = 192.5 d^2, rms = 13.87 d.
    const float d = scale / 13.87f;
    store_f16_scale(b + q2k::kD, d);
    store_f16_scale(b + q2k::kDmin, 1.5f * d);
  }
}

void random_q3_k(void* dst, int64_t nblocks, uint64_t seed, float scale) {
  SplitMix64 rng{seed ^ 0x5133'4b00ull};
  uint8_t* b = (uint8_t*)dst;
  for (int64_t i = 0; i < nblocks; ++i, b += q3k::kBytes) {
    rng.fill(b, 108);  // hmask, qs, scales
    // s uniform -32..31 (E[s^2] = 341.5), q uniform -4..3 (E[q^2] = 5.5): rms = 43.3 d.
    store_f16_scale(b + q3k::kD, scale / 43.3f);
  }
}

void random_q4_k(void* dst, int64_t nblocks, uint64_t seed, float scale) {
  SplitMix64 rng{seed ^ 0x5134'4b00ull};
  uint8_t* b = (uint8_t*)dst;
  for (int64_t i = 0; i < nblocks; ++i, b += q4k::kBytes) {
    rng.fill(b + q4k::kScales, 12 + 128);
    // sc, m uniform 0..63 (E = 31.5, E[.^2] = 1333.5), nibble uniform 0..15 (7.5, 77.5);
    // dmin = 7.5 d centres the values: E[x^2] = d^2 (1333.5*77.5 - 15*31.5*7.5*31.5 +
    // 56.25*1333.5) = 66727.5 d^2, rms = 258.3 d.
    const float d = scale / 258.3f;
    store_f16_scale(b + q4k::kD, d);
    store_f16_scale(b + q4k::kDmin, 7.5f * d);
  }
}

void random_q6_k(void* dst, int64_t nblocks, uint64_t seed, float scale) {
  SplitMix64 rng{seed ^ 0x5136'4b00ull};
  uint8_t* b = (uint8_t*)dst;
  for (int64_t i = 0; i < nblocks; ++i, b += q6k::kBytes) {
    rng.fill(b, 208);  // ql, qh, scales
    // scales uniform int8 (E[s^2] = 5461.5), q uniform -32..31 (341.5): rms = 1365.7 d.
    store_f16_scale(b + q6k::kD, scale / 1365.7f);
  }
}

const TypeTraits kRows[] = {
    {GgmlType::Q8_K, "Q8_K", kQK, q8k::kBytes, ActType::Q8_K, true, dequant_q8_k, random_q8_k,
     dot_q8_k_scalar, dot_q8_k_avx2, dot_q8_k_avx512, nullptr, nullptr},
    {GgmlType::Q2_K, "Q2_K", kQK, q2k::kBytes, ActType::Q8_K, true, dequant_q2_k, random_q2_k,
     dot_q2_k_scalar, dot_q2_k_avx2, dot_q2_k_avx512, gemm_q2_k_avx2, gemm_q2_k_avx512},
    {GgmlType::Q3_K, "Q3_K", kQK, q3k::kBytes, ActType::Q8_K, true, dequant_q3_k, random_q3_k,
     dot_q3_k_scalar, dot_q3_k_avx2, dot_q3_k_avx512, nullptr, nullptr},
    {GgmlType::Q4_K, "Q4_K", kQK, q4k::kBytes, ActType::Q8_K, true, dequant_q4_k, random_q4_k,
     dot_q4_k_scalar, dot_q4_k_avx2, dot_q4_k_avx512, nullptr, nullptr},
    {GgmlType::Q6_K, "Q6_K", kQK, q6k::kBytes, ActType::Q8_K, true, dequant_q6_k, random_q6_k,
     dot_q6_k_scalar, dot_q6_k_avx2, dot_q6_k_avx512, nullptr, nullptr},
};

}  // namespace
}  // namespace kquant

std::span<const TypeTraits> kquant_type_rows() { return kquant::kRows; }

void quantize_row_q8_k(const float* x, void* dst, int64_t n) {
  uint8_t* out = (uint8_t*)dst;
  for (int64_t i = 0; i < n / kquant::kQK; ++i) kquant::quantize_block_q8_k(x + i * kquant::kQK, out + i * kquant::q8k::kBytes);
}

}  // namespace sluice
