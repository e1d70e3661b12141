// The integer indexer (kernels/index_scores.h) against the float path it replaces: unpack the
// key to BF16, f32 dot per head, relu, head weight, sum over heads. Bit-identical on keys and
// queries whose block exponents span what real ones do; the keys outside the proven bound go
// back to the float path, and those are real: at a span of 10+ binades the exact integer sum and
// the f32 sum differ (shown below), so the bound is not vacuous. SIMD equals scalar everywhere.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/fp.h"
#include "kernels/fp4_rows.h"
#include "kernels/index_scores.h"
#include "kernels/numerics.h"
#include "kernels/types.h"

namespace sluice {
namespace {

// A vector of blocks of 32 whose block b has magnitude about 2^e[b], fake-quantized to MXFP4
// (the query form) or packed (the key form).
std::vector<float> grid_vector(std::mt19937& rng, const std::vector<int>& e) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(e.size() * 32);
  for (size_t i = 0; i < v.size(); ++i) v[i] = round_bf16(std::ldexp(u(rng), e[i / 32]));
  return v;
}

std::vector<int> exps(std::mt19937& rng, size_t blocks, int lo, int hi) {
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<int> e(blocks);
  for (int& x : e) x = d(rng);
  return e;
}

struct Case {
  uint32_t heads = 0, hd = 0;
  std::vector<float> q, w;    // [heads][hd] on the grid, [heads] w'
  std::vector<uint8_t> keys;  // n packed keys
  size_t n = 0;
};

Case make_case(std::mt19937& rng, uint32_t heads, uint32_t hd, size_t n, int lo, int hi) {
  Case c;
  c.heads = heads;
  c.hd = hd;
  c.n = n;
  for (uint32_t h = 0; h < heads; ++h) {
    std::vector<float> qh = grid_vector(rng, exps(rng, hd / 32, lo, hi));
    fake_quant_mxfp4(qh.data(), hd);
    c.q.insert(c.q.end(), qh.begin(), qh.end());
  }
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (uint32_t h = 0; h < heads; ++h) c.w.push_back(round_bf16(u(rng)) / 64.0f);
  const size_t rb = fp4_row_bytes(Fp4Grid::Mxfp4, hd);
  c.keys.resize(n * rb);
  for (size_t j = 0; j < n; ++j) {
    const std::vector<float> k = grid_vector(rng, exps(rng, hd / 32, lo, hi));
    fp4_pack_row(Fp4Grid::Mxfp4, k.data(), hd, c.keys.data() + j * rb);
  }
  return c;
}

// The float path, with the given BF16 dot (scalar reference or a SIMD one: equal by contract).
float float_score(const Case& c, size_t j, DotFn dot) {
  std::vector<uint16_t> key(c.hd);
  fp4_unpack_row(Fp4Grid::Mxfp4, c.keys.data() + j * fp4_row_bytes(Fp4Grid::Mxfp4, c.hd), c.hd, key.data());
  float acc = 0.0f;
  for (uint32_t h = 0; h < c.heads; ++h) acc += std::max(dot(key.data(), c.q.data() + (size_t)h * c.hd, c.hd), 0.0f) * c.w[h];
  return acc;
}

// Scores through an integer kernel, the fallback keys through the float path.
std::vector<float> int_scores(const Case& c, IndexScoresFn fn, std::vector<uint32_t>& fallback) {
  IndexQuery iq;
  prepare_index_query(c.q.data(), c.w.data(), c.heads, c.hd, iq);
  EXPECT_TRUE(iq.integer);
  std::vector<float> s(c.n + 1, 12345.0f);
  fallback.assign(c.n, 0);
  fallback.resize(fn(iq, c.keys.data(), c.n, s.data(), fallback.data()));
  EXPECT_EQ(s[c.n], 12345.0f) << "wrote past the scores";
  const DotFn ref = type_traits(GgmlType::BF16).dot_scalar;
  for (uint32_t j : fallback) s[j] = float_score(c, j, ref);
  s.pop_back();
  return s;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t j = 0; j < a.size(); ++j)
    ASSERT_EQ(std::bit_cast<uint32_t>(a[j]), std::bit_cast<uint32_t>(b[j])) << what << " key " << j << ": " << a[j] << " vs " << b[j];
}

std::vector<IndexScoresFn> kernels() {
  std::vector<IndexScoresFn> k = {index_scores_int};
  if (detect_isa() == Isa::Avx512) k.push_back(index_scores_int_avx512);
  return k;
}

TEST(IndexScores, SpanLimit) {
  EXPECT_EQ(index_span_limit(4), 9);   // 18,432 * 2^9 <= 2^24 < 18,432 * 2^10
  EXPECT_EQ(index_span_limit(1), 11);
  EXPECT_EQ(index_span_limit(8), 8);
}

// Real queries and keys: RMS-normed vectors whose blocks differ by a few binades. No fallback,
// and the integer scores are the float path's, bit for bit, with every BF16 dot the engine has.
TEST(IndexScores, EqualsFloatPathOnRealisticSpans) {
  std::mt19937 rng(11);
  std::vector<DotFn> dots = {type_traits(GgmlType::BF16).dot_scalar};
  for (Isa isa : {Isa::Avx2, Isa::Avx512})
    if (isa <= detect_isa()) dots.push_back(dot_for(type_traits(GgmlType::BF16), isa));
  for (uint32_t hd : {32u, 64u, 96u, 128u, 256u})
    for (uint32_t heads : {1u, 3u, 32u}) {
      const Case c = make_case(rng, heads, hd, 333, -2, 2);
      for (IndexScoresFn fn : kernels()) {
        std::vector<uint32_t> fallback;
        const std::vector<float> got = int_scores(c, fn, fallback);
        EXPECT_TRUE(fallback.empty()) << fallback.size() << " keys fell back at hd " << hd;
        for (DotFn dot : dots) {
          std::vector<float> want(c.n);
          for (size_t j = 0; j < c.n; ++j) want[j] = float_score(c, j, dot);
          expect_same_bits(got, want, "realistic");
        }
      }
    }
}

// Spans up to 24 binades and tiny or huge scales: many keys fall back, and every score, integer or
// fallen back, is still the float path's.
TEST(IndexScores, WideSpansFallBackAndStillEqual) {
  std::mt19937 rng(12);
  const DotFn ref = type_traits(GgmlType::BF16).dot_scalar;
  struct Range {
    int lo, hi;
    uint32_t heads;
  };
  for (const Range r : {Range{-12, 12, 5}, Range{-120, -100, 5}, Range{40, 60, 5}, Range{-3, 3, 1}}) {
    const Case c = make_case(rng, r.heads, 128, 517, r.lo, r.hi);
    std::vector<float> want(c.n);
    for (size_t j = 0; j < c.n; ++j) want[j] = float_score(c, j, ref);
    std::vector<uint32_t> first;
    for (IndexScoresFn fn : kernels()) {
      std::vector<uint32_t> fallback;
      expect_same_bits(int_scores(c, fn, fallback), want, "wide");
      if (fn == index_scores_int) first = fallback;
      EXPECT_EQ(fallback, first) << "kernels disagree on which keys fall back";
    }
    EXPECT_GT(first.size(), 0u) << "range " << r.lo << ".." << r.hi;
    if (r.heads == 1) {  // one head spanning up to 6 binades: some keys within the bound, some past
      EXPECT_LT(first.size(), c.n);
    }
  }
}

// The bound is needed: past it the exact sum (what the integer form computes) and the f32 sum
// differ for some keys, and those are exactly keys the check sends back. Within it they never do.
TEST(IndexScores, ExactAndFloatSumsDifferOnlyPastTheBound) {
  std::mt19937 rng(13);
  const DotFn ref = type_traits(GgmlType::BF16).dot_scalar;
  size_t differ_past = 0;
  for (int span : {6, 9, 10, 11, 12, 16}) {
    for (int trial = 0; trial < 400; ++trial) {
      // One head, full-magnitude blocks: block 0 at 2^span, the rest at 2^0.
      Case c;
      c.heads = 1;
      c.hd = 128;
      c.n = 1;
      std::vector<int> e = {span, 0, 0, 0};
      c.q = grid_vector(rng, e);
      for (float& x : c.q) x = x * 6.0f;
      fake_quant_mxfp4(c.q.data(), 128);
      c.w = {1.0f};
      std::vector<float> k = grid_vector(rng, {0, 0, 0, 0});
      for (float& x : k) x = x * 6.0f;
      c.keys.resize(68);
      fp4_pack_row(Fp4Grid::Mxfp4, k.data(), 128, c.keys.data());
      std::vector<uint16_t> kb(128);
      fp4_unpack_row(Fp4Grid::Mxfp4, c.keys.data(), 128, kb.data());
      double exact = 0.0;
      for (size_t i = 0; i < 128; ++i) exact += (double)c.q[i] * (double)bf16_to_f32(kb[i]);
      const float f = ref(kb.data(), c.q.data(), 128);
      IndexQuery iq;
      prepare_index_query(c.q.data(), c.w.data(), 1, 128, iq);
      ASSERT_TRUE(iq.integer);
      const bool within = index_key_exact(iq, c.keys.data());
      if (span <= 9) {
        EXPECT_TRUE(within) << "span " << span;
        EXPECT_EQ((double)f, exact) << "f32 sum inexact within the bound, span " << span;
      }
      if ((double)f != exact) {
        EXPECT_FALSE(within) << "an inexact f32 sum passed the check, span " << span;
        differ_past += span > 9;
      }
    }
  }
  EXPECT_GT(differ_past, 0u) << "no case past the bound where the sums differ: the bound would be vacuous";
}

TEST(IndexScores, QueriesOffTheGridTakeTheFloatPath) {
  std::vector<float> q(128, 0.0f), w = {1.0f};
  IndexQuery iq;
  prepare_index_query(q.data(), w.data(), 1, 128, iq);
  EXPECT_TRUE(iq.integer) << "an all-zero query is on every grid";
  q[5] = 0.3f;  // a lone value is 12 * 2^x for some x only if it is a power of two times 3 or less
  q[6] = 1.0f;
  prepare_index_query(q.data(), w.data(), 1, 128, iq);
  EXPECT_FALSE(iq.integer);
  q[5] = 0.25f;
  prepare_index_query(q.data(), w.data(), 1, 128, iq);
  EXPECT_TRUE(iq.integer);
  q[7] = std::nanf("");
  prepare_index_query(q.data(), w.data(), 1, 128, iq);
  EXPECT_FALSE(iq.integer);
  q[7] = 0.0f;
  prepare_index_query(q.data(), w.data(), 1, 100, iq);
  EXPECT_FALSE(iq.integer) << "head_dim not a multiple of 32";
}

// Zero blocks (their scale plays no part, even a huge one) and NaN-scale keys.
TEST(IndexScores, ZeroBlocksAndNanScales) {
  std::mt19937 rng(14);
  Case c = make_case(rng, 4, 128, 40, -1, 1);
  const size_t rb = 68;
  for (size_t j = 0; j < c.n; j += 3) {  // zero a block, give it an extreme scale code
    uint8_t* key = c.keys.data() + j * rb;
    const size_t b = j % 4;
    std::memset(key + b * 16, (j % 2) ? 0x88 : 0x00, 16);  // +0 or -0 codes
    key[64 + b] = (uint8_t)((j % 2) ? 254 : 0);
  }
  c.keys[7 * rb + 64 + 2] = 0xff;  // a NaN scale
  for (size_t i = 0; i < 32; ++i) c.q[32 + i] = 0.0f;  // a zero query block
  const DotFn ref = type_traits(GgmlType::BF16).dot_scalar;
  std::vector<float> want(c.n);
  for (size_t j = 0; j < c.n; ++j) want[j] = float_score(c, j, ref);
  EXPECT_TRUE(std::isnan(want[7]));
  for (IndexScoresFn fn : kernels()) {
    std::vector<uint32_t> fallback;
    expect_same_bits(int_scores(c, fn, fallback), want, "zero blocks");
    EXPECT_EQ(fallback, std::vector<uint32_t>{7});
  }
}

}  // namespace
}  // namespace sluice
