// Scalar float encodings used by the block formats and by the model's rounding points.
// All conversions are exact and bit-reproducible; see quant-formats.md section 2.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace sluice {

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400u));
      bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return std::bit_cast<float>(bits);
}

// Round-to-nearest-even, overflow to Inf, NaN to the canonical quiet NaN with the input's sign.
inline uint16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to >= 65520 -> Inf
  if (ax < 0x38800000u) {                                      // result is subnormal or zero
    // 0.5 ulp of the smallest subnormal is 2^-25; adding 0.5f aligns the mantissa (exact RNE).
    const float r = std::bit_cast<float>(ax) + 0.5f;
    return (uint16_t)(sign | (std::bit_cast<uint32_t>(r) - 0x3f000000u));
  }
  const uint32_t lsb = (ax >> 13) & 1u;
  const uint32_t rounded = ax + 0xc8000fffu + lsb;  // rebias (-112 << 23) and round half-even
  return (uint16_t)(sign | (rounded >> 13));
}

inline float bf16_to_f32(uint16_t b) { return std::bit_cast<float>((uint32_t)b << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// The model's bf16() rounding point: f32 -> bf16 (RNE) -> f32.
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// OCP E4M3FN: bias 7, no infinities, 0x7f and 0xff are NaN.
inline bool e4m3_is_nan(uint8_t c) { return (c & 0x7fu) == 0x7fu; }
inline float e4m3_to_f32(uint8_t c) {
  const float sign = (c & 0x80u) ? -1.0f : 1.0f;
  const int e = (c >> 3) & 0xf;
  const int m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return sign * std::ldexp((float)m, -9);
  return sign * std::ldexp(1.0f + (float)m / 8.0f, e - 7);
}

// OCP E4M3FN encoder: round to nearest even, saturating at +-448 (Inf included), subnormals
// kept; NaN -> 0x7f with the input's sign. Saturation is the spec's recommendation
// (quant-formats.md 2.4, docs/numerics.md 5): values just above 448 would otherwise round onto
// the NaN code.
inline uint8_t f32_to_e4m3(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
  if (ax >= 0x43e00000u) return (uint8_t)(sign | 0x7eu);  // >= 448
  if (ax < 0x3c800000u) {                                  // < 2^-6: subnormal or zero
    // 16384 has an ulp of 2^-9 (the subnormal step), so the float add rounds to it, half-even.
    // A result of 8 steps is exactly the smallest normal code 0x08.
    const float r = std::bit_cast<float>(ax) + 16384.0f;
    return (uint8_t)(sign | (std::bit_cast<uint32_t>(r) - 0x46800000u));
  }
  const uint32_t lsb = (ax >> 20) & 1u;
  const uint32_t code = ((ax + 0x7ffffu + lsb) >> 20) - (120u << 3);  // rebias 127 -> 7
  return (uint8_t)(sign | (code > 0x7eu ? 0x7eu : code));
}

// OCP E8M0: 2^(e-127); 0xff is NaN; there is no zero.
inline bool e8m0_is_nan(uint8_t e) { return e == 0xffu; }
inline float e8m0_to_f32(uint8_t e) {
  if (e == 0xffu) return std::numeric_limits<float>::quiet_NaN();
  if (e == 0) return std::bit_cast<float>(0x00400000u);
  return std::bit_cast<float>((uint32_t)e << 23);
}

inline uint16_t load_u16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
inline uint32_t load_u32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
inline uint64_t load_u64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }
inline float load_f32(const uint8_t* p) { float v; std::memcpy(&v, p, 4); return v; }

}  // namespace sluice
