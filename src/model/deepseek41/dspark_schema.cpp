// The DSpark support GGUF: hyperparameters, tensor list, metadata and validation (spec 6.1-6.2).
#include "model/deepseek41/dspark_schema.h"

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "kernels/types.h"
#include "util/error.h"

namespace sluice {

DsparkConfig dspark_defaults(const ModelConfig& t) {
  DsparkConfig d;
  const uint32_t nl = t.num_hidden_layers;
  d.target_layers.clear();
  for (uint32_t i = 0; i < 3; ++i) d.target_layers.push_back(nl >= 3 - i ? nl - 3 + i : 0);
  d.expert_count = std::min<uint32_t>(128, t.n_routed_experts);
  d.expert_used = std::min<uint32_t>(3, d.expert_count);
  d.markov_rank = std::max<uint32_t>(32, std::min<uint32_t>(256, t.hidden_size / 8 / 32 * 32));
  d.noise_token = t.vocab_size > 128799 ? 128799 : (t.vocab_size ? t.vocab_size - 1 : 0);
  return d;
}

DsparkConfig dspark_config_from_json(const ModelConfig& target, const nlohmann::json& j) {
  DsparkConfig d = dspark_defaults(target);
  auto has = [&](const char* k) { auto it = j.find(k); return it != j.end() && !it->is_null(); };
  auto u32 = [&](const char* k, uint32_t& dst) { if (has(k)) dst = (uint32_t)json_uint(j.at(k), k, UINT32_MAX); };
  u32("n_mtp_layers", d.stages);
  u32("dspark_block_size", d.block_size);
  u32("dspark_noise_token_id", d.noise_token);
  u32("dspark_markov_rank", d.markov_rank);
  u32("dspark_n_routed_experts", d.expert_count);
  u32("dspark_n_activated_experts", d.expert_used);
  if (has("dspark_target_layer_ids")) {
    const nlohmann::json& a = j.at("dspark_target_layer_ids");
    if (!a.is_array()) throw Error("config key dspark_target_layer_ids: expected an array of integers");
    d.target_layers.clear();
    for (const nlohmann::json& v : a) d.target_layers.push_back((uint32_t)json_uint(v, "dspark_target_layer_ids", UINT32_MAX));
  }
  return d;
}

std::vector<std::string> dspark_problems(const DsparkConfig& d, const ModelConfig& t) {
  std::vector<std::string> out;
  auto bad = [&](const std::string& field, const std::string& why) { out.push_back("dspark." + field + ": " + why); };
  if (d.stages == 0 || d.stages > 16) bad("stage_count", std::to_string(d.stages) + " stages (1-16 supported)");
  if (d.block_size < 1 || d.block_size > 16) bad("block_size", std::to_string(d.block_size) + " rows (1-16 supported)");
  if (d.noise_token >= t.vocab_size)
    bad("noise_token_id", std::to_string(d.noise_token) + " is not below the model's vocabulary of " + std::to_string(t.vocab_size));
  if (d.target_layers.empty() || d.target_layers.size() > 8)
    bad("target_layer_ids", std::to_string(d.target_layers.size()) + " layers (1-8 supported)");
  for (uint32_t l : d.target_layers)
    if (l >= t.num_hidden_layers)
      bad("target_layer_ids", "layer " + std::to_string(l) + " is not below the model's " + std::to_string(t.num_hidden_layers) +
                                  " layers");
  if (!std::is_sorted(d.target_layers.begin(), d.target_layers.end()))
    bad("target_layer_ids", "not in ascending order");
  if (d.expert_count == 0) bad("expert_count", "no routed experts");
  if (d.expert_used == 0 || d.expert_used > d.expert_count)
    bad("expert_used_count", std::to_string(d.expert_used) + " of " + std::to_string(d.expert_count) + " experts");
  // Any rank: float Markov and confidence heads (other converters' F32/F16/BF16) take any width;
  // a block type needs whole blocks, which the GGUF reader checks for every tensor.
  if (d.markov_rank == 0) bad("markov_rank", "0 (at least 1 is needed)");
  return out;
}

std::vector<std::string> dspark_generator_problems(const DsparkConfig& d, const ModelConfig& t) {
  std::vector<std::string> out = dspark_problems(d, t);
  const uint32_t block = (uint32_t)type_traits(GgmlType::Q8_0).block_elems;
  if (out.empty() && d.markov_rank % block)
    out.push_back(std::string("dspark.markov_rank: ")
                      .append(std::to_string(d.markov_rank))
                      .append(": the generator writes Q8_0 Markov and confidence heads, whose rows are whole blocks of ")
                      .append(std::to_string(block))
                      .append(" values (a support file with float heads may have any rank)"));
  return out;
}

std::vector<TensorSpec> dspark_tensors(const DsparkConfig& d, const ModelConfig& c) {
  std::vector<TensorSpec> out;
  const TensorTypes& ty = c.types;
  const uint64_t H = c.hidden_size;
  auto add = [&](std::string name, std::vector<uint64_t> ne, GgmlType type, const char* field, int stage,
                 ByteClass cls = ByteClass::Resident) {
    out.push_back(TensorSpec{std::move(name), std::move(ne), type, cls, stage, field});
  };
  for (uint32_t s = 0; s < d.stages; ++s) {
    const std::string p = "mtp." + std::to_string(s) + ".";
    const int st = (int)s;
    add_block_tensors(out, c, p, st, d.expert_count, /*image_bias=*/false);
  }
  const std::string last = "mtp." + std::to_string(d.stages - 1) + ".";
  add("mtp.0.main_proj.weight", {H * d.target_layers.size(), H}, ty.attn, "attn", 0);
  add("mtp.0.main_norm.weight", {H}, GgmlType::F32, "", 0);
  add(last + "norm.weight", {H}, GgmlType::F32, "", (int)d.stages - 1);
  add(last + "markov_head.markov_w1.weight", {d.markov_rank, c.vocab_size}, GgmlType::Q8_0, "", (int)d.stages - 1);
  add(last + "markov_head.markov_w2.weight", {d.markov_rank, c.vocab_size}, GgmlType::Q8_0, "", (int)d.stages - 1);
  add(last + "confidence_head.proj.weight", {H + d.markov_rank, 1}, GgmlType::Q8_0, "", (int)d.stages - 1);
  std::sort(out.begin(), out.end(), [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  return out;
}

std::vector<gguf::KV> dspark_metadata(const DsparkConfig& d, const ModelConfig& c) {
  using gguf::Value;
  std::vector<uint64_t> targets(d.target_layers.begin(), d.target_layers.end());
  std::string quant = std::string(type_info(c.types.routed_gate_up).name) + " routed gate/up; " +
                      std::string(type_info(c.types.routed_down).name) + " routed down; " +
                      std::string(type_info(c.types.attn).name) + " dense";
  return {
      {"general.architecture", Value::str(kDsparkArchitecture)},
      {"general.name", Value::str("DeepSeek V4.1 Flash DSpark support")},
      {"general.source.url", Value::str("https://huggingface.co/deepseek-ai/DeepSeek-V4.1-Flash")},
      {"general.source.revision", Value::str("df42c109f1defefcbfcedbe7d905718a12266e40")},
      {"general.alignment", Value::u32(kDeepseek41Alignment)},
      {"dspark.block_size", Value::u32(d.block_size)},
      {"dspark.markov_rank", Value::u32(d.markov_rank)},
      {"dspark.noise_token_id", Value::u32(d.noise_token)},
      {"dspark.target_layer_ids", Value::array_u32(targets)},
      {"dspark.stage_count", Value::u32(d.stages)},
      {"dspark.n_layers", Value::u32(d.stages)},
      {"dspark.expert_count", Value::u32(d.expert_count)},
      {"dspark.expert_used_count", Value::u32(d.expert_used)},
      {"deepseek41.dspark.quantization", Value::str(quant)},
      {"dspark.target_architecture", Value::str("deepseek41")},
  };
}

bool is_dspark_architecture(const gguf::File& f) {
  const gguf::Value* a = f.find("general.architecture");
  return a && a->type == gguf::ValueType::STRING && (a->s == kDsparkArchitecture || a->s == kDsparkArchitectureAlt);
}

namespace {

std::string shape_text(const uint64_t* ne, size_t n) {
  std::string s = "[";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

// A u32 key (or its alias); errors name the key. Returns whether it was found.
bool read_u32(const gguf::File& f, std::initializer_list<const char*> keys, uint32_t& dst,
              std::vector<std::string>& errors) {
  for (const char* k : keys) {
    const gguf::Value* v = f.find(k);
    if (!v) continue;
    try {
      const uint64_t x = v->as_uint();
      if (x > UINT32_MAX) throw Error("out of range");
      dst = (uint32_t)x;
    } catch (const Error&) {
      errors.push_back(std::string(k) + ": expected an unsigned integer");
    }
    return true;
  }
  return false;
}

}  // namespace

DsparkReport validate_dspark(const gguf::File& f, const ModelConfig* target) {
  DsparkReport r;
  const gguf::Value* arch = f.find("general.architecture");
  if (!arch || arch->type != gguf::ValueType::STRING) {
    r.errors.push_back("general.architecture: missing or not a string (a DSpark support file has " +
                       std::string(kDsparkArchitecture) + ")");
    return r;
  }
  r.architecture = arch->s;
  if (!is_dspark_architecture(f)) {
    r.errors.push_back("general.architecture: " + arch->s + " is not a DSpark support file (" + kDsparkArchitecture +
                       " or " + kDsparkArchitectureAlt + ")");
    return r;
  }
  DsparkConfig& d = r.config;
  std::vector<std::string>& e = r.errors;
  if (!read_u32(f, {"dspark.stage_count", "dspark.n_layers"}, d.stages, e)) e.push_back("dspark.stage_count: missing");
  if (!read_u32(f, {"dspark.block_size"}, d.block_size, e)) e.push_back("dspark.block_size: missing");
  if (!read_u32(f, {"dspark.noise_token_id"}, d.noise_token, e)) e.push_back("dspark.noise_token_id: missing");
  if (!read_u32(f, {"dspark.markov_rank"}, d.markov_rank, e)) e.push_back("dspark.markov_rank: missing");
  if (!read_u32(f, {"dspark.expert_used_count", "dspark.n_expert_used"}, d.expert_used, e))
    e.push_back("dspark.expert_used_count: missing");
  if (!read_u32(f, {"dspark.expert_count", "dspark.n_expert"}, d.expert_count, e)) {
    // spec 6.2: without the key the width of the router says it (never the target's count).
    const gguf::TensorInfo* g = f.find_tensor("mtp.0.ffn_gate_inp.weight");
    if (g && g->n_dims == 2) d.expert_count = (uint32_t)g->ne[1];
    else e.push_back("dspark.expert_count: missing, and no mtp.0.ffn_gate_inp.weight to take it from");
  }
  if (const gguf::Value* t = f.find("dspark.target_layer_ids")) {
    if (!t->is_array() || t->au.size() != t->array_size() || t->array_size() == 0) {
      e.push_back("dspark.target_layer_ids: expected a non-empty array of unsigned integers");
    } else {
      d.target_layers.clear();
      for (uint64_t x : t->au) d.target_layers.push_back((uint32_t)std::min<uint64_t>(x, UINT32_MAX));
    }
  } else {
    e.push_back("dspark.target_layer_ids: missing");
  }
  if (!e.empty()) return r;
  if (d.stages == 0 || d.stages > 16) {
    e.push_back("dspark.stage_count: " + std::to_string(d.stages) + " stages (1-16 supported)");
    return r;
  }

  // Names come from the hyperparameters alone; shapes need the target's widths.
  ModelConfig widths = target ? *target : published_config();
  const std::vector<TensorSpec> specs = dspark_tensors(d, widths);
  std::map<std::string, const TensorSpec*, std::less<>> want;
  for (const TensorSpec& s : specs) want[s.name] = &s;
  for (const gguf::TensorInfo& t : f.tensors())
    if (!want.count(t.name)) e.push_back(t.name + ": not a tensor of a " + std::to_string(d.stages) + "-stage DSpark support file");
  for (const TensorSpec& s : specs) {
    const gguf::TensorInfo* t = f.find_tensor(s.name);
    if (!t) {
      e.push_back(s.name + ": missing");
      continue;
    }
    (s.cls == ByteClass::RoutedExpert ? r.routed_expert_bytes : r.resident_bytes) += t->nbytes;
    if (s.cls == ByteClass::RoutedExpert && s.layer == 0 && t->ne[2]) r.expert_bytes_per_stage += t->nbytes / t->ne[2];
    if (!target) continue;
    const bool shape_ok = t->n_dims == s.ne.size() && std::equal(s.ne.begin(), s.ne.end(), t->ne.begin());
    if (!shape_ok)
      e.push_back(s.name + ": shape " + shape_text(t->ne.data(), t->n_dims) + ", the model needs " +
                  shape_text(s.ne.data(), s.ne.size()));
    // Other converters use other types (F32 heads, F16/BF16 dense, MXFP4/Q4_K experts): any type
    // with kernels is computed as it is, never requantized.
    const TypeTraits& tr = type_traits(t->type);
    if (!tr.has_kernels)
      e.push_back(s.name + ": type " + std::string(tr.name) + " has no kernels in sluice");
  }
  if (target)
    for (std::string& p : dspark_problems(d, *target)) e.push_back(std::move(p));
  return r;
}

}  // namespace sluice
