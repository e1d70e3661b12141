// What one decode token must read, from a model file's tensor records: the figure `sluice bench`
// divides the measured read bandwidth by to get the decode roofline. A decode token reads every
// resident weight once (each linear layer is a GEMV over all its rows) except the embedding
// table (one row), top_k of each layer's routed experts, and its Engram rows.
#pragma once
#include <cstdint>

#include "format/gguf.h"
#include "model/deepseek41/config.h"

namespace sluice {

struct DecodeBytes {
  uint64_t resident = 0;  // dense weights, the embedding row included
  uint64_t experts = 0;   // top_k experts of every layer (the average expert size)
  uint64_t engram = 0;    // the rows of every Engram table a token looks up
  uint64_t total() const { return resident + experts + engram; }
};

DecodeBytes decode_bytes_per_token(const gguf::File& f, const ModelConfig& c);

}  // namespace sluice
