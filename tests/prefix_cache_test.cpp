// The shared prefix cache's radix tree (runtime/prefix_cache.h) against a brute-force model:
// random inserts and lookups of prefixes of a few shared "system prompts" with random tails,
// under a budget that forces evictions. Every lookup must return the deepest held prefix a
// prompt can start from (with its logits row when it is the whole prompt), evictions must take
// the least recently used entry, and the bytes held never exceed the budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "kernels/numerics.h"
#include "runtime/prefix_cache.h"
#include "util/error.h"

namespace sluice {
namespace {

PrefixEntry entry(size_t pos, size_t payload, bool logits) {
  PrefixEntry e;
  e.snap.ck.pos = (uint32_t)pos;
  e.snap.ck.window_kv.assign(payload, 1);
  if (logits) e.logits.assign(3, 0.5f);
  return e;
}

struct Reference {  // what the cache should hold
  struct Held {
    bool logits;
    uint64_t charge, used;
  };
  std::map<std::vector<TokenId>, Held> held;
  uint64_t tick = 0, bytes = 0;

  const std::vector<TokenId>* best(const std::vector<TokenId>& prompt) {
    const std::vector<TokenId>* b = nullptr;
    for (auto& [k, h] : held) {
      if (k.size() > prompt.size() || !std::equal(k.begin(), k.end(), prompt.begin())) continue;
      if (k.size() == prompt.size() && !h.logits) continue;
      if (!b || k.size() > b->size()) b = &k;
    }
    return b;
  }
};

TEST(PrefixCache, RandomInsertsAndLookupsMatchABruteForceModel) {
  const uint64_t budget = 20 * prefix_entry_charge(0, entry(0, 0, false).blocks(), 0);
  PrefixCache cache(budget);
  Reference ref;
  uint64_t x = 99;
  auto rnd = [&](uint64_t n) { return (x = splitmix64(x)) % n; };
  std::vector<std::vector<TokenId>> bases(3);
  for (auto& b : bases)
    for (int i = 0; i < 40; ++i) b.push_back((TokenId)rnd(5));  // a small alphabet: many shared runs
  auto random_prompt = [&] {
    const std::vector<TokenId>& b = bases[rnd(3)];
    std::vector<TokenId> p(b.begin(), b.begin() + (std::ptrdiff_t)(1 + rnd(b.size())));
    for (uint64_t i = rnd(6); i > 0; --i) p.push_back((TokenId)rnd(5));
    return p;
  };
  uint64_t evictions = 0, hits = 0;
  for (int op = 0; op < 4000; ++op) {
    const std::vector<TokenId> p = random_prompt();
    if (rnd(3) == 0) {
      const PrefixEntry* got = cache.lookup(p);
      const std::vector<TokenId>* want = ref.best(p);
      ASSERT_EQ(got != nullptr, want != nullptr) << "op " << op;
      if (!want) continue;
      ++hits;
      ASSERT_EQ(got->pos(), want->size()) << "op " << op;
      ASSERT_EQ(!got->logits.empty(), ref.held[*want].logits);
      ref.held[*want].used = ++ref.tick;
      continue;
    }
    const bool logits = rnd(2) == 0;
    PrefixEntry e = entry(p.size(), 50 + rnd(400), logits);
    const uint64_t charge = prefix_entry_charge(e.bytes(), e.blocks(), p.size());
    ASSERT_TRUE(cache.make_room(charge));
    // The model evicts least recently used first until it fits.
    while (ref.bytes + charge > budget) {
      auto victim = std::min_element(ref.held.begin(), ref.held.end(),
                                     [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
      ref.bytes -= victim->second.charge;
      ref.held.erase(victim);
      ++evictions;
    }
    if (auto it = ref.held.find(p); it != ref.held.end()) ref.bytes -= it->second.charge;
    cache.insert(p, std::move(e));
    ref.held[p] = {logits, charge, ++ref.tick};
    ref.bytes += charge;
    const PrefixCacheStats st = cache.stats();
    ASSERT_LE(st.bytes, budget);
    ASSERT_EQ(st.bytes, ref.bytes) << "op " << op;
    ASSERT_EQ(st.entries, ref.held.size()) << "op " << op;
  }
  for (const auto& [k, h] : ref.held) EXPECT_TRUE(cache.contains(k, h.logits));
  EXPECT_EQ(cache.stats().evicted, evictions);
  EXPECT_GT(evictions, 100u);  // the budget was tight enough to exercise eviction and pruning
  EXPECT_GT(hits, 300u);
}

TEST(PrefixCache, SplitsAndMergesEdges) {
  PrefixCache cache(1 << 20);
  const std::vector<TokenId> sys = {1, 2, 3, 4, 5, 6};
  std::vector<TokenId> a = sys, b = sys;
  a.insert(a.end(), {7, 8});
  b.insert(b.end(), {9});
  cache.insert(a, entry(a.size(), 10, true));
  cache.insert(b, entry(b.size(), 10, false));  // splits a's edge after 6 tokens
  cache.insert(std::vector<TokenId>(sys.begin(), sys.begin() + 3), entry(3, 10, false));  // splits again
  EXPECT_EQ(cache.stats().entries, 3u);
  EXPECT_EQ(cache.lookup(a)->pos(), 8u);       // has logits: the whole prompt
  EXPECT_EQ(cache.lookup(b)->pos(), 3u);       // b's own has no logits row
  std::vector<TokenId> c = b;
  c.push_back(1);
  EXPECT_EQ(cache.lookup(c)->pos(), 7u);
  EXPECT_EQ(cache.lookup(std::vector<TokenId>{1, 2, 3, 9})->pos(), 3u);
  EXPECT_EQ(cache.lookup(std::vector<TokenId>{1, 2}), nullptr);
  EXPECT_EQ(cache.lookup(std::vector<TokenId>{2, 3, 4, 5}), nullptr);
  EXPECT_FALSE(cache.contains(sys, false));  // an inner node without an entry
  EXPECT_TRUE(cache.contains(a, true));
  EXPECT_FALSE(cache.contains(b, true));
  EXPECT_THROW(cache.insert(a, entry(5, 10, true)), Error);  // position != prefix length
  cache.clear();
  EXPECT_EQ(cache.stats().entries, 0u);
  EXPECT_EQ(cache.stats().bytes, 0u);
  EXPECT_EQ(cache.lookup(a), nullptr);
}

TEST(PrefixCache, RefusesAnEntryLargerThanTheBudgetWithoutEvicting) {
  const uint64_t budget = prefix_entry_charge(1000, entry(0, 0, false).blocks(), 3);
  PrefixCache cache(budget);
  const std::vector<TokenId> a = {1, 2, 3};
  cache.insert(a, entry(3, 100, true));
  EXPECT_FALSE(cache.make_room(budget + 1));
  EXPECT_EQ(cache.stats().skipped, 1u);
  EXPECT_EQ(cache.stats().entries, 1u);
  EXPECT_THROW(cache.insert(std::vector<TokenId>{4, 5}, entry(2, 200000, false)), Error);
  EXPECT_EQ(cache.stats().entries, 1u);
  EXPECT_TRUE(cache.make_room(budget));  // evicts a to fit
  EXPECT_EQ(cache.stats().entries, 0u);
  EXPECT_EQ(cache.stats().evicted, 1u);
}

// Issue 53 finding 10: an entry serves only its own scope (an API key's); the budget and the
// least-recently-used order are shared, and a scope whose last entry goes leaves nothing behind.
TEST(PrefixCache, AScopeSeesOnlyItsOwnEntries) {
  const PrefixEntry e0 = entry(4, 100, true);
  const uint64_t one = prefix_entry_charge(e0.bytes(), e0.blocks(), 4);
  PrefixCache cache(2 * one);
  const std::vector<TokenId> p = {1, 2, 3, 4}, longer = {1, 2, 3, 4, 5};
  cache.insert(p, entry(4, 100, true), /*scope=*/7);
  EXPECT_NE(cache.lookup(longer, 7), nullptr);
  EXPECT_EQ(cache.lookup(longer, 8), nullptr) << "another scope found the entry";
  EXPECT_EQ(cache.lookup(longer), nullptr) << "the shared scope found a scoped entry";
  EXPECT_EQ(cache.peek(p, 8), nullptr);
  EXPECT_TRUE(cache.contains(p, true, 7));
  EXPECT_FALSE(cache.contains(p, false, 8));
  // The same prefix in another scope is another entry.
  cache.insert(p, entry(4, 100, true), 8);
  EXPECT_EQ(cache.stats().entries, 2u);
  ASSERT_NE(cache.lookup(longer, 8), nullptr);
  // A third entry evicts the least recently used, whichever scope holds it (7's, looked up first).
  ASSERT_TRUE(cache.make_room(one));
  cache.insert(p, entry(4, 100, true), 0);
  EXPECT_EQ(cache.stats().entries, 2u);
  EXPECT_EQ(cache.lookup(longer, 7), nullptr);
  EXPECT_NE(cache.lookup(longer, 8), nullptr);
  EXPECT_NE(cache.lookup(longer, 0), nullptr);
  ASSERT_TRUE(cache.make_room(2 * one));
  EXPECT_EQ(cache.stats().entries, 0u);
  EXPECT_EQ(cache.stats().bytes, 0u);
}

}  // namespace
}  // namespace sluice
