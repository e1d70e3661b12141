// The primitives of the forward pass that read the model config (RoPE frequency tables, the
// Engram token compression); the config-free ones are in kernels/numerics.h.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/numerics.h"
#include "model/deepseek41/config.h"

namespace sluice {

// RoPE frequency table of one layer (numerics.md 4): rope_dim/2 doubles.
// ratio == 0: rope_theta, no YaRN; ratio > 0: compress_rope_theta with YaRN.
std::vector<double> rope_frequencies(const ModelConfig& c, uint32_t ratio);
// Compressed id of a raw token (token map, or the synthetic rule when the map is empty).
int64_t engram_compress(const ModelConfig& c, uint32_t token);

}  // namespace sluice
