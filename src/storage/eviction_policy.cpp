// The eviction policies (see eviction_policy.h). The LRU ones are intrusive doubly linked lists
// over slot ids: the per-layer policy keeps one list and one slot quota per layer, the global one a
// single list. The frequency-aware one (LfuPerLayer) keeps a use count and a last-use tick per slot.
#include "storage/eviction_policy.h"

#include <algorithm>

#include "util/error.h"

namespace sluice::storage {

namespace {
constexpr EvictionKind kKinds[] = {EvictionKind::LruPerLayer, EvictionKind::LruGlobal, EvictionKind::LfuPerLayer};
}  // namespace

std::string_view eviction_name(EvictionKind k) {
  switch (k) {
    case EvictionKind::LruPerLayer: return "lru-per-layer";
    case EvictionKind::LruGlobal: return "lru-global";
    case EvictionKind::LfuPerLayer: return "lfu-per-layer";
  }
  return "unknown";
}

std::vector<std::string_view> eviction_names() {
  std::vector<std::string_view> v;
  for (EvictionKind k : kKinds) v.push_back(eviction_name(k));
  return v;
}

std::optional<EvictionKind> eviction_kind(std::string_view name) {
  for (EvictionKind k : kKinds)
    if (eviction_name(k) == name) return k;
  return std::nullopt;
}

bool eviction_per_layer(EvictionKind k) { return k != EvictionKind::LruGlobal; }

namespace {

constexpr uint32_t kNil = ~0u;

// The slots each layer owns under a per-layer policy: an equal share, the remainder spread over the
// first layers so every slot is usable.
uint32_t layer_quota(uint32_t n_slots, uint32_t n_layer, uint32_t l) {
  return n_slots / n_layer + (l < n_slots % n_layer ? 1 : 0);
}

class Lru final : public EvictionPolicy {
 public:
  // per_layer: list index = layer with quota[layer]; otherwise one list holding up to n_slots.
  Lru(bool per_layer, uint32_t n_slots, uint32_t n_layer, uint32_t n_expert)
      : per_layer_(per_layer), prev_(n_slots, kNil), next_(n_slots, kNil), list_of_(n_slots, kNil) {
    const uint32_t lists = per_layer ? n_layer : 1;
    head_.assign(lists, kNil);
    tail_.assign(lists, kNil);
    count_.assign(lists, 0);
    quota_.assign(lists, 0);
    for (uint32_t l = 0; l < lists; ++l) {
      quota_[l] = per_layer ? layer_quota(n_slots, n_layer, l) : n_slots;
    }
    n_expert_ = n_expert;
  }
  std::string_view name() const override { return per_layer_ ? "lru-per-layer" : "lru-global"; }
  uint32_t capacity(uint32_t layer) const override {
    return std::min(n_expert_, quota_[list(layer)]);
  }
  void inserted(uint32_t slot, uint32_t layer) override {
    const uint32_t l = list(layer);
    list_of_[slot] = l;
    push_front(l, slot);
    ++count_[l];
  }
  void touched(uint32_t slot) override {
    const uint32_t l = list_of_[slot];
    unlink(l, slot);
    push_front(l, slot);
  }
  void removed(uint32_t slot) override {
    const uint32_t l = list_of_[slot];
    unlink(l, slot);
    list_of_[slot] = kNil;
    --count_[l];
  }
  int64_t choose(uint32_t layer, bool free_slot_available,
                 const std::function<bool(uint32_t)>& evictable) const override {
    const uint32_t l = list(layer);
    if (free_slot_available && count_[l] < quota_[l]) return kFree;
    for (uint32_t s = tail_[l]; s != kNil; s = prev_[s])
      if (evictable(s)) return s;
    return kNone;
  }

 private:
  uint32_t list(uint32_t layer) const { return per_layer_ ? layer : 0; }
  void push_front(uint32_t l, uint32_t s) {
    prev_[s] = kNil;
    next_[s] = head_[l];
    if (head_[l] != kNil) prev_[head_[l]] = s;
    head_[l] = s;
    if (tail_[l] == kNil) tail_[l] = s;
  }
  void unlink(uint32_t l, uint32_t s) {
    if (prev_[s] != kNil) next_[prev_[s]] = next_[s]; else head_[l] = next_[s];
    if (next_[s] != kNil) prev_[next_[s]] = prev_[s]; else tail_[l] = prev_[s];
    prev_[s] = next_[s] = kNil;
  }

  bool per_layer_;
  uint32_t n_expert_ = 0;
  std::vector<uint32_t> prev_, next_, list_of_;
  std::vector<uint32_t> head_, tail_, count_, quota_;
};

// Per-layer LFU with aging. Why frequency: a trained router's popularity is skewed and lasting (a
// few experts of a layer take most selections), and LRU lets one burst of cold experts flush them,
// since every miss becomes the most recent entry; LFU keeps the experts used most and lets the
// cold ones churn through the least used slots. Why aging: plain LFU never forgets, so experts
// hot in an earlier part of a text (another file, another language) would squat forever; halving
// every count of a layer each kAgingFactor x quota accesses makes a count a decaying window of
// roughly the last 2 x kAgingFactor turnovers of the share. Why in-cache counts only (no history
// of evicted experts, as TinyLFU keeps): the policy sees slots, not experts, and a returning
// expert that is really hot earns its place back within a few uses. Ties (new entries, halved
// counts) go to the least recently used, so with equal counts it is LRU.
class Lfu final : public EvictionPolicy {
 public:
  static constexpr uint32_t kAgingFactor = 8;

  Lfu(uint32_t n_slots, uint32_t n_layer, uint32_t n_expert)
      : n_expert_(n_expert), count_(n_slots, 0), tick_(n_slots, 0), layer_of_(n_slots, kNil), pos_(n_slots, kNil),
        members_(n_layer), quota_(n_layer), accesses_(n_layer, 0) {
    for (uint32_t l = 0; l < n_layer; ++l) quota_[l] = layer_quota(n_slots, n_layer, l);
  }
  std::string_view name() const override { return "lfu-per-layer"; }
  uint32_t capacity(uint32_t layer) const override { return std::min(n_expert_, quota_[layer]); }
  void inserted(uint32_t slot, uint32_t layer) override {
    layer_of_[slot] = layer;
    pos_[slot] = (uint32_t)members_[layer].size();
    members_[layer].push_back(slot);
    count_[slot] = 0;
    use(slot);
  }
  void touched(uint32_t slot) override { use(slot); }
  void removed(uint32_t slot) override {
    std::vector<uint32_t>& m = members_[layer_of_[slot]];
    const uint32_t last = m.back();
    m[pos_[slot]] = last;  // swap-remove: members are unordered, choose() orders them by key
    pos_[last] = pos_[slot];
    m.pop_back();
    layer_of_[slot] = pos_[slot] = kNil;
  }
  int64_t choose(uint32_t layer, bool free_slot_available,
                 const std::function<bool(uint32_t)>& evictable) const override {
    const std::vector<uint32_t>& m = members_[layer];
    if (free_slot_available && m.size() < quota_[layer]) return kFree;
    int64_t best = kNone;
    for (uint32_t s : m) {
      if (!evictable(s)) continue;
      // Ticks are unique, so (count, tick) orders the entries totally: the choice is deterministic.
      if (best == kNone || count_[s] < count_[best] || (count_[s] == count_[best] && tick_[s] < tick_[best])) best = s;
    }
    return best;
  }

 private:
  void use(uint32_t slot) {
    const uint32_t l = layer_of_[slot];
    ++count_[slot];
    tick_[slot] = ++clock_;
    if (++accesses_[l] >= (uint64_t)kAgingFactor * std::max(1u, quota_[l])) {
      accesses_[l] = 0;
      for (uint32_t s : members_[l]) count_[s] >>= 1;
    }
  }

  uint32_t n_expert_;
  uint64_t clock_ = 0;
  std::vector<uint32_t> count_;
  std::vector<uint64_t> tick_;
  std::vector<uint32_t> layer_of_, pos_;
  std::vector<std::vector<uint32_t>> members_;  // [layer] its resident slots, unordered
  std::vector<uint32_t> quota_;
  std::vector<uint64_t> accesses_;  // [layer] since the last halving
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_policy(EvictionKind k, uint32_t n_slots, uint32_t n_layer, uint32_t n_expert) {
  if (n_layer == 0) throw Error("eviction policy: no layers");
  switch (k) {
    case EvictionKind::LruPerLayer: return std::make_unique<Lru>(true, n_slots, n_layer, n_expert);
    case EvictionKind::LruGlobal: return std::make_unique<Lru>(false, n_slots, n_layer, n_expert);
    case EvictionKind::LfuPerLayer: return std::make_unique<Lfu>(n_slots, n_layer, n_expert);
  }
  throw Error("eviction policy: unknown kind");
}

}  // namespace sluice::storage
