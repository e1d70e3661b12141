// The config-dependent primitives of the forward pass; the rest are in kernels/numerics.h.
#include "model/deepseek41/primitives.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace sluice {

// numerics.md 4: f_i = theta^(-2i/r) in double; YaRN for ratio > 0 layers.
std::vector<double> rope_frequencies(const ModelConfig& c, uint32_t ratio) {
  const uint32_t r = c.qk_rope_head_dim;
  const double theta = ratio == 0 ? c.rope_theta : c.compress_rope_theta;
  std::vector<double> f(r / 2);
  for (uint32_t i = 0; i < r / 2; ++i) f[i] = std::pow(theta, -(double)(2 * i) / (double)r);
  if (ratio == 0) return f;
  const RopeScaling& y = c.rope_scaling;
  const double orig = (double)y.original_max_position_embeddings;
  auto cd = [&](double x) {
    return (double)r * std::log(orig / (2.0 * std::numbers::pi * x)) / (2.0 * std::log(theta));
  };
  const double low = std::max(std::floor(cd(y.beta_fast)), 0.0);
  const double high = std::min(std::ceil(cd(y.beta_slow)), (double)(r - 1));
  const double span = std::max(high - low, 1e-3);
  for (uint32_t i = 0; i < r / 2; ++i) {
    const double ramp = std::clamp(((double)i - low) / span, 0.0, 1.0);
    f[i] = f[i] / y.factor * ramp + f[i] * (1.0 - ramp);
  }
  return f;
}

int64_t engram_compress(const ModelConfig& c, uint32_t token) {
  if (!c.engram_token_map.empty()) return c.engram_token_map.at(token);
  const uint64_t C = c.engram_compressed_vocab_size;
  return token < C ? (int64_t)token : (int64_t)(splitmix64(token) % C);
}

}  // namespace sluice
