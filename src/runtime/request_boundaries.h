// How many of a request's checkpoint_at boundaries are kept. Each boundary stops the prefill for a
// checkpoint, a prefix-cache snapshot and (with --kv-disk-dir) a state file, so a request with
// many turns (or, before control tokens came only from the template, one spelling 1,000 markers)
// could cut its prefill into 1-token pieces and write a file per boundary. Bounded per request
// by count, and by distance so no piece is shorter than kMinBoundaryGap tokens; which write
// volume follows: at most kMaxBoundaries + 2 snapshots (the prompt's end, and the token
// before it), each no larger than a state at the context's size.
#pragma once
#include <cstdint>
#include <vector>

namespace sluice {

inline constexpr uint32_t kMaxBoundaries = 8;
inline constexpr uint32_t kMinBoundaryGap = 16;

// `at` sorted and unique. Keeps the first boundary (where conversations that share a system
// prompt diverge) and, from the last backwards, those at least kMinBoundaryGap tokens after the
// previous kept one and before the next, up to kMaxBoundaries in all (the last turns are where
// an edited or extended conversation diverges).
std::vector<uint32_t> bound_boundaries(const std::vector<uint32_t>& at);

}  // namespace sluice
