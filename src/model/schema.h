// The published deepseek41 GGUF schema (spec section 2): metadata keys, tensor names, shapes,
// types and order, for any hyperparameters; and validation of a file against it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/config.h"

namespace sluice {

enum class ByteClass { Resident, RoutedExpert, Engram };

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> ne;  // ne[0] first
  GgmlType type;
  ByteClass cls;
  int layer = -1;  // -1 for global tensors
};

// Every tensor in file order: token_embd, output_norm, output, layers 0..n-1, Engram tables last.
std::vector<TensorSpec> deepseek41_tensors(const ModelConfig& c);
// general.* and deepseek41.* keys in the converter's order (general.alignment = 16384 included).
// Tokenizer keys are added separately by the caller.
void add_deepseek41_metadata(const ModelConfig& c, gguf::Writer& w);
constexpr uint32_t kDeepseek41Alignment = 16384;

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
