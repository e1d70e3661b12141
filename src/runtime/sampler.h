// Choosing the next token from a row of logits: greedy (temperature 0) or temperature softmax +
// top-p (nucleus) with a seeded RNG. Every step is defined exactly (ties, cutoff, the uniform draw
// from the generator's raw bits) so a seed reproduces a run wherever std::mt19937_64 and exp agree.
//
// DeepSeek recommends temperature 1.0, top_p 0.95 for V4.1 (spec 3.7); sluice defaults to greedy
// so that runs are comparable with other implementations.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace sluice {

struct SamplerOptions {
  float temp = 0.0f;   // 0: greedy; > 0: softmax(logits / temp)
  float top_p = 1.0f;  // (0, 1]: keep the smallest most-likely prefix whose mass reaches top_p
  uint64_t seed = 0;
};

// Throws Error when temp is negative or not finite, or top_p is outside (0, 1].
void validate(const SamplerOptions& o);

// Index of the largest logit; ties go to the lowest id. NaN entries are never chosen.
// Throws Error when the row is empty or has no non-NaN entry.
uint32_t argmax_lowest(std::span<const float> logits);

struct TokenProb {
  uint32_t id = 0;
  double p = 0;
  bool operator==(const TokenProb&) const = default;
};

// The nucleus: softmax(logits / temp) (in double), sorted by probability descending with ties by
// ascending id, cut after the first prefix whose cumulative probability is >= top_p (all tokens
// when rounding keeps the sum below top_p). Probabilities are the full-softmax ones (not
// renormalised). Throws Error on a NaN logit or when every logit is -inf.
std::vector<TokenProb> nucleus(std::span<const float> logits, float temp, float top_p);

// A double in [0, 1) from the top 53 bits of one 64-bit draw: fixed here rather than
// std::uniform_real_distribution, whose algorithm the standard leaves to the library.
double uniform01(std::mt19937_64& rng);

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& o);  // validates o
  // Greedy consumes no randomness; otherwise exactly one draw per call.
  uint32_t sample(std::span<const float> logits);
  const SamplerOptions& options() const { return opt_; }

 private:
  SamplerOptions opt_;
  std::mt19937_64 rng_;
};

}  // namespace sluice
