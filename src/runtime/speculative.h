// Exact speculative sampling (spec 6.5): which drafts a verify pass accepts and the one token it
// adds after them, so that the emitted sequence has the distribution of plain sampling.
//
// The drafter proposes argmax drafts, so its proposal q_i is a point mass on d_{i+1}: draft
// d_{i+1} is accepted with probability p_i(d_{i+1}) (min(1, p/q) with q = 1); on the first
// rejection the token comes from p_i with d_{i+1} removed and renormalised (the residual
// max(0, p - q) normalised); when all K are accepted a bonus token comes from p_K. p_i is the
// plain sampler's distribution of verify row i (temperature, top-k, top-p, min-p, renormalised),
// so truncation stays exact. Greedy (temperature 0) is the degenerate case: p_i is one-hot, every
// test is certain and no randomness is drawn, so the output equals plain greedy decoding.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "runtime/sampler.h"
#include "util/token_id.h"

namespace sluice {

// The plain sampler's distribution of a row: greedy one-hot on argmax_lowest, else the nucleus
// renormalised to sum 1 (sampler.h), highest probability first.
std::vector<TokenProb> sampling_distribution(std::span<const float> logits, const SamplerOptions& o);

struct Verdict {
  uint32_t accepted = 0;  // drafts accepted, 0 .. K
  TokenId next = 0;       // the correction (first rejection) or the bonus token
};
// p: the K + 1 distributions of verify rows 0 .. K; drafts: d_1 .. d_K (K = drafts.size()).
// One uniform draw per test that is not certain, one per residual or bonus draw that has more
// than one token. Throws Error when p.size() != K + 1 or a distribution is empty.
Verdict verify_point_mass(std::span<const std::vector<TokenProb>> p, std::span<const TokenId> drafts,
                          std::mt19937_64& rng);

}  // namespace sluice
