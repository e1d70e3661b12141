// config_from_gguf: the deepseek41.* keys are authoritative, deepseek41.config fills the gaps
// (spec 2.2: "require the structural keys and fall back to deepseek41.config").
#include <set>

#include <nlohmann/json.hpp>

#include "format/gguf.h"
#include "model/architecture.h"
#include "model/deepseek41/config.h"
#include "util/error.h"

namespace sluice {
namespace {

using json = nlohmann::json;

std::string k41(const char* name) { return std::string("deepseek41.") + name; }

// Typed reads that name the key in every error.
uint64_t key_uint(const gguf::Value& v, const std::string& key, uint64_t max) {
  uint64_t x;
  try {
    x = v.as_uint();
  } catch (const Error& e) {
    throw Error("GGUF key " + key + ": " + e.what());
  }
  if (x > max) throw Error("GGUF key " + key + ": value " + std::to_string(x) + " out of range");
  return x;
}

double key_float(const gguf::Value& v, const std::string& key) {
  try {
    return v.as_float();
  } catch (const Error& e) {
    throw Error("GGUF key " + key + ": " + e.what());
  }
}

std::vector<uint64_t> key_uint_array(const gguf::Value& v, const std::string& key) {
  if (!v.is_array()) throw Error("GGUF key " + key + ": expected an array");
  switch (v.elem) {
    case gguf::ValueType::U8: case gguf::ValueType::U16: case gguf::ValueType::U32: case gguf::ValueType::U64:
      return v.au;
    case gguf::ValueType::I8: case gguf::ValueType::I16: case gguf::ValueType::I32: case gguf::ValueType::I64: {
      std::vector<uint64_t> out;
      for (int64_t x : v.ai) {
        if (x < 0) throw Error("GGUF key " + key + ": negative element " + std::to_string(x));
        out.push_back((uint64_t)x);
      }
      return out;
    }
    default:
      throw Error("GGUF key " + key + ": expected an integer array, got " + std::string(gguf::value_type_name(v.elem)) + "[]");
  }
}

template <class T>
std::vector<T> narrow(const std::vector<uint64_t>& v, const std::string& key) {
  std::vector<T> out;
  out.reserve(v.size());
  for (uint64_t x : v) {
    if (x > std::numeric_limits<T>::max()) throw Error("GGUF key " + key + ": element " + std::to_string(x) + " out of range");
    out.push_back((T)x);
  }
  return out;
}

// TensorTypes field -> a tensor whose type it decides.
const std::pair<const char*, const char*> kTypeProbes[] = {
    {"token_embd", "token_embd.weight"},
    {"output", "output.weight"},
    {"attn", "blk.0.attn_q_a.weight"},
    {"shared_expert", "blk.0.ffn_gate_shexp.weight"},
    {"routed_gate_up", "blk.0.ffn_gate_exps.weight"},
    {"routed_down", "blk.0.ffn_down_exps.weight"},
    {"small_f16", "blk.0.hc_attn_fn.weight"},
    {"router", "blk.0.ffn_gate_inp.weight"},
};

// Whether the file has a key (or tensor records) that overrides config.json key `k`.
bool gguf_supplies(const gguf::File& f, const std::string& k) {
  if (k == "rope_scaling") return f.find("deepseek41.rope_scaling.factor") != nullptr;
  if (k == "bos_token_id" || k == "eos_token_id") return f.find("tokenizer.ggml." + k) != nullptr;
  if (k == "sluice_tensor_types") return f.find_tensor("blk.0.ffn_gate_exps.weight") != nullptr;
  if (k.rfind("engram_", 0) == 0) {
    const std::string sub = k.substr(7);
    if (sub == "layer_ids" || sub == "compressed_vocab_size" || sub == "token_map" || sub == "primes" || sub == "multipliers")
      return f.find("deepseek41.engram." + sub) != nullptr;
    if (sub == "num_embeddings") return f.find("deepseek41.engram.primes") != nullptr;
    return false;
  }
  return f.find("deepseek41." + k) != nullptr;
}

}  // namespace

ModelConfig config_from_gguf(const gguf::File& f, std::vector<std::string>* disagreements) {
  // First: a file of another architecture must not be read as a deepseek41 one.
  require_deepseek41(f);
  // Base: the published values, overlaid with deepseek41.config when present.
  ModelConfig c = published_config();
  c.engram_token_map.clear();
  c.engram_primes.clear();
  c.engram_multipliers.clear();
  json flat;
  bool have_json = false;
  std::vector<std::string> config_errors;
  std::set<std::string> from_json;  // config.json keys applied successfully
  if (const gguf::Value* v = f.find("deepseek41.config")) {
    if (v->type != gguf::ValueType::STRING) throw Error("GGUF key deepseek41.config: expected a string");
    try {
      flat = flatten_config_json(json::parse(v->s));
    } catch (const json::exception& e) {
      throw Error(std::string("GGUF key deepseek41.config is not valid JSON: ") + e.what());
    } catch (const Error& e) {
      throw Error(std::string("GGUF key deepseek41.config: ") + e.what());
    }
    // Key by key: a value sluice cannot parse is harmless when a deepseek41.* key supplies it
    // (keys win); otherwise it is reported.
    for (auto& [k, x] : flat.items()) {
      try {
        apply_config_json(c, json{{k, x}});
        if (!x.is_null()) from_json.insert(k);
      } catch (const Error& e) {
        if (!gguf_supplies(f, k)) config_errors.push_back(std::string("deepseek41.config: ") + e.what());
      }
    }
    have_json = true;
  }
  ModelConfig json_cfg = c;
  if (json_cfg.compress_ratios.size() > json_cfg.num_hidden_layers) json_cfg.compress_ratios.resize(json_cfg.num_hidden_layers);

  auto u32 = [&](const char* name, uint32_t& dst) {
    if (const gguf::Value* v = f.find(k41(name))) dst = (uint32_t)key_uint(*v, k41(name), UINT32_MAX);
  };
  auto u64 = [&](const char* name, uint64_t& dst) {
    if (const gguf::Value* v = f.find(k41(name))) dst = key_uint(*v, k41(name), UINT64_MAX);
  };
  auto real = [&](const char* name, double& dst) {
    if (const gguf::Value* v = f.find(k41(name))) dst = key_float(*v, k41(name));
  };
  auto f32 = [&](const char* name, float& dst) {
    if (const gguf::Value* v = f.find(k41(name))) dst = (float)key_float(*v, k41(name));
  };
  auto str = [&](const char* name, std::string& dst) {
    if (const gguf::Value* v = f.find(k41(name))) {
      if (v->type != gguf::ValueType::STRING) throw Error("GGUF key " + k41(name) + ": expected a string");
      dst = v->s;
    }
  };
  auto list32 = [&](const char* name, std::vector<uint32_t>& dst) {
    if (const gguf::Value* v = f.find(k41(name))) dst = narrow<uint32_t>(key_uint_array(*v, k41(name)), k41(name));
  };

  u32("vocab_size", c.vocab_size);
  u32("hidden_size", c.hidden_size);
  u32("moe_intermediate_size", c.moe_intermediate_size);
  u32("num_hidden_layers", c.num_hidden_layers);
  u32("num_attention_heads", c.num_attention_heads);
  u32("num_key_value_heads", c.num_key_value_heads);
  u32("head_dim", c.head_dim);
  u32("qk_rope_head_dim", c.qk_rope_head_dim);
  u32("q_lora_rank", c.q_lora_rank);
  u32("o_lora_rank", c.o_lora_rank);
  u32("o_groups", c.o_groups);
  u32("n_routed_experts", c.n_routed_experts);
  u32("n_shared_experts", c.n_shared_experts);
  u32("num_experts_per_tok", c.num_experts_per_tok);
  u64("max_position_embeddings", c.max_position_embeddings);
  u32("sliding_window", c.sliding_window);
  u32("index_n_heads", c.index_n_heads);
  u32("index_head_dim", c.index_head_dim);
  u32("index_topk", c.index_topk);
  u32("candidate_source_layer_id", c.candidate_source_layer_id);
  u32("candidate_topk_blocks", c.candidate_topk_blocks);
  u32("candidate_block_size", c.candidate_block_size);
  u32("hc_mult", c.hc_mult);
  u32("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  real("rope_theta", c.rope_theta);
  real("compress_rope_theta", c.compress_rope_theta);
  f32("rms_norm_eps", c.rms_norm_eps);
  f32("hc_eps", c.hc_eps);
  f32("swiglu_limit", c.swiglu_limit);
  f32("routed_scaling_factor", c.routed_scaling_factor);
  str("scoring_func", c.scoring_func);
  str("hidden_act", c.hidden_act);
  str("topk_method", c.topk_method);
  if (const gguf::Value* v = f.find("deepseek41.norm_topk_prob")) {
    if (v->type != gguf::ValueType::BOOL) throw Error("GGUF key deepseek41.norm_topk_prob: expected a bool");
    c.norm_topk_prob = v->u != 0;
  }
  list32("compress_ratios", c.compress_ratios);
  list32("kv_source_layer_ids", c.kv_source_layer_ids);
  list32("index_source_layer_ids", c.index_source_layer_ids);
  real("rope_scaling.factor", c.rope_scaling.factor);
  real("rope_scaling.beta_fast", c.rope_scaling.beta_fast);
  real("rope_scaling.beta_slow", c.rope_scaling.beta_slow);
  if (const gguf::Value* v = f.find("deepseek41.rope_scaling.original_max_position_embeddings")) {
    double d = key_float(*v, "deepseek41.rope_scaling.original_max_position_embeddings");
    if (!(d >= 1 && d <= 9007199254740992.0 && d == (double)(uint64_t)d))
      throw Error("GGUF key deepseek41.rope_scaling.original_max_position_embeddings: " + std::to_string(d) + " is not a positive integer");
    c.rope_scaling.original_max_position_embeddings = (uint64_t)d;
  }

  // Engram: tables come only from their keys (or are derived by finalize() when absent).
  list32("engram.layer_ids", c.engram_layer_ids);
  u32("engram.compressed_vocab_size", c.engram_compressed_vocab_size);
  list32("engram.token_map", c.engram_token_map);
  if (const gguf::Value* v = f.find("deepseek41.engram.primes")) c.engram_primes = key_uint_array(*v, "deepseek41.engram.primes");
  if (const gguf::Value* v = f.find("deepseek41.engram.multipliers"))
    c.engram_multipliers = key_uint_array(*v, "deepseek41.engram.multipliers");
  // The Engram shape keys exist only in deepseek41.config; without them (no config, or a value
  // that did not parse) recover them from the tables: multipliers per layer = max_ngram, primes
  // per layer = (max_ngram - 1) * n_heads, and the table's row bytes = head_dim * 33 / 32.
  const size_t n_engram = c.engram_layer_ids.size();
  if (n_engram > 0) {
    if (!from_json.count("engram_max_ngram_size") && !c.engram_multipliers.empty() && c.engram_multipliers.size() % n_engram == 0)
      c.engram_max_ngram_size = (uint32_t)(c.engram_multipliers.size() / n_engram);
    if (!from_json.count("engram_n_heads") && !c.engram_primes.empty() && c.engram_max_ngram_size >= 2 &&
        c.engram_primes.size() % (n_engram * c.engram_orders()) == 0)
      c.engram_n_heads = (uint32_t)(c.engram_primes.size() / (n_engram * c.engram_orders()));
    const std::string t = "blk." + std::to_string(c.engram_layer_ids[0]) + ".engram_embd.weight";
    if (const gguf::TensorInfo* ti = f.find_tensor(t); ti && !from_json.count("engram_head_dim") && ti->ne[0] % 33 == 0)
      c.engram_head_dim = (uint32_t)(ti->ne[0] / 33 * 32);
  }

  // Token ids: the tokenizer keys are what the engine actually uses.
  if (const gguf::Value* v = f.find("tokenizer.ggml.bos_token_id")) c.bos_token_id = (uint32_t)key_uint(*v, "tokenizer.ggml.bos_token_id", UINT32_MAX);
  if (const gguf::Value* v = f.find("tokenizer.ggml.eos_token_id")) c.eos_token_id = (uint32_t)key_uint(*v, "tokenizer.ggml.eos_token_id", UINT32_MAX);

  // Tensor types: what the file stores (validate_deepseek41 then checks every other tensor).
  for (auto [field, tensor] : kTypeProbes)
    if (const gguf::TensorInfo* ti = f.find_tensor(tensor)) tensor_type_field(c.types, field) = ti->type;

  if (disagreements) disagreements->insert(disagreements->end(), config_errors.begin(), config_errors.end());
  if (disagreements && have_json) {
    json a = config_to_json(json_cfg, false), b = config_to_json(c, false);
    for (const char* k : {"bos_token_id", "eos_token_id", "sluice_tensor_types", "engram_num_embeddings"}) {
      a.erase(k);
      b.erase(k);
    }
    for (auto& [k, x] : b.items())
      if (from_json.count(k) && (!a.contains(k) || a[k] != x))
        disagreements->push_back("deepseek41.config says " + k + " = " + (a.contains(k) ? a[k].dump() : "?") + ", the keys give " + x.dump());
  }

  finalize(c);

  if (disagreements && have_json && flat.contains("engram_num_embeddings")) {
    json rows = json::array();
    for (size_t i = 0; i < c.engram_layer_ids.size(); ++i) rows.push_back(c.engram_rows(i));
    if (flat["engram_num_embeddings"] != rows)
      disagreements->push_back("deepseek41.config says engram_num_embeddings = " + flat["engram_num_embeddings"].dump() +
                               ", the primes give " + rows.dump());
  }
  return c;
}

}  // namespace sluice
