// Which rank computes each routed expert: per (layer, expert id), the owner rank. Rank 0 (the
// coordinator) owns a share like every other rank. The map is hashed into the handshake, so
// ranks that disagree on it refuse to start instead of computing the wrong experts.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "util/hash.h"

namespace sluice::fabric {

struct Placement {
  std::string name;  // "balanced", "file"
  uint32_t ranks = 1, layers = 0, experts = 0;
  std::vector<uint8_t> owner;  // [layer * experts + expert]

  int owner_of(uint32_t layer, uint32_t expert) const { return owner[(size_t)layer * experts + expert]; }
  // Experts of every layer `rank` owns.
  uint64_t owned_by(int rank) const;
  Digest128 hash() const;
};

// Contiguous id ranges, the same in every layer: expert e goes to rank e * ranks / experts
// (192 + 192 at 2 ranks and 384 experts, as ds4 and vLLM's expert parallelism split them).
Placement balanced_placement(uint32_t ranks, uint32_t layers, uint32_t experts);

// How often each routed expert was chosen (a run's `--routing-profile FILE`): count[layer *
// experts + expert]. Text: one line per layer, "L: c c c ..." with `experts` counts (lines
// starting with # are comments), the placement file's shape.
struct RoutingProfile {
  uint32_t layers = 0, experts = 0;
  std::vector<uint64_t> count;
};
std::string format_routing_profile(const RoutingProfile& p);
// Throws Error naming the line for anything but a count per expert of every layer.
RoutingProfile parse_routing_profile(const std::string& text, uint32_t layers, uint32_t experts);

// local-first (spec scale-out 3.1): per layer, rank 0 keeps its `local` most chosen experts
// (ties: the lower id), so most terms need no exchange and a layer whose chosen experts are all
// local sends nothing; the rest go to ranks 1.., hottest first, each to the rank with the least
// routing mass so far among those below their even share of the tail (ties: the lower rank), so
// the peers' work and memory stay level. local = 0: rank 0's even share, experts / ranks.
Placement local_first_placement(const RoutingProfile& profile, uint32_t ranks, uint32_t local = 0);

// A placement from text: one line per layer, "L: r r r ..." with `experts` owner ranks (lines
// starting with # are comments). Throws Error naming the line for anything else.
Placement parse_placement(const std::string& text, uint32_t ranks, uint32_t layers, uint32_t experts);

}  // namespace sluice::fabric
