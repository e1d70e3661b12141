// Choosing the next token from a row of logits: greedy (temperature 0) or temperature softmax +
// top-k / top-p (nucleus) / min-p with a seeded RNG. Every step is defined exactly (ties, cutoff, the uniform draw
// from the generator's raw bits) so a seed reproduces a run wherever std::mt19937_64 and exp agree.
//
// DeepSeek recommends temperature 1.0, top_p 0.95 for V4.1 (spec 3.7); sluice defaults to greedy
// so that runs are comparable with other implementations.
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "util/token_id.h"

namespace sluice {

struct SamplerOptions {
  float temp = 0.0f;   // 0: greedy; > 0: softmax(logits / temp)
  float top_p = 1.0f;  // [0, 1]: keep the smallest most-likely prefix whose mass reaches top_p
                       // (0: only the most likely token)
  uint64_t seed = 0;
  uint32_t top_k = 0;  // > 0: keep at most the top_k most likely tokens; 0: no limit
  float min_p = 0.0f;  // [0, 1]: drop tokens less likely than min_p * the most likely one
};

// Sampling settings as a caller states them, before defaults are filled in: CLI flags of run,
// chat and serve, and the fields of both HTTP APIs. Absent values are not checked.
struct SamplingRequest {
  std::optional<double> temperature, top_p, min_p;
  std::optional<int64_t> top_k, max_tokens;
};

// Ranges every entry point accepts, so `sluice run` and the server refuse the same values
// with the same message (docs/server.md lists them):
constexpr double kMaxTemperature = 100.0;          // temperature: finite, [0, 100]
                                                    // top_p, min_p: [0, 1]
constexpr int64_t kMaxTopK = int64_t{1} << 30;     // top_k: integer, [0, 2^30]; 0 = off
                                                    // max_tokens: integer >= 1
// Throws Error naming the first value out of range (field name, range, the value).
void check_sampling(const SamplingRequest& r);

// check_sampling on the options' values.
void validate(const SamplerOptions& o);

// Index of the largest logit; ties go to the lowest id. NaN entries are never chosen.
// Throws Error when the row is empty or has no non-NaN entry.
TokenId argmax_lowest(std::span<const float> logits);

struct TokenProb {
  TokenId id = 0;
  double p = 0;
  bool operator==(const TokenProb&) const = default;
};

// The nucleus: softmax(logits / temp) (in double), sorted by probability descending with ties by
// ascending id, cut to the first top_k (when > 0), then after the first prefix whose cumulative
// probability is >= top_p (all tokens when rounding keeps the sum below top_p), then tokens with
// p < min_p * p(first) dropped. Probabilities are the full-softmax ones (not renormalised).
// Throws Error on a NaN logit or when every logit is -inf.
std::vector<TokenProb> nucleus(std::span<const float> logits, float temp, float top_p, uint32_t top_k = 0,
                               float min_p = 0.0f);

// A double in [0, 1) from the top 53 bits of one 64-bit draw: fixed here rather than
// std::uniform_real_distribution, whose algorithm the standard leaves to the library.
double uniform01(std::mt19937_64& rng);

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& o);  // validates o
  // Greedy consumes no randomness; otherwise exactly one draw per call.
  TokenId sample(std::span<const float> logits);
  const SamplerOptions& options() const { return opt_; }
  // The generator itself, for draws that belong to this request's sampling (the acceptance tests
  // of speculative decoding, runtime/speculative.h).
  std::mt19937_64& rng() { return rng_; }

 private:
  SamplerOptions opt_;
  std::mt19937_64 rng_;
};

}  // namespace sluice
