#include "runtime/dspark_plan.h"

#include "format/gguf.h"
#include "model/deepseek41/dspark_forward.h"
#include "model/deepseek41/dspark_model.h"
#include "model/deepseek41/engine_footprint.h"
#include "util/error.h"
#include "runtime/meminfo.h"

namespace sluice {

DsparkConfig plan_dspark(const std::string& path, const ModelConfig& cfg, uint32_t draft_max, PlanOptions& po,
                         const storage::StoreOptions& store) {
  const gguf::File sf = gguf::File::open(path);
  const DsparkReport rep = validate_dspark(sf, &cfg);
  if (!rep.ok())
    throw Error(with_path(path, rep.errors.front() + (rep.errors.size() > 1 ? " (and " + std::to_string(rep.errors.size() - 1) +
                                                                                   " more; `sluice inspect` lists them)"
                                                                             : "")));
  if (draft_max < 2 || draft_max > rep.config.block_size)
    throw Error("--draft-max must be in 2.." + std::to_string(rep.config.block_size) + " (the drafter's block)");
  uint64_t weights = 0, experts = 0;
  for (const gguf::TensorInfo& t : sf.tensors())
    (t.name.find("_exps.") != std::string::npos ? experts : weights) += loaded_tensor_bytes(t.type, t.nbytes);
  const uint64_t cw = (uint64_t)rep.config.target_layers.size() * cfg.hidden_size;
  const uint64_t rows = rep.config.block_size + 1;  // a verify pass: anchor + drafts
  const uint64_t verify = rows * (cfg.vocab_size + cw) * sizeof(float) + checkpoint_bytes(cfg, po.ctx) +
                          rows * cfg.kv_source_layer_ids.size() * cfg.head_dim * 2 * sizeof(float);
  const uint64_t scratch = drafter_scratch_bytes(cfg, rep.config);
  po.dspark_fixed = weights + scratch + verify;
  po.dspark_per_sequence = draft_state_bytes(cfg, rep.config);
  po.dspark_per_row = 2 * cw * sizeof(float);  // the engine's capture and the step's copy
  po.dspark_block = rep.config.block_size;
  po.dspark_expert_bytes = experts;
  po.dspark_stream_slots = dspark_stream_slots(rep.config);
  po.dspark_stream_bytes =
      storage::bytes_needed(dspark_expert_geometry(sf, rep.config), dspark_store_options(rep.config, store)).total;
  po.dspark_detail = format_bytes(weights) + " weights as loaded (" + std::to_string(sf.tensors().size()) +
                     " tensors), activations " + format_bytes(scratch) + ", verify buffers " + format_bytes(verify);
  return rep.config;
}

}  // namespace sluice
