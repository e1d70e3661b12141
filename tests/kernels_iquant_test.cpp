// Tests of the iquant format group: Q8_0 (weights and the activation quantizer), Q2_0, IQ2_XXS,
// IQ2_XS, TQ2_0. Expected values in the "Known" tests were derived by hand from
// quant-formats.md (3.1, 4.7, 4.8, 4.12, 4.13) and the grid data file, not from the code.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/fp.h"
#include "kernels/iq_tables.h"
#include "kernels/types.h"
#include "util/error.h"

namespace sluice {
namespace {

using Bytes = std::vector<uint8_t>;

void put16(Bytes& b, size_t at, uint16_t v) { std::memcpy(&b[at], &v, 2); }
void put32(Bytes& b, size_t at, uint32_t v) { std::memcpy(&b[at], &v, 4); }
void putf(Bytes& b, size_t at, float v) { std::memcpy(&b[at], &v, 4); }
uint16_t get16(const Bytes& b, size_t at) { uint16_t v; std::memcpy(&v, &b[at], 2); return v; }
float getf(const Bytes& b, size_t at) { float v; std::memcpy(&v, &b[at], 4); return v; }
uint32_t fbits(float f) { return std::bit_cast<uint32_t>(f); }

// fp16 bit patterns used below.
constexpr uint16_t kH0_25 = 0x3400, kH0_5 = 0x3800, kH1 = 0x3c00, kH2 = 0x4000, kH3 = 0x4200, kH4 = 0x4400;

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint32_t below(uint32_t n) { return (uint32_t)((next() >> 32) * n >> 32); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(next() >> 40) * 0x1p-24f; }
};

// Q8_0 activation blocks: fp16 d, any int8 codes (-128 included: the kernels must be exact there too).
Bytes q8_0_act(int64_t nb, uint64_t seed, float dlo = 0.01f, float dhi = 1.0f) {
  Rng r{seed};
  Bytes b((size_t)nb * 34);
  for (int64_t i = 0; i < nb; ++i) {
    put16(b, 34 * i, f32_to_f16(r.uniform(dlo, dhi) * (r.below(2) ? -1.0f : 1.0f)));
    for (int j = 0; j < 32; ++j) b[34 * i + 2 + j] = (uint8_t)r.below(256);
  }
  return b;
}

// Q8_K activation blocks built directly (the Q8_K quantizer is another group's): float d, any
// int8 codes, bsums computed from them.
Bytes q8_k_act(int64_t nb, uint64_t seed, float dlo = 0.001f, float dhi = 0.1f) {
  Rng r{seed};
  Bytes b((size_t)nb * 292);
  for (int64_t i = 0; i < nb; ++i) {
    putf(b, 292 * i, r.uniform(dlo, dhi) * (r.below(2) ? -1.0f : 1.0f));
    for (int j = 0; j < 256; ++j) b[292 * i + 4 + j] = (uint8_t)r.below(256);
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += (int8_t)b[292 * i + 4 + 16 * g + j];
      put16(b, 292 * i + 260 + 2 * g, (uint16_t)(int16_t)s);
    }
  }
  return b;
}

// Decoded activations (exact in double).
std::vector<double> decode_act(ActType a, const Bytes& y, int64_t n) {
  std::vector<double> v((size_t)n);
  if (a == ActType::Q8_0) {
    for (int64_t e = 0; e < n; ++e)
      v[e] = (double)f16_to_f32(get16(y, 34 * (e / 32))) * (int8_t)y[34 * (e / 32) + 2 + e % 32];
  } else {
    for (int64_t e = 0; e < n; ++e) v[e] = (double)getf(y, 292 * (e / 256)) * (int8_t)y[292 * (e / 256) + 4 + e % 256];
  }
  return v;
}

const GgmlType kTypes[] = {GgmlType::Q8_0, GgmlType::Q2_0, GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::TQ2_0};

// Byte offset and width of the weight block's fp16 scale.
size_t scale_offset(GgmlType t) { return t == GgmlType::TQ2_0 ? 64 : 0; }

Bytes make_act(const TypeTraits& t, int64_t n, uint64_t seed) {
  return t.act == ActType::Q8_0 ? q8_0_act(n / 32, seed) : q8_k_act(n / 256, seed);
}

// ============================================================================================
// Tables

std::map<std::string, std::vector<uint64_t>> read_table_file() {
  std::ifstream f(std::string(SLUICE_TEST_DATA) + "/iq-grid-tables.txt");
  EXPECT_TRUE(f.good()) << "cannot open tests/data/iq-grid-tables.txt";
  std::map<std::string, std::vector<uint64_t>> out;
  std::string line, cur;
  size_t expected = 0;
  std::map<std::string, size_t> counts;
  while (std::getline(f, line)) {
    if (line.rfind("# SECTION ", 0) == 0) {
      std::istringstream is(line.substr(10));
      is >> cur >> expected;
      counts[cur] = expected;
      out[cur];
    } else if (!line.empty() && line[0] != '#') {
      out[cur].push_back(std::stoull(line, nullptr, 16));
    }
  }
  for (const auto& [name, n] : counts) EXPECT_EQ(out[name].size(), n) << name;
  return out;
}

TEST(IQuantTables, MatchDataFile) {
  auto file = read_table_file();
  ASSERT_EQ(file["iq2xxs_grid"].size(), 256u);
  ASSERT_EQ(file["iq2xs_grid"].size(), 512u);
  ASSERT_EQ(file["ksigns_iq2xs"].size(), 128u);
  ASSERT_EQ(file["kmask_iq2xs"].size(), 8u);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(iq2xxs_grid[i], file["iq2xxs_grid"][i]) << i;
  for (int i = 0; i < 512; ++i) EXPECT_EQ(iq2xs_grid[i], file["iq2xs_grid"][i]) << i;
  for (int i = 0; i < 128; ++i) EXPECT_EQ(ksigns_iq2xs[i], file["ksigns_iq2xs"][i]) << i;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(kmask_iq2xs[i], file["kmask_iq2xs"][i]) << i;
}

TEST(IQuantTables, CountsAndAlphabet) {
  EXPECT_EQ(sizeof(iq2xxs_grid) / sizeof(iq2xxs_grid[0]), 256u);
  EXPECT_EQ(sizeof(iq2xs_grid) / sizeof(iq2xs_grid[0]), 512u);
  EXPECT_EQ(std::set<uint64_t>(iq2xxs_grid, iq2xxs_grid + 256).size(), 256u);
  EXPECT_EQ(std::set<uint64_t>(iq2xs_grid, iq2xs_grid + 512).size(), 512u);
  auto alphabet_ok = [](uint64_t g) {
    for (int j = 0; j < 8; ++j) {
      const unsigned b = (g >> (8 * j)) & 0xff;
      if (b != 0x08 && b != 0x19 && b != 0x2b) return false;
    }
    return true;
  };
  for (int i = 0; i < 256; ++i) EXPECT_TRUE(alphabet_ok(iq2xxs_grid[i])) << i;
  for (int i = 0; i < 512; ++i) EXPECT_TRUE(alphabet_ok(iq2xs_grid[i])) << i;
  // Spot values read off the data file by eye.
  EXPECT_EQ(iq2xxs_grid[1], 0x080808080808082bull);
  EXPECT_EQ(iq2xxs_grid[255], 0x2b2b2b1908081908ull);
  EXPECT_EQ(iq2xs_grid[300], 0x1908190808191908ull);
  EXPECT_EQ(iq2xs_grid[511], 0x2b2b2b2b2b2b2b2bull);
}

TEST(IQuantTables, SignsParityRule) {
  for (int i = 0; i < 128; ++i) {
    EXPECT_EQ(ksigns_iq2xs[i] & 0x7f, i);
    EXPECT_EQ(std::popcount((unsigned)ksigns_iq2xs[i]) % 2, 0) << i;  // even number of negatives
  }
  EXPECT_EQ(ksigns_iq2xs[1], 0x81);
  EXPECT_EQ(ksigns_iq2xs[3], 0x03);
  EXPECT_EQ(ksigns_iq2xs[127], 0xff);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(kmask_iq2xs[j], 1u << j);
}

TEST(IQuantTables, DerivedSignMasks) {
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 8; ++j)
      EXPECT_EQ((ksigns_mask_iq2xs[i] >> (8 * j)) & 0xff, (ksigns_iq2xs[i] >> j) & 1 ? 0xffu : 0u) << i << " " << j;
  EXPECT_EQ(ksigns_mask_iq2xs[1], 0xff000000000000ffull);  // elements 0 and 7 (parity)
}

// ============================================================================================
// Rows

TEST(IQuantRows, Geometry) {
  struct Want { GgmlType t; const char* name; int qk, bytes; ActType act; uint32_t id; };
  const Want want[] = {{GgmlType::Q8_0, "Q8_0", 32, 34, ActType::Q8_0, 8},
                       {GgmlType::Q2_0, "Q2_0", 64, 18, ActType::Q8_0, 42},
                       {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66, ActType::Q8_K, 16},
                       {GgmlType::IQ2_XS, "IQ2_XS", 256, 74, ActType::Q8_K, 17},
                       {GgmlType::TQ2_0, "TQ2_0", 256, 66, ActType::Q8_K, 35}};
  for (const auto& w : want) {
    const TypeTraits* t = find_type(w.id);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->type, w.t);
    EXPECT_EQ(t->name, w.name);
    EXPECT_EQ(t->block_elems, w.qk);
    EXPECT_EQ(t->block_bytes, w.bytes);
    EXPECT_EQ(t->act, w.act);
    EXPECT_TRUE(t->has_kernels);
    EXPECT_NE(t->dequant, nullptr);
    EXPECT_NE(t->random, nullptr);
    EXPECT_NE(t->dot_scalar, nullptr);
    EXPECT_NE(t->dot_avx2, nullptr);
    EXPECT_NE(t->dot_avx512, nullptr);
    EXPECT_EQ(type_from_name(w.name), w.t);
  }
  EXPECT_EQ(row_bytes(GgmlType::Q2_0, 4096), 4096u / 64 * 18);
  EXPECT_THROW(row_bytes(GgmlType::Q2_0, 96), Error);
}

// ============================================================================================
// Q8_0 activation quantizer (reference rule: d = amax/127, id = 1/d, roundf = half away from 0)

TEST(IQuantQ8_0Quantizer, KnownValues) {
  std::vector<float> x(128, 0.0f);
  // Block 0: amax 127 -> d = 1, id = 1. Ties .5 go away from zero (RNE would give 2 for 2.5).
  const float b0[] = {127, 63.5f, -63.5f, 0.5f, -0.5f, 1.5f, 2.5f, -2.5f, 3.49f, -0.49f};
  for (int j = 0; j < 10; ++j) x[j] = b0[j];
  // Block 1: amax 254 -> d = 2, id = 0.5: 5 -> 2.5 -> 3, 1 -> 0.5 -> 1, 3 -> 1.5 -> 2, -5 -> -3.
  const float b1[] = {-254, 5, 1, 3, -5, 7, -1};
  for (int j = 0; j < 7; ++j) x[32 + j] = b1[j];
  // Block 2: all zero. Block 3: amax 100 -> d = 0.78740156 (stored fp16 0x3a4d = 0.787597...).
  x[96] = 100;
  x[97] = -100;
  Bytes q(4 * 34);
  quantize_activation(ActType::Q8_0, x.data(), q.data(), 128);
  EXPECT_EQ(get16(q, 0), kH1);
  const int e0[] = {127, 64, -64, 1, -1, 2, 3, -3, 3, 0};
  for (int j = 0; j < 10; ++j) EXPECT_EQ((int8_t)q[2 + j], e0[j]) << j;
  for (int j = 10; j < 32; ++j) EXPECT_EQ(q[2 + j], 0) << j;
  EXPECT_EQ(get16(q, 34), kH2);
  const int e1[] = {-127, 3, 1, 2, -3, 4, -1};
  for (int j = 0; j < 7; ++j) EXPECT_EQ((int8_t)q[34 + 2 + j], e1[j]) << j;
  for (int j = 0; j < 34; ++j) EXPECT_EQ(q[68 + j], 0) << "zero block byte " << j;
  EXPECT_EQ(get16(q, 102), 0x3a4d);
  EXPECT_EQ((int8_t)q[104], 127);
  EXPECT_EQ((int8_t)q[105], -127);
  EXPECT_EQ(q[106], 0);
}

TEST(IQuantQ8_0Quantizer, RandomErrorBoundAndRowLength) {
  Rng r{7};
  std::vector<float> x(32 * 33);
  for (auto& v : x) v = r.uniform(-3.0f, 3.0f);
  Bytes q(33 * 34);
  quantize_activation(ActType::Q8_0, x.data(), q.data(), (int64_t)x.size());
  for (int i = 0; i < 33; ++i) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * i + j]));
    const float d = amax / 127.0f;
    EXPECT_EQ(get16(q, 34 * i), f32_to_f16(d));
    for (int j = 0; j < 32; ++j) {
      // Codes are computed with the unrounded d: each is within half a step of x/d.
      EXPECT_LE(std::fabs((int8_t)q[34 * i + 2 + j] - x[32 * i + j] / d), 0.5f + 1e-4f);
    }
  }
  EXPECT_THROW(quantize_activation(ActType::Q8_0, x.data(), q.data(), 48), Error);
}

// ============================================================================================
// Hand-computed blocks

std::vector<float> dequant(GgmlType t, const Bytes& b, int64_t n) {
  std::vector<float> out((size_t)n);
  type_traits(t).dequant(b.data(), out.data(), n);
  return out;
}

float dot_scalar(GgmlType t, const Bytes& x, const Bytes& y, int64_t n) {
  return type_traits(t).dot_scalar(x.data(), y.data(), n);
}

// Every available ISA gives the same value as the scalar reference on a known block too.
void expect_all_isas(GgmlType t, const Bytes& x, const Bytes& y, int64_t n, float want) {
  const TypeTraits& tr = type_traits(t);
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (isa > detect_isa()) continue;
    EXPECT_EQ(fbits(dot_for(tr, isa)(x.data(), y.data(), n)), fbits(want)) << isa_name(isa);
  }
}

TEST(IQuantKnown, Q8_0) {
  Bytes x(68, 0), y(68, 0);
  put16(x, 0, kH0_5);
  x[2 + 0] = 3;
  x[2 + 5] = (uint8_t)-128;
  x[2 + 31] = 127;
  put16(y, 0, kH2);
  for (int j = 0; j < 32; ++j) y[2 + j] = 7;  // multiplies x = 0 except at 0, 5, 31
  y[2 + 0] = (uint8_t)-2;
  y[2 + 5] = (uint8_t)-128;
  y[2 + 31] = 1;
  put16(x, 34, kH1);
  put16(y, 34, kH0_25);
  for (int j = 0; j < 32; ++j) {
    x[36 + j] = 1;
    y[36 + j] = (uint8_t)-4;
  }
  const auto d = dequant(GgmlType::Q8_0, x, 64);
  EXPECT_EQ(d[0], 1.5f);
  EXPECT_EQ(d[1], 0.0f);
  EXPECT_EQ(d[5], -64.0f);
  EXPECT_EQ(d[31], 63.5f);
  EXPECT_EQ(d[32], 1.0f);
  // Block 0: (3*-2 + -128*-128 + 127*1) * (0.5*2) = 16505; block 1: 32*-4 * 0.25 = -32.
  EXPECT_EQ(dot_scalar(GgmlType::Q8_0, x, y, 64), 16473.0f);
  expect_all_isas(GgmlType::Q8_0, x, y, 64, 16473.0f);
}

TEST(IQuantKnown, Q2_0) {
  Bytes x(18, 0x55);  // 0x55: every code 01 = 0
  put16(x, 0, kH2);
  x[2 + 0] = 0xe4;   // elements 0..3: codes 00 01 10 11 = -1 0 +1 +2
  x[2 + 8] = 0x1b;   // elements 32..35: codes 11 10 01 00 = +2 +1 0 -1
  x[2 + 15] = 0x80;  // elements 60..63: codes 00 00 00 10 = -1 -1 -1 +1
  const auto d = dequant(GgmlType::Q2_0, x, 64);
  const float want_head[] = {-2, 0, 2, 4};
  const float want_mid[] = {4, 2, 0, -2};
  const float want_tail[] = {-2, -2, -2, 2};
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(d[j], want_head[j]) << j;
    EXPECT_EQ(d[32 + j], want_mid[j]) << j;
    EXPECT_EQ(d[60 + j], want_tail[j]) << j;
  }
  for (int j = 4; j < 32; ++j) EXPECT_EQ(d[j], 0.0f) << j;

  Bytes y(68, 5);
  put16(y, 0, kH0_5);
  put16(y, 34, kH4);
  const int y0[] = {10, 20, 30, 40};
  const int y1[] = {7, 2, 3, 4};
  for (int j = 0; j < 4; ++j) {
    y[2 + j] = (uint8_t)y0[j];
    y[36 + j] = (uint8_t)y1[j];
  }
  y[36 + 28] = 1, y[36 + 29] = 1, y[36 + 30] = 1, y[36 + 31] = 9;
  // sblk0 = -10 + 0 + 30 + 80 = 100; sblk1 = (14 + 2 + 0 - 4) + (-1 - 1 - 1 + 9) = 18;
  // acc = 0.5*100 + 4*18 = 122; dot = 2 * 122.
  EXPECT_EQ(dot_scalar(GgmlType::Q2_0, x, y, 64), 244.0f);
  expect_all_isas(GgmlType::Q2_0, x, y, 64, 244.0f);
}

TEST(IQuantKnown, Iq2Xxs) {
  Bytes x(66, 0);
  put16(x, 0, kH1);
  // Sub-block 0: grid indices 1, 0, 3, 255 (one byte each in w0); sign indices 1, 5, 0, 127 in
  // 7-bit fields of w1, scale 3 in its top nibble.
  put32(x, 2, 1u | 0u << 8 | 3u << 16 | 255u << 24);
  put32(x, 6, 1u | 5u << 7 | 0u << 14 | 127u << 21 | 3u << 28);
  // Sub-block 1: grid 0 everywhere, no signs, scale 15. Sub-blocks 2..7: all zero (scale 0).
  put32(x, 10, 0);
  put32(x, 14, 15u << 28);
  const auto d = dequant(GgmlType::IQ2_XXS, x, 256);
  // db = 1 * (0.5 + 3) * 0.25 = 0.875; magnitudes 8 -> 7, 25 -> 21.875, 43 -> 37.625.
  const float want0[32] = {
      -37.625f, 7, 7, 7, 7, 7, 7, -7,  // grid[1] = 43 8 8 8 8 8 8 8, ksigns[1] = 0x81 (parity bit 7)
      -7, 7, -7, 7, 7, 7, 7, 7,        // grid[0], ksigns[5] = 0x05
      7, 37.625f, 7, 7, 7, 7, 7, 7,    // grid[3] = 8 43 8 8 8 8 8 8, no signs
      -7, -21.875f, -7, -7, -21.875f, -37.625f, -37.625f, -37.625f};  // grid[255], ksigns[127] = 0xff
  for (int j = 0; j < 32; ++j) EXPECT_EQ(d[j], want0[j]) << j;
  for (int j = 32; j < 64; ++j) EXPECT_EQ(d[j], 31.0f) << j;  // 8 * 15.5 * 0.25
  for (int j = 64; j < 256; ++j) EXPECT_EQ(d[j], 1.0f) << j;  // 8 * 0.5 * 0.25

  Bytes y(292, 0);
  putf(y, 0, 0.5f);
  for (int j = 0; j < 256; ++j) y[4 + j] = 1;
  y[4 + 7] = 3;
  y[4 + 31] = (uint8_t)-2;
  y[4 + 40] = 5;
  // Sub-block 0 integer sums with y = 1: -3, 32, 99, -203; y[7] = 3 adds 2*-8, y[31] = -2 adds
  // -3*-43: groups -19, 32, 99, -74 = 38, times 2*3+1 = 266. Sub-block 1: 256 + 4*8 = 288, times
  // 31 = 8928. Sub-blocks 2..7: 6 * 256. bsum = 10730; 0.125 * (1 * 0.5) * 10730 = 670.625.
  EXPECT_EQ(dot_scalar(GgmlType::IQ2_XXS, x, y, 256), 670.625f);
  expect_all_isas(GgmlType::IQ2_XXS, x, y, 256, 670.625f);
}

TEST(IQuantKnown, Iq2Xs) {
  Bytes x(74, 0);
  put16(x, 0, kH1);
  // Sub-block 0: group 0 = grid 300 (needs the 9th index bit) with sign index 1; group 1 = grid 0;
  // group 2 = grid 511 with sign index 3; group 3 = grid 0. Scales: low nibble 2, high nibble 5.
  put16(x, 2, (uint16_t)(300 | 1 << 9));
  put16(x, 4, 0);
  put16(x, 6, (uint16_t)(511 | 3 << 9));
  put16(x, 8, 0);
  x[66] = 0x52;
  const auto d = dequant(GgmlType::IQ2_XS, x, 256);
  // db_lo = (0.5 + 2) * 0.25 = 0.625, db_hi = (0.5 + 5) * 0.25 = 1.375.
  const float want0[32] = {
      -5, 15.625f, 15.625f, 5, 5, 15.625f, 5, -15.625f,  // grid[300] = 8 25 25 8 8 25 8 25, 0x81
      5, 5, 5, 5, 5, 5, 5, 5,                              // grid[0] at 0.625
      -59.125f, -59.125f, 59.125f, 59.125f, 59.125f, 59.125f, 59.125f, 59.125f,  // 43s, 0x03
      11, 11, 11, 11, 11, 11, 11, 11};                     // grid[0] at 1.375
  for (int j = 0; j < 32; ++j) EXPECT_EQ(d[j], want0[j]) << j;
  for (int j = 32; j < 256; ++j) EXPECT_EQ(d[j], 1.0f) << j;

  Bytes y(292, 0);
  putf(y, 0, 2.0f);
  for (int j = 0; j < 256; ++j) y[4 + j] = 1;
  y[4 + 0] = (uint8_t)-1;
  y[4 + 17] = 4;
  // Groups: 66 + 16 = 82, 64, 172 - 129 = 43, 64. (82 + 64) * 5 + (43 + 64) * 11 = 1907;
  // sub-blocks 1..7 add 7 * 256. 0.125 * 2 * 3699 = 924.75.
  EXPECT_EQ(dot_scalar(GgmlType::IQ2_XS, x, y, 256), 924.75f);
  expect_all_isas(GgmlType::IQ2_XS, x, y, 256, 924.75f);
}

TEST(IQuantKnown, Tq2_0) {
  Bytes x(66, 0x55);  // every code 01 = 0
  put16(x, 64, kH3);
  x[33] = 0x92;  // codes l=0..3: 10 00 01 10 -> elements 129 (+1), 161 (-1), 193 (0), 225 (+1)
  x[0] = 0x54;   // element 0: code 00 (-1)
  x[31] = 0x15;  // element 96 + 31 = 127: code 00 (-1)
  x[10] = 0xd5;  // element 96 + 10 = 106: code 11, decodes to +2 (never produced, but defined)
  const auto d = dequant(GgmlType::TQ2_0, x, 256);
  for (int e = 0; e < 256; ++e) {
    float want = 0.0f;
    if (e == 0 || e == 127 || e == 161) want = -3.0f;
    if (e == 129 || e == 225) want = 3.0f;
    if (e == 106) want = 6.0f;
    EXPECT_EQ(d[e], want) << e;
  }
  x[10] = 0x55;
  Bytes y(292, 0);
  putf(y, 0, 0.25f);
  for (int j = 0; j < 256; ++j) y[4 + j] = 7;
  y[4 + 0] = 2;
  y[4 + 127] = (uint8_t)-5;
  y[4 + 129] = 4;
  y[4 + 161] = 6;
  y[4 + 225] = (uint8_t)-8;
  // sumi = -2 + 5 + 4 - 6 - 8 = -7; dot = -7 * (0.25 * 3).
  EXPECT_EQ(dot_scalar(GgmlType::TQ2_0, x, y, 256), -5.25f);
  expect_all_isas(GgmlType::TQ2_0, x, y, 256, -5.25f);
}

// ============================================================================================
// SIMD == scalar, bit for bit

struct SimdCase {
  Isa isa;
  DotFn fn;
};

std::vector<SimdCase> simd_impls(const TypeTraits& t) {
  std::vector<SimdCase> v;
  if (detect_isa() >= Isa::Avx2) v.push_back({Isa::Avx2, t.dot_avx2});
  if (detect_isa() >= Isa::Avx512) v.push_back({Isa::Avx512, t.dot_avx512});
  return v;
}

void expect_same_bits(const TypeTraits& t, const Bytes& x, const Bytes& y, int64_t n, const char* what) {
  const float ref = t.dot_scalar(x.data(), y.data(), n);
  for (const auto& c : simd_impls(t)) {
    const float got = c.fn(x.data(), y.data(), n);
    EXPECT_EQ(std::memcmp(&got, &ref, 4), 0)
        << t.name << " " << isa_name(c.isa) << " " << what << " n=" << n << ": " << got << " vs scalar " << ref;
  }
}

TEST(IQuantSimd, Dispatch) {
  // The bit-exactness tests below exercise every SIMD path this CPU can run (the development
  // machine has AVX-512, so both); on a smaller CPU dot_for must fall back to the best lower one.
  if (detect_isa() < Isa::Avx512)
    std::cerr << "note: CPU lacks AVX-512 (detected " << isa_name(detect_isa()) << "); its kernels are not run\n";
  for (GgmlType ty : kTypes) {
    const TypeTraits& t = type_traits(ty);
    EXPECT_EQ(dot_for(t, Isa::Scalar), t.dot_scalar) << t.name;
    EXPECT_EQ(dot_for(t, Isa::Avx2), detect_isa() >= Isa::Avx2 ? t.dot_avx2 : t.dot_scalar) << t.name;
    EXPECT_EQ(dot_for(t, Isa::Avx512), detect_isa() >= Isa::Avx512 ? t.dot_avx512 : dot_for(t, Isa::Avx2))
        << t.name;
  }
}

TEST(IQuantSimd, RandomValidBlocks) {
  for (GgmlType ty : kTypes) {
    const TypeTraits& t = type_traits(ty);
    for (int64_t nb : {1, 3, 7, 33}) {
      for (uint64_t seed : {1u, 2u, 3u, 1234567u}) {
        const int64_t n = nb * t.block_elems;
        Bytes x((size_t)(nb * t.block_bytes));
        t.random(x.data(), nb, seed, 0.02f);
        expect_same_bits(t, x, make_act(t, n, seed * 31 + 5), n, "random");
      }
    }
  }
}

TEST(IQuantSimd, ArbitraryBytes) {
  // Any byte pattern (Q8_0 codes -128, TQ2_0 code 3, every grid/sign index) with finite scales.
  for (GgmlType ty : kTypes) {
    const TypeTraits& t = type_traits(ty);
    for (int64_t nb : {1, 3, 7, 33}) {
      Rng r{(uint64_t)nb * 977};
      const int64_t n = nb * t.block_elems;
      Bytes x((size_t)(nb * t.block_bytes));
      for (auto& b : x) b = (uint8_t)r.below(256);
      for (int64_t i = 0; i < nb; ++i)
        put16(x, (size_t)(i * t.block_bytes) + scale_offset(ty), f32_to_f16(r.uniform(-0.1f, 0.1f)));
      expect_same_bits(t, x, make_act(t, n, nb), n, "arbitrary bytes");
    }
  }
}

TEST(IQuantSimd, ExtremeScalesAndCodes) {
  const uint16_t weight_scales[] = {0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff, 0x0000, 0x1000};
  const float q8k_scales[] = {1e-45f, 1e-38f, 1e-30f, 3e38f, -3e38f, 1e30f, 0.0f, 1.0f};
  const uint16_t q8_0_scales[] = {0x0001, 0x03ff, 0x7bff, 0xfbff, 0x0400, 0x0000, 0x3c00, 0x8400};
  for (GgmlType ty : kTypes) {
    const TypeTraits& t = type_traits(ty);
    for (int64_t nb : {1, 3, 7, 33}) {
      const int64_t n = nb * t.block_elems;
      Bytes x((size_t)(nb * t.block_bytes));
      t.random(x.data(), nb, 99 + nb, 1.0f);
      Bytes y = make_act(t, n, 7 + nb);
      for (int64_t i = 0; i < nb; ++i)
        put16(x, (size_t)(i * t.block_bytes) + scale_offset(ty), weight_scales[i % 8]);
      if (t.act == ActType::Q8_0) {
        for (int64_t i = 0; i < n / 32; ++i) put16(y, (size_t)(34 * i), q8_0_scales[(i / 3) % 8]);
      } else {
        for (int64_t i = 0; i < n / 256; ++i) putf(y, (size_t)(292 * i), q8k_scales[(i + 1) % 8]);
      }
      expect_same_bits(t, x, y, n, "extreme scales");
      // Saturated codes: activations all -128 or all 127 stress the unsigned/signed operand tricks.
      for (int v : {-128, 127}) {
        Bytes ys = y;
        if (t.act == ActType::Q8_0) {
          for (int64_t i = 0; i < n / 32; ++i) std::memset(&ys[34 * i + 2], (uint8_t)v, 32);
        } else {
          for (int64_t i = 0; i < n / 256; ++i) std::memset(&ys[292 * i + 4], (uint8_t)v, 256);
        }
        expect_same_bits(t, x, ys, n, v < 0 ? "activations -128" : "activations 127");
      }
    }
  }
  // Q8_0 weights of -128 against -128 activations (the one product maddubs cannot hold).
  const TypeTraits& t = type_traits(GgmlType::Q8_0);
  Bytes x(34 * 7, 0x80), y(34 * 7, 0x80);
  for (int i = 0; i < 7; ++i) put16(x, 34 * i, kH1), put16(y, 34 * i, kH0_5);
  expect_same_bits(t, x, y, 7 * 32, "all -128");
  EXPECT_EQ(t.dot_scalar(x.data(), y.data(), 7 * 32), 7.0f * 32 * 16384 * 0.5f);
}

// ============================================================================================
// Dot product against the decoded values, summed in double

TEST(IQuantDot, MatchesDequantizedDouble) {
  for (GgmlType ty : kTypes) {
    const TypeTraits& t = type_traits(ty);
    for (int64_t nb : {1, 3, 7, 33}) {
      for (uint64_t seed : {11u, 12u}) {
        const int64_t n = nb * t.block_elems;
        Bytes x((size_t)(nb * t.block_bytes));
        t.random(x.data(), nb, seed, 0.05f);
        const Bytes y = make_act(t, n, seed + 100);
        const auto xd = dequant(ty, x, n);
        const auto yd = decode_act(t.act, y, n);
        double ref = 0, mag = 0;
        for (int64_t e = 0; e < n; ++e) {
          ref += (double)xd[e] * yd[e];
          mag += std::fabs((double)xd[e] * yd[e]);
        }
        // Error budget in units of u = 2^-24 times sum |x*y|: each decoded weight carries <= 2
        // roundings (scale product, magnitude product); each block's float step <= 3 (scale
        // product, int->float of a sum that may exceed 2^24, final product), the 2-term Q2_0
        // accumulation 1 more; the running float sum over nb blocks adds <= nb - 1.
        const double tol = (double)(nb + 8) * 0x1p-24 * mag;
        for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
          if (isa > detect_isa()) continue;
          const float got = dot_for(t, isa)(x.data(), y.data(), n);
          EXPECT_NEAR((double)got, ref, tol) << t.name << " nb=" << nb << " " << isa_name(isa);
        }
      }
    }
  }
}

// ============================================================================================
// Random blocks

TEST(IQuantRandom, DeterministicValidAndScaled) {
  for (GgmlType ty : kTypes) {
    const TypeTraits& t = type_traits(ty);
    const int64_t nb = 64, n = nb * t.block_elems;
    Bytes a((size_t)(nb * t.block_bytes)), b = a, c = a;
    t.random(a.data(), nb, 5, 1.0f);
    t.random(b.data(), nb, 5, 1.0f);
    t.random(c.data(), nb, 6, 1.0f);
    EXPECT_EQ(a, b) << t.name;
    EXPECT_NE(a, c) << t.name;
    for (float scale : {1e-3f, 1.0f, 30.0f}) {
      t.random(a.data(), nb, 8, scale);
      for (int64_t i = 0; i < nb; ++i) {
        const uint16_t h = get16(a, (size_t)(i * t.block_bytes) + scale_offset(ty));
        EXPECT_NE(h & 0x7c00, 0x7c00) << t.name << " block " << i << ": non-finite scale";
        EXPECT_EQ(h & 0x8000, 0) << t.name;
      }
      const auto v = dequant(ty, a, n);
      double ss = 0;
      for (float f : v) ss += (double)f * f;
      const double rms = std::sqrt(ss / (double)n);
      EXPECT_GT(rms, 0.7 * scale) << t.name << " scale " << scale;
      EXPECT_LT(rms, 1.4 * scale) << t.name << " scale " << scale;
    }
    if (ty == GgmlType::TQ2_0) {
      for (int64_t i = 0; i < nb; ++i)
        for (int j = 0; j < 64; ++j)
          for (int l = 0; l < 4; ++l) EXPECT_NE((a[66 * i + j] >> (2 * l)) & 3, 3) << "TQ2_0 code 3";
    }
  }
}

}  // namespace
}  // namespace sluice
