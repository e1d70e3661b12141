// What a routing trace says about expert traffic, per layer (bench/bench_routing.cpp prints it;
// docs/routing.md): how concentrated the router's choices are (popularity entropy, the top 10%'s
// share), how soon an expert comes back (reuse distance), how much of a token's experts the previous
// token used, and how well the engine's next-layer guess (TokenTrace::guessed_experts) matches what
// the layer then selects. Each figure is paired with what uniform independent routing gives, the
// random-weight baseline. Pure functions of the trace, so tests check them on hand-made traces.
#pragma once
#include <cstdint>
#include <vector>

#include "storage/policy_replay.h"

namespace sluice {

struct LayerRouting {
  uint64_t selections = 0;
  double entropy_bits = 0;     // of the layer's expert popularity (selection counts)
  double entropy_norm = 0;     // entropy_bits / log2(n_expert): 1 = uniform
  double top10_share = 0;      // share of selections going to the top_decile_count() most popular experts
  // Tokens since this layer last selected the same expert (first uses excluded). The mean is about
  // n_expert / top_k for ANY routing over a long trace (Kac: an expert used c times in T tokens
  // returns every T / c on average, and it is counted c times), so the median, and the cache
  // replay, are what show locality; the mean only checks the trace.
  double reuse_mean = 0;
  double reuse_median = 0;
  uint64_t reuses = 0;         // selections with a previous use (what the reuse figures average)
  double prev_overlap = 0;     // mean over tokens 1.. of |S_t ∩ S_t-1| / |S_t|
  // The guess for this layer (empty when the trace has none, and for layer 0): recall =
  // guessed ∩ selected / selected, precision = guessed ∩ selected / guessed, summed over tokens.
  uint64_t guessed = 0, selected_with_guess = 0, guess_hits = 0;
  double guess_recall() const { return selected_with_guess ? (double)guess_hits / (double)selected_with_guess : 0.0; }
  double guess_precision() const { return guessed ? (double)guess_hits / (double)guessed : 0.0; }
};

// The experts counted as "the 10% most popular": ceil(n_expert / 10), at least 1.
uint32_t top_decile_count(uint32_t n_expert);

// selected: [token][layer] experts; guessed: the same shape or empty (no guesses recorded).
std::vector<LayerRouting> routing_stats(const storage::RoutingTrace& selected, const storage::RoutingTrace& guessed,
                                        uint32_t n_layer, uint32_t n_expert);

// Uniform independent routing of top_k of n_expert: the top 10%'s share (top_decile_count / n),
// the mean reuse distance (geometric: n / top_k), the previous token's overlap and a guess's
// recall and precision (top_k / n each).
struct UniformRouting {
  double top10_share, reuse_mean, overlap;
};
UniformRouting uniform_routing(uint32_t n_expert, uint32_t top_k);

}  // namespace sluice
