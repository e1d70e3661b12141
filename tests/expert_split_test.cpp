// The CPU's share of a device's routed-expert misses (--cpu-experts F|auto): the fixed share
// over a run, the cost model auto minimises, which misses go to the CPU. Plain arithmetic,
// tested without a device (tests/vulkan_backend_test.cpp holds the bits on lavapipe).
#include "backend/expert_split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace sluice {
namespace {

// The cost model written out: uploads first, then the device's and the CPU's projections side
// by side.
double model_time(const ExpertSplitCosts& c, size_t h, size_t m, size_t k) {
  return c.upload * (double)(m - k) + std::max(c.device * (double)(h + m - k), c.cpu * (double)k);
}

TEST(ExpertSplit, AFixedShareIsKeptOverARun) {
  for (const double share : {0.0, 0.25, 1.0 / 3, 0.5, 0.9, 1.0}) {
    ExpertSplit s(share, false);
    size_t cpu = 0, misses = 0;
    for (size_t call = 0; call < 200; ++call) {
      const size_t m = call % 7;  // 0..6 misses a call, decode-sized
      const size_t k = s.cpu_count(6 - m, m);
      ASSERT_LE(k, m);
      cpu += k;
      misses += m;
      // Never more than one expert behind the share, never ahead of it.
      ASSERT_LE((double)cpu, share * (double)misses + 1e-9);
      ASSERT_GT((double)cpu + 1.0, share * (double)misses - 1e-9);
    }
  }
}

TEST(ExpertSplit, AutoMeasuresBothSidesThenMinimisesTheModel) {
  ExpertSplit s(0, true);
  EXPECT_EQ(s.cpu_count(2, 4), 2u) << "the CPU is measured first, on half the misses";
  EXPECT_EQ(s.cpu_count(5, 1), 1u) << "at least one expert to measure the CPU";
  s.cpu_took(0.004, 2);
  EXPECT_EQ(s.costs().cpu, 0.002);
  EXPECT_EQ(s.cpu_count(5, 1), 0u) << "the device not measured yet: it gets the lone miss";
  s.device_took(0.003, 3);
  s.upload_took(0.0005, 1);
  const size_t k = s.cpu_count(2, 4);
  EXPECT_EQ(k, ExpertSplit::best_k(s.costs(), 2, 4));
  s.cpu_took(0.004, 1);  // a quarter of the way to 4 ms
  EXPECT_DOUBLE_EQ(s.costs().cpu, 0.75 * 0.002 + 0.25 * 0.004);

  // A side the model leaves idle is measured again every kRemeasureEvery decided calls.
  ExpertSplit cpu_wins(0, true), device_wins(0, true);
  for (ExpertSplit* x : {&cpu_wins, &device_wins}) {
    x->cpu_took(x == &cpu_wins ? 0.001 : 1.0, 1);
    x->device_took(1e-6, 1);
    x->upload_took(x == &cpu_wins ? 1.0 : 0.0, 1);
  }
  // decided calls so far: none (the ones above were measuring calls of another split)
  for (uint64_t call = 1; call <= 2 * ExpertSplit::kRemeasureEvery; ++call) {
    const bool again = call % ExpertSplit::kRemeasureEvery == 0;
    EXPECT_EQ(cpu_wins.cpu_count(0, 3), again ? 2u : 3u) << call;
    EXPECT_EQ(device_wins.cpu_count(0, 3), again ? 1u : 0u) << call;
  }

  // best_k against every k of the written-out model, on a grid of costs.
  for (const double up : {0.0, 0.2, 1.0, 5.0})
    for (const double dev : {0.1, 0.5, 2.0})
      for (const double cpu : {0.3, 1.0, 4.0})
        for (size_t h = 0; h <= 6; h += 3)
          for (size_t m = 0; m <= 12; ++m) {
            const ExpertSplitCosts c{up, dev, cpu};
            const size_t b = ExpertSplit::best_k(c, h, m);
            ASSERT_LE(b, m);
            double best = std::numeric_limits<double>::infinity();
            size_t first = 0;
            for (size_t kk = 0; kk <= m; ++kk)
              if (model_time(c, h, m, kk) < best) {
                best = model_time(c, h, m, kk);
                first = kk;
              }
            ASSERT_EQ(b, first) << "upload " << up << " device " << dev << " cpu " << cpu << " h " << h << " m " << m;
          }
  // The cases the model is for: a slow upload (PCIe) sends misses to the CPU, a fast device
  // with a free upload keeps them.
  EXPECT_EQ(ExpertSplit::best_k({5.0, 0.1, 1.0}, 0, 6), 6u);
  EXPECT_EQ(ExpertSplit::best_k({0.0, 0.1, 1.0}, 0, 6), 0u);
  EXPECT_EQ(ExpertSplit::best_k({0.0, 1.0, 1.0}, 0, 6), 3u) << "equal speeds split the work in half";
}

TEST(ExpertSplit, TheMissesWithTheFewestTokensGoToTheCpu) {
  // Expert 9 has 3 tokens, 4 has 1, 7 has 2, 2 has 1 (and 5 is a hit, not a miss).
  const std::vector<ExpertTriple> triples = {{2, 0, 1}, {4, 1, 1}, {5, 0, 1}, {5, 1, 1}, {7, 0, 1},
                                             {7, 2, 1}, {9, 0, 1}, {9, 1, 1}, {9, 2, 1}};
  const std::vector<uint32_t> misses = {2, 4, 7, 9};
  EXPECT_EQ(ExpertSplit::pick(triples, misses, 0), std::vector<uint32_t>{});
  EXPECT_EQ(ExpertSplit::pick(triples, misses, 1), std::vector<uint32_t>{2});
  EXPECT_EQ(ExpertSplit::pick(triples, misses, 2), (std::vector<uint32_t>{2, 4}));
  EXPECT_EQ(ExpertSplit::pick(triples, misses, 3), (std::vector<uint32_t>{2, 4, 7}));
  EXPECT_EQ(ExpertSplit::pick(triples, misses, 9), (std::vector<uint32_t>{2, 4, 7, 9}));
}

}  // namespace
}  // namespace sluice
