// The eviction policies replayed over a recorded routing trace, with no store and no I/O: each
// token's selected experts of each layer are looked up the way ExpertStore::acquire does (the
// resident ones pinned and touched first, then each missing one given a slot by the policy's
// choose(), evicting what it names), so a hit rate here is the policy object the engine runs
// (make_policy), not a copy of it. A layer's union is acquired in ascending id and its lease ends
// before the next layer's acquire, as StreamedExperts::prepare does in decode. What it leaves out:
// prefetch hints (their reads, and the touches they give entries already held).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "storage/eviction_policy.h"

namespace sluice::storage {

// [token][layer] the experts the router selected for that token in that layer.
using RoutingTrace = std::vector<std::vector<std::vector<uint32_t>>>;

struct ReplayResult {
  bool feasible = true;       // false: a layer's share cannot hold one token's experts (the store refuses)
  uint64_t requests = 0;      // expert lookups (selections)
  uint64_t hits = 0;
  uint64_t miss_bytes = 0;    // sum of bytes(layer, expert) over the misses
  double hit_rate() const { return requests ? (double)hits / (double)requests : 0.0; }
};

// Replays `trace` through a fresh make_policy(kind, slots, n_layer, n_expert). bytes (may be
// empty) gives the bytes one miss reads.
ReplayResult replay_policy(EvictionKind kind, uint32_t slots, uint32_t n_layer, uint32_t n_expert,
                           const RoutingTrace& trace,
                           const std::function<uint64_t(uint32_t layer, uint32_t expert)>& bytes = {});

}  // namespace sluice::storage
