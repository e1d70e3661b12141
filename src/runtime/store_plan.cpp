#include "runtime/store_plan.h"

#include <algorithm>
#include <limits>

#include "format/gguf.h"
#include "model/deepseek41/engine_footprint.h"
#include "storage/expert_geometry.h"
#include "util/error.h"

namespace sluice {

namespace {

Plan plan_with_store(const gguf::File& f, ModelFootprint fp, const StorePlanOptions& o) {
  PlanOptions po = o.plan;
  if (po.overhead_bytes == 0) po.overhead_bytes = measured_process_overhead();
  po.cache_per_layer = storage::eviction_per_layer(o.store.policy);
  po.cache_policy = std::string(storage::eviction_name(o.store.policy));
  po.io_depth = o.store.queue_depth;
  if (!o.stream_experts) {
    po.store_bytes = [](uint64_t) { return uint64_t{0}; };
    return make_plan(fp, po, read_host_facts());
  }
  const storage::ExpertGeometry g =
      storage::expert_geometry(f, fp.config.num_hidden_layers, fp.config.n_routed_experts);
  // The store's figure for a cache of `slots` experts (max_slots 0 means "no cap", so an empty
  // cache is asked for with a zero byte budget instead).
  po.store_bytes = [g, base = o.store](uint64_t slots) {
    storage::StoreOptions so = base;
    so.max_slots = (uint32_t)std::min<uint64_t>(slots, std::numeric_limits<uint32_t>::max());
    so.cache_bytes = slots == 0 ? 0 : std::numeric_limits<uint64_t>::max();
    return storage::bytes_needed(g, so).total;
  };
  return make_plan(fp, po, read_host_facts());
}

}  // namespace

Plan plan_for_file(const gguf::File& f, const StorePlanOptions& o) {
  ModelFootprint fp = footprint_from_gguf(f);
  if (o.stream_experts) return plan_with_store(f, std::move(fp), o);
  // Every expert is read at load: it is resident memory, and there is no store to size.
  fp.resident_bytes += fp.routed_expert_bytes;
  fp.resident_loaded_bytes += fp.routed_loaded_bytes;
  Plan p = plan_with_store(f, fp, o);
  p.warnings.push_back("routed experts are loaded whole (no expert store): " + format_bytes(fp.routed_expert_bytes) +
                       " counted in resident weights");
  return p;
}

Plan plan_expert_server(const gguf::File& f, const StorePlanOptions& o, const std::vector<uint32_t>& owned) {
  ModelFootprint fp = footprint_from_gguf(f);
  if (owned.size() != fp.config.num_hidden_layers)
    throw Error("expert server plan: " + std::to_string(owned.size()) + " layers of owned experts for a model of " +
                std::to_string(fp.config.num_hidden_layers));
  StorePlanOptions so = o;
  so.plan.expert_server = true;
  so.plan.owned_experts = 0;
  // As load_model(experts_only) allocates them: per layer and tensor, the owned slices packed.
  fp.resident_bytes = fp.resident_loaded_bytes = fp.resident_tensors = 0;
  for (uint32_t n : owned) {
    so.plan.owned_experts += n;
    so.plan.owned_per_layer_max = std::max(so.plan.owned_per_layer_max, n);
    if (!o.stream_experts && n)
      for (uint64_t slice : {fp.expert_gate_bytes, fp.expert_up_bytes, fp.expert_down_bytes}) {
        fp.resident_bytes += n * slice;
        fp.resident_loaded_bytes += aligned_tensor_bytes(n * slice);
      }
  }
  // No sequence: the context only bounds the automatic chunk (the rows of one exchange).
  so.plan.ctx = (uint32_t)std::min<uint64_t>(std::max(so.plan.chunk, so.plan.max_chunk), fp.config.max_position_embeddings);
  return plan_with_store(f, std::move(fp), so);
}

uint64_t measured_process_overhead() {
  // Whole MiB: page-level noise from run to run must not move a plan across a slot boundary.
  constexpr uint64_t MiB = 1ull << 20;
  return (read_self_status().rss + MiB - 1) / MiB * MiB;
}

storage::StoreOptions store_options_for(const Plan& p, storage::StoreOptions base) {
  base.max_slots = (uint32_t)std::min<uint64_t>(p.cache_slots, std::numeric_limits<uint32_t>::max());
  base.cache_bytes = std::numeric_limits<uint64_t>::max();
  const uint64_t share = p.union_capacity * p.slot_bytes;
  base.prefetch_budget_bytes = std::min(share, p.cache_slots * p.slot_bytes / 4);
  return base;
}

}  // namespace sluice
