// The published deepseek41 GGUF schema (spec section 2): metadata keys, tensor names, shapes,
// types and order, for any hyperparameters; and validation of a file against it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/deepseek41/config.h"

namespace sluice {

enum class ByteClass { Resident, RoutedExpert, Engram };

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> ne;  // ne[0] first
  GgmlType type;
  ByteClass cls;
  int layer = -1;  // -1 for global tensors
  // TensorTypes field that chose `type` ("attn", "routed_down", ...); empty for fixed types
  // (F32 norms/biases, I8 Engram tables).
  std::string type_field;
  uint64_t nbytes() const;  // unpadded data bytes (row_bytes(type, ne[0]) * rows)
};

// Every tensor in file order: token_embd, output_norm, output, layers 0..n-1, Engram tables last.
// Within layer L: the 25 tensors every layer has, in the order of spec 2.3's per-layer table
// (hc_attn_fn/base/scale, attn_norm, hc_ffn_fn/base/scale, ffn_norm, attn_sinks, attn_q_a,
// attn_q_a_norm, attn_q_b, attn_kv, attn_kv_a_norm, attn_output_a/b, ffn_gate_inp,
// exp_probs_b, exp_probs_b_vl, ffn_{gate,up,down}_shexp, ffn_{gate,up,down}_exps); then, if L is
// a KV source, attn_compressor_kv, attn_compressor_gate (ratio 2 only), attn_compressor_norm,
// indexer.attn_k, indexer.k_norm; then, if L is an index source, indexer.attn_q_b, indexer.proj;
// then, if an Engram precedes L, engram_q_norm, engram_k_norm, engram_kv. The
// blk.L.engram_embd tables (I8 [row_bytes, rows]) follow all layers, in engram_layer_ids order.
std::vector<TensorSpec> deepseek41_tensors(const ModelConfig& c);
// The 25 tensors of one block in that order (24 without exp_probs_b_vl) under prefix p
// ("blk.L." or a DSpark stage's "mtp.S."), with E routed experts, tagged with `layer`.
void add_block_tensors(std::vector<TensorSpec>& out, const ModelConfig& c, const std::string& p, int layer, uint64_t E,
                       bool image_bias);

// Provenance strings of the general.* / quantization keys. The defaults are the published
// artifact's; `quantization` empty means "describe c.types" (which for the published recipe
// gives "IQ2_XXS gate/up; Q2_K down; Q8_0 attention/shared/head").
struct Deepseek41Provenance {
  std::string name = "DeepSeek V4.1 Flash";
  std::string source_url = "https://huggingface.co/deepseek-ai/DeepSeek-V4.1-Flash";
  std::string source_revision = "df42c109f1defefcbfcedbe7d905718a12266e40";
  std::string quantization;
  std::string calibration = "imatrix";
  std::string imatrix_file = "imatrix.dat";  // the artifact's actual name is not in the spec
};
std::string describe_tensor_types(const TensorTypes& t);

// general.* and deepseek41.* keys in the converter's order (general.alignment = 16384 included),
// then quantize.imatrix.file: 5 general + 53 deepseek41.* + 1 keys.
// Tokenizer keys are added separately by the caller.
void add_deepseek41_metadata(const ModelConfig& c, gguf::Writer& w);
std::vector<gguf::KV> deepseek41_metadata(const ModelConfig& c, const Deepseek41Provenance& p = {});  // the same keys
void add_deepseek41_metadata(const ModelConfig& c, gguf::Writer& w, const Deepseek41Provenance& p);
constexpr uint32_t kDeepseek41Alignment = 16384;

// Byte totals of a tensor list by class (unpadded), and of the data section with every tensor
// padded to `alignment`.
struct SchemaBytes {
  uint64_t resident = 0, routed_expert = 0, engram = 0;
  uint64_t aligned_total = 0;
  uint64_t total() const { return resident + routed_expert + engram; }
};
SchemaBytes schema_bytes(const std::vector<TensorSpec>& tensors, uint64_t alignment = kDeepseek41Alignment);

struct SchemaReport {
  std::vector<std::string> errors;   // empty when the file matches the schema
  uint64_t resident_bytes = 0;       // tensor bytes (unaligned) by class
  uint64_t routed_expert_bytes = 0;
  uint64_t engram_bytes = 0;
  uint64_t expert_bytes_per_layer = 0;  // gate + up + down of one expert in one layer
  uint64_t expert_gate_bytes = 0, expert_up_bytes = 0, expert_down_bytes = 0;
  uint32_t n_layer = 0, n_expert = 0;
};
// Checks every required key and tensor (name, shape, type); never reads payload.
SchemaReport validate_deepseek41(const gguf::File& f);

}  // namespace sluice
