#include "runtime/state_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "util/error.h"
#include "util/file_size_limit.h"

namespace sluice {
namespace {

constexpr uint64_t kKeySeed = 0x73746174656b6579ull;       // "statekey"
constexpr uint32_t kFlagLogits = 1;

// Header offsets (docs/state.md).
constexpr size_t kOffFormat = 8, kOffHeaderBytes = 12, kOffBuild = 16, kOffIdentity = 32, kOffKey = 48, kOffPos = 64,
                 kOffFlags = 68, kOffVocab = 72, kOffSources = 76, kOffFileBytes = 80, kOffChecksum = 88;
constexpr size_t kBuildBytes = 16;

template <class T>
void put(uint8_t* h, size_t off, T v) {
  std::memcpy(h + off, &v, sizeof v);
}
template <class T>
T get(const uint8_t* h, size_t off) {
  T v;
  std::memcpy(&v, h + off, sizeof v);
  return v;
}

std::array<char, kBuildBytes> build_id() {
  std::array<char, kBuildBytes> b{};
  const char* v = SLUICE_VERSION;
  std::memcpy(b.data(), v, std::min(std::strlen(v), kBuildBytes));
  return b;
}

// The payload's sections in file order: tokens, window rings, per KV source its carries, rows
// and index keys, the Engram history, then the logits row.
struct Sections {
  uint64_t tokens, window;
  std::vector<uint64_t> carry, kv, index;  // per source: carry is one of carry_k / carry_s
  uint64_t engram, logits;
};
Sections sections(const StateShape& s, uint32_t pos, bool with_logits) {
  Sections x;
  x.tokens = (uint64_t)pos * sizeof(TokenId);
  x.window = (uint64_t)s.layers * std::min(pos, s.window) * s.head_dim * sizeof(uint16_t);
  for (const StateShape::Source& src : s.sources) {
    const uint32_t ratio = std::max<uint32_t>(1, src.ratio);
    x.carry.push_back((uint64_t)(ratio - 1) * s.head_dim * sizeof(float));
    x.kv.push_back((uint64_t)(pos / ratio) * src.kv_row_bytes);
    x.index.push_back((uint64_t)(pos / ratio) * src.index_row_bytes);
  }
  x.engram = (uint64_t)s.engram_tail * sizeof(int64_t);
  x.logits = with_logits ? (uint64_t)s.vocab * sizeof(float) : 0;
  return x;
}

class Writer {
 public:
  Writer(int fd, const std::string& name, const SipKey& mac_key) : fd_(fd), name_(name), hash_(mac_key) {}
  void bytes(const void* p, uint64_t n, bool hashed = true) {
    if (hashed) hash_.update(p, n);
    const uint8_t* b = static_cast<const uint8_t*>(p);
    while (n) {
      const ssize_t w = ::pwrite(fd_, b, std::min<uint64_t>(n, 1u << 30), (off_t)off_);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw Error(name_ + ": cannot write the state: " + (w < 0 ? write_error_text(errno) : "no progress"));
      b += w, n -= (uint64_t)w, off_ += (uint64_t)w;
    }
  }
  template <class V>
  void vec(const V& v, uint64_t want) {
    if (v.size() * sizeof(v[0]) != want) throw Error(name_ + ": the snapshot does not have the model's shapes");
    if (want) bytes(v.data(), want);
  }
  Digest128 digest() const { return hash_.digest(); }
  void at(uint64_t off) { off_ = off; }

 private:
  int fd_;
  const std::string& name_;
  SipHash128 hash_;
  uint64_t off_ = 0;
};

class Reader {
 public:
  Reader(int fd, const SipKey& mac_key) : fd_(fd), hash_(mac_key) {}
  // false: the file ended (or an I/O error: io_error()).
  bool bytes(void* p, uint64_t n) {
    uint8_t* b = static_cast<uint8_t*>(p);
    const uint64_t want = n;
    while (n) {
      const ssize_t r = ::pread(fd_, b, std::min<uint64_t>(n, 1u << 30), (off_t)off_);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) err_ = errno;
      if (r <= 0) return false;
      b += r, n -= (uint64_t)r, off_ += (uint64_t)r;
    }
    hash_.update(p, want);
    return true;
  }
  template <class T>
  bool vec(std::vector<T>& v, uint64_t n_bytes) {
    v.resize(n_bytes / sizeof(T));
    return n_bytes == 0 || bytes(v.data(), n_bytes);
  }
  void hash(const void* p, size_t n) { hash_.update(p, n); }
  Digest128 digest() const { return hash_.digest(); }
  void at(uint64_t off) { off_ = off; }
  int io_error() const { return err_; }

 private:
  int fd_;
  SipHash128 hash_;
  uint64_t off_ = 0;
  int err_ = 0;
};

StateCheck fail(StateReject r, std::string why) { return StateCheck{r, std::move(why)}; }

std::string hex(const Digest128& d) { return digest_hex(d).data(); }

// The header's checks, in the order that says the most: is it a state file at all, of this
// format, build and model, with this model's shapes, and as long as it says.
StateCheck check_header(const uint8_t* h, uint64_t file_len, const StateShape& shape, const Digest128& identity,
                        StateFileSummary* out) {
  if (std::memcmp(h, kStateMagic, sizeof kStateMagic) != 0) return fail(StateReject::NotState, "not a sluice state file");
  const uint32_t format = get<uint32_t>(h, kOffFormat);
  if (format != kStateFormatVersion || get<uint32_t>(h, kOffHeaderBytes) != kStateHeaderBytes)
    return fail(StateReject::OtherFormat, "state format " + std::to_string(format) + " (this sluice reads " +
                                              std::to_string(kStateFormatVersion) + ")");
  const std::array<char, kBuildBytes> build = build_id();
  if (std::memcmp(h + kOffBuild, build.data(), kBuildBytes) != 0) {
    char other[kBuildBytes + 1] = {};
    std::memcpy(other, h + kOffBuild, kBuildBytes);
    for (char& c : other)
      if (c && (c < 0x20 || c > 0x7e)) c = '?';
    return fail(StateReject::OtherBuild, std::string("written by sluice ") + other + " (this is " + SLUICE_VERSION + ")");
  }
  Digest128 id;
  std::memcpy(id.data(), h + kOffIdentity, id.size());
  if (id != identity) return fail(StateReject::OtherModel, "a state of another model (identity " + hex(id) + ")");
  const uint32_t pos = get<uint32_t>(h, kOffPos), flags = get<uint32_t>(h, kOffFlags);
  if (pos == 0 || pos > shape.ctx || (flags & ~kFlagLogits) != 0 || get<uint32_t>(h, kOffVocab) != shape.vocab ||
      get<uint32_t>(h, kOffSources) != shape.sources.size())
    return fail(StateReject::BadShape, "position " + std::to_string(pos) + ", flags " + std::to_string(flags) +
                                           ", vocabulary " + std::to_string(get<uint32_t>(h, kOffVocab)) +
                                           " or sources " + std::to_string(get<uint32_t>(h, kOffSources)) +
                                           " do not fit this model and a context of " + std::to_string(shape.ctx));
  const bool with_logits = flags & kFlagLogits;
  const uint64_t want = state_file_bytes(shape, pos, with_logits);
  if (get<uint64_t>(h, kOffFileBytes) != want)
    return fail(StateReject::BadShape, "says " + std::to_string(get<uint64_t>(h, kOffFileBytes)) +
                                           " bytes; a state at position " + std::to_string(pos) + " has " +
                                           std::to_string(want));
  if (file_len != want)
    return fail(StateReject::Truncated, std::to_string(file_len) + " bytes of " + std::to_string(want) +
                                            (file_len < want ? " (truncated)" : " (trailing bytes)"));
  if (out) {
    std::memcpy(out->key.data(), h + kOffKey, out->key.size());
    out->pos = pos;
    out->with_logits = with_logits;
    out->bytes = want;
  }
  return {};
}

StateCheck header_of(int fd, const StateShape& shape, const Digest128& identity, uint8_t* h, StateFileSummary* sum) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail(StateReject::Io, std::string("cannot stat: ") + std::strerror(errno));
  Reader r(fd, SipKey{});  // the header alone: its MAC is checked with the payload
  if (!r.bytes(h, kStateHeaderBytes))
    return r.io_error() ? fail(StateReject::Io, std::string("cannot read: ") + std::strerror(r.io_error()))
                        : fail(StateReject::NotState, "shorter than a state file's header");
  return check_header(h, (uint64_t)st.st_size, shape, identity, sum);
}

}  // namespace

const char* state_reject_name(StateReject r) {
  switch (r) {
    case StateReject::None: return "ok";
    case StateReject::NotState: return "not a state file";
    case StateReject::OtherFormat: return "another state format";
    case StateReject::OtherBuild: return "another sluice build";
    case StateReject::OtherModel: return "another model";
    case StateReject::BadShape: return "wrong shape";
    case StateReject::Truncated: return "truncated";
    case StateReject::Checksum: return "signature mismatch";
    case StateReject::Values: return "non-finite values";
    case StateReject::Tokens: return "tokens do not match the key";
    case StateReject::Io: return "I/O error";
  }
  return "?";
}

uint64_t state_file_bytes(const StateShape& s, uint32_t pos, bool with_logits) {
  const Sections x = sections(s, pos, with_logits);
  uint64_t b = kStateHeaderBytes + x.tokens + x.window + x.engram + x.logits;
  for (size_t i = 0; i < x.kv.size(); ++i) b += 2 * x.carry[i] + x.kv[i] + x.index[i];
  return b;
}

namespace {
// The hash of every key starts with the model and, when it has one, the scope (a marker byte
// first, so no token run of the shared scope can spell a scoped key's start).
void key_start(Hasher& h, const Digest128& model_identity, uint64_t scope) {
  h.update(model_identity.data(), model_identity.size());
  if (scope) {
    const uint8_t marker = 0xfe;
    h.update(&marker, 1);
    h.update(&scope, sizeof scope);
  }
}
}  // namespace

Digest128 state_key(const Digest128& model_identity, std::span<const TokenId> tokens, uint64_t scope) {
  Hasher h(kKeySeed);
  key_start(h, model_identity, scope);
  h.update(tokens.data(), tokens.size_bytes());
  return h.digest();
}

std::vector<Digest128> state_keys_at(const Digest128& model_identity, std::span<const TokenId> tokens,
                                     std::span<const uint32_t> lengths, uint64_t scope) {
  Hasher h(kKeySeed);
  key_start(h, model_identity, scope);
  std::vector<Digest128> keys;
  size_t done = 0;
  for (const uint32_t n : lengths) {
    if (n < done || n > tokens.size()) throw Error("state_keys_at: lengths must ascend within the tokens");
    h.update(tokens.data() + done, (n - done) * sizeof(TokenId));
    done = n;
    keys.push_back(h.digest());
  }
  return keys;
}

void write_state_file(int fd, const std::string& name, const StateShape& shape, const Digest128& model_identity,
                      const SipKey& mac_key, std::span<const TokenId> tokens, const SequenceSnapshot& snap,
                      std::span<const float> logits, uint64_t scope) {
  const uint32_t pos = snap.pos();
  const bool with_logits = !logits.empty();
  if (tokens.size() != pos || pos == 0 || (with_logits && logits.size() != shape.vocab) ||
      snap.kv.size() != shape.sources.size() || snap.index_k.size() != shape.sources.size() ||
      snap.ck.carry_k.size() != shape.sources.size() || snap.ck.carry_s.size() != shape.sources.size())
    throw Error(name + ": the snapshot does not have the model's shapes");
  const Sections x = sections(shape, pos, with_logits);
  uint8_t h[kStateHeaderBytes] = {};
  std::memcpy(h, kStateMagic, sizeof kStateMagic);
  put<uint32_t>(h, kOffFormat, kStateFormatVersion);
  put<uint32_t>(h, kOffHeaderBytes, kStateHeaderBytes);
  std::memcpy(h + kOffBuild, build_id().data(), kBuildBytes);
  std::memcpy(h + kOffIdentity, model_identity.data(), model_identity.size());
  const Digest128 key = state_key(model_identity, tokens, scope);
  std::memcpy(h + kOffKey, key.data(), key.size());
  put<uint32_t>(h, kOffPos, pos);
  put<uint32_t>(h, kOffFlags, with_logits ? kFlagLogits : 0);
  put<uint32_t>(h, kOffVocab, shape.vocab);
  put<uint32_t>(h, kOffSources, (uint32_t)shape.sources.size());
  put<uint64_t>(h, kOffFileBytes, state_file_bytes(shape, pos, with_logits));
  // The MAC covers the header (with its MAC field zero) and then the payload.
  Writer w(fd, name, mac_key);
  w.bytes(h, sizeof h);
  if (x.tokens) w.bytes(tokens.data(), x.tokens);
  w.vec(snap.ck.window_kv, x.window);
  for (size_t i = 0; i < shape.sources.size(); ++i) {
    w.vec(snap.ck.carry_k[i], x.carry[i]);
    w.vec(snap.ck.carry_s[i], x.carry[i]);
    w.vec(snap.kv[i], x.kv[i]);
    w.vec(snap.index_k[i], x.index[i]);
  }
  w.vec(snap.ck.engram_tail, x.engram);
  if (with_logits) w.bytes(logits.data(), x.logits);
  const Digest128 sum = w.digest();
  w.at(kOffChecksum);
  w.bytes(sum.data(), sum.size(), false);
}

StateCheck read_state_summary(int fd, const StateShape& shape, const Digest128& model_identity, StateFileSummary* out) {
  uint8_t h[kStateHeaderBytes];
  return header_of(fd, shape, model_identity, h, out);
}

StateCheck read_state_file(int fd, const StateShape& shape, const Digest128& model_identity, const SipKey& mac_key,
                           LoadedState* out, uint32_t expect_pos, uint64_t scope) {
  uint8_t h[kStateHeaderBytes];
  StateFileSummary sum;
  if (StateCheck c = header_of(fd, shape, model_identity, h, &sum); !c) return c;
  if (expect_pos && sum.pos != expect_pos)  // replaced since it was indexed: not read at all
    return StateCheck{StateReject::Tokens, "it holds position " + std::to_string(sum.pos) + ", not the " +
                                               std::to_string(expect_pos) + " it was indexed at (replaced meanwhile)"};
  const Sections x = sections(shape, sum.pos, sum.with_logits);
  Digest128 stored;
  std::memcpy(stored.data(), h + kOffChecksum, stored.size());
  std::memset(h + kOffChecksum, 0, stored.size());
  Reader r(fd, mac_key);
  r.hash(h, sizeof h);
  r.at(kStateHeaderBytes);
  LoadedState ls;
  SequenceSnapshot& s = ls.snap;
  s.ck.pos = sum.pos;
  const size_t n = shape.sources.size();
  s.ck.carry_k.resize(n), s.ck.carry_s.resize(n), s.kv.resize(n), s.index_k.resize(n);
  bool ok = r.vec(ls.tokens, x.tokens) && r.vec(s.ck.window_kv, x.window);
  for (size_t i = 0; ok && i < n; ++i)
    ok = r.vec(s.ck.carry_k[i], x.carry[i]) && r.vec(s.ck.carry_s[i], x.carry[i]) && r.vec(s.kv[i], x.kv[i]) &&
         r.vec(s.index_k[i], x.index[i]);
  ok = ok && r.vec(s.ck.engram_tail, x.engram) && r.vec(ls.logits, x.logits);
  if (!ok)
    return r.io_error() ? fail(StateReject::Io, std::string("cannot read: ") + std::strerror(r.io_error()))
                        : fail(StateReject::Truncated, "ended before its payload (truncated while read)");
  if (r.digest() != stored)
    return fail(StateReject::Checksum, "its signature does not verify (damaged, or not written by this server)");
  if (state_key(model_identity, ls.tokens, scope) != sum.key)
    return fail(StateReject::Tokens, "its tokens do not hash to its key");
  // A signed file is this server's own, but a state must never fail the request that loads it:
  // a logits row that is not finite would (the sampler refuses it), so it is not used.
  for (const float v : ls.logits)
    if (!std::isfinite(v)) return fail(StateReject::Values, "its logits row holds a NaN or an infinity");
  *out = std::move(ls);
  return {};
}

}  // namespace sluice
