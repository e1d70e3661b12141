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

// A placement from text: one line per layer, "L: r r r ..." with `experts` owner ranks (lines
// starting with # are comments). Throws Error naming the line for anything else.
Placement parse_placement(const std::string& text, uint32_t ranks, uint32_t layers, uint32_t experts);

}  // namespace sluice::fabric
