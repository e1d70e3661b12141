// Synthetic deepseek41 GGUF files: the exact published schema (keys, tensor names, shapes,
// types, order, 16 KiB alignment) for any ModelConfig, with random but valid payload whose
// magnitudes keep a forward pass finite. Used by `sluice make-model` and by tests.
//
// Payload is a pure function of (seed, tensor name, row): every row has its own seed, so the
// bytes do not depend on how the writer chunks a tensor, and two runs with the same seed give
// identical files.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "format/gguf.h"
#include "model/deepseek41/config.h"
#include "model/deepseek41/dspark_schema.h"
#include "model/deepseek41/schema.h"
#include "synth/vocab.h"

namespace sluice {

// How one tensor's values are drawn.
enum class InitKind {
  Uniform,     // F32: center + uniform noise of rms `scale` (lets norm weights sit near 1.0)
  Blocks,      // any other type: type_traits(type).random with rms `scale`
  EngramRows,  // I8 Engram table: each row made by the ENGRAM_ROW random generator
};
struct InitRule {
  InitKind kind = InitKind::Blocks;
  float center = 0;
  float scale = 0;
};
// Norm weights ~1, linear weights ~1/sqrt(fan_in), embeddings ~1, hc_*_fn small, biases and
// attention sinks ~0, Engram rows ~0.5.
InitRule init_rule(const TensorSpec& t);

uint64_t tensor_seed(uint64_t seed, std::string_view name);
uint64_t tensor_rows(const TensorSpec& t);       // product of ne[1..]
uint64_t tensor_row_bytes(const TensorSpec& t);  // bytes of one ne[0] row

// Fills rows [first_row, first_row + n_rows) of tensor t into dst (n_rows * row bytes).
void generate_rows(const ModelConfig& c, const TensorSpec& t, uint64_t seed, uint64_t first_row,
                   uint64_t n_rows, void* dst);

// Metadata (deepseek41 keys + tokenizer keys) and tensor records, ready to write.
// Throws Error when the vocabulary size differs from c.vocab_size.
gguf::Writer model_writer(const ModelConfig& c, const Vocab& v);

struct GenerateOptions {
  uint64_t seed = 0;
  bool sparse = false;  // header only; the payload stays a file hole
  Existing existing = Existing::Refuse;  // Replace: an existing regular file at path may be replaced
};
struct GenerateResult {
  uint64_t file_bytes = 0;
  uint64_t data_offset = 0;
  uint64_t tensor_count = 0;
};
// Writes the model to `path` (atomically, util/output_file.h: a failure leaves `path` as it was).
GenerateResult generate_model(const ModelConfig& c, const Vocab& v, const std::string& path,
                              const GenerateOptions& o);

// A DSpark support file (model/deepseek41/dspark_schema.h) for target model c with random but
// valid weights (a seed stream of its own). Throws Error when d does not fit c.
GenerateResult generate_dspark(const DsparkConfig& d, const ModelConfig& c, const std::string& path,
                               const GenerateOptions& o);

}  // namespace sluice
