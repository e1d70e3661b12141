// The FLOAT group's GEMMs (src/kernels/gemm_float_avx2.cpp, gemm_float_avx512.cpp) on the values
// where a register tile could drift from the canonical dot: Inf/NaN weights, products that round
// to -0 (the zero padding turns a -0 lane into +0), subnormal weights and activations, and the
// lengths n = 1 and n = 17 (all tail, one step plus a tail). Each (row, token) of the GEMM must
// equal dot_scalar bit for bit (memcmp), on row and token counts that leave ragged register tiles.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/fp.h"
#include "kernels/types.h"

namespace sluice {
namespace {

constexpr GgmlType kFloatTypes[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16};

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Stores the float v as element i of a row of type g (F16/BF16 values must be representable).
void put(GgmlType g, uint8_t* row, int64_t i, float v) {
  if (g == GgmlType::F32) {
    std::memcpy(row + 4 * i, &v, 4);
  } else {
    const uint16_t h = g == GgmlType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
    std::memcpy(row + 2 * i, &h, 2);
  }
}

void put_bits(GgmlType g, uint8_t* row, int64_t i, uint32_t bits) {
  if (g == GgmlType::F32) {
    std::memcpy(row + 4 * i, &bits, 4);
  } else {
    const uint16_t h = (uint16_t)bits;
    std::memcpy(row + 2 * i, &h, 2);
  }
}

// rows x n weights (one byte off alignment) and tokens x n activations (each at its own odd
// float offset), filled by the callers' functions.
struct Case {
  GgmlType g;
  int64_t rows, tokens, n;
  size_t row_bytes;
  std::vector<uint8_t> w;
  std::vector<std::vector<float>> x;
  std::vector<const uint8_t*> acts;
  Case(GgmlType gg, int64_t r, int64_t t, int64_t nn, const std::function<void(uint8_t*, int64_t, int64_t)>& weight,
       const std::function<float(int64_t, int64_t)>& act)
      : g(gg), rows(r), tokens(t), n(nn), row_bytes((size_t)nn * (gg == GgmlType::F32 ? 4 : 2)) {
    w.resize(row_bytes * (size_t)r + 1);
    for (int64_t i = 0; i < r; ++i) weight(row(i), i, nn);
    for (int64_t k = 0; k < t; ++k) {
      x.emplace_back((size_t)(nn + 1 + k % 3));
      for (int64_t i = 0; i < nn; ++i) x.back()[(size_t)(i + 1 + k % 3)] = act(k, i);
    }
    for (int64_t k = 0; k < t; ++k)
      acts.push_back(reinterpret_cast<const uint8_t*>(x[(size_t)k].data() + 1 + k % 3));
  }
  uint8_t* row(int64_t r) { return w.data() + 1 + (size_t)r * row_bytes; }
};

// Every GEMM of type g this CPU runs, on every (row, token) of c: memcmp with dot_scalar.
// Returns the number of pairs checked, so a caller can tell the case was not empty.
int64_t expect_gemm_equals_scalar(Case& c, const std::string& what) {
  const TypeTraits& t = type_traits(c.g);
  int64_t checked = 0;
  for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
    if (detect_isa() < isa) continue;
    const GemmFn gemm = isa == Isa::Avx2 ? t.gemm_avx2 : t.gemm_avx512;
    if (!gemm) {
      ADD_FAILURE() << t.name << " has no " << isa_name(isa) << " GEMM";
      continue;
    }
    const size_t ldy = (size_t)c.rows + 1;
    std::vector<float> y(ldy * (size_t)c.tokens, -7.0f);
    gemm(c.row(0), c.row_bytes, c.rows, c.acts.data(), c.tokens, c.n, y.data(), ldy);
    int bad = 0;
    for (int64_t k = 0; k < c.tokens; ++k)
      for (int64_t r = 0; r < c.rows; ++r) {
        const float want = t.dot_scalar(c.row(r), c.acts[(size_t)k], c.n);
        const float got = y[(size_t)k * ldy + (size_t)r];
        ++checked;
        if (std::memcmp(&want, &got, 4) != 0 && bad++ < 3)
          ADD_FAILURE() << t.name << " " << isa_name(isa) << " " << what << " rows=" << c.rows << " tokens=" << c.tokens
                        << " n=" << c.n << " at (r=" << r << ", t=" << k << "): got " << std::hexfloat << got
                        << " scalar " << want;
      }
  }
  return checked;
}

float uniform(uint64_t& s) { return (float)((double)(splitmix(s) >> 11) * 0x1p-53 * 4.0 - 2.0); }

// Row kinds: 0 finite, 1 one NaN with a payload (a single NaN source, so its quieted payload is
// the result on every path), 2 infinities of both signs (products of opposite infinities and
// Inf * 0 give the default NaN), 3 one +Inf meeting finite activations (the result is +Inf).
TEST(GemmFloat, InfAndNanWeightsGiveTheScalarBits) {
  for (GgmlType g : kFloatTypes)
    for (int64_t n : {1, 17, 100})
      for (auto [rows, tokens] : {std::pair{5, 7}, std::pair{9, 13}}) {
        const uint32_t nan_bits = g == GgmlType::F32 ? 0x7fc01234u : g == GgmlType::F16 ? 0x7e01u : 0x7fc1u;
        Case c(
            g, rows, tokens, n,
            [&](uint8_t* w, int64_t r, int64_t len) {
              uint64_t s = (uint64_t)(r * 131 + len);
              for (int64_t i = 0; i < len; ++i) put(g, w, i, g == GgmlType::F32 ? uniform(s) : 0.5f);
              const int kind = (int)(r % 4);
              if (kind == 1) put_bits(g, w, splitmix(s) % (uint64_t)len, nan_bits);
              if (kind == 2)
                for (int64_t i = 0; i < len; i += 3) put(g, w, i, i % 2 ? -INFINITY : INFINITY);
              if (kind == 3) put(g, w, len / 2, INFINITY);
            },
            // Token 2 has zeros (Inf * 0), the others are positive so kind 3 stays +Inf.
            [&](int64_t k, int64_t i) { return k == 2 && i % 2 == 0 ? 0.0f : 0.25f + (float)((k + i) % 5); });
        EXPECT_GT(expect_gemm_equals_scalar(c, "inf/nan"), 0);
      }
}

// Each product rounds to -0 (tiny negative weight x tiny positive activation) or +0. A lane that
// the zero padding walks turns -0 into +0 (fma(0, 0, -0) = +0), so a row of -0 products gives -0
// only when n is a multiple of 16. Tokens alternate the activation's sign.
TEST(GemmFloat, NegativeZeroProductsFollowThePadding) {
  for (GgmlType g : kFloatTypes) {
    const uint32_t wbits = g == GgmlType::F32 ? 0x8da24260u /* -1e-30 */ : 0x8001u;
    const float a = g == GgmlType::F32 ? 1e-30f : g == GgmlType::F16 ? 1e-40f : 1e-20f;
    for (int64_t n : {1, 15, 16, 17, 32, 33})
      for (auto [rows, tokens] : {std::pair{3, 5}, std::pair{6, 8}}) {
        Case c(
            g, rows, tokens, n,
            [&](uint8_t* w, int64_t, int64_t len) {
              for (int64_t i = 0; i < len; ++i) put_bits(g, w, i, wbits);
            },
            [&](int64_t k, int64_t) { return k % 2 ? -a : a; });
        const TypeTraits& t = type_traits(g);
        const float neg = t.dot_scalar(c.row(0), c.acts[0], n);
        EXPECT_EQ(std::signbit(neg), n % 16 == 0) << t.name << " n=" << n;
        EXPECT_EQ(neg, 0.0f);
        EXPECT_GT(expect_gemm_equals_scalar(c, "signed zero"), 0);
      }
  }
}

// Subnormal weights (every F16/BF16 subnormal exponent pattern, F32 down to 2^-149) against
// subnormal, tiny normal and ordinary activations; products and sums land in the subnormal range,
// where flush-to-zero or a converter that drops subnormals would show.
TEST(GemmFloat, SubnormalsGiveTheScalarBits) {
  for (GgmlType g : kFloatTypes)
    for (int64_t n : {1, 17, 64, 70})
      for (auto [rows, tokens] : {std::pair{7, 11}}) {
        Case c(
            g, rows, tokens, n,
            [&](uint8_t* w, int64_t r, int64_t len) {
              uint64_t s = (uint64_t)(r * 17 + len);
              for (int64_t i = 0; i < len; ++i) {
                const uint64_t v = splitmix(s);
                const uint32_t mant = g == GgmlType::F32 ? (uint32_t)(v & 0x7fffff) | 1u
                                      : g == GgmlType::F16 ? (uint32_t)(v & 0x3ff) | 1u
                                                           : (uint32_t)(v & 0x7f) | 1u;
                const uint32_t sign = (v >> 40) & 1 ? (g == GgmlType::F32 ? 0x80000000u : 0x8000u) : 0u;
                put_bits(g, w, i, sign | mant);  // exponent field 0: a subnormal
              }
            },
            [&](int64_t k, int64_t i) {
              const float vals[] = {1e-40f, -3e-39f, 1e-38f, 1.0f, -2.5f, 6e4f, 1e30f};
              return vals[(size_t)((k * 5 + i) % 7)];
            });
        EXPECT_GT(expect_gemm_equals_scalar(c, "subnormal"), 0);
      }
}

// n = 1 (the whole row is the masked / padded tail) and n = 17 (one full step and a one-element
// tail), on random weights and activations, for every row count 1..9 and token count 1..13 (all
// ragged register tiles of both ISAs).
TEST(GemmFloat, LengthsOneAndSeventeenGiveTheScalarBits) {
  for (GgmlType g : kFloatTypes)
    for (int64_t n : {1, 17})
      for (int64_t rows = 1; rows <= 9; ++rows)
        for (int64_t tokens = 1; tokens <= 13; ++tokens) {
          Case c(
              g, rows, tokens, n,
              [&](uint8_t* w, int64_t r, int64_t len) {
                type_traits(g).random(w, len, (uint64_t)(r * 7 + len + tokens), 1.0f);
              },
              [&](int64_t k, int64_t i) {
                uint64_t s = (uint64_t)(k * 1000 + i + rows);
                return uniform(s);
              });
          EXPECT_GT(expect_gemm_equals_scalar(c, "short"), 0);
        }
}


// Rows longer than a K-block (the AVX-512 F16/BF16 GEMM converts 1,024 elements of a tile at a
// time and keeps each pair's accumulators between blocks) and more tokens than a token block
// (48): exact multiples, one step past and a ragged tail, with some products that round to -0
// in the last block (the padding's fma(0, 0, acc) turns a -0 lane into +0 on every path).
TEST(GemmFloat, RowsAcrossKBlocksAndTokensAcrossTokenBlocks) {
  for (GgmlType g : kFloatTypes)
    for (int64_t n : {1024, 1040, 2048, 2500})
      for (int64_t tokens : {47, 53, 97}) {
        const int64_t rows = 7;
        Case c(
            g, rows, tokens, n,
            [&](uint8_t* w, int64_t r, int64_t len) {
              type_traits(g).random(w, len, (uint64_t)(r * 13 + len + tokens), 1.0f);
              if (r == 2)  // tiny weights near the end: products that underflow to +-0
                for (int64_t i = len - 20; i < len; ++i) put(g, w, i, (i % 2 ? -1.0f : 1.0f) * 0x1p-100f);
            },
            [&](int64_t k, int64_t i) {
              if (i >= n - 20) return (k % 2 ? 0x1p-60f : -0x1p-60f);
              uint64_t s = (uint64_t)(k * 100003 + i);
              return uniform(s);
            });
        EXPECT_EQ(expect_gemm_equals_scalar(c, "long"), rows * tokens * (detect_isa() >= Isa::Avx512 ? 2 : 1));
      }
}

}  // namespace
}  // namespace sluice
