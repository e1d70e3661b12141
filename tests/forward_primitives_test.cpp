// Hand-worked checks of the forward pass primitives (src/model/deepseek41/primitives.h, engram.h) against
// docs/numerics.md: fake-quant grids, RoPE/YaRN frequencies, Sinkhorn, hyper-connection
// collapse/expand, top-k and candidate tie rules, the router, the Engram hash and row decode,
// and the bounded, deduplicated Engram row reader.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <vector>

#include <unistd.h>

#include "format/gguf.h"
#include "model/deepseek41/config.h"
#include "model/deepseek41/engram.h"
#include "model/deepseek41/primitives.h"
#include "util/error.h"

namespace sluice {
namespace {

const float kInf = std::numeric_limits<float>::infinity();

TEST(ForwardConsistencyPrimitives, E4m3RoundToNearestEven) {
  EXPECT_EQ(e4m3_rne(1.0f), 1.0f);
  EXPECT_EQ(e4m3_rne(0.3f), 0.3125f);        // quantum 2^-5 in [0.25, 0.5): 9.6 -> 10
  EXPECT_EQ(e4m3_rne(1.0625f), 1.0f);        // tie between 1 and 1.125 -> even mantissa
  EXPECT_EQ(e4m3_rne(1.1875f), 1.25f);       // tie between 1.125 and 1.25 -> 1.25
  EXPECT_EQ(e4m3_rne(-1.1875f), -1.25f);
  EXPECT_EQ(e4m3_rne(440.0f), 448.0f);       // quantum 32 in [256, 512): 13.75 -> 14
  EXPECT_EQ(e4m3_rne(464.0f), 448.0f);       // would round to 480 (NaN code): saturates
  EXPECT_EQ(e4m3_rne(-1e6f), -448.0f);
  EXPECT_EQ(e4m3_rne(std::ldexp(1.0f, -10)), 0.0f);                          // subnormal tie -> 0
  EXPECT_EQ(e4m3_rne(std::ldexp(3.0f, -10)), std::ldexp(1.0f, -8));          // 1.5 steps -> 2
  EXPECT_EQ(e4m3_rne(std::ldexp(7.0f, -9)), std::ldexp(7.0f, -9));           // largest subnormal
  EXPECT_EQ(e4m3_rne(std::ldexp(1.0f, -6)), std::ldexp(1.0f, -6));           // smallest normal
}

TEST(ForwardConsistencyPrimitives, E2m1NearestTiesToEvenCode) {
  const float in[] = {0.0f, 0.25f, 0.26f, 0.75f, 1.25f, 1.3f, 1.75f, 2.5f, 2.6f, 3.5f, 5.0f, 5.1f, 100.0f, -0.8f};
  const float out[] = {0.0f, 0.0f, 0.5f, 1.0f, 1.0f, 1.5f, 2.0f, 2.0f, 3.0f, 4.0f, 4.0f, 6.0f, 6.0f, -1.0f};
  for (size_t i = 0; i < std::size(in); ++i) EXPECT_EQ(e2m1_rne(in[i]), out[i]) << in[i];
}

TEST(ForwardConsistencyPrimitives, Fp8WindowGrid) {
  std::vector<float> v(64, 0.0f);
  v[0] = 1.0f;                       // amax 1 -> s = 2^ceil(log2(1/448)) = 2^-8
  v[1] = 0.30078125f;                // 77 -> 80 (quantum 8) -> 0.3125
  v[2] = std::ldexp(1.0f, -10);      // 0.25: exact
  v[3] = -std::ldexp(1.0f, -12);     // 0.0625: exact
  v[4] = std::ldexp(1.0f, -18);      // 2^-10: subnormal tie -> 0
  v[5] = std::ldexp(3.0f, -18);      // 3*2^-10 -> 2^-8 -> 2^-16
  v[32] = 672.0f;                    // second block: s = 2; 336 = 10.5 steps of 32 -> 320 (tie to even)
  v[33] = 1.0f;                      // 0.5 -> 1
  v[34] = 21.0f;                     // 10.5 -> 10 (quantum 1 in [8,16), tie to even) -> 20
  fake_quant_fp8_window(v.data(), v.size());
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 0.3125f);
  EXPECT_EQ(v[2], std::ldexp(1.0f, -10));
  EXPECT_EQ(v[3], -std::ldexp(1.0f, -12));
  EXPECT_EQ(v[4], 0.0f);
  EXPECT_EQ(v[5], std::ldexp(1.0f, -16));
  EXPECT_EQ(v[6], 0.0f);
  EXPECT_EQ(v[32], 640.0f);
  EXPECT_EQ(v[33], 1.0f);
  EXPECT_EQ(v[34], 20.0f);
}

TEST(ForwardConsistencyPrimitives, Nvfp4Grid) {
  std::vector<float> v(48, 0.0f);
  const float a[] = {6.0f, 0.30078125f, -2.5f, 0.25f, 0.75f, 5.0f};  // amax 6 -> s = e4m3(1) = 1
  const float qa[] = {6.0f, 0.5f, -2.0f, 0.0f, 1.0f, 4.0f};
  for (int i = 0; i < 6; ++i) v[i] = a[i];
  v[16] = 0.703125f;          // amax 45/64: s = e4m3(15/128) = 15/128 exactly
  v[17] = 0.2001953125f;      // /s = 1.708 -> 1.5 -> 45/256
  v[18] = -0.05859375f;       // /s = -0.5 -> -0.5 -> -15/256
  // third block all zero: s = e4m3(2^-9), outputs zero
  fake_quant_nvfp4(v.data(), v.size());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(v[i], qa[i]) << i;
  EXPECT_EQ(v[16], 0.703125f);
  EXPECT_EQ(v[17], 0.17578125f);
  EXPECT_EQ(v[18], -0.05859375f);
  for (int i = 32; i < 48; ++i) EXPECT_EQ(v[i], 0.0f);
}

TEST(ForwardConsistencyPrimitives, Mxfp4Grid) {
  std::vector<float> v(64, 0.0f);
  v[0] = 7.0f;   // amax 7: s = 2^ceil(log2(7/6)) = 2; 3.5 -> 4 -> 8
  v[1] = 1.0f;   // 0.5 -> 1
  v[2] = 2.5f;   // 1.25 -> 1 -> 2
  v[3] = -0.5f;  // -0.25 -> -0
  v[32] = 6.0f;  // amax 6: s = 1
  v[33] = 1.75f; // -> 2
  fake_quant_mxfp4(v.data(), v.size());
  EXPECT_EQ(v[0], 8.0f);
  EXPECT_EQ(v[1], 1.0f);
  EXPECT_EQ(v[2], 2.0f);
  EXPECT_EQ(v[3], 0.0f);
  EXPECT_TRUE(std::signbit(v[3]));
  EXPECT_EQ(v[32], 6.0f);
  EXPECT_EQ(v[33], 2.0f);
}

TEST(ForwardConsistencyPrimitives, RopeFrequenciesAndYarn) {
  const ModelConfig pub = published_config();
  const std::vector<double> f0 = rope_frequencies(pub, 0);
  ASSERT_EQ(f0.size(), 32u);
  for (int i : {0, 7, 31}) EXPECT_DOUBLE_EQ(f0[i], std::pow(10000.0, -2.0 * i / 64.0)) << i;
  // Published YaRN range (spec 3.0): low = 15, high = 25.
  const std::vector<double> f = rope_frequencies(pub, 1);
  auto base = [](int i) { return std::pow(160000.0, -2.0 * i / 64.0); };
  for (int i : {0, 10, 15}) EXPECT_DOUBLE_EQ(f[i], base(i)) << i;
  EXPECT_DOUBLE_EQ(f[20], base(20) / 16 * 0.5 + base(20) * 0.5);
  EXPECT_DOUBLE_EQ(f[18], base(18) / 16 * 0.3 + base(18) * 0.7);
  for (int i : {25, 30, 31}) EXPECT_DOUBLE_EQ(f[i], base(i) / 16) << i;
  EXPECT_EQ(rope_frequencies(pub, 2), f);
}

TEST(ForwardConsistencyPrimitives, RopeApplyRotatesLastPairs) {
  const RopeAngles a = rope_angles({1.0}, 1);
  std::vector<float> v = {9.0f, 9.0f, 1.0f, 2.0f};
  rope_apply(v.data(), 4, a);
  // (1*cos1 - 2*sin1, 1*sin1 + 2*cos1) = (-1.14264, 1.92208), rounded to BF16.
  EXPECT_EQ(v, (std::vector<float>{9.0f, 9.0f, -1.140625f, 1.921875f}));
  std::vector<float> w = {1.0f, 0.0f};
  rope_apply(w.data(), 2, a, /*inverse=*/true);  // (cos1, -sin1)
  EXPECT_EQ(w, (std::vector<float>{0.5390625f, -0.83984375f}));
}

TEST(ForwardConsistencyPrimitives, SinkhornIsDoublyStochastic) {
  const uint32_t hc = 4;
  std::vector<float> m(24), base(24);
  const float scale[3] = {0.7f, 1.3f, 2.0f};
  uint64_t x = 1;
  for (int i = 0; i < 24; ++i) {
    x = splitmix64(x);
    m[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 4.0 - 2.0);
    base[i] = (float)i / 24.0f - 0.5f;
  }
  const HcMix mix = hc_mix_from_projections(m.data(), base.data(), scale, hc, 20, 1e-6f);
  for (uint32_t i = 0; i < hc; ++i) {
    float row = 0, col = 0;
    for (uint32_t j = 0; j < hc; ++j) {
      row += mix.comb[i * hc + j];
      col += mix.comb[j * hc + i];
      EXPECT_GT(mix.comb[i * hc + j], 0.0f);
    }
    EXPECT_NEAR(row, 1.0f, 1e-3f);
    EXPECT_NEAR(col, 1.0f, 1e-5f);
    EXPECT_GT(mix.pre[i], 0.0f);
    EXPECT_LE(mix.pre[i], 1.0f + 1e-6f);
    EXPECT_GT(mix.post[i], 0.0f);
    EXPECT_LT(mix.post[i], 2.0f);
  }
  // pre = sigmoid(m*scale0 + base) + eps.
  EXPECT_FLOAT_EQ(mix.pre[1], 1.0f / (1.0f + std::exp(-(m[1] * 0.7f + base[1]))) + 1e-6f);
}

TEST(ForwardConsistencyPrimitives, HyperConnectionCollapseAndExpand) {
  const float X[4] = {1.0f, 2.0f, 3.0f, 4.0f};  // 2 streams of 2
  const float w[2] = {0.5f, 0.25f};
  float y[2];
  hc_pre(X, w, 2, 2, y);
  EXPECT_EQ(y[0], 1.25f);
  EXPECT_EQ(y[1], 2.0f);
  const float Xt[2] = {1.00390625f, 0.0f};  // 1 + 2^-8 is a BF16 tie -> 1
  const float one[2] = {1.0f, 0.0f};
  hc_pre(Xt, one, 2, 1, y);
  EXPECT_EQ(y[0], 1.0f);
  HcMix mix;
  mix.post = {0.5f, 1.0f};
  mix.comb = {0.25f, 0.75f, 0.5f, 0.5f};
  const float F[1] = {2.0f}, X1[2] = {1.0f, 3.0f};
  float Y[2];
  hc_post(F, X1, mix, 2, 1, Y);
  EXPECT_EQ(Y[0], 2.75f);  // 0.5*2 + 0.25*1 + 0.5*3
  EXPECT_EQ(Y[1], 4.25f);  // 1*2 + 0.75*1 + 0.5*3
}

TEST(ForwardConsistencyPrimitives, TopkTiesToLowerIndex) {
  const std::vector<float> s = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f, -kInf};
  EXPECT_EQ(topk_ascending(s, 2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(topk_ascending(s, 3), (std::vector<int32_t>{1, 2, 4}));
  EXPECT_EQ(topk_ascending(s, 4), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(topk_ascending(s, 10), (std::vector<int32_t>{0, 1, 2, 3, 4}));  // -inf never selected
  const std::vector<float> z(5, 0.0f);
  EXPECT_EQ(topk_ascending(z, 2), (std::vector<int32_t>{0, 1}));
}

TEST(ForwardConsistencyPrimitives, CandidateBlocks) {
  const std::vector<float> s = {0.1f, 0.5f, 0.2f, 0.9f, 0.3f, 0.4f, 0.0f, 0.8f};
  // n_vis 7: row 7 invisible; block 3 = {6} holds the newest row (forced); then block 1 (0.9).
  EXPECT_EQ(candidate_blocks(s, 7, 2, 2), (std::vector<uint8_t>{0, 1, 0, 1}));
  const std::vector<float> eq(8, 1.0f);
  EXPECT_EQ(candidate_blocks(eq, 8, 2, 2), (std::vector<uint8_t>{1, 0, 0, 1}));
  const std::vector<float> neg(6, -kInf);
  EXPECT_EQ(candidate_blocks(neg, 6, 2, 3), (std::vector<uint8_t>{0, 0, 1}));
  EXPECT_EQ(candidate_blocks(s, 8, 4, 5), (std::vector<uint8_t>{1, 1}));
}

TEST(ForwardConsistencyPrimitives, RouterSelectionBiasAndWeights) {
  const std::vector<float> logits = {0.0f, 0.0f, 2.0f, -1.0f};
  const std::vector<float> bias = {0.0f, 0.1f, 0.0f, 0.0f};
  const Routing r = route(logits, bias, 2, true, 1.5f);
  EXPECT_EQ(r.experts, (std::vector<uint32_t>{2, 1}));  // bias picks 1 over 0 (equal scores)
  const double s2 = std::sqrt(std::log1p(std::exp(2.0))), s1 = std::sqrt(std::log(2.0));
  ASSERT_EQ(r.weights.size(), 2u);
  EXPECT_NEAR(r.weights[0], s2 / (s1 + s2) * 1.5, 1e-6);  // bias not in the weights
  EXPECT_NEAR(r.weights[1], s1 / (s1 + s2) * 1.5, 1e-6);
  const std::vector<float> flat(4, 1.0f), zero(4, 0.0f), last = {0, 0, 0, 0.5f};
  EXPECT_EQ(route(flat, zero, 2, true, 1.0f).experts, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(route(flat, last, 2, true, 1.0f).experts, (std::vector<uint32_t>{3, 0}));
  const Routing u = route(flat, zero, 1, false, 2.0f);
  EXPECT_NEAR(u.weights[0], std::sqrt(std::log1p(std::exp(1.0))) * 2.0, 1e-6);
}

TEST(ForwardConsistencyPrimitives, EngramHashHandWorked) {
  const std::vector<uint64_t> primes = {5, 7, 11, 13, 17, 19}, mult = {3, 5, 7, 9};
  // ids [2, 1, 0, DEAD] -> [2, 1, 0, pad=4]; h = 6, ^5 = 3, ^0 = 3, ^36 = 39.
  const std::vector<int64_t> a = {2, 1, 0, kEngramDead};
  EXPECT_EQ(engram_hash(a, 4, primes, mult, 2), (std::vector<uint64_t>{3, 8, 15, 26, 41, 54}));
  // A DEAD id blocks everything older: [2, pad, pad, pad]; h = 6, ^20 = 18, ^28 = 14, ^36 = 42.
  const std::vector<int64_t> b = {2, kEngramDead, 1, 0};
  EXPECT_EQ(engram_hash(b, 4, primes, mult, 2), (std::vector<uint64_t>{3, 9, 15, 24, 44, 57}));
  // uint64 products wrap: (2^63 + 1) ^ 3 = 2^63 + 2 = 3 mod 7.
  const std::vector<int64_t> c = {1, 1};
  const std::vector<uint64_t> p7 = {7}, big = {(1ull << 63) + 1, 3};
  EXPECT_EQ(engram_hash(c, 0, p7, big, 1), (std::vector<uint64_t>{3}));
  ModelConfig cfg = tiny_config();
  EXPECT_EQ(engram_compress(cfg, 5), (int64_t)cfg.engram_token_map[5]);
}

TEST(ForwardConsistencyPrimitives, EngramRowDecode) {
  std::vector<uint8_t> row(64 + 2, 0x30);  // 0x30 = 0.5
  row[0] = 0x38;   // 1.0
  row[1] = 0x39;   // 1.125
  row[2] = 0xB8;   // -1.0
  row[3] = 0x01;   // 2^-9
  row[4] = 0x7E;   // 448
  row[5] = 0x00;
  row[32] = 0x3F;  // 1.875
  row[64] = 127;   // x1
  row[65] = 130;   // x8
  std::vector<float> out(64);
  ASSERT_TRUE(engram_decode_row(row.data(), 64, out.data()));
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.125f);
  EXPECT_EQ(out[2], -1.0f);
  EXPECT_EQ(out[3], std::ldexp(1.0f, -9));
  EXPECT_EQ(out[4], 448.0f);
  EXPECT_EQ(out[5], 0.0f);
  EXPECT_EQ(out[31], 0.5f);
  EXPECT_EQ(out[32], 15.0f);
  EXPECT_EQ(out[33], 4.0f);
  // E8M0 0 is 2^-127: values land in BF16's subnormal range and are rounded there.
  row[64] = 0;
  row[0] = 0x0F;  // 1.875 * 2^-6 * 2^-127 = 1.875 * 2^-133 -> 2^-132
  ASSERT_TRUE(engram_decode_row(row.data(), 64, out.data()));
  EXPECT_EQ(out[0], std::ldexp(1.0f, -132));
  EXPECT_EQ(out[3], 0.0f);  // 2^-136 rounds to zero in BF16
  row[7] = 0x7F;  // NaN code
  EXPECT_FALSE(engram_decode_row(row.data(), 64, out.data()));
  row[7] = 0x30;
  row[65] = 255;  // NaN scale
  EXPECT_FALSE(engram_decode_row(row.data(), 64, out.data()));
}

// The reader deduplicates, coalesces consecutive rows and stays within its staging buffer; the
// result equals reading and decoding every reference on its own.
TEST(ForwardConsistencyPrimitives, EngramGatherMatchesRowByRow) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("sluice-engram-gather-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "tiny.gguf").string();
  const std::string cmd = std::string(SLUICE_BINARY) + " make-model --preset tiny -o " + path + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const gguf::File f = gguf::File::open(path);
  const ModelConfig c = tiny_config();
  const std::string name = "blk." + std::to_string(c.engram_layer_ids[0]) + ".engram_embd.weight";
  const gguf::TensorInfo* t = f.find_tensor(name);
  ASSERT_NE(t, nullptr);
  const uint32_t hd = c.engram_head_dim, rb = c.engram_row_bytes();
  const std::vector<uint64_t> rows = {5, 3, 5, 4, 100, 3, t->ne[1] - 1};
  std::vector<float> got(rows.size() * hd);
  const EngramReadStats st = engram_gather(f, *t, hd, rows, got.data(), 2 * rb);  // 2 rows per batch
  EXPECT_EQ(st.requested, 7u);
  EXPECT_EQ(st.unique, 5u);
  EXPECT_EQ(st.batches, 3u);   // {3,4} {5,100} {last}
  EXPECT_EQ(st.reads, 4u);     // 3-4 coalesced
  std::vector<uint8_t> raw(rb);
  std::vector<float> want(hd);
  for (size_t i = 0; i < rows.size(); ++i) {
    f.read_bytes(*t, rows[i] * rb, raw.data(), rb);
    ASSERT_TRUE(engram_decode_row(raw.data(), hd, want.data()));
    for (uint32_t k = 0; k < hd; ++k) ASSERT_EQ(got[i * hd + k], want[k]) << i << " " << k;
  }
  const std::vector<uint64_t> bad = {t->ne[1]};
  EXPECT_THROW(engram_gather(f, *t, hd, bad, got.data()), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace sluice
