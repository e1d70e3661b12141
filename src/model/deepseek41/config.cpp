// Presets, config.json in/out, finalize() (derivations + validation) and per-layer roles.
#include "model/deepseek41/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "model/deepseek41/schema.h"
#include "util/error.h"

namespace sluice {
namespace {

using json = nlohmann::json;

constexpr uint64_t kU32Max = std::numeric_limits<uint32_t>::max();

std::string list_str(const std::vector<uint32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  s += ']';
  return s;
}

// ---- checked JSON reads: every failure names the key ------------------------------------------

}  // namespace

uint64_t json_uint(const json& v, const std::string& key, uint64_t max) {
  if (v.is_number_unsigned()) {
    uint64_t x = v.get<uint64_t>();
    if (x <= max) return x;
  } else if (v.is_number_integer()) {
    int64_t x = v.get<int64_t>();
    if (x >= 0 && (uint64_t)x <= max) return (uint64_t)x;
  } else if (v.is_number_float()) {
    // config.json writers sometimes emit integral values as floats (e.g. 65536.0).
    double d = v.get<double>();
    if (d >= 0 && d <= (double)max && std::floor(d) == d) return (uint64_t)d;
  } else {
    throw Error("config key " + key + ": expected a non-negative integer, got " + v.dump());
  }
  throw Error("config key " + key + ": value " + v.dump() + " is out of range [0, " + std::to_string(max) + "]");
}

namespace {

double json_num(const json& v, const std::string& key) {
  if (!v.is_number()) throw Error("config key " + key + ": expected a number, got " + v.dump());
  return v.get<double>();
}

template <class T>
std::vector<T> json_uint_list(const json& v, const std::string& key, uint64_t max) {
  if (!v.is_array()) throw Error("config key " + key + ": expected an array of integers");
  std::vector<T> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) out.push_back((T)json_uint(v[i], key + "[" + std::to_string(i) + "]", max));
  return out;
}

// Floats are written with their shortest decimal form, so 1e-20f appears as 1e-20 (not
// 9.99999968e-21) and reads back to the same float.
json float_json(float f) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, f);
  *r.ptr = 0;
  return json(std::strtod(buf, nullptr));
}

json real_json(double d) {
  if (d >= 0 && d < 9007199254740992.0 && std::floor(d) == d) return json((uint64_t)d);
  return json(d);
}

}  // namespace

// Merges a `text_config` object over the top level (the multimodal config.json nests the
// language model's keys there; bos/eos may sit at the top).
json flatten_config_json(const json& root) {
  if (!root.is_object()) throw Error("config: expected a JSON object");
  json merged = root;
  auto it = root.find("text_config");
  if (it != root.end() && it->is_object()) {
    merged.erase("text_config");
    for (auto& [k, v] : it->items()) merged[k] = v;
  }
  return merged;
}

void apply_config_json(ModelConfig& c, const json& j) {
  auto has = [&](const char* k) { auto it = j.find(k); return it != j.end() && !it->is_null(); };
  auto u32 = [&](const char* k, uint32_t& dst) { if (has(k)) dst = (uint32_t)json_uint(j.at(k), k, kU32Max); };
  auto u64 = [&](const char* k, uint64_t& dst) { if (has(k)) dst = json_uint(j.at(k), k, UINT64_MAX); };
  auto f32 = [&](const char* k, float& dst) { if (has(k)) dst = (float)json_num(j.at(k), k); };
  auto f64 = [&](const char* k, double& dst) { if (has(k)) dst = json_num(j.at(k), k); };
  auto str = [&](const char* k, std::string& dst) {
    if (!has(k)) return;
    if (!j.at(k).is_string()) throw Error(std::string("config key ") + k + ": expected a string");
    dst = j.at(k).get<std::string>();
  };
  auto list32 = [&](const char* k, std::vector<uint32_t>& dst) { if (has(k)) dst = json_uint_list<uint32_t>(j.at(k), k, kU32Max); };

  u32("hidden_size", c.hidden_size);
  u32("num_hidden_layers", c.num_hidden_layers);
  u32("num_attention_heads", c.num_attention_heads);
  u32("num_key_value_heads", c.num_key_value_heads);
  u32("head_dim", c.head_dim);
  u32("qk_rope_head_dim", c.qk_rope_head_dim);
  u32("q_lora_rank", c.q_lora_rank);
  u32("o_lora_rank", c.o_lora_rank);
  u32("o_groups", c.o_groups);
  u32("moe_intermediate_size", c.moe_intermediate_size);
  u32("n_routed_experts", c.n_routed_experts);
  u32("num_experts_per_tok", c.num_experts_per_tok);
  u32("n_shared_experts", c.n_shared_experts);
  u32("vocab_size", c.vocab_size);
  u32("sliding_window", c.sliding_window);
  list32("compress_ratios", c.compress_ratios);
  list32("kv_source_layer_ids", c.kv_source_layer_ids);
  list32("index_source_layer_ids", c.index_source_layer_ids);
  u32("candidate_source_layer_id", c.candidate_source_layer_id);
  u32("candidate_topk_blocks", c.candidate_topk_blocks);
  u32("candidate_block_size", c.candidate_block_size);
  u32("index_n_heads", c.index_n_heads);
  u32("index_head_dim", c.index_head_dim);
  u32("index_topk", c.index_topk);
  list32("engram_layer_ids", c.engram_layer_ids);
  u32("engram_max_ngram_size", c.engram_max_ngram_size);
  u32("engram_n_heads", c.engram_n_heads);
  u32("engram_head_dim", c.engram_head_dim);
  u64("engram_vocab_size", c.engram_vocab_size);
  u32("engram_compressed_vocab_size", c.engram_compressed_vocab_size);
  u32("engram_pad_token_id", c.engram_pad_token_id);
  f64("rope_theta", c.rope_theta);
  f64("compress_rope_theta", c.compress_rope_theta);
  if (has("rope_scaling")) {
    const json& r = j.at("rope_scaling");
    if (!r.is_object()) throw Error("config key rope_scaling: expected an object");
    auto rhas = [&](const char* k) { auto it = r.find(k); return it != r.end() && !it->is_null(); };
    for (const char* k : {"type", "rope_type"})
      if (rhas(k) && r.at(k) != "yarn")
        throw Error(std::string("config key rope_scaling.") + k + ": only \"yarn\" is supported, got " + r.at(k).dump());
    if (rhas("factor")) c.rope_scaling.factor = json_num(r.at("factor"), "rope_scaling.factor");
    if (rhas("beta_fast")) c.rope_scaling.beta_fast = json_num(r.at("beta_fast"), "rope_scaling.beta_fast");
    if (rhas("beta_slow")) c.rope_scaling.beta_slow = json_num(r.at("beta_slow"), "rope_scaling.beta_slow");
    if (rhas("original_max_position_embeddings"))
      c.rope_scaling.original_max_position_embeddings =
          json_uint(r.at("original_max_position_embeddings"), "rope_scaling.original_max_position_embeddings", UINT64_MAX);
  }
  u64("max_position_embeddings", c.max_position_embeddings);
  f32("rms_norm_eps", c.rms_norm_eps);
  u32("hc_mult", c.hc_mult);
  u32("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  f32("hc_eps", c.hc_eps);
  f32("routed_scaling_factor", c.routed_scaling_factor);
  f32("swiglu_limit", c.swiglu_limit);
  str("scoring_func", c.scoring_func);
  str("hidden_act", c.hidden_act);
  str("topk_method", c.topk_method);
  if (has("norm_topk_prob")) {
    if (!j.at("norm_topk_prob").is_boolean()) throw Error("config key norm_topk_prob: expected a boolean");
    c.norm_topk_prob = j.at("norm_topk_prob").get<bool>();
  }
  u32("bos_token_id", c.bos_token_id);
  u32("eos_token_id", c.eos_token_id);
  list32("engram_token_map", c.engram_token_map);
  if (has("engram_primes")) c.engram_primes = json_uint_list<uint64_t>(j.at("engram_primes"), "engram_primes", UINT64_MAX);
  if (has("engram_multipliers"))
    c.engram_multipliers = json_uint_list<uint64_t>(j.at("engram_multipliers"), "engram_multipliers", UINT64_MAX);
  if (has("sluice_tensor_types")) {
    const json& t = j.at("sluice_tensor_types");
    if (!t.is_object()) throw Error("config key sluice_tensor_types: expected an object of field -> type name");
    for (auto& [field, v] : t.items()) {
      const std::string key = "sluice_tensor_types." + field;
      if (!v.is_string()) throw Error("config key " + key + ": expected a type name string");
      auto ty = type_from_name(v.get<std::string>());
      if (!ty) throw Error("config key " + key + ": unknown tensor type \"" + v.get<std::string>() + "\"");
      try {
        tensor_type_field(c.types, field) = *ty;
      } catch (const Error&) {
        throw Error("config key " + key + ": unknown TensorTypes field");
      }
    }
  }
}

namespace {

// ---- derivations ---------------------------------------------------------------------------

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bool is_prime(uint64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (uint64_t d = 3; d <= n / d; d += 2)
    if (n % d == 0) return false;
  return true;
}

// ---- validation helpers ----------------------------------------------------------------------

[[noreturn]] void bad(const std::string& key, const std::string& why) { throw Error("config key " + key + ": " + why); }

void require_positive(uint64_t v, const char* key) {
  if (v == 0) bad(key, "must be > 0");
}

void require_layer_list(const std::vector<uint32_t>& v, const char* key, uint32_t n_layer) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] >= n_layer)
      bad(key, list_str(v) + ": layer " + std::to_string(v[i]) + " >= num_hidden_layers " + std::to_string(n_layer));
    if (i > 0 && v[i] <= v[i - 1]) bad(key, list_str(v) + " must be sorted ascending without duplicates");
  }
}

int largest_at_most(const std::vector<uint32_t>& v, uint32_t l) {
  int r = -1;
  for (uint32_t x : v)
    if (x <= l) r = (int)x;
  return r;
}

bool contains(const std::vector<uint32_t>& v, uint32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

void validate_scalars(const ModelConfig& c) {
  require_positive(c.num_hidden_layers, "num_hidden_layers");
  require_positive(c.hidden_size, "hidden_size");
  require_positive(c.num_attention_heads, "num_attention_heads");
  // The schema has one latent KV head (attn_kv [hidden, head_dim]); K and V are that vector.
  if (c.num_key_value_heads != 1) bad("num_key_value_heads", "must be 1 (MQA with one shared latent), got " + std::to_string(c.num_key_value_heads));
  require_positive(c.head_dim, "head_dim");
  require_positive(c.q_lora_rank, "q_lora_rank");
  require_positive(c.o_lora_rank, "o_lora_rank");
  require_positive(c.o_groups, "o_groups");
  require_positive(c.moe_intermediate_size, "moe_intermediate_size");
  require_positive(c.n_routed_experts, "n_routed_experts");
  if (c.num_experts_per_tok == 0 || c.num_experts_per_tok > c.n_routed_experts)
    bad("num_experts_per_tok", std::to_string(c.num_experts_per_tok) + " must be in [1, n_routed_experts = " + std::to_string(c.n_routed_experts) + "]");
  // ffn_*_shexp hold exactly one shared expert of moe_intermediate_size.
  if (c.n_shared_experts != 1) bad("n_shared_experts", "must be 1, got " + std::to_string(c.n_shared_experts));
  require_positive(c.vocab_size, "vocab_size");
  require_positive(c.sliding_window, "sliding_window");
  // RoPE rotates interleaved pairs of the last qk_rope_head_dim dims of each head and index head.
  if (c.qk_rope_head_dim == 0 || c.qk_rope_head_dim % 2)
    bad("qk_rope_head_dim", std::to_string(c.qk_rope_head_dim) + " must be even and > 0");
  if (c.head_dim < c.qk_rope_head_dim)
    bad("head_dim", std::to_string(c.head_dim) + " must be >= qk_rope_head_dim " + std::to_string(c.qk_rope_head_dim));
  // KV rows are fake-quantized in blocks of 32 (FP8) and 16 (NVFP4), index keys/queries in
  // blocks of 32 (MXFP4); Engram rows carry one E8M0 scale per 32 values.
  if (c.head_dim % 32) bad("head_dim", std::to_string(c.head_dim) + " must be a multiple of 32");
  require_positive(c.index_n_heads, "index_n_heads");
  if (c.index_head_dim < c.qk_rope_head_dim)
    bad("index_head_dim", std::to_string(c.index_head_dim) + " must be >= qk_rope_head_dim " + std::to_string(c.qk_rope_head_dim));
  if (c.index_head_dim == 0 || c.index_head_dim % 32) bad("index_head_dim", std::to_string(c.index_head_dim) + " must be a positive multiple of 32");
  require_positive(c.index_topk, "index_topk");
  require_positive(c.candidate_topk_blocks, "candidate_topk_blocks");
  require_positive(c.candidate_block_size, "candidate_block_size");
  if (c.num_attention_heads % c.o_groups)
    bad("o_groups", std::to_string(c.o_groups) + " must divide num_attention_heads " + std::to_string(c.num_attention_heads));
  if ((uint64_t)c.num_attention_heads * c.head_dim > kU32Max) bad("num_attention_heads", "num_attention_heads * head_dim overflows");
  require_positive(c.hc_mult, "hc_mult");
  require_positive(c.hc_sinkhorn_iters, "hc_sinkhorn_iters");
  // The GGUF stores rope thetas and max_position_embeddings as u32 (spec 2.2) and the
  // rope_scaling values as f32: a config that does not survive that cannot be written.
  for (auto [v, k] : {std::pair{c.rope_theta, "rope_theta"}, std::pair{c.compress_rope_theta, "compress_rope_theta"}})
    if (!(v >= 1 && v <= (double)kU32Max && std::floor(v) == v)) bad(k, "must be an integer in [1, 2^32) (stored as u32), got " + std::to_string(v));
  if (c.max_position_embeddings == 0 || c.max_position_embeddings > kU32Max)
    bad("max_position_embeddings", "must be in [1, 2^32) (stored as u32)");
  if (!(c.rope_scaling.factor >= 1) || !std::isfinite(c.rope_scaling.factor)) bad("rope_scaling.factor", "must be >= 1");
  if (!(c.rope_scaling.beta_fast > 0) || !(c.rope_scaling.beta_slow > 0) || !std::isfinite(c.rope_scaling.beta_fast) ||
      !std::isfinite(c.rope_scaling.beta_slow))
    bad("rope_scaling.beta_fast", "beta_fast and beta_slow must be finite and > 0");
  const uint64_t orig = c.rope_scaling.original_max_position_embeddings;
  if (orig == 0 || orig > (1u << 24)) bad("rope_scaling.original_max_position_embeddings", "must be in [1, 2^24] (stored exactly as f32)");
  for (auto [v, k] : {std::pair{c.rms_norm_eps, "rms_norm_eps"}, std::pair{c.hc_eps, "hc_eps"},
                      std::pair{c.routed_scaling_factor, "routed_scaling_factor"}, std::pair{c.swiglu_limit, "swiglu_limit"}})
    if (!(v > 0) || !std::isfinite(v)) bad(k, "must be finite and > 0");
  // The forward pass implements exactly these (spec 3.6).
  if (c.scoring_func != "sqrtsoftplus") bad("scoring_func", "only \"sqrtsoftplus\" is supported, got \"" + c.scoring_func + "\"");
  if (c.hidden_act != "silu") bad("hidden_act", "only \"silu\" is supported, got \"" + c.hidden_act + "\"");
  if (c.topk_method != "noaux_tc") bad("topk_method", "only \"noaux_tc\" is supported, got \"" + c.topk_method + "\"");
  if (c.bos_token_id >= c.vocab_size) bad("bos_token_id", "must be < vocab_size");
  if (c.eos_token_id >= c.vocab_size) bad("eos_token_id", "must be < vocab_size");
}

void validate_roles(const ModelConfig& c) {
  const uint32_t n = c.num_hidden_layers;
  if (c.compress_ratios.size() != n)
    bad("compress_ratios", "has " + std::to_string(c.compress_ratios.size()) + " entries, num_hidden_layers is " + std::to_string(n));
  for (uint32_t l = 0; l < n; ++l)
    if (c.compress_ratios[l] > 2)
      bad("compress_ratios", "layer " + std::to_string(l) + " has ratio " + std::to_string(c.compress_ratios[l]) + "; only 0, 1 and 2 exist");
  require_layer_list(c.kv_source_layer_ids, "kv_source_layer_ids", n);
  require_layer_list(c.index_source_layer_ids, "index_source_layer_ids", n);
  require_layer_list(c.engram_layer_ids, "engram_layer_ids", n);
  for (uint32_t l : c.kv_source_layer_ids)
    if (c.compress_ratios[l] == 0) bad("kv_source_layer_ids", "layer " + std::to_string(l) + " has compress ratio 0 (a KV source compresses)");
  for (uint32_t l : c.index_source_layer_ids)
    if (c.compress_ratios[l] == 0) bad("index_source_layer_ids", "layer " + std::to_string(l) + " has compress ratio 0 (nothing to index)");
  for (uint32_t l = 0; l < n; ++l) {
    const uint32_t r = c.compress_ratios[l];
    if (r == 0) continue;
    int kv = largest_at_most(c.kv_source_layer_ids, l);
    if (kv < 0) bad("kv_source_layer_ids", "layer " + std::to_string(l) + " has ratio " + std::to_string(r) + " but no KV source at or before it");
    // Visible compressed rows and their positions depend on the ratio of the stream read.
    if (c.compress_ratios[(size_t)kv] != r)
      bad("compress_ratios", "layer " + std::to_string(l) + " has ratio " + std::to_string(r) + " but its KV source " + std::to_string(kv) +
                                 " has ratio " + std::to_string(c.compress_ratios[(size_t)kv]));
    int tk = largest_at_most(c.index_source_layer_ids, l);
    if (tk < 0) bad("index_source_layer_ids", "layer " + std::to_string(l) + " has ratio " + std::to_string(r) + " but no index source at or before it");
    // A top-k list indexes the compressed stream of the selecting layer's KV source.
    if (largest_at_most(c.kv_source_layer_ids, (uint32_t)tk) != kv)
      bad("index_source_layer_ids", "layer " + std::to_string(l) + " reads KV source " + std::to_string(kv) + " but its top-k source " +
                                        std::to_string(tk) + " selects from another KV source's stream");
  }
  if (!contains(c.index_source_layer_ids, c.candidate_source_layer_id))
    bad("candidate_source_layer_id", std::to_string(c.candidate_source_layer_id) + " is not in index_source_layer_ids " + list_str(c.index_source_layer_ids));
  const int cand_kv = largest_at_most(c.kv_source_layer_ids, c.candidate_source_layer_id);
  for (uint32_t l : c.index_source_layer_ids)
    if (l > c.candidate_source_layer_id && largest_at_most(c.kv_source_layer_ids, l) != cand_kv)
      bad("kv_source_layer_ids", "candidate consumer " + std::to_string(l) + " reads a different KV source than candidate source " +
                                     std::to_string(c.candidate_source_layer_id) + " (the pool indexes that source's stream)");
}

void validate_engram(ModelConfig& c) {
  const size_t ne = c.engram_layer_ids.size();
  if (c.engram_max_ngram_size < 2) bad("engram_max_ngram_size", "must be >= 2");
  require_positive(c.engram_n_heads, "engram_n_heads");
  if (c.engram_head_dim == 0 || c.engram_head_dim % 32) bad("engram_head_dim", "must be a positive multiple of 32");
  if (c.engram_vocab_size < 2) bad("engram_vocab_size", "must be >= 2");
  if (c.engram_compressed_vocab_size == 0 || c.engram_compressed_vocab_size > c.vocab_size)
    bad("engram_compressed_vocab_size", std::to_string(c.engram_compressed_vocab_size) + " must be in [1, vocab_size]");
  if (c.engram_pad_token_id >= c.vocab_size) bad("engram_pad_token_id", "must be < vocab_size");

  if (c.engram_token_map.empty()) c.engram_token_map = synthetic_engram_token_map(c.vocab_size, c.engram_compressed_vocab_size);
  if (c.engram_token_map.size() != c.vocab_size)
    bad("engram_token_map", "has " + std::to_string(c.engram_token_map.size()) + " entries, vocab_size is " + std::to_string(c.vocab_size));
  for (size_t i = 0; i < c.engram_token_map.size(); ++i)
    if (c.engram_token_map[i] >= c.engram_compressed_vocab_size)
      bad("engram_token_map", "entry " + std::to_string(i) + " = " + std::to_string(c.engram_token_map[i]) +
                                  " is not below engram_compressed_vocab_size " + std::to_string(c.engram_compressed_vocab_size));

  if (c.engram_primes.empty()) c.engram_primes = derive_engram_primes(c);
  if (c.engram_primes.size() != ne * c.engram_columns())
    bad("engram_primes", "has " + std::to_string(c.engram_primes.size()) + " entries, expected " + std::to_string(ne * c.engram_columns()) +
                             " (engram layers x (max_ngram - 1) x n_heads)");
  for (uint64_t p : c.engram_primes)
    if (p < 2 || p > kU32Max) bad("engram_primes", std::to_string(p) + " must be in [2, 2^32) (stored as u32)");
  for (size_t i = 0; i < ne; ++i)
    if (c.engram_rows(i) > kU32Max) bad("engram_primes", "table rows of Engram layer " + std::to_string(c.engram_layer_ids[i]) + " exceed 2^32 (stored as u32)");

  if (c.engram_multipliers.empty()) c.engram_multipliers = derive_engram_multipliers(c);
  if (c.engram_multipliers.size() != ne * c.engram_max_ngram_size)
    bad("engram_multipliers", "has " + std::to_string(c.engram_multipliers.size()) + " entries, expected " +
                                  std::to_string(ne * c.engram_max_ngram_size) + " (engram layers x max_ngram)");
  // The hash is uint64 arithmetic that must stay below 2^63 (spec 4.3): id * M < 2^63.
  const uint64_t mmax = (uint64_t)INT64_MAX / c.engram_compressed_vocab_size;
  for (uint64_t m : c.engram_multipliers) {
    if (m % 2 == 0) bad("engram_multipliers", std::to_string(m) + " is even (multipliers are odd)");
    if (m > mmax) bad("engram_multipliers", std::to_string(m) + " * compressed ids can reach 2^63");
  }
}

void validate_types(const ModelConfig& c) {
  for (const auto& field : tensor_type_fields()) {
    GgmlType t = tensor_type_field(c.types, field);
    if (!find_type((uint32_t)t) || t == GgmlType::ENGRAM_ROW)
      bad("sluice_tensor_types." + field, "type id " + std::to_string((uint32_t)t) + " is not a GGUF tensor type");
  }
  for (const TensorSpec& s : deepseek41_tensors(c)) {
    const TypeTraits& tr = type_traits(s.type);
    if (s.ne[0] % (uint64_t)tr.block_elems)
      bad(s.type_field.empty() ? std::string("tensor ") + s.name : "sluice_tensor_types." + s.type_field,
          std::string(tr.name) + " needs rows of whole " + std::to_string(tr.block_elems) + "-element blocks but " + s.name +
              " has ne[0] = " + std::to_string(s.ne[0]));
  }
}

}  // namespace

// ---- TensorTypes by name --------------------------------------------------------------------

const std::vector<std::string>& tensor_type_fields() {
  static const std::vector<std::string> f = {"token_embd", "output", "attn", "shared_expert",
                                             "routed_gate_up", "routed_down", "small_f16", "router"};
  return f;
}

GgmlType& tensor_type_field(TensorTypes& t, std::string_view field) {
  if (field == "token_embd") return t.token_embd;
  if (field == "output") return t.output;
  if (field == "attn") return t.attn;
  if (field == "shared_expert") return t.shared_expert;
  if (field == "routed_gate_up") return t.routed_gate_up;
  if (field == "routed_down") return t.routed_down;
  if (field == "small_f16") return t.small_f16;
  if (field == "router") return t.router;
  throw Error("unknown tensor type field \"" + std::string(field) + "\"");
}

GgmlType tensor_type_field(const TensorTypes& t, std::string_view field) {
  return tensor_type_field(const_cast<TensorTypes&>(t), field);
}

// ---- ModelConfig derived sizes --------------------------------------------------------------

uint64_t ModelConfig::engram_rows(size_t engram_index) const {
  const size_t cols = engram_columns();
  if ((engram_index + 1) * cols > engram_primes.size())
    throw Error("engram_rows: Engram layer index " + std::to_string(engram_index) + " has no primes");
  uint64_t s = 0;
  for (size_t i = 0; i < cols; ++i) s += engram_primes[engram_index * cols + i];
  return s;
}

uint32_t ModelConfig::engram_pad_compressed() const {
  if (engram_pad_token_id >= engram_token_map.size()) throw Error("engram_pad_token_id outside engram_token_map");
  return engram_token_map[engram_pad_token_id];
}

// ---- derivations ----------------------------------------------------------------------------

std::vector<uint32_t> synthetic_engram_token_map(uint32_t vocab_size, uint32_t compressed_vocab_size) {
  if (compressed_vocab_size == 0) throw Error("synthetic_engram_token_map: compressed vocabulary is empty");
  std::vector<uint32_t> m(vocab_size);
  for (uint32_t id = 0; id < vocab_size; ++id)
    m[id] = id < compressed_vocab_size ? id : (uint32_t)(splitmix64(id) % compressed_vocab_size);
  return m;
}

std::vector<uint64_t> derive_engram_primes(const ModelConfig& c) {
  if (c.engram_vocab_size < 1) throw Error("config key engram_vocab_size: must be >= 1");
  std::vector<uint64_t> out;
  const size_t n = c.engram_layer_ids.size() * c.engram_columns();
  out.reserve(n);
  uint64_t p = c.engram_vocab_size - 1;
  for (size_t i = 0; i < n; ++i) {
    do {
      if (p >= kU32Max) bad("engram_vocab_size", "primes above it exceed 2^32 (stored as u32)");
      ++p;
    } while (!is_prime(p));
    out.push_back(p);
  }
  return out;
}

std::vector<uint64_t> derive_engram_multipliers(const ModelConfig& c) {
  if (c.engram_compressed_vocab_size == 0) bad("engram_compressed_vocab_size", "must be > 0");
  const uint64_t b = ((uint64_t)INT64_MAX / c.engram_compressed_vocab_size) / 2;
  std::vector<uint64_t> out;
  for (uint32_t layer : c.engram_layer_ids)
    for (uint64_t d : numpy_default_rng_integers(10007ull * layer, b, c.engram_max_ngram_size)) out.push_back(d * 2 + 1);
  return out;
}

// ---- presets --------------------------------------------------------------------------------

namespace {
ModelConfig published_unfinalized() {
  ModelConfig c;  // the struct's defaults are the Flash values
  c.compress_ratios.assign(40, 1);
  c.compress_ratios[0] = c.compress_ratios[1] = 0;
  for (int l = 2; l < 20; ++l) c.compress_ratios[l] = 2;
  c.kv_source_layer_ids = {2, 8, 14, 20};
  c.index_source_layer_ids = {2, 8, 14, 20, 24, 28, 32, 36};
  c.candidate_source_layer_id = 20;
  c.engram_layer_ids = {1, 14};
  return c;
}
}  // namespace

ModelConfig published_config() {
  ModelConfig c = published_unfinalized();
  finalize(c);
  return c;
}

// 8 layers covering every role:
//   0 window only | 1 window only, Engram before it | 2 ratio-2 KV + index source (with gate)
//   3 ratio-2 reuse of 2 | 4 ratio-1 KV + index + candidate source, Engram before it
//   5 ratio-1 reuse of 4 | 6 re-index (candidate consumer) | 7 reuse of 6's top-k
ModelConfig tiny_config() {
  ModelConfig c;
  c.hidden_size = 256;  // IQ2_XXS / Q2_K rows are whole 256-blocks
  c.num_hidden_layers = 8;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 1;
  c.head_dim = 64;
  c.qk_rope_head_dim = 16;
  c.q_lora_rank = 64;
  c.o_lora_rank = 32;
  c.o_groups = 2;
  c.moe_intermediate_size = 256;
  c.n_routed_experts = 16;
  c.num_experts_per_tok = 4;
  c.n_shared_experts = 1;
  c.vocab_size = 512;
  c.sliding_window = 8;
  c.compress_ratios = {0, 0, 2, 2, 1, 1, 1, 1};
  c.kv_source_layer_ids = {2, 4};
  c.index_source_layer_ids = {2, 4, 6};
  c.candidate_source_layer_id = 4;
  c.candidate_topk_blocks = 4;
  c.candidate_block_size = 4;
  c.index_n_heads = 4;
  c.index_head_dim = 64;
  c.index_topk = 8;
  c.engram_layer_ids = {1, 4};
  c.engram_max_ngram_size = 4;
  c.engram_n_heads = 2;
  c.engram_head_dim = 32;
  c.engram_vocab_size = 2000;
  c.engram_compressed_vocab_size = 384;
  c.engram_pad_token_id = 2;
  c.rope_theta = 10000;
  c.compress_rope_theta = 160000;
  c.rope_scaling = RopeScaling{16, 32, 1, 256};
  c.max_position_embeddings = 4096;
  finalize(c);
  return c;
}

// ---- JSON -----------------------------------------------------------------------------------

ModelConfig config_from_json(const nlohmann::json& j) {
  const json flat = flatten_config_json(j);
  ModelConfig c = published_unfinalized();
  apply_config_json(c, flat);
  finalize(c);
  auto it = flat.find("engram_num_embeddings");
  if (it != flat.end() && !it->is_null()) {
    auto rows = json_uint_list<uint64_t>(*it, "engram_num_embeddings", UINT64_MAX);
    std::vector<uint64_t> derived;
    for (size_t i = 0; i < c.engram_layer_ids.size(); ++i) derived.push_back(c.engram_rows(i));
    if (rows != derived) bad("engram_num_embeddings", it->dump() + " disagrees with the rows the primes give " + json(derived).dump());
  }
  return c;
}

nlohmann::json config_to_json(const ModelConfig& c, bool with_engram_tables) {
  json j;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["q_lora_rank"] = c.q_lora_rank;
  j["o_lora_rank"] = c.o_lora_rank;
  j["o_groups"] = c.o_groups;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["n_routed_experts"] = c.n_routed_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["n_shared_experts"] = c.n_shared_experts;
  j["vocab_size"] = c.vocab_size;
  j["sliding_window"] = c.sliding_window;
  j["compress_ratios"] = c.compress_ratios;
  j["kv_source_layer_ids"] = c.kv_source_layer_ids;
  j["index_source_layer_ids"] = c.index_source_layer_ids;
  j["candidate_source_layer_id"] = c.candidate_source_layer_id;
  j["candidate_topk_blocks"] = c.candidate_topk_blocks;
  j["candidate_block_size"] = c.candidate_block_size;
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["engram_layer_ids"] = c.engram_layer_ids;
  j["engram_max_ngram_size"] = c.engram_max_ngram_size;
  j["engram_n_heads"] = c.engram_n_heads;
  j["engram_head_dim"] = c.engram_head_dim;
  j["engram_vocab_size"] = c.engram_vocab_size;
  j["engram_compressed_vocab_size"] = c.engram_compressed_vocab_size;
  j["engram_pad_token_id"] = c.engram_pad_token_id;
  if (c.engram_primes.size() == c.engram_layer_ids.size() * c.engram_columns()) {
    std::vector<uint64_t> rows;
    for (size_t i = 0; i < c.engram_layer_ids.size(); ++i) rows.push_back(c.engram_rows(i));
    j["engram_num_embeddings"] = rows;
  }
  j["rope_theta"] = real_json(c.rope_theta);
  j["compress_rope_theta"] = real_json(c.compress_rope_theta);
  j["rope_scaling"] = {{"type", "yarn"},
                       {"factor", real_json(c.rope_scaling.factor)},
                       {"beta_fast", real_json(c.rope_scaling.beta_fast)},
                       {"beta_slow", real_json(c.rope_scaling.beta_slow)},
                       {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = float_json(c.rms_norm_eps);
  j["hc_mult"] = c.hc_mult;
  j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  j["hc_eps"] = float_json(c.hc_eps);
  j["routed_scaling_factor"] = float_json(c.routed_scaling_factor);
  j["swiglu_limit"] = float_json(c.swiglu_limit);
  j["scoring_func"] = c.scoring_func;
  j["hidden_act"] = c.hidden_act;
  j["topk_method"] = c.topk_method;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_id;

  const TensorTypes published_types;
  json types = json::object();
  for (const auto& f : tensor_type_fields()) {
    GgmlType t = tensor_type_field(c.types, f);
    if (t != tensor_type_field(published_types, f)) {
      const TypeTraits* tr = find_type((uint32_t)t);
      types[f] = tr ? std::string(tr->name) : std::to_string((uint32_t)t);
    }
  }
  if (!types.empty()) j["sluice_tensor_types"] = types;

  if (with_engram_tables) {
    // Only tables a reader could not re-derive: the config stays small for synthetic models.
    if (c.engram_compressed_vocab_size == 0 ||
        c.engram_token_map != synthetic_engram_token_map(c.vocab_size, c.engram_compressed_vocab_size))
      j["engram_token_map"] = c.engram_token_map;
    bool primes_derived = false, mults_derived = false;
    try {
      primes_derived = c.engram_primes == derive_engram_primes(c);
      mults_derived = c.engram_multipliers == derive_engram_multipliers(c);
    } catch (const Error&) {
    }
    if (!primes_derived) j["engram_primes"] = c.engram_primes;
    if (!mults_derived) j["engram_multipliers"] = c.engram_multipliers;
  }
  return j;
}

// ---- finalize and roles ---------------------------------------------------------------------

void finalize(ModelConfig& c) {
  if (c.compress_ratios.size() > c.num_hidden_layers) c.compress_ratios.resize(c.num_hidden_layers);
  validate_scalars(c);
  validate_roles(c);
  validate_engram(c);
  validate_types(c);
}

std::vector<LayerRole> layer_roles(const ModelConfig& c) {
  std::vector<LayerRole> roles(c.num_hidden_layers);
  for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerRole& r = roles[l];
    r.ratio = l < c.compress_ratios.size() ? c.compress_ratios[l] : 0;
    if (r.ratio > 0) {
      r.kv_source = largest_at_most(c.kv_source_layer_ids, l);
      r.topk_source = largest_at_most(c.index_source_layer_ids, l);
    }
    r.is_kv_source = contains(c.kv_source_layer_ids, l);
    r.is_index_source = contains(c.index_source_layer_ids, l);
    r.is_candidate_source = l == c.candidate_source_layer_id;
    r.is_candidate_consumer = r.is_index_source && l > c.candidate_source_layer_id;
    for (size_t i = 0; i < c.engram_layer_ids.size(); ++i)
      if (c.engram_layer_ids[i] == l) r.engram_index = (int)i;
  }
  return roles;
}

}  // namespace sluice
