// The packed 4-bit cache rows (kernels/fp4_rows.h) hold exactly what the BF16 rows held: for
// any input, unpack(pack(v)) is the BF16 bits of fake_quant(v), on random rows of every
// magnitude, with zeros, signed zeros, infinities and values on the rounding midpoints; every
// scale code the grids can produce round-trips; a NaN poisons its block and no other.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/fp.h"
#include "kernels/fp4_rows.h"
#include "kernels/numerics.h"

namespace sluice {
namespace {

void fake_quant(Fp4Grid g, float* v, size_t n) {
  if (g == Fp4Grid::Nvfp4) fake_quant_nvfp4(v, n);
  else fake_quant_mxfp4(v, n);
}

// BF16 bits of the fake-quantized row and of the packed-then-unpacked one.
void expect_lossless(Fp4Grid g, const std::vector<float>& v, const char* what) {
  const size_t n = v.size();
  std::vector<float> fq = v;
  fake_quant(g, fq.data(), n);
  std::vector<uint8_t> packed(fp4_row_bytes(g, n) + 1, 0xa5);
  fp4_pack_row(g, v.data(), n, packed.data());
  EXPECT_EQ(packed.back(), 0xa5) << "pack wrote past its row";
  std::vector<uint16_t> got(n + 1, 0x1234);
  fp4_unpack_row(g, packed.data(), n, got.data());
  EXPECT_EQ(got.back(), 0x1234) << "unpack wrote past its row";
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(got[i], f32_to_bf16(fq[i])) << what << " grid " << (int)g << " n " << n << " element " << i << " value " << v[i];
}

float bf16_value(std::mt19937& rng, int lo_exp, int hi_exp) {
  std::uniform_real_distribution<float> m(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(lo_exp, hi_exp);
  return round_bf16(std::ldexp(m(rng), e(rng)));
}

TEST(Fp4Rows, RowBytes) {
  EXPECT_EQ(fp4_row_bytes(Fp4Grid::Nvfp4, 512), 288u);  // the published compressed KV row
  EXPECT_EQ(fp4_row_bytes(Fp4Grid::Mxfp4, 128), 68u);   // the published index key
  EXPECT_EQ(fp4_row_bytes(Fp4Grid::Nvfp4, 16), 9u);
  EXPECT_EQ(fp4_row_bytes(Fp4Grid::Mxfp4, 32), 17u);
}

TEST(Fp4Rows, UnpackEqualsFakeQuantOnRandomRows) {
  std::mt19937 rng(7);
  for (Fp4Grid g : {Fp4Grid::Nvfp4, Fp4Grid::Mxfp4}) {
    const size_t B = fp4_block(g);
    for (size_t blocks : {1u, 3u, 7u, 32u, 33u}) {
      for (int range : {0, 1, 2, 3}) {
        std::vector<float> v(blocks * B);
        for (size_t i = 0; i < v.size(); ++i) {
          switch (range) {
            case 0: v[i] = bf16_value(rng, -4, 4); break;        // the usual magnitudes
            case 1: v[i] = bf16_value(rng, -140, 127); break;    // everything, subnormals included
            case 2: v[i] = bf16_value(rng, -12, -6); break;      // around the Nvfp4 scale floor
            default:                                               // blocks of very different scales
              v[i] = bf16_value(rng, (int)(i / B) % 2 ? -30 : 20, (int)(i / B) % 2 ? -28 : 22);
          }
        }
        expect_lossless(g, v, "random");
      }
    }
  }
}

TEST(Fp4Rows, EdgeValues) {
  const float inf = std::numeric_limits<float>::infinity();
  for (Fp4Grid g : {Fp4Grid::Nvfp4, Fp4Grid::Mxfp4}) {
    const size_t B = fp4_block(g);
    std::vector<float> v(4 * B, 0.0f);  // block 0: all +0
    for (size_t i = 0; i < B; ++i) v[B + i] = i % 2 ? -0.0f : 1e-30f;  // block 1: signed zeros and tiny
    // Block 2: a max of 6 and every rounding midpoint of the E2M1 grid, both signs.
    const float mids[] = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.25f, -0.75f, -1.25f, -1.75f, -2.5f, -3.5f, -5.0f, -6.0f};
    for (size_t i = 0; i < B; ++i) v[2 * B + i] = mids[i % 16];
    // Block 3: infinities and the largest BF16 values.
    for (size_t i = 0; i < B; ++i) v[3 * B + i] = i == 0 ? inf : i == 1 ? -inf : (i % 2 ? -3.3895314e38f : 3.3895314e38f);
    expect_lossless(g, v, "edges");
  }
}

TEST(Fp4Rows, EveryScaleCodeRoundTrips) {
  // A block whose largest magnitude is 6 s has scale s: every E4M3 code from the floor 2^-9
  // (code 1) to 448 (0x7e) for Nvfp4, every power of two 2^-126 .. 2^126 for Mxfp4.
  for (uint8_t code = 1; code <= 0x7e; ++code) {
    const float s = e4m3_to_f32(code);
    std::vector<float> v(16, 0.0f);
    v[3] = 6.0f * s;
    v[5] = -s;
    std::vector<uint8_t> p(fp4_row_bytes(Fp4Grid::Nvfp4, 16));
    fp4_pack_row(Fp4Grid::Nvfp4, v.data(), 16, p.data());
    EXPECT_EQ(p[8], code) << "E4M3 scale " << s;
    expect_lossless(Fp4Grid::Nvfp4, v, "e4m3 scale");
  }
  for (int e = -126; e <= 126; ++e) {
    std::vector<float> v(32, 0.0f);
    v[0] = e < 126 ? std::ldexp(6.0f, e) : 3.3895314e38f;  // 6 x 2^126 overflows; the largest BF16 has scale 2^126
    v[31] = -std::ldexp(1.0f, e);
    std::vector<uint8_t> p(fp4_row_bytes(Fp4Grid::Mxfp4, 32));
    fp4_pack_row(Fp4Grid::Mxfp4, v.data(), 32, p.data());
    EXPECT_EQ(p[16], (uint8_t)(e + 127)) << "E8M0 scale 2^" << e;
    expect_lossless(Fp4Grid::Mxfp4, v, "e8m0 scale");
  }
}

TEST(Fp4Rows, NanPoisonsOnlyItsBlock) {
  for (Fp4Grid g : {Fp4Grid::Nvfp4, Fp4Grid::Mxfp4}) {
    const size_t B = fp4_block(g);
    std::vector<float> v(3 * B);
    for (size_t i = 0; i < v.size(); ++i) v[i] = round_bf16(0.1f * (float)i - 2.0f);
    v[B + 2] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> fq = v;
    fake_quant(g, fq.data(), v.size());
    std::vector<uint8_t> p(fp4_row_bytes(g, v.size()));
    fp4_pack_row(g, v.data(), v.size(), p.data());
    std::vector<uint16_t> got(v.size());
    fp4_unpack_row(g, p.data(), v.size(), got.data());
    for (size_t i = 0; i < v.size(); ++i) {
      if (i / B == 1) {
        EXPECT_TRUE(std::isnan(bf16_to_f32(got[i]))) << "element " << i;
      } else {
        EXPECT_EQ(got[i], f32_to_bf16(fq[i])) << "element " << i;
      }
    }
  }
}

// Every SIMD unpacker equals the scalar reference on arbitrary bytes (any code, any scale byte:
// negative, NaN and the E8M0 extremes included) at odd sizes.
TEST(Fp4Rows, SimdUnpackEqualsScalarOnArbitraryBytes) {
  std::mt19937 rng(11);
  for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
    if ((int)isa > (int)detect_isa()) continue;  // this CPU cannot run it; CI machines with it do
    const Fp4UnpackFn simd = fp4_unpack_for(isa);
    for (Fp4Grid g : {Fp4Grid::Nvfp4, Fp4Grid::Mxfp4})
      for (size_t n : {16u, 32u, 48u, 96u, 160u, 512u, 528u}) {
        if (n % fp4_block(g)) continue;
        for (int rep = 0; rep < 50; ++rep) {
          std::vector<uint8_t> packed(fp4_row_bytes(g, n));
          for (uint8_t& b : packed) b = (uint8_t)rng();
          std::vector<uint16_t> want(n + 1, 0x5555), got(n + 1, 0x5555);
          fp4_unpack_row(g, packed.data(), n, want.data());
          simd(g, packed.data(), n, got.data());
          ASSERT_EQ(got, want) << isa_name(isa) << " grid " << (int)g << " n " << n;
        }
      }
  }
}

}  // namespace
}  // namespace sluice
