#include "runtime/request_boundaries.h"

#include <algorithm>

namespace sluice {

std::vector<uint32_t> bound_boundaries(const std::vector<uint32_t>& at) {
  if (at.empty()) return {};
  const uint32_t first = at.front();
  std::vector<uint32_t> tail;  // kept after the first, last first
  for (auto it = at.rbegin(); it != at.rend() && tail.size() + 1 < kMaxBoundaries; ++it) {
    const uint32_t b = *it;
    if (b < first + kMinBoundaryGap) break;
    if (!tail.empty() && tail.back() - b < kMinBoundaryGap) continue;
    tail.push_back(b);
  }
  std::vector<uint32_t> out{first};
  out.insert(out.end(), tail.rbegin(), tail.rend());
  return out;
}

}  // namespace sluice
