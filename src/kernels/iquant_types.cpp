// The iquant format group: Q8_0 (weight and activation), Q2_0, IQ2_XXS, IQ2_XS and TQ2_0.
// Scalar reference kernels (they define the results bit for bit), decoders, random valid blocks,
// the Q8_0 activation quantizer, and this group's rows of the type table.
// sluice's canonical dot product (exact integer sums per block, then one fixed float sequence per
// block accumulated into a single float) is spelled out in iquant_types.h, whose step functions
// both this file and the SIMD files call.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/fp.h"
#include "kernels/gemm_q8_0.h"
#include "kernels/groups.h"
#include "kernels/iq_tables.h"
#include "kernels/iquant_types.h"

namespace sluice {
using namespace iquant;

namespace {

inline const uint8_t* bytes(const void* p) { return static_cast<const uint8_t*>(p); }
inline void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
inline void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// ---------------------------------------------------------------------------------------------
// Q8_0 (3.1)

void dequant_q8_0(const void* src, float* dst, int64_t n) {
  const uint8_t* b = bytes(src);
  for (int64_t i = 0; i < n / kQ8_0Elems; ++i, b += kQ8_0Bytes) {
    const float d = f16_to_f32(load_u16(b));
    for (int j = 0; j < 32; ++j) dst[32 * i + j] = d * (float)(int8_t)b[2 + j];
  }
}

float dot_q8_0_scalar(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = bytes(vx);
  const uint8_t* y = bytes(vy);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQ8_0Elems; ++i, x += kQ8_0Bytes, y += kQ8_0Bytes) {
    int32_t sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += (int8_t)x[2 + j] * (int8_t)y[2 + j];
    sumf = step_q8_0(sumf, sumi, f16_to_f32(load_u16(x)), f16_to_f32(load_u16(y)));
  }
  return sumf;
}

// ---------------------------------------------------------------------------------------------
// Q2_0 (4.13): code q in 2 bits, value (q - 1) * d, so 00 = -1, 01 = 0, 10 = +1, 11 = +2.

inline int q2_0_code(const uint8_t* qs, int j) { return (qs[j / 4] >> (2 * (j % 4))) & 3; }

void dequant_q2_0(const void* src, float* dst, int64_t n) {
  const uint8_t* b = bytes(src);
  for (int64_t i = 0; i < n / kQ2_0Elems; ++i, b += kQ2_0Bytes) {
    const float d = f16_to_f32(load_u16(b));
    for (int j = 0; j < 64; ++j) dst[64 * i + j] = (float)(q2_0_code(b + 2, j) - 1) * d;
  }
}

float dot_q2_0_scalar(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = bytes(vx);
  const uint8_t* y = bytes(vy);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / kQ2_0Elems; ++i, x += kQ2_0Bytes, y += 2 * kQ8_0Bytes) {
    int32_t s[2] = {0, 0};
    for (int k = 0; k < 2; ++k)
      for (int j = 0; j < 32; ++j)
        s[k] += (q2_0_code(x + 2, 32 * k + j) - 1) * (int8_t)y[kQ8_0Bytes * k + 2 + j];
    sumf = step_q2_0(sumf, s[0], s[1], f16_to_f32(load_u16(x)), f16_to_f32(load_u16(y)),
                     f16_to_f32(load_u16(y + kQ8_0Bytes)));
  }
  return sumf;
}

// ---------------------------------------------------------------------------------------------
// IQ2_XXS (4.7) and IQ2_XS (4.8): 8-element groups of grid magnitudes with 8 sign bits, the
// 8th sign being the parity of the other seven.

inline int grid_byte(uint64_t g, int j) { return (int)((g >> (8 * j)) & 0xff); }
inline bool negated(int sign_index, int j) { return (ksigns_iq2xs[sign_index] & kmask_iq2xs[j]) != 0; }

// Signed integer dot of one 8-element group with 8 activation codes.
inline int32_t group_dot(uint64_t g, int sign_index, const int8_t* q8) {
  int32_t s = 0;
  for (int j = 0; j < 8; ++j) {
    const int32_t p = grid_byte(g, j) * q8[j];
    s += negated(sign_index, j) ? -p : p;
  }
  return s;
}

inline void decode_group(float db, uint64_t g, int sign_index, float* out) {
  for (int j = 0; j < 8; ++j) {
    const float v = db * (float)grid_byte(g, j);
    out[j] = negated(sign_index, j) ? -v : v;
  }
}

void dequant_iq2_xxs(const void* src, float* dst, int64_t n) {
  const uint8_t* b = bytes(src);
  for (int64_t i = 0; i < n / 256; ++i, b += kIq2xxsBytes) {
    const float d = f16_to_f32(load_u16(b));
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t w0 = load_u32(b + 2 + 8 * ib), w1 = load_u32(b + 6 + 8 * ib);
      const float db = d * (0.5f + (float)(w1 >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l)
        decode_group(db, iq2xxs_grid[(w0 >> (8 * l)) & 255], (int)((w1 >> (7 * l)) & 127),
                     dst + 256 * i + 32 * ib + 8 * l);
    }
  }
}

float dot_iq2_xxs_scalar(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = bytes(vx);
  const uint8_t* y = bytes(vy);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / 256; ++i, x += kIq2xxsBytes, y += kQ8_KBytes) {
    const int8_t* q8 = reinterpret_cast<const int8_t*>(y + kQ8_KQs);
    int32_t bsum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t w0 = load_u32(x + 2 + 8 * ib), w1 = load_u32(x + 6 + 8 * ib);
      int32_t sumi = 0;
      for (int l = 0; l < 4; ++l)
        sumi += group_dot(iq2xxs_grid[(w0 >> (8 * l)) & 255], (int)((w1 >> (7 * l)) & 127),
                          q8 + 32 * ib + 8 * l);
      bsum += sumi * (int32_t)(2 * (w1 >> 28) + 1);
    }
    sumf = step_iq2(sumf, bsum, f16_to_f32(load_u16(x)), load_f32(y));
  }
  return finish_iq2(sumf);
}

void dequant_iq2_xs(const void* src, float* dst, int64_t n) {
  const uint8_t* b = bytes(src);
  for (int64_t i = 0; i < n / 256; ++i, b += kIq2xsBytes) {
    const float d = f16_to_f32(load_u16(b));
    for (int ib = 0; ib < 8; ++ib) {
      const int sc = b[kIq2xsScales + ib];
      for (int l = 0; l < 4; ++l) {
        const int nibble = l < 2 ? (sc & 15) : (sc >> 4);
        const float db = d * (0.5f + (float)nibble) * 0.25f;
        const uint16_t q = load_u16(b + 2 + 2 * (4 * ib + l));
        decode_group(db, iq2xs_grid[q & 511], q >> 9, dst + 256 * i + 32 * ib + 8 * l);
      }
    }
  }
}

float dot_iq2_xs_scalar(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = bytes(vx);
  const uint8_t* y = bytes(vy);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / 256; ++i, x += kIq2xsBytes, y += kQ8_KBytes) {
    const int8_t* q8 = reinterpret_cast<const int8_t*>(y + kQ8_KQs);
    int32_t bsum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const int sc = x[kIq2xsScales + ib];
      int32_t half[2] = {0, 0};  // groups {0,1} use the low nibble, {2,3} the high one
      for (int l = 0; l < 4; ++l) {
        const uint16_t q = load_u16(x + 2 + 2 * (4 * ib + l));
        half[l / 2] += group_dot(iq2xs_grid[q & 511], q >> 9, q8 + 32 * ib + 8 * l);
      }
      bsum += half[0] * (2 * (sc & 15) + 1) + half[1] * (2 * (sc >> 4) + 1);
    }
    sumf = step_iq2(sumf, bsum, f16_to_f32(load_u16(x)), load_f32(y));
  }
  return finish_iq2(sumf);
}

// ---------------------------------------------------------------------------------------------
// TQ2_0 (4.12): element e is code (qs[32*(e/128) + e%32] >> 2*((e%128)/32)) & 3, value (q-1)*d.

inline int tq2_0_code(const uint8_t* qs, int e) {
  return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

void dequant_tq2_0(const void* src, float* dst, int64_t n) {
  const uint8_t* b = bytes(src);
  for (int64_t i = 0; i < n / 256; ++i, b += kTq2_0Bytes) {
    const float d = f16_to_f32(load_u16(b + kTq2_0D));
    for (int e = 0; e < 256; ++e) dst[256 * i + e] = (float)(tq2_0_code(b, e) - 1) * d;
  }
}

float dot_tq2_0_scalar(const void* vx, const void* vy, int64_t n) {
  const uint8_t* x = bytes(vx);
  const uint8_t* y = bytes(vy);
  float sumf = 0.0f;
  for (int64_t i = 0; i < n / 256; ++i, x += kTq2_0Bytes, y += kQ8_KBytes) {
    const int8_t* q8 = reinterpret_cast<const int8_t*>(y + kQ8_KQs);
    int32_t sumi = 0;
    for (int e = 0; e < 256; ++e) sumi += (tq2_0_code(x, e) - 1) * q8[e];
    sumf = step_tq2_0(sumf, sumi, f16_to_f32(load_u16(x + kTq2_0D)), load_f32(y));
  }
  return sumf;
}

// ---------------------------------------------------------------------------------------------
// Random valid blocks. Each block's scale is the value that makes the expected rms of its decoded
// elements equal `scale`, times a random factor in [0.75, 1.25); codes are uniform.

struct Rng {  // splitmix64: small, fast, and identical on every platform
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint32_t below(uint32_t n) { return (uint32_t)((next() >> 32) * n >> 32); }
  float unit() { return (float)(next() >> 40) * 0x1p-24f; }  // [0, 1)
};

// fp16 of a non-negative scale, clamped to the largest finite fp16 so blocks stay valid.
uint16_t scale_f16(Rng& r, float d) {
  const float v = std::min(d * (0.75f + 0.5f * r.unit()), 65504.0f);
  return f32_to_f16(v);
}

// Mean square of the bytes of a grid (the rms of a random group's magnitudes).
double grid_mean_square(const uint64_t* grid, int count) {
  double s = 0;
  for (int i = 0; i < count; ++i)
    for (int j = 0; j < 8; ++j) s += (double)grid_byte(grid[i], j) * grid_byte(grid[i], j);
  return s / (8.0 * count);
}

// Mean of (2s+1)^2 over s = 0..15 is 341: the rms of the IQ2 sub-block multipliers.
constexpr double kMeanSubScaleSq = 341.0;

void random_q8_0(void* dst, int64_t nb, uint64_t seed, float scale) {
  Rng r{seed};
  uint8_t* b = static_cast<uint8_t*>(dst);
  const float d = scale / std::sqrt((127.0f * 128.0f) / 3.0f);  // rms of uniform -127..127
  for (int64_t i = 0; i < nb; ++i, b += kQ8_0Bytes) {
    store_u16(b, scale_f16(r, d));
    for (int j = 0; j < 32; ++j) b[2 + j] = (uint8_t)(int8_t)((int)r.below(255) - 127);
  }
}

void random_q2_0(void* dst, int64_t nb, uint64_t seed, float scale) {
  Rng r{seed};
  uint8_t* b = static_cast<uint8_t*>(dst);
  const float d = scale / std::sqrt(1.5f);  // values -1, 0, 1, 2: mean square 6/4
  for (int64_t i = 0; i < nb; ++i, b += kQ2_0Bytes) {
    store_u16(b, scale_f16(r, d));
    for (int j = 0; j < 16; ++j) b[2 + j] = (uint8_t)r.below(256);
  }
}

void random_iq2_xxs(void* dst, int64_t nb, uint64_t seed, float scale) {
  Rng r{seed};
  uint8_t* b = static_cast<uint8_t*>(dst);
  const float d = (float)(scale * 8.0 / std::sqrt(kMeanSubScaleSq * grid_mean_square(iq2xxs_grid, 256)));
  for (int64_t i = 0; i < nb; ++i, b += kIq2xxsBytes) {
    store_u16(b, scale_f16(r, d));
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t w0 = 0, w1 = r.below(16) << 28;
      for (int l = 0; l < 4; ++l) {
        w0 |= r.below(256) << (8 * l);
        w1 |= r.below(128) << (7 * l);
      }
      store_u32(b + 2 + 8 * ib, w0);
      store_u32(b + 6 + 8 * ib, w1);
    }
  }
}

void random_iq2_xs(void* dst, int64_t nb, uint64_t seed, float scale) {
  Rng r{seed};
  uint8_t* b = static_cast<uint8_t*>(dst);
  const float d = (float)(scale * 8.0 / std::sqrt(kMeanSubScaleSq * grid_mean_square(iq2xs_grid, 512)));
  for (int64_t i = 0; i < nb; ++i, b += kIq2xsBytes) {
    store_u16(b, scale_f16(r, d));
    for (int k = 0; k < 32; ++k) store_u16(b + 2 + 2 * k, (uint16_t)(r.below(512) | r.below(128) << 9));
    for (int ib = 0; ib < 8; ++ib) b[kIq2xsScales + ib] = (uint8_t)r.below(256);
  }
}

void random_tq2_0(void* dst, int64_t nb, uint64_t seed, float scale) {
  Rng r{seed};
  uint8_t* b = static_cast<uint8_t*>(dst);
  const float d = scale / std::sqrt(2.0f / 3.0f);  // values -1, 0, 1
  for (int64_t i = 0; i < nb; ++i, b += kTq2_0Bytes) {
    for (int j = 0; j < 64; ++j) {
      uint8_t v = 0;
      for (int l = 0; l < 4; ++l) v |= (uint8_t)(r.below(3) << (2 * l));  // code 3 is never valid
      b[j] = v;
    }
    store_u16(b + kTq2_0D, scale_f16(r, d));
  }
}

constexpr TypeTraits kRows[] = {
    {GgmlType::Q8_0, "Q8_0", 32, kQ8_0Bytes, ActType::Q8_0, true, dequant_q8_0, random_q8_0,
     dot_q8_0_scalar, dot_q8_0_avx2, dot_q8_0_avx512, gemm_q8_0_avx2, gemm_q8_0_avx512},
    {GgmlType::Q2_0, "Q2_0", 64, kQ2_0Bytes, ActType::Q8_0, true, dequant_q2_0, random_q2_0,
     dot_q2_0_scalar, dot_q2_0_avx2, dot_q2_0_avx512, nullptr, nullptr},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, kIq2xxsBytes, ActType::Q8_K, true, dequant_iq2_xxs,
     random_iq2_xxs, dot_iq2_xxs_scalar, dot_iq2_xxs_avx2, dot_iq2_xxs_avx512, gemm_iq2_xxs_avx2, gemm_iq2_xxs_avx512},
    {GgmlType::IQ2_XS, "IQ2_XS", 256, kIq2xsBytes, ActType::Q8_K, true, dequant_iq2_xs, random_iq2_xs,
     dot_iq2_xs_scalar, dot_iq2_xs_avx2, dot_iq2_xs_avx512, nullptr, nullptr},
    {GgmlType::TQ2_0, "TQ2_0", 256, kTq2_0Bytes, ActType::Q8_K, true, dequant_tq2_0, random_tq2_0,
     dot_tq2_0_scalar, dot_tq2_0_avx2, dot_tq2_0_avx512, nullptr, nullptr},
};

}  // namespace

std::span<const TypeTraits> iquant_type_rows() { return kRows; }

// The ggml REFERENCE Q8_0 quantizer (ggml-quants.c quantize_row_q8_0_ref), not the x86 AVX2 one:
// d = amax/127 and id = 1/d (not 127/amax), qs = roundf(x*id), i.e. ties round half AWAY from zero
// (the AVX2 build rounds ties to even), and the stored scale is fp16(d) while the codes were
// computed with the unrounded float d. sluice uses this rule on every ISA.
void quantize_row_q8_0(const float* x, void* dst, int64_t n) {
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / kQ8_0Elems; ++i, x += 32, b += kQ8_0Bytes) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; ++j) {
      // Finite input gives |v| <= 127; the clamp only keeps NaN/Inf input from undefined casts.
      const float v = std::roundf(x[j] * id);
      b[2 + j] = (uint8_t)(int8_t)(v == v ? std::clamp(v, -127.0f, 127.0f) : 0.0f);
    }
    store_u16(b, f32_to_f16(d));
  }
}

}  // namespace sluice
