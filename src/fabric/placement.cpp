#include "fabric/placement.h"

#include <charconv>
#include <sstream>

#include "util/error.h"

namespace sluice::fabric {

namespace {

void check_shape(uint32_t ranks, uint32_t layers, uint32_t experts) {
  if (ranks == 0 || ranks > 255) throw Error("placement: " + std::to_string(ranks) + " ranks (1 .. 255 supported)");
  if (layers == 0 || experts == 0) throw Error("placement: a model without routed experts");
  if (ranks > experts)
    throw Error("placement: " + std::to_string(ranks) + " ranks for " + std::to_string(experts) + " experts per layer");
}

}  // namespace

uint64_t Placement::owned_by(int rank) const {
  uint64_t n = 0;
  for (uint8_t r : owner) n += r == rank;
  return n;
}

Digest128 Placement::hash() const {
  Hasher h(0x706c6163656dull);  // "placem"
  const uint32_t dims[3] = {ranks, layers, experts};
  h.update(dims, sizeof dims);
  h.update(owner.data(), owner.size());
  return h.digest();
}

Placement balanced_placement(uint32_t ranks, uint32_t layers, uint32_t experts) {
  check_shape(ranks, layers, experts);
  Placement p{"balanced", ranks, layers, experts, {}};
  p.owner.resize((size_t)layers * experts);
  for (uint32_t l = 0; l < layers; ++l)
    for (uint32_t e = 0; e < experts; ++e) p.owner[(size_t)l * experts + e] = (uint8_t)((uint64_t)e * ranks / experts);
  return p;
}

Placement parse_placement(const std::string& text, uint32_t ranks, uint32_t layers, uint32_t experts) {
  check_shape(ranks, layers, experts);
  Placement p{"file", ranks, layers, experts, {}};
  p.owner.assign((size_t)layers * experts, 0);
  std::vector<uint8_t> seen(layers, 0);
  std::istringstream in(text);
  std::string line;
  for (uint32_t lineno = 1; std::getline(in, line); ++lineno) {
    const auto bad = [&](const std::string& why) {
      return Error("placement line " + std::to_string(lineno) + ": " + why);
    };
    if (line.empty() || line[0] == '#') continue;
    const char* s = line.data();
    const char* end = s + line.size();
    uint32_t layer = 0;
    auto r = std::from_chars(s, end, layer);
    if (r.ec != std::errc() || r.ptr == end || *r.ptr != ':') throw bad("expected \"LAYER: rank rank ...\"");
    if (layer >= layers) throw bad("layer " + std::to_string(layer) + " (the model has " + std::to_string(layers) + ")");
    if (seen[layer]) throw bad("layer " + std::to_string(layer) + " given twice");
    seen[layer] = 1;
    s = r.ptr + 1;
    for (uint32_t e = 0; e < experts; ++e) {
      while (s < end && *s == ' ') ++s;
      uint32_t rank = 0;
      r = std::from_chars(s, end, rank);
      if (r.ec != std::errc()) throw bad("expert " + std::to_string(e) + ": expected a rank");
      if (rank >= ranks) throw bad("expert " + std::to_string(e) + ": rank " + std::to_string(rank) + " (the job has " + std::to_string(ranks) + ")");
      p.owner[(size_t)layer * experts + e] = (uint8_t)rank;
      s = r.ptr;
    }
    while (s < end && *s == ' ') ++s;
    if (s != end) throw bad("more than " + std::to_string(experts) + " owners (one per expert)");
  }
  for (uint32_t l = 0; l < layers; ++l)
    if (!seen[l]) throw Error("placement: no line for layer " + std::to_string(l));
  return p;
}

}  // namespace sluice::fabric
