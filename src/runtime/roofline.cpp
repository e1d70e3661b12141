#include "runtime/roofline.h"

#include <string_view>

namespace sluice {

DecodeBytes decode_bytes_per_token(const gguf::File& f, const ModelConfig& c) {
  DecodeBytes b;
  for (const gguf::TensorInfo& t : f.tensors()) {
    const std::string_view name = t.name;
    if (name.find(".engram_embd.") != std::string_view::npos) continue;  // counted by rows below
    if (name.find("_exps.") != std::string_view::npos) {
      const uint64_t n_expert = t.n_dims >= 3 && t.ne[2] ? t.ne[2] : c.n_routed_experts;
      b.experts += t.nbytes / n_expert * c.num_experts_per_tok;
    } else if (name == "token_embd.weight") {
      b.resident += t.row_bytes();
    } else {
      b.resident += t.nbytes;
    }
  }
  b.engram = (uint64_t)c.engram_layer_ids.size() * c.engram_columns() * c.engram_row_bytes();
  return b;
}

}  // namespace sluice
