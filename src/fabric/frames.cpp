#include "fabric/frames.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "util/error.h"

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");

namespace sluice::fabric {

namespace {

constexpr size_t kHelloBytes = 64 + 16 + 16 + 16 + 4 * 4 + 4 * 8 + 1;
constexpr size_t kStoreCountersAt = 48;  // a Result's two u64 counters, to the header's end

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& b) : b_(b) {}
  template <class T>
  void put(T v) {
    const size_t o = b_.size();
    b_.resize(o + sizeof v);
    std::memcpy(b_.data() + o, &v, sizeof v);
  }
  void bytes(const void* p, size_t n) {
    const size_t o = b_.size();
    b_.resize(o + n);
    if (n) std::memcpy(b_.data() + o, p, n);
  }
  void text(const std::string& s, size_t field) {  // fixed width, zero padded
    std::vector<uint8_t> f(field, 0);
    std::memcpy(f.data(), s.data(), std::min(s.size(), field - 1));
    bytes(f.data(), field);
  }

 private:
  std::vector<uint8_t>& b_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> m) : m_(m) {}
  template <class T>
  T get() {
    T v;
    std::memcpy(&v, m_.data() + at_, sizeof v);  // callers checked the length first
    at_ += sizeof v;
    return v;
  }
  std::string text(size_t field) {
    const char* p = (const char*)m_.data() + at_;
    at_ += field;
    return std::string(p, strnlen(p, field));
  }
  void skip(size_t n) { at_ += n; }

 private:
  std::span<const uint8_t> m_;
  size_t at_ = 0;
};

std::vector<uint8_t> header(Kind kind, uint64_t nonce, uint64_t seq, uint32_t layer, uint32_t rows, uint32_t triples,
                            uint32_t width, uint64_t payload) {
  if (payload > UINT32_MAX) throw Error("fabric: a frame payload of " + std::to_string(payload) + " bytes is too long");
  std::vector<uint8_t> b;
  b.reserve(kHeaderBytes + payload);
  Writer w(b);
  w.put(kFrameMagic);
  w.put(kProtocolVersion);
  w.put((uint16_t)kind);
  w.put(nonce);
  w.put(seq);
  w.put(layer);
  w.put(rows);
  w.put(triples);
  w.put(width);
  w.put((uint32_t)payload);
  b.resize(kHeaderBytes, 0);
  return b;
}

Error bad(int from, const std::string& what) { return Error("fabric: rank " + std::to_string(from) + " sent " + what); }

}  // namespace

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Hello: return "Hello";
    case Kind::Welcome: return "Welcome";
    case Kind::Refuse: return "Refuse";
    case Kind::Work: return "Work";
    case Kind::Result: return "Result";
    case Kind::Failed: return "Failed";
    case Kind::Bye: return "Bye";
    case Kind::Hint: return "Hint";
  }
  return "?";
}

std::vector<uint8_t> encode_hello(const Hello& h) {
  std::vector<uint8_t> b = header(Kind::Hello, 0, 0, 0, h.rows, 0, 0, kHelloBytes);
  Writer w(b);
  w.text(h.build, 64);
  w.text(h.isa, 16);
  w.bytes(h.model.data(), 16);
  w.bytes(h.placement.data(), 16);
  for (uint32_t v : {h.ranks, h.layers, h.experts, h.hidden}) w.put(v);
  for (uint64_t v : {h.owned_experts, h.owned_bytes, h.budget, h.cache_slots}) w.put(v);
  w.put(h.resident);
  return b;
}

std::vector<uint8_t> encode_text(Kind kind, uint64_t nonce, uint64_t seq, const std::string& text) {
  const std::string t = text.substr(0, kMaxTextBytes);
  std::vector<uint8_t> b = header(kind, nonce, seq, 0, 0, 0, 0, t.size());
  Writer(b).bytes(t.data(), t.size());
  return b;
}

std::vector<uint8_t> encode_welcome(uint64_t nonce, uint32_t max_rows) {
  return header(Kind::Welcome, nonce, 0, 0, max_rows, 0, 0, 0);
}
std::vector<uint8_t> encode_bye(uint64_t nonce) { return header(Kind::Bye, nonce, 0, 0, 0, 0, 0, 0); }

std::vector<uint8_t> encode_hint(uint64_t nonce, uint32_t layer, std::span<const uint32_t> experts) {
  std::vector<uint8_t> b =
      header(Kind::Hint, nonce, 0, layer, 0, (uint32_t)experts.size(), 0, hint_frame_bytes(experts.size()) - kHeaderBytes);
  Writer w(b);
  for (uint32_t e : experts) w.put(e);
  return b;
}

std::vector<uint8_t> encode_work(uint64_t nonce, uint64_t seq, uint32_t layer, uint32_t width,
                                 std::span<const uint16_t> rows, std::span<const WorkTriple> triples) {
  if (width == 0 || rows.size() % width) throw Error("fabric: work rows are not whole rows of the width");
  const uint64_t n_rows = rows.size() / width;
  std::vector<uint8_t> b = header(Kind::Work, nonce, seq, layer, (uint32_t)n_rows, (uint32_t)triples.size(), width,
                                  work_frame_bytes(n_rows, triples.size(), width) - kHeaderBytes);
  Writer w(b);
  w.bytes(rows.data(), rows.size() * 2);
  for (const WorkTriple& t : triples) {
    w.put(t.expert);
    w.put(t.row);
    w.put(t.weight);
  }
  return b;
}

std::vector<uint8_t> result_frame(uint64_t nonce, uint64_t seq, uint32_t layer, uint32_t triples, uint32_t width,
                                  uint64_t store_requests, uint64_t store_hits) {
  std::vector<uint8_t> b =
      header(Kind::Result, nonce, seq, layer, 0, triples, width, result_frame_bytes(triples, width) - kHeaderBytes);
  std::memcpy(b.data() + kStoreCountersAt, &store_requests, 8);
  std::memcpy(b.data() + kStoreCountersAt + 8, &store_hits, 8);
  return b;
}

Header decode_header(std::span<const uint8_t> m, int from) {
  if (m.size() < kHeaderBytes) throw bad(from, "a frame of " + std::to_string(m.size()) + " bytes (shorter than its header)");
  Reader r(m);
  const uint32_t magic = r.get<uint32_t>();
  if (magic != kFrameMagic) throw bad(from, "a frame with a bad magic");
  const uint16_t version = r.get<uint16_t>();
  if (version != kProtocolVersion)
    throw bad(from, "protocol version " + std::to_string(version) + " (this is " + std::to_string(kProtocolVersion) + ")");
  const uint16_t kind = r.get<uint16_t>();
  if (kind < (uint16_t)Kind::Hello || kind > (uint16_t)Kind::Hint) throw bad(from, "a frame of unknown kind " + std::to_string(kind));
  Header h;
  h.kind = (Kind)kind;
  h.nonce = r.get<uint64_t>();
  h.seq = r.get<uint64_t>();
  h.layer = r.get<uint32_t>();
  h.rows = r.get<uint32_t>();
  h.triples = r.get<uint32_t>();
  h.width = r.get<uint32_t>();
  h.payload = r.get<uint32_t>();
  const size_t reserved_end = h.kind == Kind::Result ? kStoreCountersAt : kHeaderBytes;
  for (size_t i = 44; i < reserved_end; ++i)
    if (m[i]) throw bad(from, "a frame with reserved header bytes set");
  if (h.kind == Kind::Result) {
    std::memcpy(&h.store_requests, m.data() + kStoreCountersAt, 8);
    std::memcpy(&h.store_hits, m.data() + kStoreCountersAt + 8, 8);
    if (h.store_hits > h.store_requests)
      throw bad(from, "a Result whose expert store has more hits (" + std::to_string(h.store_hits) + ") than requests (" +
                          std::to_string(h.store_requests) + ")");
  }
  if ((uint64_t)h.payload != m.size() - kHeaderBytes)
    throw bad(from, std::string("a ") + kind_name(h.kind) + " frame whose header says " + std::to_string(h.payload) +
                        " payload bytes but which has " + std::to_string(m.size() - kHeaderBytes));
  return h;
}

Hello decode_hello(std::span<const uint8_t> m, int from) {
  const Header h = decode_header(m, from);
  if (h.kind != Kind::Hello) throw bad(from, std::string("a ") + kind_name(h.kind) + " frame where a Hello was due");
  if (h.payload != kHelloBytes) throw bad(from, "a Hello of " + std::to_string(h.payload) + " payload bytes");
  Reader r(m);
  r.skip(kHeaderBytes);
  Hello o;
  o.build = r.text(64);
  o.isa = r.text(16);
  for (auto& b : o.model) b = r.get<uint8_t>();
  for (auto& b : o.placement) b = r.get<uint8_t>();
  o.ranks = r.get<uint32_t>();
  o.layers = r.get<uint32_t>();
  o.experts = r.get<uint32_t>();
  o.hidden = r.get<uint32_t>();
  o.owned_experts = r.get<uint64_t>();
  o.owned_bytes = r.get<uint64_t>();
  o.budget = r.get<uint64_t>();
  o.cache_slots = r.get<uint64_t>();
  o.resident = r.get<uint8_t>();
  o.rows = h.rows;
  return o;
}

std::string decode_text(std::span<const uint8_t> m, int from) {
  const Header h = decode_header(m, from);
  if (h.payload > kMaxTextBytes) throw bad(from, "a text of " + std::to_string(h.payload) + " bytes");
  std::string s((const char*)m.data() + kHeaderBytes, h.payload);
  for (char& c : s)
    if (c < 0x20 || c > 0x7e) c = '?';
  return s;
}

Hint decode_hint(std::span<const uint8_t> m, const Expect& e) {
  const Header h = decode_header(m, e.from);
  if (h.kind != Kind::Hint) throw bad(e.from, std::string("a ") + kind_name(h.kind) + " frame where a Hint was due");
  if (h.nonce != e.nonce) throw bad(e.from, "a Hint with another job's nonce");
  if (h.layer >= e.layers) throw bad(e.from, "a Hint for layer " + std::to_string(h.layer) + " (the model has " + std::to_string(e.layers) + ")");
  if (h.triples == 0 || h.triples > e.experts)
    throw bad(e.from, "a Hint of " + std::to_string(h.triples) + " experts (1 .. " + std::to_string(e.experts) + ")");
  if (h.rows || h.width || h.seq) throw bad(e.from, "a Hint with rows, width or an exchange number");
  if ((uint64_t)h.payload + kHeaderBytes != hint_frame_bytes(h.triples))
    throw bad(e.from, "a Hint of " + std::to_string(h.payload) + " payload bytes for " + std::to_string(h.triples) + " experts");
  Hint o;
  o.layer = h.layer;
  o.experts.resize(h.triples);
  Reader r(m);
  r.skip(kHeaderBytes);
  for (uint32_t i = 0; i < h.triples; ++i) {
    o.experts[i] = r.get<uint32_t>();
    if (o.experts[i] >= e.experts)
      throw bad(e.from, "a Hint for expert " + std::to_string(o.experts[i]) + " (the model has " + std::to_string(e.experts) + ")");
    if (i && o.experts[i - 1] >= o.experts[i]) throw bad(e.from, "a Hint whose experts are not strictly ascending");
  }
  return o;
}

Work decode_work(std::span<const uint8_t> m, const Expect& e) {
  Work w;
  w.h = decode_header(m, e.from);
  const Header& h = w.h;
  if (h.kind != Kind::Work) throw bad(e.from, std::string("a ") + kind_name(h.kind) + " frame where Work was due");
  if (h.nonce != e.nonce) throw bad(e.from, "a Work frame with another job's nonce");
  if (h.layer >= e.layers) throw bad(e.from, "Work for layer " + std::to_string(h.layer) + " (the model has " + std::to_string(e.layers) + ")");
  if (h.width != e.width) throw bad(e.from, "Work of width " + std::to_string(h.width) + " (the model's is " + std::to_string(e.width) + ")");
  if (h.rows > e.max_rows) throw bad(e.from, "Work of " + std::to_string(h.rows) + " rows (at most " + std::to_string(e.max_rows) + ")");
  if (h.triples > e.max_triples || h.triples == 0)
    throw bad(e.from, "Work of " + std::to_string(h.triples) + " experts (1 .. " + std::to_string(e.max_triples) + ")");
  if ((uint64_t)h.payload + kHeaderBytes != work_frame_bytes(h.rows, h.triples, h.width))
    throw bad(e.from, "a Work frame of " + std::to_string(h.payload) + " payload bytes for " + std::to_string(h.rows) +
                          " rows and " + std::to_string(h.triples) + " experts");
  w.rows = m.subspan(kHeaderBytes, (size_t)h.rows * h.width * 2);
  Reader r(m);
  r.skip(kHeaderBytes + w.rows.size());
  w.triples.resize(h.triples);
  for (uint32_t i = 0; i < h.triples; ++i) {
    WorkTriple& t = w.triples[i];
    t.expert = r.get<uint32_t>();
    t.row = r.get<uint32_t>();
    t.weight = r.get<float>();
    if (t.expert >= e.experts) throw bad(e.from, "Work for expert " + std::to_string(t.expert) + " (the model has " + std::to_string(e.experts) + ")");
    if (t.row >= h.rows) throw bad(e.from, "Work naming row " + std::to_string(t.row) + " of " + std::to_string(h.rows));
    if (!std::isfinite(t.weight)) throw bad(e.from, "Work with a weight that is not finite");
    if (i && !(w.triples[i - 1].expert < t.expert || (w.triples[i - 1].expert == t.expert && w.triples[i - 1].row < t.row)))
      throw bad(e.from, "Work whose experts are not in ascending order");
  }
  return w;
}

std::span<const uint8_t> decode_result(std::span<const uint8_t> m, const Expect& e, uint64_t seq, uint32_t layer,
                                       uint32_t triples) {
  const Header h = decode_header(m, e.from);
  if (h.kind != Kind::Result) throw bad(e.from, std::string("a ") + kind_name(h.kind) + " frame where a Result was due");
  if (h.nonce != e.nonce) throw bad(e.from, "a Result with another job's nonce");
  if (h.seq != seq || h.layer != layer)
    throw bad(e.from, "the Result of exchange " + std::to_string(h.seq) + " layer " + std::to_string(h.layer) +
                          " where exchange " + std::to_string(seq) + " layer " + std::to_string(layer) + " was due");
  if (h.triples != triples || h.width != e.width || (uint64_t)h.payload + kHeaderBytes != result_frame_bytes(triples, e.width))
    throw bad(e.from, "a Result of " + std::to_string(h.triples) + " rows of width " + std::to_string(h.width) + " where " +
                          std::to_string(triples) + " of " + std::to_string(e.width) + " were due");
  return m.subspan(kHeaderBytes);
}

std::string hello_mismatch(const Hello& a, const Hello& b) {
  if (a.build != b.build) return "build (" + a.build + " vs " + b.build + ")";
  if (a.isa != b.isa) return "kernel ISA (" + a.isa + " vs " + b.isa + ")";
  if (a.model != b.model) return "model file identity (a hash of every byte of the model file)";
  if (a.ranks != b.ranks) return "ranks";
  if (a.layers != b.layers || a.experts != b.experts || a.hidden != b.hidden) return "model shape";
  if (a.placement != b.placement) return "placement";
  return "";
}

}  // namespace sluice::fabric
