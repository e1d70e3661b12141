// The expert-parallel wire format (docs/scale-out.md "Frames"). Every message is a 64-byte
// header and a payload whose size the header's counts fix exactly. Nothing in a frame is ever
// used as a pointer, an offset into our memory or a size to allocate before it is checked
// against the limits the receiver already knows (its model's widths, the chunk, the placement).
//
//   Hello    peer -> 0   build, ISA, model identity, placement hash, shape, the peer's admission
//                        (in `rows`, the most rows one exchange may carry there)
//   Welcome  0 -> peer   the job's nonce (every later frame carries it) and, in `rows`, the most
//                        rows a Work frame will carry
//   Refuse   0 -> peer   why the job does not start (text)
//   Work     0 -> peer   one layer's rows: `rows` BF16 activations of `width`, then `triples`
//                        (u32 expert, u32 row, f32 weight), sorted by expert then row
//   Result   peer -> 0   `triples` f32 rows of `width`: each triple's expert output, in order; the
//                        header's last 16 bytes: the peer's expert-store requests and hits so far
//   Failed   peer -> 0   why a Work frame could not be computed (text; the peer keeps serving)
//   Bye      0 -> peer   the job ends; the peer exits 0
//   Hint     0 -> peer   `triples` u32 expert ids (ascending) of layer `layer` that rank 0's router
//                        predicts for the coming layer: the peer may start reading them. No answer.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "util/hash.h"

namespace sluice::fabric {

inline constexpr uint32_t kFrameMagic = 0x5045'4c53;  // "SLEP" little-endian
// 2: a Hello carries the rows its admission holds; a Result, its sender's expert-store counters;
// Hint frames.
inline constexpr uint16_t kProtocolVersion = 2;
inline constexpr size_t kHeaderBytes = 64;
inline constexpr size_t kMaxTextBytes = 4096;
// Message tags: requests to a peer, and what a peer sends back.
inline constexpr uint32_t kTagToPeer = 17, kTagToCoordinator = 18;

enum class Kind : uint16_t { Hello = 1, Welcome = 2, Refuse = 3, Work = 4, Result = 5, Failed = 6, Bye = 7, Hint = 8 };
const char* kind_name(Kind k);

struct Header {
  Kind kind = Kind::Bye;
  uint64_t nonce = 0, seq = 0;
  uint32_t layer = 0, rows = 0, triples = 0, width = 0;
  uint32_t payload = 0;  // bytes after the header
  // A Result's: the sender's expert-store counters so far (header bytes 48..63; zero in every
  // other kind). Zero requests: its experts are resident.
  uint64_t store_requests = 0, store_hits = 0;
};

// What one rank is and holds, compared field by field before any work is sent.
struct Hello {
  std::string build;  // version and compiler (at most 63 bytes)
  std::string isa;    // the kernels' ISA variant (at most 15 bytes): accumulation orders differ
  Digest128 model{};  // model file identity (runtime/state_disk.h model_file_identity)
  Digest128 placement{};
  uint32_t ranks = 0, layers = 0, experts = 0, hidden = 0;
  // The rank's own admission of its experts.
  uint64_t owned_experts = 0, owned_bytes = 0, budget = 0, cache_slots = 0;
  uint8_t resident = 0;
  uint32_t rows = 0;  // the most rows of one exchange its scratch is planned for (the header's rows)
};

struct Hint {
  uint32_t layer = 0;
  std::vector<uint32_t> experts;
};

struct WorkTriple {
  uint32_t expert = 0, row = 0;
  float weight = 0.0f;
};

struct Work {
  Header h;
  std::span<const uint8_t> rows;  // h.rows * h.width BF16 values (little-endian u16), into the message
  std::vector<WorkTriple> triples;
};

// What a receiver checks a frame against.
struct Expect {
  int from = 0;                 // for the messages
  uint64_t nonce = 0;
  uint32_t layers = 0, experts = 0, width = 0, max_rows = 0, max_triples = 0;
};

std::vector<uint8_t> encode_hello(const Hello& h);
// Refuse, Failed (seq: the exchange a Failed answers; 0 when it answers none).
std::vector<uint8_t> encode_text(Kind kind, uint64_t nonce, uint64_t seq, const std::string& text);
// max_rows: the most rows a Work frame of this job carries (the coordinator's chunk).
std::vector<uint8_t> encode_welcome(uint64_t nonce, uint32_t max_rows);
std::vector<uint8_t> encode_bye(uint64_t nonce);
// experts: ascending ids of `layer`.
std::vector<uint8_t> encode_hint(uint64_t nonce, uint32_t layer, std::span<const uint32_t> experts);
// rows: n_rows * width BF16 bits.
std::vector<uint8_t> encode_work(uint64_t nonce, uint64_t seq, uint32_t layer, uint32_t width,
                                 std::span<const uint16_t> rows, std::span<const WorkTriple> triples);
// Header of a Result with `triples` rows of `width` f32 and the sender's expert-store counters;
// the caller appends the rows after it.
std::vector<uint8_t> result_frame(uint64_t nonce, uint64_t seq, uint32_t layer, uint32_t triples, uint32_t width,
                                  uint64_t store_requests = 0, uint64_t store_hits = 0);

// The checks every frame passes: length >= header, magic, version, a known kind, reserved bytes
// zero (a Result's store counters: hits <= requests), payload == length - header. Throws Error "fabric: rank R sent ...".
Header decode_header(std::span<const uint8_t> m, int from);
Hello decode_hello(std::span<const uint8_t> m, int from);
std::string decode_text(std::span<const uint8_t> m, int from);  // printable ASCII, others as '?'
// The nonce, the layer, the width, the counts against their limits, the exact payload size, and
// the triples: expert < experts, row < rows, (expert, row) strictly ascending, finite weights.
Work decode_work(std::span<const uint8_t> m, const Expect& e);
// The nonce, layer < layers, 1 .. experts ids, each < experts, strictly ascending, the exact
// payload size.
Hint decode_hint(std::span<const uint8_t> m, const Expect& e);
// A Result answering (seq, layer, triples): returns its f32 rows (triples * width), into m.
std::span<const uint8_t> decode_result(std::span<const uint8_t> m, const Expect& e, uint64_t seq, uint32_t layer,
                                       uint32_t triples);

// The first field two ranks disagree on ("model file identity", "placement", ...), or "".
std::string hello_mismatch(const Hello& a, const Hello& b);

// Bytes of each frame, the formula the traffic counters are checked against.
inline uint64_t work_frame_bytes(uint64_t rows, uint64_t triples, uint64_t width) {
  return kHeaderBytes + rows * width * 2 + triples * 12;
}
inline uint64_t result_frame_bytes(uint64_t triples, uint64_t width) { return kHeaderBytes + triples * width * 4; }
inline uint64_t hint_frame_bytes(uint64_t experts) { return kHeaderBytes + experts * 4; }

}  // namespace sluice::fabric
