// The forward pass's activation tensors. They are allocated once per Engine, for its chunk
// size, from one list of shapes (workspace_shapes) — the same list the Engine reports as its
// activation scratch, so what admission plans for and what is allocated cannot drift apart.
// A chunk of n <= chunk tokens uses the first n rows of each.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/deepseek41/config.h"

namespace sluice {

enum class Ws : uint8_t {
  X, X2,            // [chunk][hc x hidden] residual streams before / after the attention
  Xin, Out,         // [chunk][hidden] a sublayer's collapsed input and its output
  MixA, MixF, P0,   // hyper-connection mixes of the attention / FFN; the first layer's pre-weights
  Qr, Q, Kv, Heads, Z,            // attention: q low rank, queries, window row, per-head output, grouped output
  CompK, CompG, Latents, IndexK,  // compressor projections, pooled rows, their index keys
  IndexQ, IndexW,                 // indexer queries and head weights
  Router, RouterNext,             // router logits of this layer and the prefetch guess for the next
  Shared, Routed,                 // shared and routed expert outputs
  EngramRows, EngramKv,           // Engram rows read from the file, their key/value projection
  Count
};

struct TensorShape {
  Ws id;
  const char* name;
  size_t rows = 0, width = 0;
  uint64_t bytes() const { return (uint64_t)rows * width * sizeof(float); }
};
std::vector<TensorShape> workspace_shapes(const ModelConfig& c, uint32_t chunk);
uint64_t workspace_bytes(const ModelConfig& c, uint32_t chunk);

class Workspace {
 public:
  Workspace(const Backend& be, const ModelConfig& c, uint32_t chunk);
  // The first n rows of tensor id.
  Mat operator()(Ws id, size_t n) const { return t_[(size_t)id].m().rows(0, n); }
  uint64_t bytes() const { return bytes_; }

 private:
  std::vector<Tensor> t_;
  uint64_t bytes_ = 0;
};

}  // namespace sluice
