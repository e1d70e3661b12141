// The DSpark drafter's weights (spec 6.2), loaded from a support GGUF beside the target model
// whose widths, embedding and output head it shares. Routed experts are resident: the drafter's
// whole file is 4.2 GiB at the published recipe, planned as one resident part (docs/dspark.md).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/deepseek41/dspark_schema.h"
#include "model/model.h"

namespace sluice {

struct DsparkModel {
  gguf::File file;
  DsparkConfig config;
  std::vector<LayerWeights> stages;  // attention, hyper-connections, router, shared and routed experts
  Weight main_proj;                  // stage 0: captured target rows -> hidden
  std::vector<float> main_norm, norm;  // stage 0's main_norm; the last stage's final norm
  Weight markov_w1, markov_w2;       // [vocab][rank] each
  Weight confidence;                 // [1][hidden + rank]
  ResidentExperts experts;           // layer index = stage
  std::vector<std::unique_ptr<uint8_t, Model::FreeDeleter>> buffers;
  uint64_t loaded_bytes = 0;

  explicit DsparkModel(gguf::File f) : file(std::move(f)) {}
};

// Loads path as the drafter of target. Throws Error naming the file and the first problems
// (validate_dspark against target's config) before reading any payload.
std::unique_ptr<DsparkModel> load_dspark(const std::string& path, const Model& target, const LoadOptions& o = {});

}  // namespace sluice
