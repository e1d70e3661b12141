#include "backend/held_chunk.h"

#include <algorithm>
#include <functional>

namespace sluice {

HeldChunk held_chunk(std::span<const ExpertSource::HeldMemory> spans, const uint8_t* p, uint64_t bytes,
                     uint64_t max_bytes) {
  const std::less<const uint8_t*> before;  // pointers of different spans compare only this way
  for (const ExpertSource::HeldMemory& s : spans) {
    if (!s.base || s.unit == 0 || before(p, s.base) || !before(p, s.base + s.bytes)) continue;
    const uint64_t at = (uint64_t)(p - s.base);
    if (bytes > s.bytes - at || s.unit > max_bytes) return {};
    const uint64_t chunk = max_bytes / s.unit * s.unit;
    const uint64_t lo = at / chunk * chunk, hi = std::min(lo + chunk, s.bytes);
    if (at + bytes > hi) return {};
    return {s.base + lo, s.base + hi};
  }
  return {};
}

}  // namespace sluice
