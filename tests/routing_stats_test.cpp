// bench_routing's per-layer statistics (runtime/routing_stats.h) on a trace small enough to work
// out by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/routing_stats.h"

using namespace sluice;

namespace {

// 5 tokens, 2 layers, top-2 of 4 experts. Layer 0:
//   t0 {0,1}  t1 {0,2}  t2 {0,1}  t3 {3,0}  t4 {1,2}
// Layer 1 is the guess target: selected t0 {2,3} t1 {2,3} t2 {0,1} t3 {1,2} t4 {1,2}.
storage::RoutingTrace selected() {
  return {{{0, 1}, {2, 3}}, {{0, 2}, {2, 3}}, {{0, 1}, {0, 1}}, {{3, 0}, {1, 2}}, {{1, 2}, {1, 2}}};
}
// Guesses for layer 1 (none for layer 0): t0 {2,3} t1 {2,1} t2 {3,2} t3 {1,2} t4 {} (not made).
storage::RoutingTrace guessed() {
  return {{{}, {2, 3}}, {{}, {1, 2}}, {{}, {2, 3}}, {{}, {1, 2}}, {{}, {}}};
}

}  // namespace

TEST(RoutingStats, HandComputedFiveTokenTrace) {
  const std::vector<LayerRouting> r = routing_stats(selected(), guessed(), 2, 4);
  ASSERT_EQ(r.size(), 2u);
  const LayerRouting& l0 = r[0];
  EXPECT_EQ(l0.selections, 10u);
  // Counts: expert 0 x4, 1 x3, 2 x2, 3 x1 of 10.
  const double h = -(0.4 * std::log2(0.4) + 0.3 * std::log2(0.3) + 0.2 * std::log2(0.2) + 0.1 * std::log2(0.1));
  EXPECT_NEAR(l0.entropy_bits, h, 1e-12);
  EXPECT_NEAR(l0.entropy_norm, h / 2.0, 1e-12);
  EXPECT_EQ(top_decile_count(4), 1u);      // ceil(4 / 10)
  EXPECT_DOUBLE_EQ(l0.top10_share, 0.4);   // expert 0
  // Reuse distances: expert 0 at t0,t1,t2,t3 -> 1,1,1; expert 1 at t0,t2,t4 -> 2,2; expert 2 at
  // t1,t4 -> 3; expert 3 once. {1,1,1,2,2,3}: mean 10/6, median (1+2)/2.
  EXPECT_EQ(l0.reuses, 6u);
  EXPECT_NEAR(l0.reuse_mean, 10.0 / 6.0, 1e-12);
  EXPECT_DOUBLE_EQ(l0.reuse_median, 1.5);
  // Overlap with the previous token: t1 {0} of 2, t2 {0}, t3 {0}, t4 {} -> (0.5+0.5+0.5+0)/4.
  EXPECT_DOUBLE_EQ(l0.prev_overlap, 0.375);
  EXPECT_EQ(l0.guessed, 0u);  // layer 0 has no guess
  // Layer 1's guesses: t0 2 of 2, t1 {2} 1, t2 0, t3 2; t4 had none and is not counted.
  const LayerRouting& l1 = r[1];
  EXPECT_EQ(l1.guessed, 8u);
  EXPECT_EQ(l1.selected_with_guess, 8u);
  EXPECT_EQ(l1.guess_hits, 5u);
  EXPECT_DOUBLE_EQ(l1.guess_recall(), 5.0 / 8.0);
  EXPECT_DOUBLE_EQ(l1.guess_precision(), 5.0 / 8.0);
  // Layer 1 overlap: t1 2/2, t2 0, t3 {1} 1/2, t4 2/2 -> 2.5/4; reuse: 2: t0,t1,t3,t4 -> 1,2,1;
  // 3: t0,t1 -> 1; 0: once; 1: t2,t3,t4 -> 1,1. {1,1,1,1,1,2}: median 1.
  EXPECT_DOUBLE_EQ(l1.prev_overlap, 0.625);
  EXPECT_EQ(l1.reuses, 6u);
  EXPECT_DOUBLE_EQ(l1.reuse_median, 1.0);
  EXPECT_NEAR(l1.reuse_mean, 7.0 / 6.0, 1e-12);
}

TEST(RoutingStats, UniformBaseline) {
  const UniformRouting u = uniform_routing(48, 3);
  EXPECT_DOUBLE_EQ(u.top10_share, 5.0 / 48.0);
  EXPECT_DOUBLE_EQ(u.reuse_mean, 16.0);
  EXPECT_DOUBLE_EQ(u.overlap, 3.0 / 48.0);
}
