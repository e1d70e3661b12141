// DeviceRows (backend/device_rows.h): which attention rows a GPU keeps in its slots. A row is
// found again only while its bytes are the ones its slot was filled from; a slot the batch being
// recorded reads is never given to another row; a forgotten slot is filled again.
#include "backend/device_rows.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

namespace sluice {
namespace {

using Found = DeviceRows::Found;

std::span<const uint8_t> row(const std::vector<uint8_t>& mem, size_t i, size_t bytes) {
  return {mem.data() + i * bytes, bytes};
}

TEST(DeviceRows, ARowIsFoundAgainOnlyWhileItsBytesAreUnchanged) {
  std::vector<uint8_t> mem(16 * 24, 7);
  DeviceRows d(4, 24);
  Found a, b;
  ASSERT_TRUE(d.find(row(mem, 0, 24), 0, a));
  EXPECT_FALSE(a.hit);
  ASSERT_TRUE(d.find(row(mem, 0, 24), 0, b));
  EXPECT_TRUE(b.hit);
  EXPECT_EQ(b.slot, a.slot);
  // Same bytes read another way (a grid's tag): another row.
  ASSERT_TRUE(d.find(row(mem, 0, 24), 3, b));
  EXPECT_FALSE(b.hit);
  EXPECT_NE(b.slot, a.slot);
  // One byte rewritten in place while this batch reads the old row: a new slot, the old one kept.
  mem[23] = 9;
  ASSERT_TRUE(d.find(row(mem, 0, 24), 0, b));
  EXPECT_FALSE(b.hit);
  EXPECT_NE(b.slot, a.slot);
  const uint32_t rewritten = b.slot;
  ASSERT_TRUE(d.find(row(mem, 0, 24), 0, b));
  EXPECT_TRUE(b.hit);
  EXPECT_EQ(b.slot, rewritten);
  // Rewritten again after the batch went: refilled where it is.
  d.next_batch();
  mem[5] = 1;
  ASSERT_TRUE(d.find(row(mem, 0, 24), 0, b));
  EXPECT_FALSE(b.hit);
  EXPECT_EQ(b.slot, rewritten);
  // A forgotten slot (its copy never arrived) is not found.
  d.forget(b.slot);
  ASSERT_TRUE(d.find(row(mem, 0, 24), 0, b));
  EXPECT_FALSE(b.hit);
  // Rows longer than a slot's copy are not kept.
  EXPECT_FALSE(d.find({mem.data(), 25}, 0, b));
}

TEST(DeviceRows, ABatchKeepsItsSlotsUntilItIsSubmitted) {
  std::vector<uint8_t> mem(64 * 8);
  for (size_t i = 0; i < mem.size(); ++i) mem[i] = (uint8_t)(i * 13 + 1);
  DeviceRows d(5, 8);
  std::set<uint32_t> used;
  Found f;
  for (size_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(d.find(row(mem, i, 8), 0, f));
    EXPECT_FALSE(f.hit);
    used.insert(f.slot);
  }
  EXPECT_EQ(used.size(), 5u) << "a batch's rows share a slot";
  const uint64_t steps = d.clock_steps();
  EXPECT_FALSE(d.find(row(mem, 5, 8), 0, f)) << "a slot the batch reads was given to another row";
  EXPECT_EQ(d.clock_steps(), steps) << "a row refused for a full batch scanned the slots first";
  for (size_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(d.find(row(mem, i, 8), 0, f));
    EXPECT_TRUE(f.hit) << i;
  }
  d.next_batch();
  ASSERT_TRUE(d.find(row(mem, 5, 8), 0, f));
  EXPECT_FALSE(f.hit);
}

// Against a plain model on random traffic: a hit names a slot last filled with exactly the row's
// current bytes, and no two rows read in one batch share a slot.
TEST(DeviceRows, RandomTrafficNeverFindsStaleBytesNorSharesASlotInABatch) {
  std::mt19937_64 rng(11);
  for (const uint64_t slots : {1u, 3u, 17u, 64u}) {
    const size_t bytes = 1 + rng() % 40;
    std::vector<uint8_t> mem(37 * bytes);
    for (uint8_t& b : mem) b = (uint8_t)rng();
    DeviceRows d(slots, bytes);
    std::vector<std::vector<uint8_t>> filled(slots);  // what each slot was filled from
    std::vector<int> batch_row(slots, -1);            // the row each slot serves this batch
    uint64_t hits = 0;
    for (int step = 0; step < 4000; ++step) {
      const uint32_t op = (uint32_t)(rng() % 10);
      if (op == 0) {
        d.next_batch();
        std::fill(batch_row.begin(), batch_row.end(), -1);
      } else if (op == 1) {
        mem[rng() % mem.size()] ^= (uint8_t)(1 + rng() % 255);
      } else {
        const size_t i = rng() % 37;
        const std::span<const uint8_t> r = row(mem, i, bytes);
        Found f;
        const uint64_t steps = d.clock_steps();
        if (!d.find(r, 0, f)) {
          EXPECT_TRUE(std::all_of(batch_row.begin(), batch_row.end(), [](int x) { return x >= 0; }))
              << "a row refused while a slot was free of this batch";
          EXPECT_EQ(d.clock_steps(), steps) << "a refusal scanned the slots";
          continue;
        }
        EXPECT_LE(d.clock_steps() - steps, 2 * slots);
        ASSERT_LT(f.slot, slots);
        if (f.hit) {
          ++hits;
          EXPECT_TRUE(std::equal(r.begin(), r.end(), filled[f.slot].begin(), filled[f.slot].end())) << "stale bytes";
        } else {
          filled[f.slot].assign(r.begin(), r.end());
        }
        EXPECT_TRUE(batch_row[f.slot] < 0 || batch_row[f.slot] == (int)i) << "two rows of a batch in one slot";
        if (!f.hit && batch_row[f.slot] == (int)i) ADD_FAILURE() << "a slot the batch reads was refilled";
        batch_row[f.slot] = (int)i;
      }
    }
    EXPECT_GT(hits, 0u);
  }
}

}  // namespace
}  // namespace sluice
