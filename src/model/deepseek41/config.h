// DeepSeek-V4.1 hyperparameters (spec section 1), the per-layer roles derived from them, and the
// Engram hashing parameters. One struct serves the published model, the tiny preset and any
// generated config: nothing elsewhere may assume 40 layers, 5120 or 384 experts.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kernels/types.h"

namespace sluice {
namespace gguf { class File; class Writer; }

struct RopeScaling {
  double factor = 16;
  double beta_fast = 32;
  double beta_slow = 1;
  uint64_t original_max_position_embeddings = 65536;
  bool operator==(const RopeScaling&) const = default;
};

// Tensor data types per tensor class (the published recipe by default). A generated model may
// choose others (any type with kernels), e.g. to test K-quants or small dims.
struct TensorTypes {
  GgmlType token_embd = GgmlType::F16;
  GgmlType output = GgmlType::Q8_0;
  GgmlType attn = GgmlType::Q8_0;           // q_a, q_b, kv, output_a, output_b
  GgmlType shared_expert = GgmlType::Q8_0;  // gate/up/down shexp
  GgmlType routed_gate_up = GgmlType::IQ2_XXS;
  GgmlType routed_down = GgmlType::Q2_K;
  GgmlType small_f16 = GgmlType::F16;       // hc_*_fn, compressor, indexer, engram_kv
  GgmlType router = GgmlType::F32;          // ffn_gate_inp
  bool operator==(const TensorTypes&) const = default;
};
// The JSON names of the TensorTypes fields ("token_embd", "output", "attn", "shared_expert",
// "routed_gate_up", "routed_down", "small_f16", "router"), in declaration order, and access by name.
const std::vector<std::string>& tensor_type_fields();
GgmlType& tensor_type_field(TensorTypes& t, std::string_view field);  // throws Error if unknown
GgmlType tensor_type_field(const TensorTypes& t, std::string_view field);

struct ModelConfig {
  uint32_t hidden_size = 5120;
  uint32_t num_hidden_layers = 40;
  uint32_t num_attention_heads = 64;
  uint32_t num_key_value_heads = 1;
  uint32_t head_dim = 512;
  uint32_t qk_rope_head_dim = 64;
  uint32_t q_lora_rank = 1280;
  uint32_t o_lora_rank = 1024;
  uint32_t o_groups = 8;
  uint32_t moe_intermediate_size = 2304;
  uint32_t n_routed_experts = 384;
  uint32_t num_experts_per_tok = 6;
  uint32_t n_shared_experts = 1;
  uint32_t vocab_size = 129280;
  uint32_t sliding_window = 128;
  std::vector<uint32_t> compress_ratios;        // exactly num_hidden_layers entries
  std::vector<uint32_t> kv_source_layer_ids;
  std::vector<uint32_t> index_source_layer_ids;
  uint32_t candidate_source_layer_id = 20;
  uint32_t candidate_topk_blocks = 2048;
  uint32_t candidate_block_size = 8;
  uint32_t index_n_heads = 32;
  uint32_t index_head_dim = 128;
  uint32_t index_topk = 512;
  std::vector<uint32_t> engram_layer_ids;
  uint32_t engram_max_ngram_size = 4;
  uint32_t engram_n_heads = 8;
  uint32_t engram_head_dim = 256;
  uint64_t engram_vocab_size = 16000000;
  uint32_t engram_compressed_vocab_size = 99092;
  uint32_t engram_pad_token_id = 2;
  double rope_theta = 10000;
  double compress_rope_theta = 160000;
  RopeScaling rope_scaling;
  uint64_t max_position_embeddings = 1048576;
  float rms_norm_eps = 1e-20f;
  uint32_t hc_mult = 4;
  uint32_t hc_sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float routed_scaling_factor = 1.5f;
  float swiglu_limit = 10.0f;
  std::string scoring_func = "sqrtsoftplus";
  std::string hidden_act = "silu";
  std::string topk_method = "noaux_tc";
  bool norm_topk_prob = true;
  uint32_t bos_token_id = 0;
  uint32_t eos_token_id = 1;

  // Engram hashing (spec 4.2-4.3). Filled by finalize() unless given explicitly.
  std::vector<uint32_t> engram_token_map;    // vocab_size entries: raw id -> compressed id
  std::vector<uint64_t> engram_primes;       // per Engram layer: (max_ngram-1)*n_heads primes
  std::vector<uint64_t> engram_multipliers;  // per Engram layer: max_ngram odd multipliers

  TensorTypes types;

  // Derived sizes.
  uint32_t engram_orders() const { return engram_max_ngram_size - 1; }                 // 3
  uint32_t engram_columns() const { return engram_orders() * engram_n_heads; }         // 24
  uint32_t engram_row_bytes() const { return engram_head_dim + engram_head_dim / 32; } // 264
  uint64_t engram_rows(size_t engram_index) const;  // sum of that layer's primes
  uint32_t engram_pad_compressed() const;           // token_map[engram_pad_token_id]

  bool operator==(const ModelConfig&) const = default;
};

// Role of one layer (spec section 1, "Derived per-layer roles").
struct LayerRole {
  uint32_t ratio = 0;             // compress_ratios[L]
  int kv_source = -1;             // layer whose compressed KV / index keys L reads (-1: none)
  int topk_source = -1;           // layer whose top-k selection L uses (-1: none)
  bool is_kv_source = false;      // owns a compressor + index-key projection
  bool is_index_source = false;   // runs the indexer (own indexer Q)
  bool is_candidate_source = false;
  bool is_candidate_consumer = false;  // index source after the candidate source: searches the pool
  int engram_index = -1;          // position in engram_layer_ids, -1 if no Engram before L
};

ModelConfig published_config();
ModelConfig tiny_config();  // every V4.1 layer role present, runs the test suite in seconds
// The model's own config.json format (spec section 1 keys; `text_config` nesting accepted);
// missing keys take the published values. Calls finalize().
ModelConfig config_from_json(const nlohmann::json& j);
// A config value that must be an integer in [0, max] (integral floats such as 65536.0 accepted,
// as config.json writers emit them); Error names the key. What every integer key is read with.
uint64_t json_uint(const nlohmann::json& v, const std::string& key, uint64_t max);
//
// config_to_json writes every section 1 key (compress_ratios with num_hidden_layers entries,
// engram_num_embeddings derived from the primes), `sluice_tensor_types` with the TensorTypes fields
// that differ from the published recipe, and, when with_engram_tables is set, `engram_token_map` /
// `engram_primes` / `engram_multipliers` for those that differ from what finalize() would derive
// (so config_from_json(config_to_json(c)) == c). The GGUF's deepseek41.config omits the tables:
// they have their own keys. nlohmann::json keeps keys sorted; dump() is compact.
nlohmann::json config_to_json(const ModelConfig& c, bool with_engram_tables = true);
// configs/tiny.json equals tiny_config(); configs/tiny-alt.json is a second valid plan (10
// layers, hc_mult 2, top-2, 3 Engram layers of 2 orders, other tensor types);
// configs/published.json is the published config.json's keys (43 compress_ratios).
// The pieces of config_from_json: merge a `text_config` object over the top level, and overlay
// the known keys present (non-null) in a flattened object onto c without finalizing.
nlohmann::json flatten_config_json(const nlohmann::json& root);
void apply_config_json(ModelConfig& c, const nlohmann::json& flat);
// Derives the Engram token map / primes / multipliers where empty and validates everything
// (role lists sorted and in range, dims divisible, types fit dims). Throws Error naming the key.
// compress_ratios longer than num_hidden_layers is truncated (config.json lists the DSpark
// blocks after the backbone). Idempotent. A finalized config keeps its tables: after editing
// the fields they depend on (vocab, Engram layers/shape), clear them before finalizing again.
void finalize(ModelConfig& c);

// The derivations finalize() uses when the tables are not given:
// * token map (synthetic models only; the real map is data from the tokenizer, spec 4.2):
//   id < C ? id : splitmix64(id) % C, with C = engram_compressed_vocab_size <= vocab_size, so
//   every compressed id occurs and the low ids map to themselves (pad 2 -> 2 as in Flash);
// * primes (spec 4.3): consecutive primes above engram_vocab_size - 1, taken in the order
//   layer, n-gram order, head, never reusing one across layers;
// * multipliers: numpy.random.default_rng(10007 * layer_id).integers(0, B, max_ngram) * 2 + 1,
//   B = (INT64_MAX / C) / 2, so ids[j] * M < 2^63 for every compressed id.
std::vector<uint32_t> synthetic_engram_token_map(uint32_t vocab_size, uint32_t compressed_vocab_size);
std::vector<uint64_t> derive_engram_primes(const ModelConfig& c);
std::vector<uint64_t> derive_engram_multipliers(const ModelConfig& c);
std::vector<LayerRole> layer_roles(const ModelConfig& c);

// numpy.random.default_rng(seed).integers(0, high, size=n, dtype=int64), reproduced exactly
// (SeedSequence + PCG64 + Lemire bounded draws): the Engram multiplier derivation needs it.
std::vector<uint64_t> numpy_default_rng_integers(uint64_t seed, uint64_t high, size_t n);

// GGUF side: reading a config back from deepseek41.* keys (falling back to deepseek41.config for
// anything missing; keys win). Engram tables come from deepseek41.engram.*, bos/eos from the
// tokenizer keys, tensor types from the tensors of layer 0 (and token_embd / output) where present.
// When `disagreements` is given it receives one line per section 1 key whose value in
// deepseek41.config differs from the config built from the keys, and one per deepseek41.config
// value that cannot be parsed and is not supplied by a key (such values are otherwise ignored).
// Calls finalize().
ModelConfig config_from_gguf(const gguf::File& f, std::vector<std::string>* disagreements = nullptr);

}  // namespace sluice
