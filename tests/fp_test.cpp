// Scalar float encodings (src/kernels/fp.h) against independent formulas written here with
// double arithmetic, and against the F16C hardware conversion where the CPU has it.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "kernels/fp.h"

namespace sluice {
namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t b) { return std::bit_cast<float>(b); }

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// ---- F16 ----------------------------------------------------------------------------------

// IEEE binary16 by the textbook formula, evaluated in double (exact for every code).
double f16_formula(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  const double s = sign ? -1.0 : 1.0;
  if (exp == 31) return man ? std::nan("") : s * INFINITY;
  if (exp == 0) return s * std::ldexp((double)man, -24);
  return s * std::ldexp(1024.0 + man, exp - 25);
}

TEST(Fp, F16DecodeAllCodes) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = f16_to_f32((uint16_t)h);
    const double want = f16_formula((uint16_t)h);
    if (std::isnan(want)) {
      // NaN: sign and payload kept in the upper mantissa bits.
      EXPECT_EQ(bits(got), ((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13)) << std::hex << h;
    } else {
      EXPECT_EQ(bits(got), bits((float)want)) << std::hex << h;  // also checks the sign of zero
    }
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(bits(f16_to_f32(0x8000)), 0x80000000u);
}

// Round-to-nearest-even to binary16 in double arithmetic (std::nearbyint rounds half-even in the
// default rounding mode; every scaling below is by a power of two, hence exact).
uint16_t f16_formula_encode(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return sign | 0x7e00;
  const double a = std::fabs((double)f);
  if (a >= 65520.0) return sign | 0x7c00;  // halfway between 65504 and 2^16 rounds to even = Inf
  if (a < 0x1p-14) return (uint16_t)(sign | (uint16_t)std::nearbyint(a * 0x1p24));
  int e = std::ilogb(a);
  double q = std::nearbyint(std::ldexp(a, 10 - e));
  if (q == 2048.0) { q = 1024.0; ++e; }
  return (uint16_t)(sign | ((e + 15) << 10) | ((int)q - 1024));
}

__attribute__((target("f16c"))) void f16c_encode(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i + 4 <= n; i += 4) {
    const __m128i h = _mm_cvtps_ph(_mm_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), h);
  }
}

std::vector<float> f16_edge_cases() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f,
                          65536.0f, INFINITY, -INFINITY, 0x1p-24f, 0x1p-25f, 0x1.000002p-25f,
                          0x1.8p-24f, 0x1.4p-23f, 0x1p-14f, 0x1.ffcp-15f, 0x1.ffep-15f, 0x1p-149f,
                          std::numeric_limits<float>::max(), std::numeric_limits<float>::min()};
  // Every f16 value, the midpoints between neighbours (ties) and one f32 ulp either side.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float a = f16_to_f32((uint16_t)h), b = f16_to_f32((uint16_t)(h + 1));
    const float mid = (float)(((double)a + (double)b) / 2);  // exact: f16 has 11 bits
    for (float x : {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      v.push_back(x);
      v.push_back(-x);
    }
  }
  return v;
}

TEST(Fp, F32ToF16EdgeCasesMatchFormula) {
  for (float f : f16_edge_cases()) EXPECT_EQ(f32_to_f16(f), f16_formula_encode(f)) << std::hexfloat << f;
  for (uint32_t h = 0; h < 65536; ++h) {
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) continue;  // NaN codes
    EXPECT_EQ(f32_to_f16(f16_to_f32((uint16_t)h)), h) << "round trip " << std::hex << h;
  }
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);       // tie with zero -> even (0)
  EXPECT_EQ(f32_to_f16(0x1.8p-24f), 0x0002);     // 1.5 subnormal steps -> 2 (even)
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1.0f), 0xbc00);
}

TEST(Fp, F32ToF16NanIsCanonical) {
  for (uint32_t b : {0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0x7fa00000u, 0xffc00000u, 0xff800001u}) {
    const uint16_t want = (uint16_t)(((b >> 16) & 0x8000u) | 0x7e00u);
    EXPECT_EQ(f32_to_f16(from_bits(b)), want) << std::hex << b;
  }
}

TEST(Fp, F32ToF16MatchesF16cOnRandomBits) {
  __builtin_cpu_init();
  const bool have_f16c = __builtin_cpu_supports("f16c");
  std::vector<float> in = f16_edge_cases();
  uint64_t seed = 12345;
  for (int i = 0; i < (1 << 22); ++i) {
    const uint64_t r = splitmix(seed);
    in.push_back(from_bits((uint32_t)r));
    in.push_back(from_bits((uint32_t)(r >> 32)));
    // Bias half the draws to the f16 exponent range, where rounding actually happens.
    const uint32_t near = (uint32_t)(0x33000000u + (r % 0x15000000u)) | (uint32_t)((r >> 40) & 1u) << 31;
    in.push_back(from_bits(near));
  }
  std::vector<float> finite;
  for (float f : in)
    if (!std::isnan(f)) finite.push_back(f);
  while (finite.size() % 4) finite.push_back(0.0f);
  ASSERT_GT(finite.size(), 10'000'000u);
  std::vector<uint16_t> hw(finite.size());
  if (have_f16c) f16c_encode(finite.data(), hw.data(), finite.size());
  size_t bad = 0;
  for (size_t i = 0; i < finite.size(); ++i) {
    const uint16_t got = f32_to_f16(finite[i]);
    if (have_f16c && got != hw[i] && bad++ < 10)
      ADD_FAILURE() << std::hexfloat << finite[i] << ": f32_to_f16 " << std::hex << got << " F16C " << hw[i];
    if (got != f16_formula_encode(finite[i]) && bad++ < 10)
      ADD_FAILURE() << std::hexfloat << finite[i] << ": f32_to_f16 " << std::hex << got << " formula "
                    << f16_formula_encode(finite[i]);
  }
  EXPECT_EQ(bad, 0u);
  if (!have_f16c) std::puts("note: CPU has no F16C; compared with the double formula only");
}

// ---- BF16 ---------------------------------------------------------------------------------

// Nearest bf16 by comparing the distances to the two neighbours in double; ties to even.
uint16_t bf16_formula_encode(float f) {
  const uint32_t x = bits(f);
  if (std::isnan(f)) return (uint16_t)((x >> 16) | 0x40);
  const uint32_t lo = x & 0xffff0000u;
  if (lo == x) return (uint16_t)(x >> 16);
  const uint32_t hi = lo + 0x10000u;  // next bf16 away from zero (0x7f800000 = Inf is fine)
  const double dlo = std::fabs((double)f - (double)from_bits(lo));
  // Beyond the largest finite bf16 the "distance" to Inf is measured to 2^128, as IEEE does.
  const double vhi = (hi & 0x7fffffffu) == 0x7f800000u ? std::copysign(0x1p128, (double)f) : (double)from_bits(hi);
  const double dhi = std::fabs((double)f - vhi);
  if (dlo < dhi) return (uint16_t)(lo >> 16);
  if (dhi < dlo) return (uint16_t)(hi >> 16);
  return (uint16_t)(((lo >> 16) & 1u) ? hi >> 16 : lo >> 16);
}

TEST(Fp, Bf16RoundsHalfEven) {
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);  // tie, odd below -> up
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f807fffu)), 0x3f80);  // below the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0xbf818000u)), 0xbf82);  // negative tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f8000u)), 0x7f80);  // max bf16 + half ulp -> Inf
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000u)), 0x0000);  // subnormal tie -> even
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000u)), 0x0002);
  EXPECT_EQ(round_bf16(1.00390625f), 1.0f);  // 1 + 2^-8 is a tie
  EXPECT_EQ(round_bf16(3.0f), 3.0f);
}

TEST(Fp, Bf16NanIsQuietedKeepingSignAndPayload) {
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f800001u)), 0x7fc0);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7fc00000u)), 0x7fc0);
  EXPECT_EQ(f32_to_bf16(from_bits(0xffc00000u)), 0xffc0);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f9f0000u)), 0x7fdf);
  EXPECT_EQ(f32_to_bf16(from_bits(0xff80ffffu)), 0xffc0);  // payload only in the dropped bits
  EXPECT_TRUE(std::isnan(round_bf16(from_bits(0x7f800001u))));
}

TEST(Fp, Bf16MatchesFormulaOnRandomBits) {
  uint64_t seed = 777;
  size_t bad = 0;
  for (int i = 0; i < (1 << 22); ++i) {
    const uint32_t x = (uint32_t)splitmix(seed);
    const uint32_t tie = (x & 0xffff0000u) | 0x8000u;  // force an exact tie half the time
    for (uint32_t b : {x, tie}) {
      if (f32_to_bf16(from_bits(b)) != bf16_formula_encode(from_bits(b)) && bad++ < 10)
        ADD_FAILURE() << std::hex << b << ": " << f32_to_bf16(from_bits(b)) << " vs " << bf16_formula_encode(from_bits(b));
    }
  }
  EXPECT_EQ(bad, 0u);
  for (uint32_t b = 0; b < 65536; ++b) EXPECT_EQ(bits(bf16_to_f32((uint16_t)b)), b << 16);
}

// ---- E4M3 / E8M0 --------------------------------------------------------------------------

double e4m3_formula(uint8_t c) {
  const double s = (c & 0x80) ? -1.0 : 1.0;
  const int e = (c >> 3) & 15, m = c & 7;
  if (e == 0) return s * m * std::pow(2.0, -9);
  return s * (1.0 + m / 8.0) * std::pow(2.0, e - 7);
}

TEST(Fp, E4m3AllCodes) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_f32((uint8_t)c);
    EXPECT_EQ(e4m3_is_nan((uint8_t)c), c == 0x7f || c == 0xff) << c;
    if (c == 0x7f || c == 0xff) {
      EXPECT_TRUE(std::isnan(v));
      ++nans;
      continue;
    }
    EXPECT_EQ(bits(v), bits((float)e4m3_formula((uint8_t)c))) << c;
  }
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0.001953125f);
  EXPECT_EQ(e4m3_to_f32(0x08), 0.015625f);
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(bits(e4m3_to_f32(0x80)), 0x80000000u);
}

// Nearest E4M3 by brute force over the 127 non-negative finite codes; ties to the even code.
uint8_t e4m3_formula_encode(float f) {
  static const std::vector<double> values = [] {
    std::vector<double> v;
    for (int c = 0; c <= 0x7e; ++c) v.push_back(e4m3_formula((uint8_t)c));
    return v;
  }();
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return sign | 0x7f;
  const double a = std::fabs((double)f);
  if (a >= 448.0) return sign | 0x7e;
  int best = 0;
  for (int c = 1; c <= 0x7e; ++c) {
    const double d = std::fabs(values[(size_t)c] - a), db = std::fabs(values[(size_t)best] - a);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return (uint8_t)(sign | best);
}

TEST(Fp, F32ToE4m3) {
  for (int c = 0; c < 256; ++c) {
    if (e4m3_is_nan((uint8_t)c)) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32((uint8_t)c)), c) << "round trip " << c;
  }
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);   // tie between 1 (0x38) and 1.125 (0x39): even
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);   // tie between 0x39 and 0x3a: even
  EXPECT_EQ(f32_to_e4m3(0x1p-10f), 0x00);  // half the smallest subnormal: tie to 0
  EXPECT_EQ(f32_to_e4m3(0x1.8p-9f), 0x02); // 1.5 subnormal steps -> 2
  EXPECT_EQ(f32_to_e4m3(0x1.fp-7f), 0x08); // rounds up into the first normal
  EXPECT_EQ(f32_to_e4m3(449.0f), 0x7e);    // saturates instead of reaching the NaN code
  EXPECT_EQ(f32_to_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(f32_to_e4m3(std::nanf("")), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-std::nanf("")), 0xff);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  uint64_t seed = 99;
  for (int i = 0; i < 200000; ++i) {
    const uint64_t r = splitmix(seed);
    const float f = std::ldexp((float)(r & 0xffffff) / 0x1p24f, (int)((r >> 24) % 30) - 16) * ((r >> 40) & 1 ? -1.0f : 1.0f);
    ASSERT_EQ(f32_to_e4m3(f), e4m3_formula_encode(f)) << std::hexfloat << f;
  }
}

TEST(Fp, E8m0) {
  for (int e = 0; e < 255; ++e) {
    EXPECT_FALSE(e8m0_is_nan((uint8_t)e));
    EXPECT_EQ(bits(e8m0_to_f32((uint8_t)e)), bits((float)std::ldexp(1.0, e - 127))) << e;
  }
  EXPECT_EQ(e8m0_to_f32(0), 0x1p-127f);
  EXPECT_EQ(bits(e8m0_to_f32(0)), 0x00400000u);
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(254), 0x1p127f);
  EXPECT_TRUE(e8m0_is_nan(255));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

}  // namespace
}  // namespace sluice
