// The top-k selection (numerics.h topk_ascending, candidate_blocks' block choice): a sampled
// threshold and a SIMD scan keep a few times k scores before the exact order runs. Whatever the
// sample, the result must be the plain selection's: the k best by score, ties to the lower index,
// never -inf or NaN, ascending. Checked against a full sort on sizes around the sampling cut-off,
// ties, signed zeros, infinities, NaN, mostly -inf rows (a candidate consumer's), and a layout
// that fools the sample (the scan then runs again over everything).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/numerics.h"
#include "kernels/topk_collect.h"

namespace sluice {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<int32_t> full_sort_topk(const std::vector<float>& s, uint32_t k) {
  std::vector<int32_t> idx;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] > -kInf) idx.push_back((int32_t)i);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
  if (idx.size() > k) idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<float> make_scores(std::mt19937& rng, size_t n, int kind) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> s(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = u(rng);
    switch (kind) {
      case 0: s[i] = v; break;                                   // distinct
      case 1: s[i] = std::round(v * 8.0f) / 8.0f; break;        // many ties, +0 and -0
      case 2: s[i] = (float)i; break;                             // ascending
      case 3: s[i] = -(float)i; break;                            // descending
      case 4: s[i] = rng() % 50 ? -kInf : v; break;               // mostly masked
      case 5: s[i] = rng() % 7 ? v : (rng() % 2 ? std::nanf("") : kInf); break;
      default: s[i] = (v > 0.0f ? 0.0f : -0.0f); break;           // only signed zeros
    }
  }
  return s;
}

TEST(Topk, EqualsAFullSort) {
  std::mt19937 rng(21);
  for (size_t n : {0u, 1u, 17u, 600u, 5119u, 5121u, 40001u, 262147u})
    for (int kind = 0; kind < 7; ++kind)
      for (uint32_t k : {1u, 7u, 512u, 2048u}) {
        const std::vector<float> s = make_scores(rng, n, kind);
        ASSERT_EQ(topk_ascending(s, k), full_sort_topk(s, k)) << "n " << n << " kind " << kind << " k " << k;
      }
}

// The sampled positions hold the only high scores: the threshold keeps fewer than k and the
// scan must run again over every score.
TEST(Topk, ASampleThatMisleadsStillGivesTheExactSet) {
  const size_t n = 100000;
  std::vector<float> s(n, 0.25f);
  for (size_t i = 0; i < 1024; ++i) s[i * n / 1024] = 1.0f;
  for (size_t i = 0; i < n; i += 3) s[i] = std::max(s[i], 0.5f);
  for (uint32_t k : {512u, 2048u, 40000u}) EXPECT_EQ(topk_ascending(s, k), full_sort_topk(s, k)) << k;
}

TEST(Topk, SimdCollectEqualsScalar) {
  if (detect_isa() != Isa::Avx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(22);
  for (size_t n : {0u, 5u, 16u, 33u, 1000u, 4097u})
    for (int kind = 0; kind < 7; ++kind) {
      const std::vector<float> s = make_scores(rng, n, kind);
      for (float t : {-kInf, -0.5f, 0.0f, -0.0f, 0.5f, kInf}) {
        std::vector<int32_t> a(n + 1, -7), b(n + 1, -7);
        const size_t ca = topk_collect(s.data(), n, t, a.data()), cb = topk_collect_avx512(s.data(), n, t, b.data());
        ASSERT_EQ(ca, cb) << n << " " << kind << " " << t;
        ASSERT_EQ(a, b) << n << " " << kind << " " << t;
      }
    }
}

TEST(Topk, CandidateBlocksEqualAFullSortOfBlockMaxima) {
  std::mt19937 rng(23);
  for (uint32_t n_vis : {1u, 9u, 70000u, 200003u})
    for (int kind : {0, 1, 4}) {
      const std::vector<float> s = make_scores(rng, n_vis, kind);
      const uint32_t block = 8, keep = 2048, nb = (n_vis + block - 1) / block;
      std::vector<float> b(nb, -kInf);
      for (uint32_t j = 0; j < n_vis; ++j) b[j / block] = std::max(b[j / block], s[j]);
      b[(n_vis - 1) / block] = kInf;
      std::vector<uint8_t> want(nb, 0);
      for (int32_t i : full_sort_topk(b, keep)) want[i] = 1;
      EXPECT_EQ(candidate_blocks(s, n_vis, block, keep), want) << n_vis << " " << kind;
    }
}

}  // namespace
}  // namespace sluice
