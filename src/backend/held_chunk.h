// Which part of an expert source's memory a device maps to run an expert's slice in place
// (--gpu-experts in-place). A source states the spans its experts lie in
// (ExpertSource::held_memory), each made of whole units no slice straddles; a device maps them
// in chunks of whole units no larger than one storage binding, so every slice lies within one
// chunk and each chunk is mapped once for all the slices it holds.
#pragma once
#include <cstdint>
#include <span>

#include "backend/expert_source.h"

namespace sluice {

struct HeldChunk {
  const uint8_t* lo = nullptr;  // null: no chunk holds the slice
  const uint8_t* hi = nullptr;
};

// The chunk of at most `max_bytes` holding [p, p + bytes): the span that holds it, cut from its
// base into floor(max_bytes / unit) units per chunk (the last one shorter). None when no span
// holds the slice whole, its span's unit exceeds max_bytes, or the slice straddles two chunks
// (a source that broke its contract).
HeldChunk held_chunk(std::span<const ExpertSource::HeldMemory> spans, const uint8_t* p, uint64_t bytes,
                     uint64_t max_bytes);

}  // namespace sluice
