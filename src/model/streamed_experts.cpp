// StreamedExperts: the forward pass's ExpertSource backed by storage::ExpertStore.
#include "model/streamed_experts.h"

#include <algorithm>
#include <string>

#include "util/error.h"

namespace sluice {

namespace {
// Half a layer's share per window (the other half is the read-ahead), at least one expert.
size_t window_for(size_t union_size, uint32_t capacity) {
  return union_size <= capacity ? union_size : std::max<size_t>(1, capacity / 2);
}
}  // namespace

void StreamedExperts::lease_window(size_t first) const {
  lease_.release();  // the previous window's pointers die here
  begin_ = end_ = first;
  const size_t last = std::min(order_.size(), first + window_);
  lease_ = store_.acquire(layer_, std::span<const uint32_t>(order_.data() + first, last - first));
  end_ = last;
  if (last < order_.size()) {
    const size_t ahead = std::min(order_.size(), last + window_);
    store_.hint(layer_, std::span<const uint32_t>(order_.data() + last, ahead - last));
  }
}

void StreamedExperts::prepare(uint32_t layer, std::span<const uint32_t> experts) const {
  lease_.release();  // the previous chunk/layer's pointers die here, as the interface promises
  layer_ = layer;
  order_.assign(experts.begin(), experts.end());
  begin_ = end_ = 0;
  window_ = window_for(order_.size(), store_.max_union_experts(layer));
  if (!order_.empty()) lease_window(0);
}

ExpertWeights StreamedExperts::get(uint32_t layer, uint32_t expert) const {
  if (layer == layer_ && !std::binary_search(order_.begin() + (std::ptrdiff_t)begin_, order_.begin() + (std::ptrdiff_t)end_, expert)) {
    const auto it = std::lower_bound(order_.begin() + (std::ptrdiff_t)end_, order_.end(), expert);
    if (it != order_.end() && *it == expert) {
      const size_t pos = (size_t)(it - order_.begin());
      lease_window(end_ + (pos - end_) / window_ * window_);
    } else if (std::binary_search(order_.begin(), order_.begin() + (std::ptrdiff_t)begin_, expert)) {
      throw Error("expert " + std::to_string(expert) + " of layer " + std::to_string(layer) +
                  " was asked for after a later window of the layer's experts was leased (get() must go in ascending order)");
    }
  }
  const storage::ExpertBytes b = lease_.get(layer, expert);
  return ExpertWeights{b.gate, b.up, b.down};
}

void StreamedExperts::hint(uint32_t layer, std::span<const uint32_t> experts) const {
  const uint32_t cap = store_.max_union_experts(layer);
  store_.hint(layer, experts.first(std::min(experts.size(), window_for(experts.size(), cap))));
}

void StreamedExperts::at_hand(uint32_t layer, std::span<const uint32_t> experts, const UseExpert& use) const {
  std::vector<uint32_t> want(experts.begin(), experts.end());
  std::sort(want.begin(), want.end());
  want.erase(std::unique(want.begin(), want.end()), want.end());
  // Those resident now, pinned in one step: one evicted meanwhile is left out, never read here.
  const storage::Lease l = store_.acquire_resident(layer, want);
  for (const uint32_t e : l.experts()) {
    const storage::ExpertBytes b = l.get(layer, e);
    use(e, ExpertWeights{b.gate, b.up, b.down});
  }
}

void check_expert_slices(const storage::ExpertGeometry& g, std::span<const LayerWeights> layers, const char* who) {
  for (uint32_t L = 0; L < g.layers.size() && L < layers.size(); ++L) {
    const ExpertLayout& lay = layers[L].experts;
    const uint64_t want[storage::kParts] = {lay.gate_bytes, lay.up_bytes, lay.down_bytes};
    for (uint32_t p = 0; p < storage::kParts; ++p)
      if (g.layers[L][p].slice != want[p])
        throw Error(g.path + ": " + g.layers[L][p].name + " holds " + std::to_string(g.layers[L][p].slice) +
                    "-byte expert slices but " + who + " expects " + std::to_string(want[p]));
  }
}

std::unique_ptr<storage::ExpertStore> open_expert_store(const Model& m, storage::StoreOptions o) {
  const ModelConfig& c = m.config;
  storage::ExpertGeometry g = storage::expert_geometry(m.file, c.num_hidden_layers, c.n_routed_experts);
  check_expert_slices(g, m.layers, "the model");
  return std::make_unique<storage::ExpertStore>(m.file, std::move(g), std::move(o));
}

uint64_t expert_slot_bytes(const Model& m) {
  storage::StoreOptions probe;
  probe.max_slots = 1;
  const ModelConfig& c = m.config;
  return storage::bytes_needed(storage::expert_geometry(m.file, c.num_hidden_layers, c.n_routed_experts), probe).slot_bytes;
}

}  // namespace sluice
