// StreamedExperts: the forward pass's ExpertSource backed by storage::ExpertStore.
#include "model/streamed_experts.h"

#include "util/error.h"

namespace sluice {

void StreamedExperts::prepare(uint32_t layer, std::span<const uint32_t> experts) const {
  lease_.release();  // the previous chunk/layer's pointers die here, as the interface promises
  lease_ = store_.acquire(layer, experts);
}

ExpertWeights StreamedExperts::get(uint32_t layer, uint32_t expert) const {
  const storage::ExpertBytes b = lease_.get(layer, expert);
  return ExpertWeights{b.gate, b.up, b.down};
}

std::unique_ptr<storage::ExpertStore> open_expert_store(const Model& m, storage::StoreOptions o) {
  const ModelConfig& c = m.config;
  storage::ExpertGeometry g = storage::expert_geometry(m.file, c.num_hidden_layers, c.n_routed_experts);
  for (uint32_t L = 0; L < c.num_hidden_layers && L < m.layers.size(); ++L) {
    const ExpertLayout& lay = m.layers[L].experts;
    const uint64_t want[storage::kParts] = {lay.gate_bytes, lay.up_bytes, lay.down_bytes};
    for (uint32_t p = 0; p < storage::kParts; ++p)
      if (g.layers[L][p].slice != want[p])
        throw Error(m.file.path() + ": " + g.layers[L][p].name + " holds " + std::to_string(g.layers[L][p].slice) +
                    "-byte expert slices but the model expects " + std::to_string(want[p]));
  }
  return std::make_unique<storage::ExpertStore>(m.file, std::move(g), std::move(o));
}

}  // namespace sluice
