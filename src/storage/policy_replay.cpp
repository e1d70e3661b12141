#include "storage/policy_replay.h"

#include <algorithm>
#include <memory>
#include <string>
#include <unordered_map>

#include "util/error.h"

namespace sluice::storage {

namespace {

// The slots and what they hold, as the store keeps them: (layer, expert) -> slot, free slots
// taken from the back of the list.
struct Cache {
  std::unique_ptr<EvictionPolicy> policy;
  std::unordered_map<uint64_t, uint32_t> index;
  std::vector<uint64_t> key_of;   // [slot] the key it holds
  std::vector<uint8_t> pinned;    // [slot] leased by the current acquire
  std::vector<uint32_t> free_slots;
};

uint64_t key(uint32_t layer, uint32_t expert) { return ((uint64_t)layer << 32) | expert; }

// One layer's acquire of `experts` for one token; the lease ends at return.
void acquire(Cache& c, uint32_t layer, std::vector<uint32_t> experts, ReplayResult& r,
             const std::function<uint64_t(uint32_t, uint32_t)>& bytes) {
  std::sort(experts.begin(), experts.end());  // the engine leases a layer's union in ascending id
  std::vector<uint32_t> held, missing;
  for (uint32_t e : experts) {
    auto it = c.index.find(key(layer, e));
    if (it == c.index.end()) {
      missing.push_back(e);
      continue;
    }
    c.pinned[it->second] = 1;
    c.policy->touched(it->second);
    held.push_back(it->second);
    ++r.hits;
  }
  r.requests += experts.size();
  for (uint32_t e : missing) {
    const int64_t ch = c.policy->choose(layer, !c.free_slots.empty(), [&c](uint32_t s) { return c.pinned[s] == 0; });
    uint32_t s;
    if (ch == EvictionPolicy::kFree) {
      s = c.free_slots.back();
      c.free_slots.pop_back();
    } else if (ch >= 0) {
      s = (uint32_t)ch;
      c.index.erase(c.key_of[s]);
      c.policy->removed(s);
    } else {
      throw Error("policy replay: no slot for layer " + std::to_string(layer) + " (capacity checked before)");
    }
    c.key_of[s] = key(layer, e);
    c.index[c.key_of[s]] = s;
    c.policy->inserted(s, layer);
    c.pinned[s] = 1;
    held.push_back(s);
    if (bytes) r.miss_bytes += bytes(layer, e);
  }
  for (uint32_t s : held) c.pinned[s] = 0;
}

}  // namespace

ReplayResult replay_policy(EvictionKind kind, uint32_t slots, uint32_t n_layer, uint32_t n_expert,
                           const RoutingTrace& trace, const std::function<uint64_t(uint32_t, uint32_t)>& bytes) {
  ReplayResult r;
  Cache c;
  c.policy = make_policy(kind, slots, n_layer, n_expert);
  size_t widest = 0;
  for (const auto& tok : trace)
    for (const auto& sel : tok) widest = std::max(widest, sel.size());
  for (uint32_t l = 0; l < n_layer; ++l)
    if (c.policy->capacity(l) < widest) {
      r.feasible = false;
      return r;
    }
  c.key_of.assign(slots, 0);
  c.pinned.assign(slots, 0);
  for (uint32_t s = slots; s-- > 0;) c.free_slots.push_back(s);  // slot 0 taken first
  for (const auto& tok : trace) {
    if (tok.size() > n_layer) throw Error("policy replay: a token has more layers than the model");
    for (uint32_t l = 0; l < tok.size(); ++l) acquire(c, l, tok[l], r, bytes);
  }
  return r;
}

}  // namespace sluice::storage
