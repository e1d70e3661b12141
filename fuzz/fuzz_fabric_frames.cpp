// libFuzzer target for the expert-parallel wire format (src/fabric/frames.h) and placement files:
// every frame a rank receives comes from another process over a link without authentication. The
// first byte picks the input's use: raw bytes as a frame for every decoder; a valid Work frame
// built from a seed and then damaged (xor at offsets from the rest of the input), which reaches
// the triple checks past a header a fuzzer would rarely guess; or text for parse_placement and
// parse_routing_profile (whose accepted profiles must give a local-first placement of the shape).
// Decoders may refuse (an Error naming the cause) but must never crash or read out of bounds, and
// a Work frame they accept must be one encode_work writes, with every triple inside the limits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fabric/frames.h"
#include "fabric/placement.h"
#include "util/error.h"

namespace {

using namespace sluice::fabric;

Expect expect() {
  Expect e;
  e.from = 1;
  e.nonce = 0x1122334455667788ull;
  e.layers = 5;
  e.experts = 24;
  e.width = 6;
  e.max_rows = 4;
  e.max_triples = 24;
  return e;
}

void check_work(const std::vector<uint8_t>& m) {
  const Expect e = expect();
  try {
    const Work w = decode_work(m, e);
    if (w.h.rows > e.max_rows || w.triples.empty() || w.triples.size() > e.max_triples || w.h.layer >= e.layers) std::abort();
    for (size_t i = 0; i < w.triples.size(); ++i) {
      if (w.triples[i].expert >= e.experts || w.triples[i].row >= w.h.rows) std::abort();
      if (i && w.triples[i - 1].expert > w.triples[i].expert) std::abort();
    }
    std::vector<uint16_t> rows(w.rows.size() / 2);
    std::memcpy(rows.data(), w.rows.data(), w.rows.size());
    if (encode_work(w.h.nonce, w.h.seq, w.h.layer, w.h.width, rows, w.triples) != m) std::abort();
  } catch (const sluice::Error&) {
  }
}

void every_decoder(const std::vector<uint8_t>& m) {
  check_work(m);
  try {
    const Expect e = expect();
    const Hint h = decode_hint(m, e);
    if (h.layer >= e.layers || h.experts.empty() || h.experts.size() > e.experts) std::abort();
    for (size_t i = 0; i < h.experts.size(); ++i)
      if (h.experts[i] >= e.experts || (i && h.experts[i - 1] >= h.experts[i])) std::abort();
    if (encode_hint(e.nonce, h.layer, h.experts) != m) std::abort();
  } catch (const sluice::Error&) {
  }
  try {
    decode_hello(m, 2);
  } catch (const sluice::Error&) {
  }
  try {
    if (decode_text(m, 2).size() > kMaxTextBytes) std::abort();
  } catch (const sluice::Error&) {
  }
  try {
    const Expect e = expect();
    const Header h = decode_header(m, 2);
    const std::span<const uint8_t> r = decode_result(m, e, h.seq, h.layer, h.triples);
    if (r.size() != (size_t)h.triples * e.width * 4) std::abort();
  } catch (const sluice::Error&) {
  }
}

std::vector<uint8_t> valid_work(uint8_t seed) {
  const Expect e = expect();
  uint32_t x = seed * 2654435761u + 7;
  auto next = [&] { return x = x * 1664525u + 1013904223u; };
  const uint32_t rows = 1 + next() % e.max_rows;
  std::vector<uint16_t> bits(rows * e.width);
  for (uint16_t& b : bits) b = (uint16_t)next();
  std::vector<WorkTriple> t;
  for (uint32_t ex = 0; ex < e.experts; ++ex)
    for (uint32_t r = 0; r < rows; ++r)
      if (next() % 7 == 0 && t.size() < e.max_triples) t.push_back({ex, r, (float)(next() % 1000) / 997.0f});
  if (t.empty()) t.push_back({0, 0, 1.0f});
  return encode_work(e.nonce, 1 + next() % 100, next() % e.layers, e.width, bits, t);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0] % 3;
  if (mode == 0) {
    every_decoder(std::vector<uint8_t>(data + 1, data + size));
  } else if (mode == 1) {
    if (size < 2) return 0;
    std::vector<uint8_t> m = valid_work(data[1]);
    check_work(m);  // must be accepted as it is
    // Pairs (offset, xor) damage it; a trailing odd byte cuts it.
    size_t i = 2;
    for (; i + 2 <= size; i += 2) m[(data[i] * 7u + data[i + 1]) % m.size()] ^= data[i + 1] | 1;
    if (i < size) m.resize(m.size() * data[i] / 256);
    every_decoder(m);
  } else {
    const std::string text((const char*)data + 1, size - 1);
    try {
      const Placement p = parse_placement(text, 3, 4, 5);
      for (uint8_t o : p.owner)
        if (o >= 3) std::abort();
    } catch (const sluice::Error&) {
    }
    try {
      const RoutingProfile prof = parse_routing_profile(text, 4, 5);
      if (prof.count.size() != 20) std::abort();
      const Placement p = local_first_placement(prof, 3, 1);
      for (uint8_t o : p.owner)
        if (o >= 3) std::abort();
    } catch (const sluice::Error&) {
    }
  }
  return 0;
}
