// Which cached expert makes room for a new one. The store owns slot states (free, loading,
// leased); a policy only orders the entries it was told about and answers "take a free slot"
// or "evict this one". Every decision depends only on the sequence of calls, so eviction is
// deterministic for a given access sequence.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

namespace sluice::storage {

enum class EvictionKind {
  LruPerLayer,  // each layer owns an equal share of the slots, LRU within the layer
  LruGlobal,    // one LRU list over all layers
  // Each layer owns an equal share, least frequently used out; counts halve every few times the
  // share in accesses (aging), ties go to the least recently used (eviction_policy.cpp says why).
  LfuPerLayer,
};
std::string_view eviction_name(EvictionKind k);
// Every policy's name, in EvictionKind order: the one list the CLI checks --cache-policy against.
std::vector<std::string_view> eviction_names();
// The kind named `name` (as eviction_name spells it); nullopt for anything else.
std::optional<EvictionKind> eviction_kind(std::string_view name);
// Whether each layer owns a fixed share of the slots (so one layer's union must fit that share).
bool eviction_per_layer(EvictionKind k);

class EvictionPolicy {
 public:
  static constexpr int64_t kFree = -1;  // use a free slot
  static constexpr int64_t kNone = -2;  // nothing may be evicted now

  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;
  // Most entries of `layer` resident at once: a larger union can never be held.
  virtual uint32_t capacity(uint32_t layer) const = 0;
  virtual void inserted(uint32_t slot, uint32_t layer) = 0;  // new entry, most recently used
  virtual void touched(uint32_t slot) = 0;                   // used again
  virtual void removed(uint32_t slot) = 0;                   // evicted or failed
  // Room for a new entry of `layer`: kFree, a slot to evict (evictable(slot) is true for it),
  // or kNone.
  virtual int64_t choose(uint32_t layer, bool free_slot_available,
                         const std::function<bool(uint32_t)>& evictable) const = 0;
};

std::unique_ptr<EvictionPolicy> make_policy(EvictionKind k, uint32_t n_slots, uint32_t n_layer, uint32_t n_expert);

}  // namespace sluice::storage
