// FLOAT group of the type table (src/kernels/float_types*.cpp, engram_row.*): F32, F16, BF16
// and Engram rows. The scalar dot defines the result; every SIMD kernel the CPU can run must give
// the same bits (memcmp), including on extreme values and the sign of zero.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/engram_row.h"
#include "kernels/fp.h"
#include "kernels/types.h"
#include "util/error.h"

namespace sluice {
namespace {

const TypeTraits& tt(GgmlType t) { return type_traits(t); }

// The SIMD ISAs this CPU can run (dot_for would silently fall back for the others).
std::vector<Isa> simd_isas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::Avx2, Isa::Avx512})
    if ((int)detect_isa() >= (int)i) v.push_back(i);
  return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<float> random_floats(int64_t n, uint64_t seed) {
  std::vector<float> x((size_t)n);
  for (float& v : x) v = (float)((double)(splitmix(seed) >> 11) * 0x1p-53 * 4.0 - 2.0);
  return x;
}

// Weight bytes for a row of n elements, placed at an odd offset so unaligned loads are covered.
struct Row {
  std::vector<uint8_t> storage;
  uint8_t* data() { return storage.data() + 1; }
  explicit Row(uint64_t bytes) : storage(bytes + 1) {}
};

// All kernels of type t agree bit for bit with dot_scalar on (w, x, n).
void expect_simd_equals_scalar(const TypeTraits& t, const void* w, const float* x, int64_t n, const char* what) {
  const float ref = t.dot_scalar(w, x, n);
  for (Isa isa : simd_isas()) {
    const float got = dot_for(t, isa)(w, x, n);
    EXPECT_TRUE(same_bits(got, ref)) << t.name << " " << what << " n=" << n << " " << isa_name(isa) << ": got "
                                     << std::hexfloat << got << " scalar " << ref;
  }
}

constexpr GgmlType kElementTypes[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16};
constexpr int64_t kOddLengths[] = {1, 7, 15, 16, 17, 31, 33, 1000, 4099};

// ---- the rows ------------------------------------------------------------------------------

TEST(FloatKernelsTable, Rows) {
  struct Want { GgmlType t; const char* name; int elems, bytes; };
  for (Want w : {Want{GgmlType::F32, "F32", 1, 4}, Want{GgmlType::F16, "F16", 1, 2},
                 Want{GgmlType::BF16, "BF16", 1, 2}, Want{GgmlType::ENGRAM_ROW, "ENGRAM_ROW", 32, 33}}) {
    const TypeTraits& t = tt(w.t);
    EXPECT_EQ(t.name, w.name);
    EXPECT_EQ(t.block_elems, w.elems);
    EXPECT_EQ(t.block_bytes, w.bytes);
    EXPECT_EQ(t.act, ActType::F32);
    EXPECT_TRUE(t.has_kernels);
    EXPECT_TRUE(t.dequant && t.random && t.dot_scalar && t.dot_avx2 && t.dot_avx512);
    EXPECT_EQ(type_from_name(w.name), w.t);
  }
  EXPECT_EQ(row_bytes(GgmlType::ENGRAM_ROW, 256), 264u);
  EXPECT_EQ(engram_row_bytes(256), 264);
  EXPECT_EQ(row_bytes(GgmlType::BF16, 7), 14u);
  // On a CPU with AVX-512 the tests below really exercise distinct SIMD code.
  if (detect_isa() == Isa::Avx512)
    for (GgmlType g : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::ENGRAM_ROW}) {
      EXPECT_NE(dot_for(tt(g), Isa::Avx512), tt(g).dot_scalar);
      EXPECT_NE(dot_for(tt(g), Isa::Avx2), tt(g).dot_scalar);
    }
}

// ---- SIMD == scalar ------------------------------------------------------------------------

TEST(FloatKernelsSimd, RandomRowsMatchScalar) {
  for (GgmlType g : kElementTypes) {
    const TypeTraits& t = tt(g);
    for (int64_t n : kOddLengths)
      for (uint64_t seed : {1u, 2u, 3u}) {
        Row w(row_bytes(g, (uint64_t)n));
        t.random(w.data(), n, seed * 1000 + (uint64_t)n, 0.7f);
        const std::vector<float> x = random_floats(n, seed);
        expect_simd_equals_scalar(t, w.data(), x.data(), n, "random");
      }
  }
}

TEST(FloatKernelsSimd, EngramRandomRowsMatchScalar) {
  const TypeTraits& t = tt(GgmlType::ENGRAM_ROW);
  for (int64_t head_dim : {32, 64, 96, 256, 4096})
    for (uint64_t seed : {5u, 6u}) {
      Row w((uint64_t)engram_row_bytes(head_dim));
      if (head_dim / 32 % 8 != 0 || head_dim == 256) {
        t.random(w.data(), head_dim / 32, seed, 3.0f);  // one row of head_dim (see engram_row.h)
      } else {
        // The RandomFn would write rows of 256; build one long row from random valid bytes.
        uint64_t s = seed;
        for (int64_t i = 0; i < head_dim; ++i) {
          uint8_t c = (uint8_t)splitmix(s);
          w.data()[i] = e4m3_is_nan(c) ? 0x7e : c;
        }
        for (int64_t k = 0; k < head_dim / 32; ++k) w.data()[head_dim + k] = (uint8_t)(110 + splitmix(s) % 30);
      }
      ASSERT_TRUE(engram_row_valid(w.data(), (int)head_dim));
      const std::vector<float> x = random_floats(head_dim, seed + 10);
      expect_simd_equals_scalar(t, w.data(), x.data(), head_dim, "random");
    }
}

// Values that stress the rounding: near overflow, near underflow, subnormal, both zeros, mixed
// signs. Infinities are included (their NaNs are the hardware default NaN on both paths).
const float kHugeTiny[] = {3e38f, -3e38f, std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                           1e-38f, -1e-38f, 1e-45f, -1e-45f, 3e-40f, -3e-40f, 0.0f, -0.0f, 1.0f, -1.0f,
                           1e20f, -1e20f, 65504.0f, 1.5f, INFINITY, -INFINITY};
// Weight palettes; [2] and [3] are the smallest subnormals, the last two are the infinities.
const uint16_t kF16Extreme[] = {0x7bff, 0xfbff, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x0400, 0x8000,
                                0x0000, 0x3c00, 0xbc00, 0x3555, 0x7c00, 0xfc00};
const uint16_t kBf16Extreme[] = {0x7f7f, 0xff7f, 0x0001, 0x8001, 0x0080, 0x8080, 0x8000, 0x0000,
                                 0x3f80, 0xbf80, 0x4049, 0x1f00, 0x7f80, 0xff80};
static_assert(std::size(kF16Extreme) == std::size(kBf16Extreme));

TEST(FloatKernelsSimd, ExtremeValuesMatchScalar) {
  for (GgmlType g : kElementTypes) {
    const TypeTraits& t = tt(g);
    for (int64_t n : kOddLengths)
      for (int mode = 0; mode < 3; ++mode) {  // 0: palette incl. Inf, 1: finite only, 2: tiny only
        uint64_t s = (uint64_t)n * 31 + (uint64_t)mode;
        Row w(row_bytes(g, (uint64_t)n));
        std::vector<float> x((size_t)n);
        const size_t pal = std::size(kHugeTiny) - (mode ? 2 : 0);
        for (int64_t i = 0; i < n; ++i) {
          const uint64_t r = splitmix(s);
          x[(size_t)i] = mode == 2 ? kHugeTiny[4 + (r >> 8) % 8] : kHugeTiny[(r >> 8) % pal];
          if (g == GgmlType::F32) {
            const float v = mode == 2 ? kHugeTiny[4 + r % 8] : kHugeTiny[r % pal];
            std::memcpy(w.data() + 4 * i, &v, 4);
          } else {
            const uint16_t* p = g == GgmlType::F16 ? kF16Extreme : kBf16Extreme;
            const size_t m = std::size(kF16Extreme) - (mode ? 2 : 0);
            const uint16_t v = mode == 2 ? p[2 + r % 2] : p[r % m];
            std::memcpy(w.data() + 2 * i, &v, 2);
          }
        }
        expect_simd_equals_scalar(t, w.data(), x.data(), n, mode == 0 ? "extreme+inf" : mode == 1 ? "extreme" : "tiny");
      }
  }
}

TEST(FloatKernelsSimd, EngramExtremeScalesMatchScalar) {
  const TypeTraits& t = tt(GgmlType::ENGRAM_ROW);
  const uint8_t codes[] = {0x7e, 0xfe, 0x01, 0x81, 0x00, 0x80, 0x08, 0x09, 0x0c, 0x38, 0x77, 0xf7};
  const uint8_t scales[] = {0, 1, 2, 100, 127, 200, 253, 254};
  for (int64_t head_dim : {32, 256, 1024}) {
    uint64_t s = (uint64_t)head_dim;
    Row w((uint64_t)engram_row_bytes(head_dim));
    for (int64_t i = 0; i < head_dim; ++i) w.data()[i] = codes[splitmix(s) % std::size(codes)];
    for (int64_t k = 0; k < head_dim / 32; ++k) w.data()[head_dim + k] = scales[splitmix(s) % std::size(scales)];
    std::vector<float> x((size_t)head_dim);
    for (float& v : x) v = kHugeTiny[splitmix(s) % (std::size(kHugeTiny) - 2)];
    expect_simd_equals_scalar(t, w.data(), x.data(), head_dim, "extreme scales");
  }
}

// A product that underflows from below leaves -0 in its lane; the zero padding turns such a lane
// into +0 (fma(0, 0, -0) = +0). The result is -0 only when all 16 lanes hold -0 and none is padded.
TEST(FloatKernelsSimd, SignOfZeroFollowsThePadding) {
  struct Case { GgmlType g; uint32_t wbits; float x; };
  for (Case c : {Case{GgmlType::F32, 0x8da24260u /* -1e-30 */, 1e-30f}, Case{GgmlType::F16, 0x8001u, 1e-40f},
                 Case{GgmlType::BF16, 0x8001u, 1e-20f}}) {
    const TypeTraits& t = tt(c.g);
    for (int64_t n : {15, 16, 17, 32, 33}) {
      Row w(row_bytes(c.g, (uint64_t)n));
      for (int64_t i = 0; i < n; ++i) std::memcpy(w.data() + i * t.block_bytes, &c.wbits, (size_t)t.block_bytes);
      const std::vector<float> x((size_t)n, c.x);
      const bool negative = n % 16 == 0;
      const float want = negative ? -0.0f : 0.0f;
      EXPECT_TRUE(same_bits(t.dot_scalar(w.data(), x.data(), n), want)) << t.name << " n=" << n;
      expect_simd_equals_scalar(t, w.data(), x.data(), n, "signed zero");
    }
  }
}

TEST(FloatKernelsSimd, NanInputGivesNan) {
  for (GgmlType g : kElementTypes) {
    const TypeTraits& t = tt(g);
    for (int64_t n : {1, 17, 100}) {
      Row w(row_bytes(g, (uint64_t)n));
      t.random(w.data(), n, 4, 1.0f);
      const uint32_t nan32 = 0x7fc01234u;
      const uint16_t nan16 = g == GgmlType::F16 ? 0x7e01 : 0x7fc1;
      if (g == GgmlType::F32) std::memcpy(w.data() + 4 * (n - 1), &nan32, 4);
      else std::memcpy(w.data() + 2 * (n - 1), &nan16, 2);
      const std::vector<float> x = random_floats(n, 9);
      EXPECT_TRUE(std::isnan(t.dot_scalar(w.data(), x.data(), n)));
      for (Isa isa : simd_isas()) EXPECT_TRUE(std::isnan(dot_for(t, isa)(w.data(), x.data(), n))) << t.name;
    }
  }
  const TypeTraits& e = tt(GgmlType::ENGRAM_ROW);
  for (auto [pos, byte] : {std::pair{5, 0x7f}, std::pair{40, 0xff}, std::pair{64, 0xff}}) {
    Row w((uint64_t)engram_row_bytes(64));
    e.random(w.data(), 2, 3, 1.0f);
    w.data()[pos] = (uint8_t)byte;  // position 64 is the first scale byte
    const std::vector<float> x = random_floats(64, 2);
    EXPECT_TRUE(std::isnan(e.dot_scalar(w.data(), x.data(), 64)));
    for (Isa isa : simd_isas()) EXPECT_TRUE(std::isnan(dot_for(e, isa)(w.data(), x.data(), 64)));
  }
}

// ---- accuracy ------------------------------------------------------------------------------

// Dequantize, then an f64 dot (each product of two floats is exact in double), compared with the
// kernel. Error bound of the canonical dot: every output is a chain of at most m = ceil(n/16)
// fmas in one lane plus 4 reduction adds, each rounding once with relative error <= u = 2^-24,
// so |dot - exact| <= (m + 4) u / (1 - (m + 4) u) * sum |w_i x_i| (Higham, gamma_k). Products
// below the normal range add an absolute error of at most 2^-149 per operation.
void expect_close_to_exact(const TypeTraits& t, const void* w, const float* x, int64_t n) {
  std::vector<float> deq((size_t)n);
  t.dequant(w, deq.data(), n);
  double exact = 0, mag = 0;
  for (int64_t i = 0; i < n; ++i) {
    exact += (double)deq[(size_t)i] * (double)x[(size_t)i];
    mag += std::fabs((double)deq[(size_t)i] * (double)x[(size_t)i]);
  }
  const double k = (double)((n + 15) / 16 + 4), u = 0x1p-24;
  const double tol = k * u / (1 - k * u) * mag + (double)(n + 4) * 0x1p-149;
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    const float got = dot_for(t, isa)(w, x, n);
    EXPECT_LE(std::fabs((double)got - exact), tol) << t.name << " n=" << n << " " << isa_name(isa);
  }
}

TEST(FloatKernelsAccuracy, DequantThenDotInDouble) {
  for (GgmlType g : kElementTypes)
    for (int64_t n : kOddLengths) {
      Row w(row_bytes(g, (uint64_t)n));
      tt(g).random(w.data(), n, (uint64_t)n, 2.0f);
      const std::vector<float> x = random_floats(n, (uint64_t)n + 1);
      expect_close_to_exact(tt(g), w.data(), x.data(), n);
    }
  for (int64_t head_dim : {32, 256}) {
    Row w((uint64_t)engram_row_bytes(head_dim));
    tt(GgmlType::ENGRAM_ROW).random(w.data(), head_dim / 32, 11, 0.05f);
    const std::vector<float> x = random_floats(head_dim, 12);
    expect_close_to_exact(tt(GgmlType::ENGRAM_ROW), w.data(), x.data(), head_dim);
  }
}

// ---- known values (bit patterns decoded by hand) -------------------------------------------

void expect_dot_everywhere(GgmlType g, const void* w, const float* x, int64_t n, float want) {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    const float got = dot_for(tt(g), isa)(w, x, n);
    EXPECT_TRUE(same_bits(got, want)) << tt(g).name << " " << isa_name(isa) << ": " << std::hexfloat << got
                                      << " want " << want;
  }
}

TEST(FloatKernelsKnown, F32) {
  // 1.0, 2.0, -0.5, 0.25
  const uint32_t w[] = {0x3f800000u, 0x40000000u, 0xbf000000u, 0x3e800000u};
  const float x[] = {3.0f, 0.25f, 4.0f, -8.0f};
  expect_dot_everywhere(GgmlType::F32, w, x, 4, -0.5f);  // 3 + 0.5 - 2 - 2
  float deq[4];
  tt(GgmlType::F32).dequant(w, deq, 4);
  EXPECT_EQ(deq[2], -0.5f);
}

// Pins the summation order: lane 0 gets 2^24 then 1 (rounds back to 2^24, tie to even), lane 8
// gets -2^24, lane 1 gets 1. Canonical: (2^24 + -2^24) + 1 = 1; a left-to-right sum would give 2.
TEST(FloatKernelsKnown, F32LaneOrder) {
  uint32_t w[18] = {};
  float x[18] = {};
  w[0] = 0x4b800000u;  // 2^24
  w[8] = 0xcb800000u;  // -2^24
  w[16] = 0x3f800000u;
  w[17] = 0x3f800000u;
  for (float& v : x) v = 1.0f;
  expect_dot_everywhere(GgmlType::F32, w, x, 18, 1.0f);
}

TEST(FloatKernelsKnown, F16) {
  // 1.0, -2.0, 0.333251953125 (1365/4096), 2^-24 (smallest subnormal), 65504 (max), -2^-14
  const uint16_t w[] = {0x3c00, 0xc000, 0x3555, 0x0001, 0x7bff, 0x8400};
  const float x[] = {0.5f, 0.25f, 3.0f, 16777216.0f, 0.0009765625f, 16384.0f};
  // lanes: 0.5, -0.5, 0.999755859375, 1, 63.96875, -1
  // +4: 64.46875, -1.5, 0.999755859375, 1   +2: 65.468505859375, -0.5   sum: 64.968505859375
  expect_dot_everywhere(GgmlType::F16, w, x, 6, 64.968505859375f);
  float deq[6];
  tt(GgmlType::F16).dequant(w, deq, 6);
  const float want[] = {1.0f, -2.0f, 0.333251953125f, 5.9604644775390625e-08f, 65504.0f, -6.103515625e-05f};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(deq[i], want[i]) << i;
}

TEST(FloatKernelsKnown, Bf16) {
  // 1.0, 3.140625, -123.5, 2^-133 (smallest subnormal), 255 * 2^120 (max finite), 2^-7
  const uint16_t w[] = {0x3f80, 0x4049, 0xc2f7, 0x0001, 0x7f7f, 0x3c00};
  const float x[] = {2.0f, 2.0f, 0.5f, 0x1p126f, 0x1p-120f, 128.0f};
  // lanes: 2, 6.28125, -61.75, 0.0078125, 255, 1
  // +4: 257, 7.28125, -61.75, 0.0078125   +2: 195.25, 7.2890625   sum: 202.5390625
  expect_dot_everywhere(GgmlType::BF16, w, x, 6, 202.5390625f);
  float deq[6];
  tt(GgmlType::BF16).dequant(w, deq, 6);
  const float want[] = {1.0f, 3.140625f, -123.5f, 9.18354961579912115600575419705e-41f, 3.38953138925153547590470800371e38f,
                        0.0078125f};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(deq[i], want[i]) << i;
}

// Three 32-value blocks with scale bytes 127 (x1), 0 (x2^-127) and 254 (x2^127).
std::vector<uint8_t> known_engram_row() {
  std::vector<uint8_t> r((size_t)engram_row_bytes(96), 0);
  const uint8_t b0[] = {0x38, 0xb8, 0x01, 0x7e, 0x80, 0x3c, 0x4b, 0xfe};
  const uint8_t b1[] = {0x09, 0x0c, 0x01, 0x3f, 0x0d, 0x8c};
  const uint8_t b2[] = {0x38, 0x40, 0xc0};
  std::memcpy(&r[0], b0, sizeof b0);
  std::memcpy(&r[32], b1, sizeof b1);
  std::memcpy(&r[64], b2, sizeof b2);
  r[96] = 127;
  r[97] = 0;
  r[98] = 254;
  return r;
}

TEST(FloatKernelsKnown, EngramRowDecodedByHand) {
  const std::vector<uint8_t> row = known_engram_row();
  ASSERT_TRUE(engram_row_valid(row.data(), 96));
  std::vector<float> v(96, 42.0f);
  engram_dequant_row(row.data(), 96, v.data());
  // Block 0, scale 1: 0x38 = 1, 0xb8 = -1, 0x01 = 2^-9, 0x7e = 448, 0x80 = -0, 0x3c = 1.5,
  // 0x4b = 1.375 * 4, 0xfe = -448.
  const float want0[] = {1.0f, -1.0f, 0.001953125f, 448.0f, -0.0f, 1.5f, 5.5f, -448.0f};
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(same_bits(v[(size_t)i], want0[i])) << i << " " << v[(size_t)i];
  for (int i = 8; i < 32; ++i) EXPECT_TRUE(same_bits(v[(size_t)i], 0.0f)) << i;
  // Block 1, scale 2^-127: products land in the bf16 subnormal range, step 2^-133.
  //   0x09 = 1.125 * 2^-6 -> 1.125 steps -> 1 step;   0x0c = 1.5 * 2^-6 -> 1.5 steps -> 2 (tie, even)
  //   0x01 = 2^-9 -> 2^-136 = 1/8 step -> 0;          0x3f = 1.875 -> 1.875 * 2^-127 = 120 steps, exact
  //   0x0d = 1.625 * 2^-6 -> 1.625 steps -> 2;        0x8c -> -2 steps
  const float want1[] = {0x1p-133f, 0x1p-132f, 0.0f, 1.1020259538958945e-38f, 0x1p-132f, -0x1p-132f};
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(same_bits(v[(size_t)(32 + i)], want1[i])) << i << " " << v[(size_t)(32 + i)];
  EXPECT_EQ(1.1020259538958945e-38f, 120 * 0x1p-133f);
  // Block 2, scale 2^127: 1 -> 2^127; 2 -> overflow to +Inf; -2 -> -Inf.
  EXPECT_EQ(v[64], 0x1p127f);
  EXPECT_EQ(v[65], INFINITY);
  EXPECT_EQ(v[66], -INFINITY);
  EXPECT_TRUE(same_bits(v[67], 0.0f));
  // The table's DequantFn is the same decoder (n = head_dim).
  std::vector<float> t(96);
  tt(GgmlType::ENGRAM_ROW).dequant(row.data(), t.data(), 96);
  EXPECT_EQ(0, std::memcmp(t.data(), v.data(), 96 * sizeof(float)));
}

TEST(FloatKernelsKnown, EngramDot) {
  std::vector<uint8_t> row = known_engram_row();
  // Use the first two blocks as a row of 64: codes 0..63, then scales 127 and 0.
  std::vector<uint8_t> r64(row.begin(), row.begin() + 64);
  r64.push_back(127);
  r64.push_back(0);
  float x[64] = {};
  const float head[] = {1.0f, 0.5f, 512.0f, 0.25f, 7.0f, 2.0f, 2.0f, 0.125f};
  std::memcpy(x, head, sizeof head);
  // lanes 0-7: 1, -0.5, 1, 112, 0, 3, 11, -56 (block 1 meets x = 0)
  // +4: 1, 2.5, 12, 56   +2: 13, 58.5   sum: 71.5
  expect_dot_everywhere(GgmlType::ENGRAM_ROW, r64.data(), x, 64, 71.5f);
}

TEST(FloatKernelsEngram, NanCodesRejected) {
  std::vector<uint8_t> row = known_engram_row();
  EXPECT_TRUE(engram_row_valid(row.data(), 96));
  for (auto [pos, byte] : {std::pair{0, 0x7f}, std::pair{95, 0xff}, std::pair{31, 0x7f}, std::pair{96, 0xff},
                           std::pair{98, 0xff}}) {
    std::vector<uint8_t> bad = row;
    bad[(size_t)pos] = (uint8_t)byte;
    EXPECT_FALSE(engram_row_valid(bad.data(), 96)) << pos;
    float v[96];
    engram_dequant_row(bad.data(), 96, v);
    EXPECT_TRUE(std::isnan(v[pos < 96 ? pos : (pos - 96) * 32])) << pos;
  }
  // The largest codes and scale are valid.
  std::vector<uint8_t> ok = row;
  ok[5] = 0x7e;
  ok[6] = 0xfe;
  ok[97] = 254;
  EXPECT_TRUE(engram_row_valid(ok.data(), 96));
  EXPECT_TRUE(std::isnan(engram_value(0x7f, 127)));
  EXPECT_TRUE(std::isnan(engram_value(0x38, 255)));
  EXPECT_THROW(engram_row_valid(row.data(), 33), Error);
  EXPECT_THROW(engram_row_valid(row.data(), 0), Error);
  float v[96];
  EXPECT_THROW(engram_dequant_row(row.data(), 48, v), Error);
}

// ---- RandomFn ------------------------------------------------------------------------------

TEST(FloatKernelsRandom, DeterministicFiniteAndScaled) {
  for (GgmlType g : kElementTypes) {
    const TypeTraits& t = tt(g);
    const int64_t n = 4096;
    for (float scale : {1e-3f, 1.0f, 300.0f}) {
      std::vector<uint8_t> a(row_bytes(g, n)), b(a.size()), c(a.size());
      t.random(a.data(), n, 7, scale);
      t.random(b.data(), n, 7, scale);
      t.random(c.data(), n, 8, scale);
      EXPECT_EQ(a, b) << t.name;
      EXPECT_NE(a, c) << t.name;
      std::vector<float> v((size_t)n);
      t.dequant(a.data(), v.data(), n);
      double ss = 0;
      for (float f : v) {
        ASSERT_TRUE(std::isfinite(f)) << t.name;
        ss += (double)f * f;
      }
      const double rms = std::sqrt(ss / (double)n);
      EXPECT_GT(rms, 0.8 * scale) << t.name;
      EXPECT_LT(rms, 1.25 * scale) << t.name;
    }
    // Scales beyond the format's range still give finite values.
    std::vector<uint8_t> a(row_bytes(g, 64));
    t.random(a.data(), 64, 1, g == GgmlType::F32 ? 1e38f : g == GgmlType::F16 ? 1e6f : 1e38f);
    std::vector<float> v(64);
    t.dequant(a.data(), v.data(), 64);
    for (float f : v) EXPECT_TRUE(std::isfinite(f)) << t.name;
  }
}

TEST(FloatKernelsRandom, EngramRowsValidAndScaled) {
  const TypeTraits& t = tt(GgmlType::ENGRAM_ROW);
  // nblocks % 8 == 0: rows of 256.
  const int64_t rows = 16;
  std::vector<uint8_t> a((size_t)(rows * 264)), b(a.size());
  t.random(a.data(), rows * 8, 21, 0.02f);
  t.random(b.data(), rows * 8, 21, 0.02f);
  EXPECT_EQ(a, b);
  double ss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* p = a.data() + r * 264;
    ASSERT_TRUE(engram_row_valid(p, 256)) << r;
    float v[256];
    t.dequant(p, v, 256);
    for (float f : v) {
      ASSERT_TRUE(std::isfinite(f));
      ss += (double)f * f;
    }
  }
  const double rms = std::sqrt(ss / (double)(rows * 256));
  EXPECT_GT(rms, 0.8 * 0.02);
  EXPECT_LT(rms, 1.25 * 0.02);
  // Otherwise: a single row of 32 * nblocks values.
  std::vector<uint8_t> c((size_t)(3 * 33));
  t.random(c.data(), 3, 2, 5.0f);
  EXPECT_TRUE(engram_row_valid(c.data(), 96));
  float v[96];
  t.dequant(c.data(), v, 96);
  double s3 = 0;
  for (float f : v) s3 += (double)f * f;
  EXPECT_GT(std::sqrt(s3 / 96), 0.6 * 5.0);
  EXPECT_LT(std::sqrt(s3 / 96), 1.6 * 5.0);
}

}  // namespace
}  // namespace sluice
