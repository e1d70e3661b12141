// The FLOAT group of the type table: F32, F16, BF16 weights and Engram rows. All four take F32
// activations and share one dot-product order (the "canonical dot", docs/numerics.md 1):
// 16 float lanes, lane = i mod 16, acc[lane] = fma(w_i, x_i, acc[lane]) in index order over the
// row zero-padded to a multiple of 16, then acc[i] += acc[i+8], += acc[i+4], += acc[i+2],
// result acc[0] + acc[1]. This order is what one AVX-512 register (or two AVX2 registers) does
// naturally, so the SIMD kernels reproduce it bit for bit.
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/engram_row.h"
#include "kernels/fp.h"
#include "kernels/groups.h"
#include "util/error.h"

namespace sluice {

// SIMD kernels, defined in float_types_avx2.cpp / float_types_avx512.cpp.
float dot_f32_avx2(const void* w, const void* x, int64_t n);
float dot_f16_avx2(const void* w, const void* x, int64_t n);
float dot_bf16_avx2(const void* w, const void* x, int64_t n);
float dot_engram_avx2(const void* w, const void* x, int64_t n);
float dot_f32_avx512(const void* w, const void* x, int64_t n);
float dot_f16_avx512(const void* w, const void* x, int64_t n);
float dot_bf16_avx512(const void* w, const void* x, int64_t n);
float dot_engram_avx512(const void* w, const void* x, int64_t n);
// GEMMs (TypeTraits::gemm_*), defined in gemm_float_avx2.cpp / gemm_float_avx512.cpp.
void gemm_f32_avx2(const void*, size_t, int64_t, const uint8_t* const*, int64_t, int64_t, float*, size_t);
void gemm_f16_avx2(const void*, size_t, int64_t, const uint8_t* const*, int64_t, int64_t, float*, size_t);
void gemm_bf16_avx2(const void*, size_t, int64_t, const uint8_t* const*, int64_t, int64_t, float*, size_t);
void gemm_f32_avx512(const void*, size_t, int64_t, const uint8_t* const*, int64_t, int64_t, float*, size_t);
void gemm_f16_avx512(const void*, size_t, int64_t, const uint8_t* const*, int64_t, int64_t, float*, size_t);
void gemm_bf16_avx512(const void*, size_t, int64_t, const uint8_t* const*, int64_t, int64_t, float*, size_t);

namespace {

// The reference. It really walks the zero padding: fma(0, 0, -0) is +0, so a lane holding -0
// (a product that underflowed from below) turns into +0 exactly as in the masked SIMD tail.
template <class Weight>
float canonical_dot(Weight weight, const float* x, int64_t n) {
  std::array<float, 16> acc{};
  const int64_t padded = (n + 15) / 16 * 16;
  for (int64_t i = 0; i < padded; ++i) {
    const float w = i < n ? weight(i) : 0.0f;
    const float a = i < n ? x[i] : 0.0f;
    acc[(size_t)(i % 16)] = std::fma(w, a, acc[(size_t)(i % 16)]);
  }
  for (int width = 8; width >= 2; width /= 2)
    for (int i = 0; i < width; ++i) acc[(size_t)i] = acc[(size_t)i] + acc[(size_t)(i + width)];
  return acc[0] + acc[1];
}

float dot_f32_scalar(const void* w, const void* x, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(w);
  return canonical_dot([p](int64_t i) { return load_f32(p + 4 * i); }, static_cast<const float*>(x), n);
}

float dot_f16_scalar(const void* w, const void* x, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(w);
  return canonical_dot([p](int64_t i) { return f16_to_f32(load_u16(p + 2 * i)); },
                       static_cast<const float*>(x), n);
}

float dot_bf16_scalar(const void* w, const void* x, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(w);
  return canonical_dot([p](int64_t i) { return bf16_to_f32(load_u16(p + 2 * i)); },
                       static_cast<const float*>(x), n);
}

// n is the row's head_dim: codes at [0, n), scales at [n, n + n/32).
float dot_engram_scalar(const void* w, const void* x, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(w);
  return canonical_dot([p, n](int64_t i) { return engram_value(p[i], p[n + i / kEngramBlock]); },
                       static_cast<const float*>(x), n);
}

void dequant_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, (size_t)n * 4); }

void dequant_f16(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(p + 2 * i));
}

void dequant_bf16(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(p + 2 * i));
}

void dequant_engram(const void* src, float* dst, int64_t n) {
  if (n > std::numeric_limits<int>::max())
    throw Error("Engram row of " + std::to_string(n) + " values is too long");
  engram_dequant_row(static_cast<const uint8_t*>(src), (int)n, dst);
}

// Deterministic values, uniform in [-sqrt(3), sqrt(3)) * scale (rms = scale).
struct Rng {
  uint64_t state;
  uint64_t next() {  // splitmix64
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double value(float scale) {
    const double u = (double)(next() >> 11) * 0x1p-53 * 2.0 - 1.0;  // [-1, 1)
    return u * 1.7320508075688772 * (double)scale;
  }
};

// Clamped in double: converting an out-of-range double to float is undefined behaviour.
float clamp_abs(double v, float max) { return v > max ? max : v < -max ? -max : (float)v; }

void random_f32(void* dst, int64_t nblocks, uint64_t seed, float scale) {
  Rng rng{seed};
  auto* p = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < nblocks; ++i) {
    const float v = clamp_abs(rng.value(scale), std::numeric_limits<float>::max());
    std::memcpy(p + 4 * i, &v, 4);
  }
}

void random_f16(void* dst, int64_t nblocks, uint64_t seed, float scale) {
  Rng rng{seed};
  auto* p = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < nblocks; ++i) {
    const uint16_t h = f32_to_f16(clamp_abs(rng.value(scale), 65504.0f));
    std::memcpy(p + 2 * i, &h, 2);
  }
}

void random_bf16(void* dst, int64_t nblocks, uint64_t seed, float scale) {
  Rng rng{seed};
  auto* p = static_cast<uint8_t*>(dst);
  const float max_bf16 = std::bit_cast<float>(0x7f7f0000u);
  for (int64_t i = 0; i < nblocks; ++i) {
    const uint16_t b = f32_to_bf16(clamp_abs(rng.value(scale), max_bf16));
    std::memcpy(p + 2 * i, &b, 2);
  }
}

// Quantizes like DeepSeek's FP8 rows: per 32 values the smallest power-of-two scale that brings
// the block's amax to <= 448, then E4M3 round-to-nearest-even. Never produces a NaN byte.
void random_engram_row(uint8_t* row, int64_t head_dim, Rng& rng, float scale) {
  for (int64_t b = 0; b < head_dim / kEngramBlock; ++b) {
    float v[kEngramBlock];
    float amax = 0.0f;
    for (float& x : v) {
      x = clamp_abs(rng.value(scale), std::numeric_limits<float>::max());
      amax = std::fmax(amax, std::fabs(x));
    }
    int e = 127;
    if (amax > 0.0f && std::isfinite(amax)) {
      int exp2;
      const float frac = std::frexp(amax / 448.0f, &exp2);  // amax/448 = frac * 2^exp2
      e = 127 + (frac == 0.5f ? exp2 - 1 : exp2);           // ceil(log2(amax / 448))
      e = e < 0 ? 0 : e > 254 ? 254 : e;
    }
    for (int i = 0; i < kEngramBlock; ++i)
      row[b * kEngramBlock + i] = f32_to_e4m3(std::ldexp(v[i], 127 - e));
    row[head_dim + b] = (uint8_t)e;
  }
}

void random_engram(void* dst, int64_t nblocks, uint64_t seed, float scale) {
  Rng rng{seed};
  auto* p = static_cast<uint8_t*>(dst);
  const int64_t per_row = kEngramRandomHeadDim / kEngramBlock;
  const int64_t head_dim = nblocks % per_row == 0 ? kEngramRandomHeadDim : nblocks * kEngramBlock;
  for (int64_t done = 0; done < nblocks * kEngramBlock; done += head_dim) {
    random_engram_row(p, head_dim, rng, scale);
    p += engram_row_bytes(head_dim);
  }
}

constexpr TypeTraits kRows[] = {
    {GgmlType::F32, "F32", 1, 4, ActType::F32, true, dequant_f32, random_f32, dot_f32_scalar,
     dot_f32_avx2, dot_f32_avx512, gemm_f32_avx2, gemm_f32_avx512},
    {GgmlType::F16, "F16", 1, 2, ActType::F32, true, dequant_f16, random_f16, dot_f16_scalar,
     dot_f16_avx2, dot_f16_avx512, gemm_f16_avx2, gemm_f16_avx512},
    {GgmlType::BF16, "BF16", 1, 2, ActType::F32, true, dequant_bf16, random_bf16, dot_bf16_scalar,
     dot_bf16_avx2, dot_bf16_avx512, gemm_bf16_avx2, gemm_bf16_avx512},
    {GgmlType::ENGRAM_ROW, "ENGRAM_ROW", kEngramBlock, kEngramBlock + 1, ActType::F32, true,
     dequant_engram, random_engram, dot_engram_scalar, dot_engram_avx2, dot_engram_avx512, nullptr, nullptr},
};

}  // namespace

std::span<const TypeTraits> float_type_rows() { return kRows; }

}  // namespace sluice
