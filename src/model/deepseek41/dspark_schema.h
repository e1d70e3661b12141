// The DSpark support GGUF (spec 6.1-6.2): the drafter's hyperparameters, its tensor list for any
// target model, the metadata our generator writes, and the checks a support file must pass
// before it is loaded beside a target model.
//
// A support file is not a model of its own: its widths (hidden size, heads, ranks, window,
// vocabulary) are the target's, and its embedding and output head are the target's too. So every
// check of its tensors is made against a target ModelConfig.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/deepseek41/config.h"
#include "model/deepseek41/schema.h"
#include "util/token_id.h"

namespace sluice {

struct DsparkConfig {
  uint32_t stages = 3;            // mtp.0 .. mtp.{stages-1}
  uint32_t block_size = 5;        // rows of a drafter block: anchor + block_size - 1 noise rows
  TokenId noise_token = 128799;   // input id of the noise rows
  std::vector<uint32_t> target_layers{37, 38, 39};  // layers whose entering streams are captured
  uint32_t markov_rank = 256;
  uint32_t expert_count = 128, expert_used = 3;
  bool operator==(const DsparkConfig&) const = default;
};

// The published drafter's hyperparameters scaled to a target (the published values for the
// published config): target layers the last three, min(128, target experts) experts of which
// min(3, that) are used, Markov rank min(256, hidden / 8 rounded down to 32, at least 32), noise
// token 128799 or, for a smaller vocabulary, its last id.
DsparkConfig dspark_defaults(const ModelConfig& target);
// Overlays the official config.json keys present in a flattened config (n_mtp_layers,
// dspark_block_size, dspark_noise_token_id, dspark_target_layer_ids, dspark_markov_rank,
// dspark_n_routed_experts, dspark_n_activated_experts) on dspark_defaults(target).
DsparkConfig dspark_config_from_json(const ModelConfig& target, const nlohmann::json& flat);
// What makes d unusable with target, one line per problem naming the field; empty when fine.
std::vector<std::string> dspark_problems(const DsparkConfig& d, const ModelConfig& target);
// dspark_problems, and what our generator cannot write: its Markov and confidence heads are Q8_0,
// so the Markov rank must be a multiple of 32 there (any rank is fine with float heads).
std::vector<std::string> dspark_generator_problems(const DsparkConfig& d, const ModelConfig& target);

// Every tensor of the support file in file order (sorted by name, as the converter writes it):
// 24 per stage + mtp.0.main_proj/main_norm + the last stage's norm, Markov head and confidence
// head. Types: the target's recipe for the dense and routed weights (TensorTypes), F16 hc_*_fn,
// F32 vectors and router, Q8_0 Markov and confidence heads.
std::vector<TensorSpec> dspark_tensors(const DsparkConfig& d, const ModelConfig& target);

inline constexpr const char* kDsparkArchitecture = "deepseek4-dspark";     // what [DS4-MTP] writes
inline constexpr const char* kDsparkArchitectureAlt = "deepseek41-dspark";  // other V4.1 forks
// general.* + dspark.* keys of the support file (general.alignment 16384 included).
std::vector<gguf::KV> dspark_metadata(const DsparkConfig& d, const ModelConfig& target);

// A support file as read: its hyperparameters (from dspark.* keys, with the aliases of other
// converters) and every problem found, each naming its key or tensor.
struct DsparkReport {
  std::string architecture;
  DsparkConfig config;
  std::vector<std::string> errors;
  uint64_t resident_bytes = 0, routed_expert_bytes = 0;  // unpadded tensor bytes
  uint64_t expert_bytes_per_stage = 0;                   // gate + up + down of one expert
  bool ok() const { return errors.empty(); }
};
bool is_dspark_architecture(const gguf::File& f);
// The support file's own checks (architecture, keys, every tensor present) and, when target is
// given, every tensor's shape and type against that target and the hyperparameters against its
// layers and vocabulary. Never reads payload.
DsparkReport validate_dspark(const gguf::File& f, const ModelConfig* target);

}  // namespace sluice
