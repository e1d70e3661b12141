// held_chunk (backend/held_chunk.h): the part of a source's memory a device maps to run an expert
// slice in place. Spans of odd units and odd binding limits; the chunk must hold the slice whole,
// be made of whole units from its span's base, and stay within the limit.
#include "backend/held_chunk.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace sluice {
namespace {

using Held = ExpertSource::HeldMemory;

TEST(HeldChunk, EverySliceOfAUnitLiesInOneChunkOfWholeUnitsWithinTheLimit) {
  std::mt19937_64 rng(5);
  std::vector<uint8_t> mem(1 << 16);
  for (int round = 0; round < 200; ++round) {
    const uint64_t unit = 1 + rng() % 997, units = 1 + rng() % 40, max = unit + rng() % (5 * unit);
    const uint64_t start = rng() % 256;
    if (start + unit * units > mem.size()) continue;
    const Held spans[2] = {{mem.data() + start, unit * units, unit}, {nullptr, 0, 0}};
    const uint64_t u = rng() % units, in = rng() % unit, len = 1 + rng() % (unit - in);
    const uint8_t* p = spans[0].base + u * unit + in;
    const HeldChunk c = held_chunk(spans, p, len, max);
    ASSERT_NE(c.lo, nullptr) << "unit " << unit << " max " << max;
    EXPECT_LE(c.lo, p);
    EXPECT_LE(p + len, c.hi);
    EXPECT_LE((uint64_t)(c.hi - c.lo), max);
    EXPECT_EQ((uint64_t)(c.lo - spans[0].base) % unit, 0u);
    const uint64_t chunk = max / unit * unit;
    EXPECT_EQ((uint64_t)(c.lo - spans[0].base) % chunk, 0u) << "chunks start at fixed places, so each is mapped once";
    EXPECT_TRUE(c.hi == spans[0].base + spans[0].bytes || (uint64_t)(c.hi - c.lo) == chunk);
    // Any other slice of the same unit gets the same chunk.
    EXPECT_EQ(held_chunk(spans, spans[0].base + u * unit, unit, max).lo, c.lo);
  }
}

TEST(HeldChunk, NoChunkForWhatNoSpanHoldsWhole) {
  std::vector<uint8_t> mem(1000), other(100);
  const std::vector<Held> spans = {{mem.data() + 10, 7 * 90, 90}, {other.data(), 100, 100}};
  EXPECT_NE(held_chunk(spans, mem.data() + 10, 90, 200).lo, nullptr);
  EXPECT_EQ(held_chunk(spans, mem.data() + 9, 10, 200).lo, nullptr) << "before the span";
  EXPECT_EQ(held_chunk(spans, mem.data() + 10 + 7 * 90, 1, 1000).lo, nullptr) << "past its end";
  EXPECT_EQ(held_chunk(spans, mem.data() + 10 + 6 * 90, 91, 1000).lo, nullptr) << "running past its end";
  EXPECT_EQ(held_chunk(spans, mem.data() + 10 + 170, 20, 200).lo, nullptr) << "straddles two chunks of 2 units";
  EXPECT_EQ(held_chunk(spans, mem.data() + 10, 90, 89).lo, nullptr) << "a unit larger than a binding";
  const HeldChunk c = held_chunk(spans, other.data() + 3, 50, 4096);
  EXPECT_EQ(c.lo, other.data());
  EXPECT_EQ(c.hi, other.data() + 100);
  EXPECT_EQ(held_chunk({}, mem.data(), 1, 100).lo, nullptr);
}

}  // namespace
}  // namespace sluice
