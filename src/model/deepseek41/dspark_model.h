// The DSpark drafter's weights (spec 6.2), loaded from a support GGUF beside the target model
// whose widths, embedding and output head it shares. Its routed experts (3.9 of the 4.2 GiB at
// the published recipe) are either loaded with the rest or, when the memory plan has no room for
// them (PlanOptions::dspark_experts), streamed from the support file through an expert store of
// their own, charged in the same budget (docs/dspark.md, "Memory").
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/deepseek41/dspark_schema.h"
#include "model/model.h"
#include "storage/expert_store.h"

namespace sluice {

struct DsparkModel {
  gguf::File file;
  DsparkConfig config;
  std::vector<LayerWeights> stages;  // attention, hyper-connections, router, shared and routed experts
  Weight main_proj;                  // stage 0: captured target rows -> hidden
  std::vector<float> main_norm, norm;  // stage 0's main_norm; the last stage's final norm
  Weight markov_w1, markov_w2;       // [vocab][rank] each
  Weight confidence;                 // [1][hidden + rank]
  ResidentExperts experts;           // layer index = stage; null pointers when streamed
  bool resident_experts = true;
  std::vector<std::unique_ptr<uint8_t, Model::FreeDeleter>> buffers;
  uint64_t loaded_bytes = 0;

  explicit DsparkModel(gguf::File f) : file(std::move(f)) {}
};

// Loads path as the drafter of target; routed experts only when o.resident_experts. Throws
// Error naming the file and the first problems (validate_dspark against target's config) before
// reading any payload.
std::unique_ptr<DsparkModel> load_dspark(const std::string& path, const Model& target, const LoadOptions& o = {});

// The drafter's expert store: mtp.S.ffn_{gate,up,down}_exps of every stage, one slot per expert
// a proposal can route to (dspark_stream_slots), shared per stage (lru-per-layer), without hints
// (a stage's routing depends on the stage before). `base` gives queue depth and direct I/O.
uint32_t dspark_stream_slots(const DsparkConfig& d);
storage::ExpertGeometry dspark_expert_geometry(const gguf::File& f, const DsparkConfig& d);
storage::StoreOptions dspark_store_options(const DsparkConfig& d, storage::StoreOptions base);
// Throws Error when the file's slices do not match the stages' expert layouts.
std::unique_ptr<storage::ExpertStore> open_dspark_expert_store(const DsparkModel& m, storage::StoreOptions base);

}  // namespace sluice
