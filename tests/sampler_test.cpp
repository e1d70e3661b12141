// The token sampler: greedy tie-breaking, the top-p cutoff on hand-made distributions, temperature
// limits and seeded reproducibility.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "runtime/sampler.h"
#include "util/error.h"

namespace {

using sluice::Sampler;
using sluice::SamplerOptions;
using sluice::TokenProb;

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// Logits whose softmax at temperature 1 is exactly proportional to p.
std::vector<float> log_probs(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back((float)std::log(x));
  return l;
}

std::vector<uint32_t> ids_of(const std::vector<TokenProb>& v) {
  std::vector<uint32_t> ids;
  for (const TokenProb& t : v) ids.push_back(t.id);
  return ids;
}

}  // namespace

TEST(SamplerGreedy, TiesGoToTheLowestId) {
  EXPECT_EQ(sluice::argmax_lowest(std::vector<float>{1, 3, 3, 2}), 1u);
  EXPECT_EQ(sluice::argmax_lowest(std::vector<float>{5, 5}), 0u);
  EXPECT_EQ(sluice::argmax_lowest(std::vector<float>{-1, 0, 7, 0, 7, 7}), 2u);
  EXPECT_EQ(sluice::argmax_lowest(std::vector<float>{-kInf, -kInf, -3}), 2u);
  EXPECT_EQ(sluice::argmax_lowest(std::vector<float>{-kInf, -kInf}), 0u);
  // NaN never wins, wherever it sits.
  EXPECT_EQ(sluice::argmax_lowest(std::vector<float>{kNaN, 1, 1}), 1u);
  EXPECT_EQ(sluice::argmax_lowest(std::vector<float>{0, kNaN, 2}), 2u);
  EXPECT_THROW(sluice::argmax_lowest(std::vector<float>{}), sluice::Error);
  EXPECT_THROW(sluice::argmax_lowest(std::vector<float>{kNaN, kNaN}), sluice::Error);

  // The greedy sampler is argmax_lowest and ignores the seed.
  Sampler a(SamplerOptions{0.0f, 1.0f, 1}), b(SamplerOptions{0.0f, 0.3f, 99});
  const std::vector<float> row{0.5f, 2.0f, -1.0f, 2.0f};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(a.sample(row), 1u);
    EXPECT_EQ(b.sample(row), 1u);
  }
}

TEST(SamplerTopP, CutoffOnAHandMadeDistribution) {
  // p = {0.1, 0.4, 0.2, 0.3}: nucleus order 1 (0.4), 3 (0.3), 2 (0.2), 0 (0.1).
  const std::vector<float> l = log_probs({0.1, 0.4, 0.2, 0.3});
  auto full = sluice::nucleus(l, 1.0f, 1.0f);
  ASSERT_EQ(full.size(), 4u);
  EXPECT_EQ(ids_of(full), (std::vector<uint32_t>{1, 3, 2, 0}));
  const double want[] = {0.4, 0.3, 0.2, 0.1};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(full[i].p, want[i], 1e-7) << i;

  EXPECT_EQ(ids_of(sluice::nucleus(l, 1.0f, 0.05f)), (std::vector<uint32_t>{1}));
  EXPECT_EQ(ids_of(sluice::nucleus(l, 1.0f, 0.39f)), (std::vector<uint32_t>{1}));
  EXPECT_EQ(ids_of(sluice::nucleus(l, 1.0f, 0.41f)), (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(ids_of(sluice::nucleus(l, 1.0f, 0.69f)), (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(ids_of(sluice::nucleus(l, 1.0f, 0.71f)), (std::vector<uint32_t>{1, 3, 2}));
  EXPECT_EQ(ids_of(sluice::nucleus(l, 1.0f, 0.89f)), (std::vector<uint32_t>{1, 3, 2}));
  EXPECT_EQ(ids_of(sluice::nucleus(l, 1.0f, 0.91f)), (std::vector<uint32_t>{1, 3, 2, 0}));

  // Equal probabilities are ordered by id, so the cut keeps the lowest ids.
  const std::vector<float> flat(5, 0.25f);
  EXPECT_EQ(ids_of(sluice::nucleus(flat, 1.0f, 0.1f)), (std::vector<uint32_t>{0}));
  EXPECT_EQ(ids_of(sluice::nucleus(flat, 1.0f, 0.5f)), (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(ids_of(sluice::nucleus(flat, 1.0f, 1.0f)), (std::vector<uint32_t>{0, 1, 2, 3, 4}));

  // -inf logits have probability 0 and never enter the nucleus.
  const std::vector<float> masked{-kInf, 0.0f, -kInf, 0.0f};
  EXPECT_EQ(ids_of(sluice::nucleus(masked, 1.0f, 1.0f)), (std::vector<uint32_t>{1, 3}));
}

TEST(SamplerTopP, SamplesStayInsideTheNucleusWithItsProportions) {
  const std::vector<float> l = log_probs({0.1, 0.4, 0.2, 0.3});
  Sampler s(SamplerOptions{1.0f, 0.5f, 42});  // nucleus {1, 3}: 4/7 and 3/7 after renormalising
  std::map<uint32_t, int> count;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[s.sample(l)];
  EXPECT_EQ(count.size(), 2u);
  EXPECT_NEAR((double)count[1] / n, 4.0 / 7.0, 0.02);
  EXPECT_NEAR((double)count[3] / n, 3.0 / 7.0, 0.02);

  Sampler all(SamplerOptions{1.0f, 1.0f, 43});
  count.clear();
  for (int i = 0; i < n; ++i) ++count[all.sample(l)];
  EXPECT_NEAR((double)count[0] / n, 0.1, 0.015);
  EXPECT_NEAR((double)count[2] / n, 0.2, 0.015);
}

TEST(SamplerTemperature, ZeroVersusTinyTemperature) {
  const std::vector<float> row{0.1f, 1.3f, 1.2999f, -4.0f, 1.0f};
  Sampler greedy(SamplerOptions{0.0f, 1.0f, 5});
  Sampler tiny(SamplerOptions{1e-6f, 1.0f, 5});
  Sampler warm(SamplerOptions{1.0f, 1.0f, 5});
  std::set<uint32_t> warm_ids;
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(greedy.sample(row), 1u);
    EXPECT_EQ(tiny.sample(row), 1u);  // the runner-up is 1e-4 / 1e-6 = 100 nats less likely
    warm_ids.insert(warm.sample(row));
  }
  EXPECT_GE(warm_ids.size(), 3u);  // at temperature 1 the near-ties all come up

  // With a tied maximum a tiny temperature splits between the tied ids only (greedy takes the lower).
  const std::vector<float> tied{0.0f, 2.0f, 1.9f, 2.0f};
  Sampler tiny_tied(SamplerOptions{1e-6f, 1.0f, 9});
  std::set<uint32_t> seen;
  for (int i = 0; i < 200; ++i) seen.insert(tiny_tied.sample(tied));
  EXPECT_EQ(seen, (std::set<uint32_t>{1, 3}));
  EXPECT_EQ(Sampler(SamplerOptions{0.0f, 1.0f, 9}).sample(tied), 1u);

  // Softmax at temperature T: p1/p0 = exp((l1 - l0) / T).
  const std::vector<float> two{0.0f, (float)std::log(2.0)};
  auto t1 = sluice::nucleus(two, 1.0f, 1.0f), t2 = sluice::nucleus(two, 2.0f, 1.0f);
  ASSERT_EQ(t1.size(), 2u);
  ASSERT_EQ(t2.size(), 2u);
  EXPECT_NEAR(t1[0].p, 2.0 / 3.0, 1e-7);
  EXPECT_NEAR(t1[0].p / t1[1].p, 2.0, 1e-6);
  EXPECT_NEAR(t2[0].p / t2[1].p, std::sqrt(2.0), 1e-6);
}

TEST(SamplerSeed, ReproducibleAndSeedDependent) {
  std::mt19937_64 g(123);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  std::vector<float> row(1000);
  for (float& x : row) x = d(g);

  auto draws = [&](uint64_t seed, float temp, float top_p) {
    Sampler s(SamplerOptions{temp, top_p, seed});
    std::vector<uint32_t> v;
    for (int i = 0; i < 100; ++i) v.push_back(s.sample(row));
    return v;
  };
  EXPECT_EQ(draws(7, 1.0f, 0.95f), draws(7, 1.0f, 0.95f));
  EXPECT_EQ(draws(8, 1.5f, 1.0f), draws(8, 1.5f, 1.0f));
  EXPECT_NE(draws(7, 1.0f, 0.95f), draws(8, 1.0f, 0.95f));
  const std::vector<uint32_t> v = draws(7, 1.0f, 0.95f);
  EXPECT_GT(std::set<uint32_t>(v.begin(), v.end()).size(), 10u);

  // The generator is the standard's mt19937_64 (its 10000th output is fixed by [rand.predef]),
  // and uniform01 stays in [0, 1).
  std::mt19937_64 ref;
  ref.discard(9999);
  EXPECT_EQ(ref(), 9981545732273789042ull);
  std::mt19937_64 r(1);
  for (int i = 0; i < 10000; ++i) {
    const double u = sluice::uniform01(r);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(SamplerSettings, RejectsBadSettings) {
  EXPECT_THROW(sluice::validate(SamplerOptions{-0.5f, 1.0f, 0}), sluice::Error);
  EXPECT_THROW(sluice::validate(SamplerOptions{kNaN, 1.0f, 0}), sluice::Error);
  EXPECT_THROW(sluice::validate(SamplerOptions{kInf, 1.0f, 0}), sluice::Error);
  EXPECT_THROW(sluice::validate(SamplerOptions{1.0f, -0.01f, 0}), sluice::Error);
  EXPECT_THROW(sluice::validate(SamplerOptions{101.0f, 1.0f, 0}), sluice::Error);
  EXPECT_THROW(sluice::validate(SamplerOptions{1.0f, 1.0f, 0, 0, 1.5f}), sluice::Error);
  EXPECT_THROW(sluice::validate(SamplerOptions{1.0f, 1.0f, 0, (1u << 30) + 1}), sluice::Error);
  sluice::SamplingRequest bad_n;
  bad_n.max_tokens = 0;
  EXPECT_THROW(sluice::check_sampling(bad_n), sluice::Error);
  // top_p 0 is allowed (OpenAI's range is [0, 1]): only the most likely token is kept.
  EXPECT_NO_THROW(sluice::validate(SamplerOptions{1.0f, 0.0f, 0}));
  EXPECT_THROW(sluice::validate(SamplerOptions{1.0f, 1.01f, 0}), sluice::Error);
  EXPECT_THROW(sluice::validate(SamplerOptions{1.0f, kNaN, 0}), sluice::Error);
  EXPECT_NO_THROW(sluice::validate(SamplerOptions{0.0f, 1.0f, 0}));
  EXPECT_NO_THROW(sluice::validate(SamplerOptions{1.0f, 0.95f, 0}));
  EXPECT_THROW(Sampler(SamplerOptions{-1.0f, 1.0f, 0}), sluice::Error);
  // Sampling needs a usable row.
  Sampler s(SamplerOptions{1.0f, 1.0f, 0});
  EXPECT_THROW(s.sample(std::vector<float>{0.0f, kNaN}), sluice::Error);
  EXPECT_THROW(s.sample(std::vector<float>{-kInf, -kInf}), sluice::Error);
}

TEST(SamplerTopKMinP, CutsOnAHandMadeDistribution) {
  const std::vector<float> row = log_probs({0.1, 0.4, 0.2, 0.3});
  // Order by probability: 1 (0.4), 3 (0.3), 2 (0.2), 0 (0.1).
  EXPECT_EQ(ids_of(sluice::nucleus(row, 1.0f, 1.0f, 2)), (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(ids_of(sluice::nucleus(row, 1.0f, 0.0f)), (std::vector<uint32_t>{1}));
  // min_p 0.45: keep p >= 0.18.
  EXPECT_EQ(ids_of(sluice::nucleus(row, 1.0f, 1.0f, 0, 0.45f)), (std::vector<uint32_t>{1, 3, 2}));
  EXPECT_EQ(ids_of(sluice::nucleus(row, 1.0f, 1.0f, 0, 1.0f)), (std::vector<uint32_t>{1}));
  // top_k 1 at any temperature is greedy.
  Sampler k1(SamplerOptions{2.0f, 1.0f, 7, 1});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k1.sample(row), 1u);
}
