#include "model/deepseek41/dspark_model.h"

#include <algorithm>
#include <limits>

#include "model/streamed_experts.h"
#include "model/tensor_loader.h"
#include "util/error.h"

namespace sluice {

std::unique_ptr<DsparkModel> load_dspark(const std::string& path, const Model& target, const LoadOptions& o) {
  auto dm = std::make_unique<DsparkModel>(gguf::File::open(path));
  DsparkModel& m = *dm;
  const DsparkReport rep = validate_dspark(m.file, &target.config);
  if (!rep.ok()) {
    std::string msg = path + " is not a DSpark support file for this model:";
    for (size_t i = 0; i < rep.errors.size() && i < 5; ++i) msg += "\n  " + rep.errors[i];
    if (rep.errors.size() > 5) msg += "\n  (" + std::to_string(rep.errors.size() - 5) + " more)";
    throw Error(msg);
  }
  m.config = rep.config;
  const DsparkConfig& d = m.config;
  m.resident_experts = o.resident_experts;
  TensorLoader ld(m.file, m.buffers, m.loaded_bytes, o);
  m.stages.resize(d.stages);
  m.experts.layers.resize(d.stages);
  m.experts.layouts.resize(d.stages);
  for (uint32_t s = 0; s < d.stages; ++s) {
    load_block(ld, "mtp." + std::to_string(s) + ".", m.stages[s], m.experts.layers[s], o.resident_experts,
               /*image_bias=*/false);
    m.experts.layouts[s] = m.stages[s].experts;
  }
  const std::string last = "mtp." + std::to_string(d.stages - 1) + ".";
  m.main_proj = ld.weight("mtp.0.main_proj.weight");
  m.main_norm = ld.floats("mtp.0.main_norm.weight");
  m.norm = ld.floats(last + "norm.weight");
  m.markov_w1 = ld.weight(last + "markov_head.markov_w1.weight", WeightUse::Embed);
  m.markov_w2 = ld.weight(last + "markov_head.markov_w2.weight");
  m.confidence = ld.weight(last + "confidence_head.proj.weight");
  return dm;
}

uint32_t dspark_stream_slots(const DsparkConfig& d) {
  return d.stages * std::min(d.block_size * d.expert_used, d.expert_count);
}

storage::ExpertGeometry dspark_expert_geometry(const gguf::File& f, const DsparkConfig& d) {
  return storage::expert_geometry(f, d.stages, d.expert_count, "mtp.");
}

storage::StoreOptions dspark_store_options(const DsparkConfig& d, storage::StoreOptions base) {
  base.max_slots = dspark_stream_slots(d);
  base.cache_bytes = std::numeric_limits<uint64_t>::max();
  base.policy = storage::EvictionKind::LruPerLayer;
  base.prefetch_budget_bytes = 0;
  return base;
}

std::unique_ptr<storage::ExpertStore> open_dspark_expert_store(const DsparkModel& m, storage::StoreOptions base) {
  storage::ExpertGeometry g = dspark_expert_geometry(m.file, m.config);
  check_expert_slices(g, m.stages, "the drafter");
  return std::make_unique<storage::ExpertStore>(m.file, std::move(g), dspark_store_options(m.config, base));
}

}  // namespace sluice
