// validate_deepseek41: a file against the published schema, from its header alone.
#include <map>
#include <set>

#include "model/architecture.h"
#include "model/deepseek41/schema.h"
#include "util/error.h"

namespace sluice {
namespace {

using gguf::ValueType;

// The keys add_deepseek41_metadata writes, with their value type (element type for arrays).
// Spec 2.2: a loader requires the structural keys and falls back to deepseek41.config for the
// rest, so: `always` keys must exist (the Engram tables cannot be re-derived for a real
// tokenizer), `fallback` keys must exist unless deepseek41.config does, and the optional ones
// (provenance, restatements) are only type-checked. Every present key must have its type.
enum class Need { Always, Fallback, Optional };
struct KeySpec {
  std::string key;
  bool array;
  ValueType type;
  Need need;
};

std::vector<KeySpec> schema_keys() {
  std::vector<KeySpec> k = {
      {"general.architecture", false, ValueType::STRING, Need::Always},
      {"general.name", false, ValueType::STRING, Need::Optional},
      {"general.source.url", false, ValueType::STRING, Need::Optional},
      {"general.source.revision", false, ValueType::STRING, Need::Optional},
      {"deepseek41.config", false, ValueType::STRING, Need::Optional},
      {"deepseek41.engram.encoding", false, ValueType::STRING, Need::Optional},
      {"deepseek41.engram.storage", false, ValueType::STRING, Need::Optional},
      {"deepseek41.engram.layer_ids", true, ValueType::U32, Need::Always},
      {"deepseek41.engram.rows", true, ValueType::U32, Need::Optional},
      {"deepseek41.engram.compressed_vocab_size", false, ValueType::U32, Need::Always},
      {"deepseek41.engram.pad_id", false, ValueType::U32, Need::Optional},
      {"deepseek41.engram.token_map", true, ValueType::U32, Need::Always},
      {"deepseek41.engram.primes", true, ValueType::U32, Need::Always},
      {"deepseek41.engram.multipliers", true, ValueType::U64, Need::Always},
      {"deepseek41.quantization", false, ValueType::STRING, Need::Optional},
      {"deepseek41.calibration", false, ValueType::STRING, Need::Optional},
      {"quantize.imatrix.file", false, ValueType::STRING, Need::Optional},
  };
  for (const char* n : {"vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "head_dim", "qk_rope_head_dim", "q_lora_rank", "o_lora_rank", "o_groups",
                        "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "max_position_embeddings",
                        "sliding_window", "index_n_heads", "index_head_dim", "index_topk", "candidate_source_layer_id",
                        "candidate_topk_blocks", "candidate_block_size", "hc_mult", "hc_sinkhorn_iters", "rope_theta",
                        "compress_rope_theta"})
    k.push_back({std::string("deepseek41.") + n, false, ValueType::U32, Need::Fallback});
  for (const char* n : {"rms_norm_eps", "hc_eps", "swiglu_limit", "routed_scaling_factor", "rope_scaling.factor",
                        "rope_scaling.beta_fast", "rope_scaling.beta_slow", "rope_scaling.original_max_position_embeddings"})
    k.push_back({std::string("deepseek41.") + n, false, ValueType::F32, Need::Fallback});
  for (const char* n : {"scoring_func", "hidden_act", "topk_method"})
    k.push_back({std::string("deepseek41.") + n, false, ValueType::STRING, Need::Fallback});
  k.push_back({"deepseek41.norm_topk_prob", false, ValueType::BOOL, Need::Fallback});
  for (const char* n : {"compress_ratios", "kv_source_layer_ids", "index_source_layer_ids"})
    k.push_back({std::string("deepseek41.") + n, true, ValueType::U32, Need::Fallback});
  return k;
}

std::string dims_str(const uint64_t* ne, size_t n) {
  std::string s = "[";
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ", ";
    s += std::to_string(ne[i]);
  }
  s += ']';
  return s;
}

std::string type_name(GgmlType t) {
  const TypeTraits* r = find_type((uint32_t)t);
  return r ? std::string(r->name) : "type " + std::to_string((uint32_t)t);
}

}  // namespace

SchemaReport validate_deepseek41(const gguf::File& f) {
  SchemaReport rep;
  auto err = [&](std::string s) { rep.errors.push_back(std::move(s)); };

  // Byte classes come from the tensor records whatever else is wrong.
  for (const auto& t : f.tensors()) {
    if (t.name.find(".engram_embd.") != std::string::npos) rep.engram_bytes += t.nbytes;
    else if (t.name.find("_exps.") != std::string::npos) rep.routed_expert_bytes += t.nbytes;
    else rep.resident_bytes += t.nbytes;
  }

  // Nothing else is checked in a file of another architecture: its keys mean something else.
  if (auto problem = deepseek41_problem(f)) {
    err(*problem);
    return rep;
  }
  const bool have_config = f.find("deepseek41.config") != nullptr;
  for (const KeySpec& k : schema_keys()) {
    const gguf::Value* v = f.find(k.key);
    if (!v) {
      if (k.need == Need::Always || (k.need == Need::Fallback && !have_config))
        err("missing key " + k.key + (k.need == Need::Fallback ? " (and no deepseek41.config to fall back to)" : ""));
      continue;
    }
    const bool ok = k.array ? (v->is_array() && v->elem == k.type) : v->type == k.type;
    if (!ok)
      err("key " + k.key + " has type " +
          (v->is_array() ? std::string(gguf::value_type_name(v->elem)) + "[]" : std::string(gguf::value_type_name(v->type))) +
          ", expected " + std::string(gguf::value_type_name(k.type)) + (k.array ? "[]" : ""));
  }
  if (const gguf::Value* v = f.find("general.alignment"); !v || v->type != ValueType::U32 || f.alignment() != kDeepseek41Alignment)
    err("general.alignment is " + std::to_string(f.alignment()) + ", the published schema uses 16384 (warning: readable, but not the published layout)");

  ModelConfig c;
  std::vector<std::string> disagree;
  try {
    c = config_from_gguf(f, &disagree);
  } catch (const Error& e) {
    err(std::string("config: ") + e.what());
    return rep;
  }
  for (auto& d : disagree) err(d);
  rep.n_layer = c.num_hidden_layers;
  rep.n_expert = c.n_routed_experts;

  // Engram keys that restate what the config implies.
  if (const gguf::Value* v = f.find("deepseek41.engram.rows"); v && v->is_array()) {
    std::vector<uint64_t> rows;
    for (size_t i = 0; i < c.engram_layer_ids.size(); ++i) rows.push_back(c.engram_rows(i));
    if (v->au != rows) err("deepseek41.engram.rows disagrees with the sums of deepseek41.engram.primes");
  }
  if (const gguf::Value* v = f.find("deepseek41.engram.pad_id"); v && v->type == ValueType::U32 && v->u != c.engram_pad_compressed())
    err("deepseek41.engram.pad_id is " + std::to_string(v->u) + " but token_map[" + std::to_string(c.engram_pad_token_id) +
        "] is " + std::to_string(c.engram_pad_compressed()));
  if (const gguf::Value* v = f.find("deepseek41.engram.encoding"); v && v->type == ValueType::STRING) {
    const std::string want = "e4m3_e8m0_32_row" + std::to_string(c.engram_row_bytes());
    if (v->s != want) err("deepseek41.engram.encoding is \"" + v->s + "\", sluice reads \"" + want + "\"");
  }
  if (const gguf::Value* v = f.find("deepseek41.engram.storage"); v && v->type == ValueType::STRING && v->s != "embedded")
    err("deepseek41.engram.storage is \"" + v->s + "\"; only embedded Engram tables are supported");

  // Tensors: every expected one with its shape and type, nothing else.
  const std::vector<TensorSpec> want = deepseek41_tensors(c);
  std::set<std::string> expected;
  for (const TensorSpec& s : want) {
    expected.insert(s.name);
    const gguf::TensorInfo* t = f.find_tensor(s.name);
    if (!t) {
      err("missing tensor " + s.name);
      continue;
    }
    bool same = t->n_dims == s.ne.size();
    for (size_t i = 0; same && i < 4; ++i) same = t->ne[i] == (i < s.ne.size() ? s.ne[i] : 1);
    if (!same) err("tensor " + s.name + " has ne " + dims_str(t->ne.data(), t->n_dims) + ", expected " + dims_str(s.ne.data(), s.ne.size()));
    if (t->type != s.type) err("tensor " + s.name + " has type " + type_name(t->type) + ", expected " + type_name(s.type));
  }
  for (const auto& t : f.tensors())
    if (!expected.count(t.name)) err("unexpected tensor " + t.name);

  // The Engram tables must be the tail of the data section (a separately mapped disk extent).
  uint64_t last_other = 0, first_engram = UINT64_MAX;
  for (const auto& t : f.tensors()) {
    if (t.name.find(".engram_embd.") != std::string::npos) first_engram = std::min(first_engram, t.offset);
    else last_other = std::max(last_other, t.offset);
  }
  if (first_engram != UINT64_MAX && first_engram < last_other) err("engram_embd tables are not at the end of the data section");

  if (const gguf::TensorInfo* g = f.find_tensor("blk.0.ffn_gate_exps.weight"))
    if (c.n_routed_experts) {
      rep.expert_gate_bytes = g->nbytes / c.n_routed_experts;
      if (const gguf::TensorInfo* u = f.find_tensor("blk.0.ffn_up_exps.weight")) rep.expert_up_bytes = u->nbytes / c.n_routed_experts;
      if (const gguf::TensorInfo* d = f.find_tensor("blk.0.ffn_down_exps.weight")) rep.expert_down_bytes = d->nbytes / c.n_routed_experts;
      rep.expert_bytes_per_layer = rep.expert_gate_bytes + rep.expert_up_bytes + rep.expert_down_bytes;
    }
  if (rep.errors.size() > 200) {
    const size_t more = rep.errors.size() - 200;
    rep.errors.resize(200);
    rep.errors.push_back("... and " + std::to_string(more) + " more");
  }
  return rep;
}

}  // namespace sluice
