// The deepseek41 tensor list and metadata (spec 2.2-2.3), for any ModelConfig.
#include "model/deepseek41/schema.h"

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace sluice {

uint64_t TensorSpec::nbytes() const {
  uint64_t rows = 1;
  for (size_t i = 1; i < ne.size(); ++i) rows *= ne[i];
  return row_bytes(type, ne[0]) * rows;
}

void add_block_tensors(std::vector<TensorSpec>& out, const ModelConfig& c, const std::string& p, int l, uint64_t E,
                       bool image_bias) {
  const TensorTypes& ty = c.types;
  const uint64_t H = c.hidden_size;
  auto add = [&](std::string name, std::vector<uint64_t> ne, GgmlType type, const char* field,
                 ByteClass cls = ByteClass::Resident) {
    out.push_back(TensorSpec{std::move(name), std::move(ne), type, cls, l, field});
  };
  const uint64_t hc_flat = (uint64_t)c.hc_mult * H;                  // 4 streams side by side
  const uint64_t hc_mix = (uint64_t)(2 + c.hc_mult) * c.hc_mult;     // pre + post + hc x hc comb
  const uint64_t q_dim = (uint64_t)c.num_attention_heads * c.head_dim;
  const uint64_t o_dim = (uint64_t)c.o_groups * c.o_lora_rank;
  const uint64_t F = c.moe_intermediate_size;
  for (const char* sub : {"attn", "ffn"}) {
    const std::string s = sub;
    add(p + "hc_" + s + "_fn.weight", {hc_flat, hc_mix}, ty.small_f16, "small_f16");
    add(p + "hc_" + s + "_base.weight", {hc_mix}, GgmlType::F32, "");
    add(p + "hc_" + s + "_scale.weight", {3}, GgmlType::F32, "");
    add(p + s + "_norm.weight", {H}, GgmlType::F32, "");
  }
  add(p + "attn_sinks.weight", {c.num_attention_heads}, GgmlType::F32, "");
  add(p + "attn_q_a.weight", {H, c.q_lora_rank}, ty.attn, "attn");
  add(p + "attn_q_a_norm.weight", {c.q_lora_rank}, GgmlType::F32, "");
  add(p + "attn_q_b.weight", {c.q_lora_rank, q_dim}, ty.attn, "attn");
  add(p + "attn_kv.weight", {H, c.head_dim}, ty.attn, "attn");
  add(p + "attn_kv_a_norm.weight", {c.head_dim}, GgmlType::F32, "");
  add(p + "attn_output_a.weight", {q_dim / c.o_groups, o_dim}, ty.attn, "attn");
  add(p + "attn_output_b.weight", {o_dim, H}, ty.attn, "attn");
  add(p + "ffn_gate_inp.weight", {H, E}, ty.router, "router");
  add(p + "exp_probs_b.bias", {E}, GgmlType::F32, "");
  if (image_bias) add(p + "exp_probs_b_vl.bias", {E}, GgmlType::F32, "");
  add(p + "ffn_gate_shexp.weight", {H, F}, ty.shared_expert, "shared_expert");
  add(p + "ffn_up_shexp.weight", {H, F}, ty.shared_expert, "shared_expert");
  add(p + "ffn_down_shexp.weight", {F, H}, ty.shared_expert, "shared_expert");
  add(p + "ffn_gate_exps.weight", {H, F, E}, ty.routed_gate_up, "routed_gate_up", ByteClass::RoutedExpert);
  add(p + "ffn_up_exps.weight", {H, F, E}, ty.routed_gate_up, "routed_gate_up", ByteClass::RoutedExpert);
  add(p + "ffn_down_exps.weight", {F, H, E}, ty.routed_down, "routed_down", ByteClass::RoutedExpert);
}

std::vector<TensorSpec> deepseek41_tensors(const ModelConfig& c) {
  std::vector<TensorSpec> out;
  const TensorTypes& ty = c.types;
  const uint64_t H = c.hidden_size;
  auto add = [&](std::string name, std::vector<uint64_t> ne, GgmlType type, const char* field, int layer,
                 ByteClass cls = ByteClass::Resident) {
    out.push_back(TensorSpec{std::move(name), std::move(ne), type, cls, layer, field});
  };
  add("token_embd.weight", {H, c.vocab_size}, ty.token_embd, "token_embd", -1);
  add("output_norm.weight", {H}, GgmlType::F32, "", -1);
  add("output.weight", {H, c.vocab_size}, ty.output, "output", -1);

  const std::vector<LayerRole> roles = layer_roles(c);
  for (uint32_t L = 0; L < c.num_hidden_layers; ++L) {
    const std::string p = "blk." + std::to_string(L) + ".";
    const int l = (int)L;
    add_block_tensors(out, c, p, l, c.n_routed_experts, /*image_bias=*/true);
    const LayerRole& r = roles[L];
    if (r.is_kv_source) {
      add(p + "attn_compressor_kv.weight", {H, c.head_dim}, ty.small_f16, "small_f16", l);
      if (r.ratio == 2) add(p + "attn_compressor_gate.weight", {H, c.head_dim}, ty.small_f16, "small_f16", l);
      add(p + "attn_compressor_norm.weight", {c.head_dim}, GgmlType::F32, "", l);
      add(p + "indexer.attn_k.weight", {c.head_dim, c.index_head_dim}, ty.small_f16, "small_f16", l);
      add(p + "indexer.k_norm.weight", {c.index_head_dim}, GgmlType::F32, "", l);
    }
    if (r.is_index_source) {
      add(p + "indexer.attn_q_b.weight", {c.q_lora_rank, (uint64_t)c.index_n_heads * c.index_head_dim}, ty.small_f16, "small_f16", l);
      add(p + "indexer.proj.weight", {H, c.index_n_heads}, ty.small_f16, "small_f16", l);
    }
    if (r.engram_index >= 0) {
      add(p + "engram_q_norm.weight", {H, c.hc_mult}, GgmlType::F32, "", l);
      add(p + "engram_k_norm.weight", {H, c.hc_mult}, GgmlType::F32, "", l);
      // E (columns x head_dim) -> one key per stream plus one shared value.
      add(p + "engram_kv.weight", {(uint64_t)c.engram_columns() * c.engram_head_dim, (uint64_t)(c.hc_mult + 1) * H},
          ty.small_f16, "small_f16", l);
    }
  }
  // The tables form a disk-only extent at the end of the file (spec 2.1).
  for (size_t i = 0; i < c.engram_layer_ids.size(); ++i) {
    const uint32_t L = c.engram_layer_ids[i];
    add("blk." + std::to_string(L) + ".engram_embd.weight", {c.engram_row_bytes(), c.engram_rows(i)}, GgmlType::I8, "",
        (int)L, ByteClass::Engram);
  }
  return out;
}

SchemaBytes schema_bytes(const std::vector<TensorSpec>& tensors, uint64_t alignment) {
  SchemaBytes b;
  for (const TensorSpec& t : tensors) {
    const uint64_t n = t.nbytes();
    (t.cls == ByteClass::RoutedExpert ? b.routed_expert : t.cls == ByteClass::Engram ? b.engram : b.resident) += n;
    b.aligned_total += (n + alignment - 1) / alignment * alignment;
  }
  return b;
}

std::string describe_tensor_types(const TensorTypes& t) {
  auto nm = [](GgmlType x) {
    const TypeTraits* r = find_type((uint32_t)x);
    return r ? std::string(r->name) : "type" + std::to_string((uint32_t)x);
  };
  std::string s = nm(t.routed_gate_up) + " gate/up; " + nm(t.routed_down) + " down; ";
  if (t.attn == t.shared_expert && t.attn == t.output) return s + nm(t.attn) + " attention/shared/head";
  return s + nm(t.attn) + " attention; " + nm(t.shared_expert) + " shared; " + nm(t.output) + " head";
}

std::vector<gguf::KV> deepseek41_metadata(const ModelConfig& c, const Deepseek41Provenance& p) {
  using gguf::Value;
  std::vector<gguf::KV> kv;
  struct {
    std::vector<gguf::KV>& kv;
    void add(std::string key, Value v) { kv.push_back(gguf::KV{std::move(key), std::move(v)}); }
  } w{kv};
  auto u32s = [](const auto& v) { return std::vector<uint64_t>(v.begin(), v.end()); };
  w.add("general.architecture", Value::str("deepseek41"));
  w.add("general.name", Value::str(p.name));
  w.add("general.source.url", Value::str(p.source_url));
  w.add("general.source.revision", Value::str(p.source_revision));
  w.add("general.alignment", Value::u32(kDeepseek41Alignment));

  const std::string k = "deepseek41.";
  w.add(k + "config", Value::str(config_to_json(c, false).dump()));
  w.add(k + "engram.encoding", Value::str("e4m3_e8m0_32_row" + std::to_string(c.engram_row_bytes())));
  w.add(k + "engram.storage", Value::str("embedded"));
  w.add(k + "engram.layer_ids", Value::array_u32(u32s(c.engram_layer_ids)));
  std::vector<uint64_t> rows;
  for (size_t i = 0; i < c.engram_layer_ids.size(); ++i) rows.push_back(c.engram_rows(i));
  w.add(k + "engram.rows", Value::array_u32(rows));
  w.add(k + "engram.compressed_vocab_size", Value::u32(c.engram_compressed_vocab_size));
  w.add(k + "engram.pad_id", Value::u32(c.engram_pad_compressed()));
  w.add(k + "engram.token_map", Value::array_u32(u32s(c.engram_token_map)));
  w.add(k + "engram.primes", Value::array_u32(c.engram_primes));
  w.add(k + "engram.multipliers", Value::array_u64(c.engram_multipliers));

  const std::pair<const char*, uint64_t> ints[] = {
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"moe_intermediate_size", c.moe_intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"qk_rope_head_dim", c.qk_rope_head_dim},
      {"q_lora_rank", c.q_lora_rank},
      {"o_lora_rank", c.o_lora_rank},
      {"o_groups", c.o_groups},
      {"n_routed_experts", c.n_routed_experts},
      {"n_shared_experts", c.n_shared_experts},
      {"num_experts_per_tok", c.num_experts_per_tok},
      {"max_position_embeddings", c.max_position_embeddings},
      {"sliding_window", c.sliding_window},
      {"index_n_heads", c.index_n_heads},
      {"index_head_dim", c.index_head_dim},
      {"index_topk", c.index_topk},
      {"candidate_source_layer_id", c.candidate_source_layer_id},
      {"candidate_topk_blocks", c.candidate_topk_blocks},
      {"candidate_block_size", c.candidate_block_size},
      {"hc_mult", c.hc_mult},
      {"hc_sinkhorn_iters", c.hc_sinkhorn_iters},
      {"rope_theta", (uint64_t)c.rope_theta},  // u32 in the published file (finalize() ensures integral)
      {"compress_rope_theta", (uint64_t)c.compress_rope_theta},
  };
  for (auto [name, v] : ints) w.add(k + name, Value::u32((uint32_t)v));
  w.add(k + "rms_norm_eps", Value::f32(c.rms_norm_eps));
  w.add(k + "hc_eps", Value::f32(c.hc_eps));
  w.add(k + "swiglu_limit", Value::f32(c.swiglu_limit));
  w.add(k + "routed_scaling_factor", Value::f32(c.routed_scaling_factor));
  w.add(k + "scoring_func", Value::str(c.scoring_func));
  w.add(k + "hidden_act", Value::str(c.hidden_act));
  w.add(k + "topk_method", Value::str(c.topk_method));
  w.add(k + "norm_topk_prob", Value::boolean(c.norm_topk_prob));
  w.add(k + "compress_ratios", Value::array_u32(u32s(c.compress_ratios)));
  w.add(k + "kv_source_layer_ids", Value::array_u32(u32s(c.kv_source_layer_ids)));
  w.add(k + "index_source_layer_ids", Value::array_u32(u32s(c.index_source_layer_ids)));
  w.add(k + "rope_scaling.factor", Value::f32((float)c.rope_scaling.factor));
  w.add(k + "rope_scaling.beta_fast", Value::f32((float)c.rope_scaling.beta_fast));
  w.add(k + "rope_scaling.beta_slow", Value::f32((float)c.rope_scaling.beta_slow));
  w.add(k + "rope_scaling.original_max_position_embeddings", Value::f32((float)c.rope_scaling.original_max_position_embeddings));
  w.add(k + "quantization", Value::str(p.quantization.empty() ? describe_tensor_types(c.types) : p.quantization));
  w.add(k + "calibration", Value::str(p.calibration));
  w.add("quantize.imatrix.file", Value::str(p.imatrix_file));
  return kv;
}

void add_deepseek41_metadata(const ModelConfig& c, gguf::Writer& w) { add_deepseek41_metadata(c, w, Deepseek41Provenance{}); }

void add_deepseek41_metadata(const ModelConfig& c, gguf::Writer& w, const Deepseek41Provenance& p) {
  for (gguf::KV& kv : deepseek41_metadata(c, p)) w.add(std::move(kv.key), std::move(kv.value));
}

}  // namespace sluice
