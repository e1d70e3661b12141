// K-quant group: Q8_K activation quantizer, dequantization of hand-built blocks (values worked
// out by hand from quant-formats.md 3.3 and 4.2-4.6), known dot products, SIMD == scalar bit
// for bit, dequantize-then-dot agreement and random block generation.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/groups.h"
#include "kernels/types.h"
#include "util/error.h"

namespace sluice {
namespace {

using Bytes = std::vector<uint8_t>;

void put_u16(Bytes& b, int off, uint16_t v) { std::memcpy(b.data() + off, &v, 2); }
void put_f32(Bytes& b, int off, float v) { std::memcpy(b.data() + off, &v, 4); }
float get_f32(const uint8_t* p) { float v; std::memcpy(&v, p, 4); return v; }
int16_t get_i16(const uint8_t* p) { int16_t v; std::memcpy(&v, p, 2); return v; }
bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// A Q8_K block with the given d and nonzero quants (index, value); bsums computed here.
Bytes q8k_block(float d, std::initializer_list<std::pair<int, int>> nonzero) {
  Bytes b(292, 0);
  put_f32(b, 0, d);
  for (auto [e, v] : nonzero) b[4 + e] = (uint8_t)(int8_t)v;
  for (int j = 0; j < 16; ++j) {
    int s = 0;
    for (int i = 0; i < 16; ++i) s += (int8_t)b[4 + 16 * j + i];
    put_u16(b, 260 + 2 * j, (uint16_t)(int16_t)s);
  }
  return b;
}

std::vector<float> dequant(GgmlType t, const Bytes& b) {
  const TypeTraits& r = type_traits(t);
  const int64_t n = (int64_t)(b.size() / (size_t)r.block_bytes) * r.block_elems;
  std::vector<float> out((size_t)n);
  r.dequant(b.data(), out.data(), n);
  return out;
}

// Every ISA this CPU can run, scalar first.
std::vector<Isa> isas() {
  std::vector<Isa> v{Isa::Scalar};
  if (detect_isa() >= Isa::Avx2) v.push_back(Isa::Avx2);
  if (detect_isa() >= Isa::Avx512) v.push_back(Isa::Avx512);
  return v;
}

void expect_dequant(GgmlType t, const Bytes& blk, const std::vector<float>& want) {
  const std::vector<float> got = dequant(t, blk);
  ASSERT_EQ(got.size(), want.size());
  for (size_t e = 0; e < want.size(); ++e) EXPECT_EQ(got[e], want[e]) << type_traits(t).name << " element " << e;
}

void expect_dot(GgmlType t, const Bytes& w, const Bytes& act, float want) {
  for (Isa isa : isas()) {
    const float got = dot_for(type_traits(t), isa)(w.data(), act.data(), 256);
    EXPECT_EQ(got, want) << type_traits(t).name << " " << isa_name(isa);
  }
}

// ---- Table ------------------------------------------------------------------------------------

TEST(KQuantTable, RowsHaveTheSpecGeometry) {
  struct Want { GgmlType t; const char* name; int bytes; };
  for (const Want& w : {Want{GgmlType::Q8_K, "Q8_K", 292}, Want{GgmlType::Q2_K, "Q2_K", 84},
                        Want{GgmlType::Q3_K, "Q3_K", 110}, Want{GgmlType::Q4_K, "Q4_K", 144},
                        Want{GgmlType::Q6_K, "Q6_K", 210}}) {
    const TypeTraits* r = find_type((uint32_t)w.t);
    ASSERT_NE(r, nullptr) << w.name;
    EXPECT_EQ(r->name, w.name);
    EXPECT_EQ(r->block_elems, 256);
    EXPECT_EQ(r->block_bytes, w.bytes);
    EXPECT_EQ(r->act, ActType::Q8_K);
    EXPECT_TRUE(r->has_kernels);
    EXPECT_NE(r->dequant, nullptr);
    EXPECT_NE(r->random, nullptr);
    EXPECT_NE(r->dot_scalar, nullptr);
    EXPECT_NE(r->dot_avx2, nullptr);
    EXPECT_NE(r->dot_avx512, nullptr);
    EXPECT_EQ(type_from_name(w.name), w.t);
  }
  EXPECT_EQ(row_bytes(GgmlType::Q4_K, 512), 288u);
  EXPECT_THROW(row_bytes(GgmlType::Q2_K, 300), Error);
  EXPECT_EQ(activation_bytes(ActType::Q8_K, 768), 3u * 292u);
}

TEST(KQuantTable, DispatchPicksTheIsaKernel) {
  for (GgmlType t : {GgmlType::Q8_K, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q6_K}) {
    const TypeTraits& r = type_traits(t);
    EXPECT_EQ(dot_for(r, Isa::Scalar), r.dot_scalar);
    if (detect_isa() >= Isa::Avx2) {
      EXPECT_EQ(dot_for(r, Isa::Avx2), r.dot_avx2) << r.name;
    }
    if (detect_isa() >= Isa::Avx512) {
      EXPECT_EQ(dot_for(r, Isa::Avx512), r.dot_avx512) << r.name;
    }
  }
}

// ---- Q8_K quantizer (spec 3.3) ----------------------------------------------------------------

TEST(KQuantQ8K, TiesToEvenAndFirstMaxWins) {
  std::vector<float> x(512, 0.0f);
  // Block 0: max |x| = 127 reached first by +127, then by -127: max = +127, iscale = -1, d = -1.
  x[0] = 127.0f;
  x[1] = -127.0f;
  x[2] = 2.5f;     // -2.5 -> -2 (even; round-half-away would give -3)
  x[3] = 3.5f;     // -3.5 -> -4
  x[4] = -2.5f;    // 2.5 -> 2
  x[5] = -0.5f;    // 0.5 -> 0
  x[6] = 126.5f;   // -126.5 -> -126
  x[7] = 0.49f;    // -0.49 -> 0
  x[20] = 1.5f;    // -1.5 -> -2 (block row 1 of 16)
  // Block 1: max reached first by -63.5: iscale = -127/-63.5 = 2, d = 0.5 (positive).
  x[256] = -63.5f;
  x[257] = 63.5f;   // tie of opposite sign after the first: 127
  x[258] = 1.25f;   // 2.5 -> 2
  x[259] = -0.75f;  // -1.5 -> -2
  x[260] = 0.25f;   // 0.5 -> 0
  x[261] = 63.25f;  // 126.5 -> 126
  Bytes q(2 * 292, 0xAB);
  quantize_row_q8_k(x.data(), q.data(), 512);

  const uint8_t* b0 = q.data();
  EXPECT_EQ(get_f32(b0), -1.0f);
  const int want0[8] = {-127, 127, -2, -4, 2, 0, -126, 0};
  for (int e = 0; e < 8; ++e) EXPECT_EQ((int8_t)b0[4 + e], want0[e]) << "element " << e;
  EXPECT_EQ((int8_t)b0[4 + 20], -2);
  for (int e = 8; e < 256; ++e) {
    if (e != 20) {
      EXPECT_EQ(b0[4 + e], 0) << "element " << e;
    }
  }
  EXPECT_EQ(get_i16(b0 + 260), -127 + 127 - 2 - 4 + 2 + 0 - 126 + 0);
  EXPECT_EQ(get_i16(b0 + 262), -2);
  for (int j = 2; j < 16; ++j) EXPECT_EQ(get_i16(b0 + 260 + 2 * j), 0);

  const uint8_t* b1 = q.data() + 292;
  EXPECT_EQ(get_f32(b1), 0.5f);
  const int want1[6] = {-127, 127, 2, -2, 0, 126};
  for (int e = 0; e < 6; ++e) EXPECT_EQ((int8_t)b1[4 + e], want1[e]) << "element " << e;
  EXPECT_EQ(get_i16(b1 + 260), 126);
}

TEST(KQuantQ8K, PositiveMaxGivesNegativeD) {
  std::vector<float> x(256, 0.0f);
  x[7] = 4.0f;   // max: iscale = -31.75
  x[8] = 1.0f;   // -31.75 -> -32
  x[9] = -2.0f;  // 63.5 -> 64 (tie, even)
  x[10] = -4.0f; // tie with the max, later: 127
  Bytes q(292);
  quantize_row_q8_k(x.data(), q.data(), 256);
  EXPECT_LT(get_f32(q.data()), 0.0f);
  EXPECT_EQ(get_f32(q.data()), 1.0f / -31.75f);
  EXPECT_EQ((int8_t)q[4 + 7], -127);
  EXPECT_EQ((int8_t)q[4 + 8], -32);
  EXPECT_EQ((int8_t)q[4 + 9], 64);
  EXPECT_EQ((int8_t)q[4 + 10], 127);
  EXPECT_EQ(get_i16(q.data() + 260), -127 - 32 + 64 + 127);
}

TEST(KQuantQ8K, AllZeroBlockIsZeroedCompletely) {
  std::vector<float> x(256, 0.0f);
  x[3] = -0.0f;
  Bytes q(292, 0xAB);
  quantize_row_q8_k(x.data(), q.data(), 256);
  EXPECT_EQ(get_f32(q.data()), 0.0f);
  for (int i = 4; i < 292; ++i) EXPECT_EQ(q[i], 0) << "byte " << i;
}

TEST(KQuantQ8K, MaxTooSmallForTheScaleGivesZeroQuants) {
  // -127/1e-38 overflows to -inf: every quant stores as 0 and d = 1/-inf = -0.
  std::vector<float> x(256, 0.0f);
  x[0] = 1e-38f;
  x[1] = -5e-39f;
  Bytes q(292, 0xAB);
  quantize_row_q8_k(x.data(), q.data(), 256);
  const float d = get_f32(q.data());
  EXPECT_EQ(d, 0.0f);
  EXPECT_TRUE(std::signbit(d));
  for (int i = 4; i < 292; ++i) EXPECT_EQ(q[i], 0) << "byte " << i;
}

TEST(KQuantQ8K, RandomRowsRoundTripWithinHalfAStep) {
  uint64_t s = 12345;
  auto next = [&] { s = s * 6364136223846793005ull + 1442695040888963407ull; return (double)(s >> 11) / 9007199254740992.0; };
  for (float mag : {1.0f, 1e-20f, 1e20f}) {
    std::vector<float> x(7 * 256);
    for (float& v : x) v = (float)((next() * 2 - 1) * mag);
    Bytes q(7 * 292);
    quantize_row_q8_k(x.data(), q.data(), (int64_t)x.size());
    for (int b = 0; b < 7; ++b) {
      const uint8_t* blk = q.data() + 292 * b;
      const float d = get_f32(blk);
      float amax = 0, mx = 0;
      for (int e = 0; e < 256; ++e)
        if (std::fabs(x[256 * b + e]) > amax) { amax = std::fabs(x[256 * b + e]); mx = x[256 * b + e]; }
      const float iscale = -127.0f / mx;
      for (int e = 0; e < 256; ++e) {
        const int qv = (int8_t)blk[4 + e];
        EXPECT_EQ(qv, (int)std::nearbyint(iscale * x[256 * b + e])) << "block " << b << " element " << e;
        EXPECT_LE(std::fabs((double)d * qv - x[256 * b + e]), 0.5001 * std::fabs((double)d)) << e;
      }
      for (int j = 0; j < 16; ++j) {
        int sum = 0;
        for (int i = 0; i < 16; ++i) sum += (int8_t)blk[4 + 16 * j + i];
        EXPECT_EQ(get_i16(blk + 260 + 2 * j), sum);
      }
    }
  }
}

TEST(KQuantQ8K, ActivationLengthMustBeWholeBlocks) {
  std::vector<float> x(300, 1.0f);
  Bytes q(292 * 2);
  EXPECT_THROW(quantize_activation(ActType::Q8_K, x.data(), q.data(), 300), Error);
}

// ---- Hand-built blocks: dequantization and dot ------------------------------------------------

TEST(KQuantKnown, Q8K) {
  Bytes b = q8k_block(0.5f, {{0, -127}, {1, 3}, {255, 100}});
  std::vector<float> want(256, 0.0f);
  want[0] = -63.5f;
  want[1] = 1.5f;
  want[255] = 50.0f;
  expect_dequant(GgmlType::Q8_K, b, want);
  // isum = -127*1 + 3*(-1) + 100*2 = 70; (0.5 * -2) * 70 = -70.
  expect_dot(GgmlType::Q8_K, b, q8k_block(-2.0f, {{0, 1}, {1, -1}, {255, 2}}), -70.0f);
}

// Q2_K: d = 0.5, dmin = 0.25; scales byte k = min << 4 | scale.
Bytes q2k_known() {
  Bytes b(84, 0);
  b[0] = 0x21;   // sub-block 0: scale 1, min 2  -> dl 0.5, ml 0.5
  b[1] = 0x03;   // sub-block 1: scale 3, min 0  -> dl 1.5, ml 0
  b[5] = 0xF2;   // sub-block 5: scale 2, min 15 -> dl 1.0, ml 3.75
  b[8] = 0x1F;   // sub-block 8: scale 15, min 1 -> dl 7.5, ml 0.25
  b[15] = 0x54;  // sub-block 15: scale 4, min 5 -> dl 2.0, ml 1.25
  uint8_t* qs = b.data() + 16;
  qs[0] = 0xE4;   // element 0: 0, element 32: 1, element 64: 2, element 96: 3
  qs[3] = 0x03;   // element 3: 3
  qs[17] = 0x32;  // element 17: 2, element 49: 0, element 81: 3, element 113: 0
  qs[32] = 0x01;  // element 128: 1
  qs[63] = 0xC0;  // element 255 (h 1, j 3, l 31): 3
  put_u16(b, 80, 0x3800);
  put_u16(b, 82, 0x3400);
  return b;
}

TEST(KQuantKnown, Q2K) {
  std::vector<float> want(256, 0.0f);
  for (int e = 0; e < 16; ++e) want[e] = -0.5f;      // 0.5*0 - 0.5
  for (int e = 80; e < 96; ++e) want[e] = -3.75f;    // 1.0*0 - 3.75
  for (int e = 128; e < 144; ++e) want[e] = -0.25f;  // 7.5*0 - 0.25
  for (int e = 240; e < 256; ++e) want[e] = -1.25f;  // 2.0*0 - 1.25
  want[3] = 1.0f;     // 0.5*3 - 0.5
  want[17] = 3.0f;    // 1.5*2
  want[81] = -0.75f;  // 1.0*3 - 3.75
  want[128] = 7.25f;  // 7.5*1 - 0.25
  want[255] = 4.75f;  // 2.0*3 - 1.25
  // Elements 32, 64, 96 have quants 1, 2, 3 but sit in sub-blocks with scale 0, min 0.
  expect_dequant(GgmlType::Q2_K, q2k_known(), want);
  // y = 0.5 * q8. isum = 1*(2*3) + 3*(-1*2) + 2*(4*3) + 15*(10*1) + 4*(-3*3) = 138;
  // summs = 2*2 + 0*(-1) + 15*4 + 0*7 + 1*10 + 5*(-3) = 59; 0.25*138 - 0.125*59 = 27.125.
  // (Check by elements: 1*1 + 3*(-0.5) - 0.75*2 + 7.25*5 + 4.75*(-1.5) = 27.125.)
  const Bytes act = q8k_block(0.5f, {{3, 2}, {17, -1}, {81, 4}, {100, 7}, {128, 10}, {255, -3}});
  expect_dot(GgmlType::Q2_K, q2k_known(), act, 27.125f);
}

// Q3_K: d = 0.25; packed scales decode to
// s = {10, -32, 16, 1, 16, -32, 16, -4, -11, -32, 16, 15, 0, -32, 16, 19}.
const int kQ3Scales[16] = {10, -32, 16, 1, 16, -32, 16, -4, -11, -32, 16, 15, 0, -32, 16, 19};

Bytes q3k_known() {
  Bytes b(110, 0);
  uint8_t* hmask = b.data();
  uint8_t* qs = b.data() + 32;
  uint8_t* sc = b.data() + 96;
  hmask[0] = 0x01;   // element 0 (h 0, j 0, l 0) has its high bit
  hmask[5] = 0x20;   // bit 5 = 4h + j with h 1, j 1: element 128 + 32 + 5 = 165
  hmask[24] = 0x08;  // bit 3 = h 0, j 3: element 96 + 24 = 120
  hmask[31] = 0x80;  // bit 7 = h 1, j 3: element 255
  qs[0] = 0x03;      // element 0: q2 = 3
  qs[20] = 0x02;     // element 20: q2 = 2
  qs[37] = 0x08;     // qs[32 + 5], bits 2-3: element 165, q2 = 2
  qs[63] = 0x40;     // qs[32 + 31], bits 6-7: element 255, q2 = 1
  // low4: i < 8 from b[i] & 15, i >= 8 from b[i-8] >> 4; high2: b[8 + i%4] >> 2*(i/4).
  const uint8_t packed[12] = {0x5A, 0x00, 0x00, 0xF1, 0x00, 0x00, 0x00, 0x3C, 0x9E, 0x00, 0xFF, 0xE6};
  std::memcpy(sc, packed, 12);
  put_u16(b, 108, 0x3400);
  return b;
}

TEST(KQuantKnown, Q3K) {
  // Without a high bit q = q2 - 4, so every element with q2 = 0 and no high bit is
  // (0.25*s)*(-4) = -s.
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) want[e] = (float)-kQ3Scales[e / 16];
  want[0] = 7.5f;     // high bit, q = 3: 2.5*3
  want[20] = 16.0f;   // no high bit, q = 2 - 4 = -2: (0.25*-32)*-2
  want[120] = 0.0f;   // high bit, q2 = 0: q = 0
  want[165] = 8.0f;   // high bit, q = 2: (0.25*16)*2
  want[255] = 4.75f;  // high bit, q = 1: 0.25*19
  expect_dequant(GgmlType::Q3_K, q3k_known(), want);
  // y = q8 (d = 1). isum = 10*(2*3) - 32*(5*-4 + 1*-2) - 4*(100*0) + 16*(-3*2) + 0 + 19*(4*1) = 744;
  // 0.25 * 744 = 186. (By elements: 7.5*2 + 32*5 + 16*1 + 8*(-3) + 4.75*4 = 186.)
  const Bytes act = q8k_block(1.0f, {{0, 2}, {16, 5}, {20, 1}, {120, 100}, {165, -3}, {200, -1}, {255, 4}});
  expect_dot(GgmlType::Q3_K, q3k_known(), act, 186.0f);
}

// Q4_K: d = 0.5, dmin = 0.125; packed scales decode to sc = {5, 2, 0, 63, 62, 17, 0, 35},
// m = {1, 3, 0, 10, 39, 2, 48, 31} (sub-blocks 4..7 take their top 2 bits from bytes 0..7).
Bytes q4k_known() {
  Bytes b(144, 0);
  put_u16(b, 0, 0x3800);
  put_u16(b, 2, 0x3000);
  const uint8_t packed[12] = {0xC5, 0x42, 0x00, 0xBF, 0x81, 0x03, 0xC0, 0x4A, 0x7E, 0x21, 0x00, 0xF3};
  std::memcpy(b.data() + 4, packed, 12);
  uint8_t* qs = b.data() + 16;
  qs[0] = 0xA7;    // element 0: 7 (low), element 32: 10 (high)
  qs[42] = 0x50;   // qs[32 + 10]: element 74: 0, element 106: 5
  qs[69] = 0x0F;   // qs[64 + 5]: element 133: 15, element 165: 0
  qs[70] = 0x30;   // qs[64 + 6]: element 134: 0, element 166: 3
  qs[127] = 0x90;  // qs[96 + 31]: element 223: 0, element 255: 9
  return b;
}

TEST(KQuantKnown, Q4K) {
  // dl = 0.5*sc = {2.5, 1, 0, 31.5, 31, 8.5, 0, 17.5}; ml = 0.125*m = {0.125, 0.375, 0, 1.25,
  // 4.875, 0.25, 6, 3.875}; a zero nibble decodes to -ml.
  const float ml[8] = {0.125f, 0.375f, 0.0f, 1.25f, 4.875f, 0.25f, 6.0f, 3.875f};
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) want[e] = -ml[e / 32];
  want[0] = 17.375f;    // 2.5*7 - 0.125
  want[32] = 9.625f;    // 1*10 - 0.375
  want[106] = 156.25f;  // 31.5*5 - 1.25
  want[133] = 460.125f; // 31*15 - 4.875
  want[166] = 25.25f;   // 8.5*3 - 0.25
  want[255] = 153.625f; // 17.5*9 - 3.875
  expect_dequant(GgmlType::Q4_K, q4k_known(), want);
  // y = 0.5 * q8. isum = 5*7 + 2*(-20) + 63*5 + 62*45 + 17*(-3) + 35*18 = 3679 (the q8 at 200 and
  // 223 meet zero nibbles); sumi_min = 1*1 + 3*(-2) + 10*1 + 39*3 + 2*(-1) + 48*(4+1) + 31*2 = 422;
  // 0.25*3679 - 0.0625*422 = 919.75 - 26.375 = 893.375.
  const Bytes act =
      q8k_block(0.5f, {{0, 1}, {32, -2}, {106, 1}, {133, 3}, {166, -1}, {200, 4}, {223, 1}, {255, 2}});
  expect_dot(GgmlType::Q4_K, q4k_known(), act, 893.375f);
}

// Q6_K: d = 0.0625; scales {1, -2, 0, 0, 0, 3, 0, 0, 0, 0, -128, 0, 0, 0, 0, 127}.
Bytes q6k_known() {
  Bytes b(210, 0);
  uint8_t* ql = b.data();
  uint8_t* qh = b.data() + 128;
  ql[0] = 0x5F;    // element 0 (k 0): low 15; element 64 (k 2): low 5 (scale 0)
  qh[0] = 0x02;    // element 0: high 2 -> q = 15 + 32 - 32 = 15
  ql[20] = 0xA0;   // element 20 (k 0): low 0; element 84 (k 2, l 20): low 10
  qh[20] = 0x30;   // element 84: high 3 (bits 4-5) -> q = 58 - 32 = 26
  ql[99] = 0x0C;   // ql[64 + 32 + 3]: element 163 (h 1, k 1, l 3): low 12
  qh[35] = 0x04;   // qh[32 + 3], bits 2-3: element 163 high 1 -> q = 28 - 32 = -4
  ql[127] = 0xF0;  // ql[64 + 32 + 31] high nibble: element 255 (h 1, k 3, l 31): low 15
  qh[63] = 0xC0;   // qh[32 + 31], bits 6-7: element 255 high 3 -> q = 63 - 32 = 31
  const int8_t scales[16] = {1, -2, 0, 0, 0, 3, 0, 0, 0, 0, -128, 0, 0, 0, 0, 127};
  std::memcpy(b.data() + 192, scales, 16);
  put_u16(b, 208, 0x2C00);
  return b;
}

TEST(KQuantKnown, Q6K) {
  // All-zero bits decode to q = -32: x = (0.0625*s)*(-32) = -2s.
  const int s[16] = {1, -2, 0, 0, 0, 3, 0, 0, 0, 0, -128, 0, 0, 0, 0, 127};
  std::vector<float> want(256);
  for (int e = 0; e < 256; ++e) want[e] = (float)(-2 * s[e / 16]);
  want[0] = 0.9375f;     // 0.0625*15
  want[84] = 4.875f;     // 0.1875*26
  want[163] = 32.0f;     // -8*(-4)
  want[255] = 246.0625f; // 7.9375*31
  expect_dequant(GgmlType::Q6_K, q6k_known(), want);
  // y = 2 * q8. isum = 1*(3*15) - 2*(5*-32) + 3*(-1*26) - 128*(2*-4 + -1*-32) + 127*(1*31) = 1152;
  // (0.0625*2)*1152 = 144. (By elements: 0.9375*6 + 4*10 + 4.875*(-2) + 32*4 + 256*(-2) + 246.0625*2.)
  const Bytes act = q8k_block(2.0f, {{0, 3}, {20, 5}, {84, -1}, {163, 2}, {170, -1}, {255, 1}});
  expect_dot(GgmlType::Q6_K, q6k_known(), act, 144.0f);
}

// ---- The canonical float sequence ---------------------------------------------------------------
// Rows built so that a different order of the per-super-block float operations gives another
// result: the dot must be exactly what the documented sequence gives.

Bytes concat(const Bytes& a, const Bytes& b) {
  Bytes r = a;
  r.insert(r.end(), b.begin(), b.end());
  return r;
}

TEST(KQuantSequence, Q2KSubtractsBeforeAccumulating) {
  // Block 0 contributes exactly 1. Block 1 has dall*isum = dmin*summs = 2^25 (d = dmin = 2048,
  // y.d = 256, every scale and min 1, every quant 1, q8 = 64 at one element). sumf + (A - B) = 1;
  // (sumf + A) - B would be 0 (1 is below half an ulp of 2^25).
  Bytes w0(84, 0), w1(84, 0);
  w0[0] = 0x01;
  w0[16] = 0x01;
  put_u16(w0, 80, 0x3C00);
  for (int k = 0; k < 16; ++k) w1[k] = 0x11;
  for (int i = 16; i < 80; ++i) w1[i] = 0x55;
  put_u16(w1, 80, 0x6800);
  put_u16(w1, 82, 0x6800);
  const Bytes w = concat(w0, w1);
  const Bytes a = concat(q8k_block(1.0f, {{0, 1}}), q8k_block(256.0f, {{0, 64}}));
  for (Isa isa : isas())
    EXPECT_EQ(dot_for(type_traits(GgmlType::Q2_K), isa)(w.data(), a.data(), 512), 1.0f) << isa_name(isa);
}

TEST(KQuantSequence, Q4KSubtractsBeforeAccumulating) {
  // Same construction as for Q2_K: every scale and min 1 (k >= 4 from the low/high nibbles of
  // bytes 8..11), every nibble 1.
  Bytes w0(144, 0), w1(144, 0);
  put_u16(w0, 0, 0x3C00);
  w0[4] = 0x01;   // sc0 = 1
  w0[16] = 0x01;  // element 0: nibble 1
  put_u16(w1, 0, 0x6800);
  put_u16(w1, 2, 0x6800);
  for (int i = 0; i < 8; ++i) w1[4 + i] = 0x01;
  for (int i = 8; i < 12; ++i) w1[4 + i] = 0x11;
  for (int i = 16; i < 144; ++i) w1[i] = 0x11;
  const Bytes w = concat(w0, w1);
  const Bytes a = concat(q8k_block(1.0f, {{0, 1}}), q8k_block(256.0f, {{0, 64}}));
  for (Isa isa : isas())
    EXPECT_EQ(dot_for(type_traits(GgmlType::Q4_K), isa)(w.data(), a.data(), 512), 1.0f) << isa_name(isa);
}

TEST(KQuantSequence, ScaleProductIsRoundedBeforeTheIntegerSum) {
  // x.d = fp16 0x3C02 = 1.001953125, y.d = 0.1f, isum = 3: (x.d*y.d)*3 rounds to 0x1.33ccccp-2,
  // while x.d*(y.d*3) and (x.d*3)*y.d give 0x1.33ccce p-2 (worked out with exact products
  // rounded once to binary32).
  const Bytes act = q8k_block(0.1f, {{0, 3}});
  Bytes w6(210, 0);
  w6[0] = 0x01;   // element 0: low 1
  w6[128] = 0x02; // element 0: high 2 -> q = 33 - 32 = 1
  w6[192] = 1;    // scale of sub-block 0; all others 0
  put_u16(w6, 208, 0x3C02);
  Bytes w3(110, 0);
  w3[0] = 0x01;        // element 0 has its high bit
  w3[32] = 0x01;       // element 0: q2 = 1 -> q = 1
  w3[96 + 0] = 0x01;   // s0 low4 = 1
  w3[96 + 8] = 0x02;   // s0 high2 = 2 -> s0 = 33 - 32 = 1 (the other scales are -32, their q8 are 0)
  put_u16(w3, 108, 0x3C02);
  for (Isa isa : isas()) {
    EXPECT_EQ(dot_for(type_traits(GgmlType::Q6_K), isa)(w6.data(), act.data(), 256), 0x1.33ccccp-2f) << isa_name(isa);
    EXPECT_EQ(dot_for(type_traits(GgmlType::Q3_K), isa)(w3.data(), act.data(), 256), 0x1.33ccccp-2f) << isa_name(isa);
  }
}

// ---- SIMD == scalar, bit for bit --------------------------------------------------------------

const GgmlType kTypes[] = {GgmlType::Q8_K, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q6_K};

struct Rng {
  uint64_t s;
  uint64_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return s >> 11;
  }
  double uniform() { return (double)next() / 9007199254740992.0; }  // [0, 1)
};

Bytes random_blocks(const TypeTraits& t, int nb, uint64_t seed, float scale = 1.0f) {
  Bytes b((size_t)nb * (size_t)t.block_bytes);
  t.random(b.data(), nb, seed, scale);
  return b;
}

// Quantized activation row: values of magnitude ~mag with a few outliers; every block whose
// index is in zero_every (if > 0) multiples is all zero.
Bytes activations(int nb, uint64_t seed, float mag, int zero_every = 0) {
  Rng r{seed};
  std::vector<float> x((size_t)nb * 256);
  for (size_t i = 0; i < x.size(); ++i) {
    double v = r.uniform() * 2 - 1;
    if (r.next() % 61 == 0) v *= 9;
    x[i] = (float)(v * mag);
    if (zero_every > 0 && (i / 256) % (size_t)zero_every == 0) x[i] = 0.0f;
  }
  Bytes q((size_t)nb * 292);
  quantize_row_q8_k(x.data(), q.data(), (int64_t)x.size());
  return q;
}

void expect_simd_matches(const TypeTraits& t, const Bytes& w, const Bytes& a, int nb, const std::string& what) {
  const float ref = t.dot_scalar(w.data(), a.data(), (int64_t)nb * 256);
  for (Isa isa : isas()) {
    if (isa == Isa::Scalar) continue;
    const float got = dot_for(t, isa)(w.data(), a.data(), (int64_t)nb * 256);
    EXPECT_TRUE(same_bits(got, ref)) << t.name << " " << isa_name(isa) << " " << what << ": " << got << " vs scalar "
                                     << ref << " (bits " << std::bit_cast<uint32_t>(got) << " vs "
                                     << std::bit_cast<uint32_t>(ref) << ")";
  }
}

TEST(KQuantSimd, RandomBlocksMatchScalarBitForBit) {
  for (GgmlType type : kTypes) {
    const TypeTraits& t = type_traits(type);
    for (int nb : {1, 3, 7, 33}) {
      for (uint64_t seed : {1ull, 2ull, 77ull}) {
        const Bytes w = random_blocks(t, nb, seed * 1000 + (uint64_t)nb, 0.7f);
        const Bytes a = activations(nb, seed * 31 + 5, 3.0f);
        expect_simd_matches(t, w, a, nb, "nb " + std::to_string(nb) + " seed " + std::to_string(seed));
      }
    }
  }
}

TEST(KQuantSimd, ArbitraryBytesMatchScalarBitForBit) {
  // The kernels must not depend on the activation's bsums being consistent or on q8 avoiding
  // -128: fill everything with random bytes, then make the scale fields finite.
  for (GgmlType type : kTypes) {
    const TypeTraits& t = type_traits(type);
    for (int nb : {1, 7}) {
      Rng r{(uint64_t)type * 7919 + (uint64_t)nb};
      Bytes w((size_t)nb * (size_t)t.block_bytes), a((size_t)nb * 292);
      for (auto& v : w) v = (uint8_t)(r.next() >> 8);
      for (auto& v : a) v = (uint8_t)(r.next() >> 8);
      for (int i = 0; i < nb; ++i) {
        put_f32(a, 292 * i, 0.01f * (float)(i + 1));
        uint8_t* blk = w.data() + (size_t)i * (size_t)t.block_bytes;
        const uint16_t h = (uint16_t)(0x2000 + r.next() % 0x2000);  // finite fp16 of either exponent
        switch (type) {
          case GgmlType::Q8_K: { const float d = 0.003f; std::memcpy(blk, &d, 4); break; }
          case GgmlType::Q2_K: std::memcpy(blk + 80, &h, 2); std::memcpy(blk + 82, &h, 2); break;
          case GgmlType::Q3_K: std::memcpy(blk + 108, &h, 2); break;
          case GgmlType::Q4_K: std::memcpy(blk, &h, 2); std::memcpy(blk + 2, &h, 2); break;
          case GgmlType::Q6_K: std::memcpy(blk + 208, &h, 2); break;
          default: break;
        }
      }
      expect_simd_matches(t, w, a, nb, "arbitrary bytes nb " + std::to_string(nb));
    }
  }
}

// Offsets of the fp16 super-scales (d, then dmin if any) of each weight type.
std::vector<int> scale_offsets(GgmlType t) {
  switch (t) {
    case GgmlType::Q2_K: return {80, 82};
    case GgmlType::Q3_K: return {108};
    case GgmlType::Q4_K: return {0, 2};
    case GgmlType::Q6_K: return {208};
    default: return {};
  }
}

TEST(KQuantSimd, ExtremeScalesMatchScalarBitForBit) {
  // fp16: smallest subnormal, largest subnormal, smallest normal, 65504, -65504, -subnormal, 0, 1.
  const uint16_t f16s[] = {0x0001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x8001, 0x0000, 0x3C00};
  const float act_mags[] = {1e30f, 1e-30f, 3e-36f, 3e37f, 1.0f};  // outliers reach 9x
  for (GgmlType type : kTypes) {
    const TypeTraits& t = type_traits(type);
    const int nb = 7;
    for (float mag : act_mags) {
      for (int zero_every : {0, 2}) {
        const Bytes a = activations(nb, 99, mag, zero_every);
        if (type == GgmlType::Q8_K) {
          for (float d : {1e-45f, 1.2e-38f, 3.4e38f, -3.4e38f, 0.0f}) {
            Bytes w = random_blocks(t, nb, 5);
            for (int i = 0; i < nb; ++i) put_f32(w, 292 * i, d);
            expect_simd_matches(t, w, a, nb, "d " + std::to_string(d) + " mag " + std::to_string(mag));
          }
          continue;
        }
        const std::vector<int> offs = scale_offsets(type);
        for (uint16_t d : f16s) {
          for (uint16_t dmin : f16s) {
            if (offs.size() == 1 && dmin != f16s[0]) continue;
            Bytes w = random_blocks(t, nb, 11);
            for (int i = 0; i < nb; ++i) {
              put_u16(w, i * t.block_bytes + offs[0], d);
              if (offs.size() > 1) put_u16(w, i * t.block_bytes + offs[1], dmin);
            }
            expect_simd_matches(t, w, a, nb,
                                "d " + std::to_string(d) + " dmin " + std::to_string(dmin) + " mag " + std::to_string(mag) +
                                    " zero_every " + std::to_string(zero_every));
          }
        }
      }
    }
  }
}

// ---- Dequantize-then-dot ------------------------------------------------------------------------

TEST(KQuantDot, AgreesWithDequantizedDoubleDot) {
  // Error bound. Per super-block the dot forms dall = y.d*x.d (1 rounding), (float)isum (1),
  // their product (1), the same for the min term, then one subtraction and one addition into
  // sumf: at most 4 roundings relative to M_b = |dall*isum| + |dmin*summs| plus one relative to the
  // running |sumf|, so |dot - exact| <= (4 + nb) u M with u = 2^-24 and M = sum_b M_b.
  // The reference uses dequantized values: each weight is one rounding off (the subtraction
  // dl*q - ml; Q6_K's (d*s)*q product), each activation y.d*q8 is one rounding off, the double
  // sum adds nothing at this size: another 2 u M. M is bounded by sum_e (|dl q| + |ml|) |y_e|,
  // computed as sum_e (|w_e| + |w'_e|) |y_e| where w' decodes the block with dmin negated
  // (dl*q + ml: scales and mins are non-negative in random blocks). Tolerance: 2 (nb + 6) u M.
  for (GgmlType type : kTypes) {
    const TypeTraits& t = type_traits(type);
    for (int nb : {1, 3, 7, 33}) {
      const Bytes w = random_blocks(t, nb, 4242 + (uint64_t)nb, 1.0f);
      const Bytes a = activations(nb, 17 + (uint64_t)nb, 2.0f, nb == 7 ? 3 : 0);
      const std::vector<float> wx = dequant(type, w), ay = dequant(GgmlType::Q8_K, a);
      Bytes w_flip = w;
      const std::vector<int> offs = scale_offsets(type);
      if (offs.size() > 1)
        for (int i = 0; i < nb; ++i) w_flip[(size_t)(i * t.block_bytes + offs[1] + 1)] ^= 0x80;
      const std::vector<float> wf = dequant(type, w_flip);
      double exact = 0, m = 0;
      for (size_t e = 0; e < wx.size(); ++e) {
        exact += (double)wx[e] * (double)ay[e];
        m += (std::fabs((double)wx[e]) + std::fabs((double)wf[e])) * std::fabs((double)ay[e]);
      }
      const double tol = 2.0 * (nb + 6) * std::ldexp(1.0, -24) * m;
      for (Isa isa : isas()) {
        const float got = dot_for(t, isa)(w.data(), a.data(), (int64_t)nb * 256);
        EXPECT_NEAR((double)got, exact, tol) << t.name << " nb " << nb << " " << isa_name(isa);
      }
      EXPECT_GT(std::fabs(exact), 0.0) << t.name;
    }
  }
}

// ---- Random blocks ----------------------------------------------------------------------------

TEST(KQuantRandom, DeterministicFiniteAndAboutTheRequestedRms) {
  for (GgmlType type : kTypes) {
    const TypeTraits& t = type_traits(type);
    for (float scale : {1.0f, 0.01f, 30.0f}) {
      const int nb = 64;
      const Bytes a = random_blocks(t, nb, 9, scale), b = random_blocks(t, nb, 9, scale);
      const Bytes c = random_blocks(t, nb, 10, scale);
      EXPECT_EQ(a, b) << t.name;
      EXPECT_NE(a, c) << t.name;
      const std::vector<float> x = dequant(type, a);
      double ss = 0;
      for (float v : x) {
        ASSERT_TRUE(std::isfinite(v)) << t.name;
        ss += (double)v * v;
      }
      const double rms = std::sqrt(ss / (double)x.size());
      EXPECT_GT(rms, 0.7 * scale) << t.name << " scale " << scale;
      EXPECT_LT(rms, 1.4 * scale) << t.name << " scale " << scale;
    }
  }
}

TEST(KQuantRandom, Q8KBlocksHaveConsistentBsums) {
  const Bytes a = random_blocks(type_traits(GgmlType::Q8_K), 5, 3);
  for (int i = 0; i < 5; ++i) {
    const uint8_t* blk = a.data() + 292 * i;
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int k = 0; k < 16; ++k) {
        const int q = (int8_t)blk[4 + 16 * j + k];
        EXPECT_GE(q, -127);
        sum += q;
      }
      EXPECT_EQ(get_i16(blk + 260 + 2 * j), sum);
    }
  }
}

}  // namespace
}  // namespace sluice
