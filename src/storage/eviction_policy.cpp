// LRU policies (see eviction_policy.h). Both are intrusive doubly linked lists over slot ids;
// the per-layer policy keeps one list and one slot quota per layer, the global one a single list.
#include "storage/eviction_policy.h"

#include <algorithm>

#include "util/error.h"

namespace sluice::storage {

std::string_view eviction_name(EvictionKind k) {
  return k == EvictionKind::LruPerLayer ? "lru-per-layer" : "lru-global";
}

namespace {

constexpr uint32_t kNil = ~0u;

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
      // Spread the remainder over the first layers so every slot is usable.
      const uint32_t q = per_layer ? n_slots / n_layer + (l < n_slots % n_layer ? 1 : 0) : n_slots;
      quota_[l] = q;
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

}  // namespace

std::unique_ptr<EvictionPolicy> make_policy(EvictionKind k, uint32_t n_slots, uint32_t n_layer, uint32_t n_expert) {
  if (n_layer == 0) throw Error("eviction policy: no layers");
  switch (k) {
    case EvictionKind::LruPerLayer: return std::make_unique<Lru>(true, n_slots, n_layer, n_expert);
    case EvictionKind::LruGlobal: return std::make_unique<Lru>(false, n_slots, n_layer, n_expert);
  }
  throw Error("eviction policy: unknown kind");
}

}  // namespace sluice::storage
