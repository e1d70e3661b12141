#include "fabric/placement.h"

#include <algorithm>
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

namespace {

// "L: v v v ..." lines, one per layer, `experts` values each at most max_value; `what` names
// the file kind in errors, `value_name` / `plural` the values.
std::vector<uint64_t> parse_layer_table(const std::string& text, uint32_t layers, uint32_t experts, const char* what,
                                        const char* value_name, const char* plural, uint64_t max_value,
                                        const std::string& max_note) {
  std::vector<uint64_t> v((size_t)layers * experts, 0);
  std::vector<uint8_t> seen(layers, 0);
  std::istringstream in(text);
  std::string line;
  for (uint32_t lineno = 1; std::getline(in, line); ++lineno) {
    const auto bad = [&](const std::string& why) {
      return Error(std::string(what) + " line " + std::to_string(lineno) + ": " + why);
    };
    if (line.empty() || line[0] == '#') continue;
    const char* s = line.data();
    const char* end = s + line.size();
    uint32_t layer = 0;
    auto r = std::from_chars(s, end, layer);
    if (r.ec != std::errc() || r.ptr == end || *r.ptr != ':')
      throw bad(std::string("expected \"LAYER: ") + value_name + " " + value_name + " ...\"");
    if (layer >= layers) throw bad("layer " + std::to_string(layer) + " (the model has " + std::to_string(layers) + ")");
    if (seen[layer]) throw bad("layer " + std::to_string(layer) + " given twice");
    seen[layer] = 1;
    s = r.ptr + 1;
    for (uint32_t e = 0; e < experts; ++e) {
      while (s < end && *s == ' ') ++s;
      uint64_t x = 0;
      r = std::from_chars(s, end, x);
      if (r.ec != std::errc()) throw bad("expert " + std::to_string(e) + ": expected a " + value_name);
      if (x > max_value) throw bad("expert " + std::to_string(e) + ": " + value_name + " " + std::to_string(x) + max_note);
      v[(size_t)layer * experts + e] = x;
      s = r.ptr;
    }
    while (s < end && *s == ' ') ++s;
    if (s != end) throw bad("more than " + std::to_string(experts) + " " + plural + " (one per expert)");
  }
  for (uint32_t l = 0; l < layers; ++l)
    if (!seen[l]) throw Error(std::string(what) + ": no line for layer " + std::to_string(l));
  return v;
}

}  // namespace

Placement parse_placement(const std::string& text, uint32_t ranks, uint32_t layers, uint32_t experts) {
  check_shape(ranks, layers, experts);
  Placement p{"file", ranks, layers, experts, {}};
  const std::vector<uint64_t> v = parse_layer_table(text, layers, experts, "placement", "rank", "owners", ranks - 1,
                                                    " (the job has " + std::to_string(ranks) + ")");
  p.owner.assign(v.begin(), v.end());
  return p;
}

std::string format_routing_profile(const RoutingProfile& p) {
  std::string s = "# sluice routing profile: how often each routed expert was chosen, one line per layer\n";
  for (uint32_t l = 0; l < p.layers; ++l) {
    s += std::to_string(l);
    s += ':';
    for (uint32_t e = 0; e < p.experts; ++e) {
      s += ' ';
      s += std::to_string(p.count[(size_t)l * p.experts + e]);
    }
    s += "\n";
  }
  return s;
}

RoutingProfile parse_routing_profile(const std::string& text, uint32_t layers, uint32_t experts) {
  if (layers == 0 || experts == 0) throw Error("routing profile: a model without routed experts");
  RoutingProfile p{layers, experts, {}};
  p.count = parse_layer_table(text, layers, experts, "routing profile", "count", "counts", UINT64_MAX, "");
  return p;
}

Placement local_first_placement(const RoutingProfile& prof, uint32_t ranks, uint32_t local) {
  const uint32_t E = prof.experts;
  check_shape(ranks, prof.layers, E);
  if (local == 0) local = E / ranks;
  if (local > E || (ranks > 1 && local + (ranks - 1) > E))
    throw Error("placement local-first: rank 0 keeping " + std::to_string(local) + " of " + std::to_string(E) +
                " experts per layer leaves too few for " + std::to_string(ranks - 1) + " other rank(s)");
  if (ranks == 1) local = E;
  Placement p{"local-first", ranks, prof.layers, E, {}};
  p.owner.assign((size_t)prof.layers * E, 0);
  std::vector<uint32_t> order(E);
  for (uint32_t l = 0; l < prof.layers; ++l) {
    const uint64_t* c = prof.count.data() + (size_t)l * E;
    for (uint32_t e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [c](uint32_t a, uint32_t b) { return c[a] > c[b]; });
    const uint32_t tail = E - local, peers = ranks - 1;
    const uint32_t share = peers ? (tail + peers - 1) / peers : 0;  // the most experts a peer takes
    std::vector<uint64_t> mass(ranks, 0);
    std::vector<uint32_t> held(ranks, 0);
    for (uint32_t i = 0; i < E; ++i) {
      const uint32_t e = order[i];
      uint32_t r = 0;
      if (i >= local) {
        r = 0;
        for (uint32_t q = 1; q < ranks; ++q)
          if (held[q] < share && (r == 0 || mass[q] < mass[r])) r = q;
      }
      p.owner[(size_t)l * E + e] = (uint8_t)r;
      mass[r] += c[e];
      held[r] += 1;
    }
  }
  return p;
}

}  // namespace sluice::fabric
