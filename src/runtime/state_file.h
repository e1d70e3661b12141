// The on-disk form of a sequence state (--kv-disk-dir; docs/state.md is the format's reference).
// One file holds one SequenceSnapshot with the tokens that produced it and, at a prompt's end,
// the row of logits after its last token. A file is named by its key, a hash of the model's
// identity and the token prefix, so it is found again by whoever evaluates the same tokens on
// the same model, after a restart too. Everything read back is outside input: the header is
// checked against what this build and this model expect before anything is allocated (sizes
// follow from the model's shape and the position, never from the file), the whole file against
// its MAC (SipHash-2-4 under the state directory's secret key, so a file is only read back
// by the server that can sign it), and the tokens against the key; any mismatch is reported with its cause and the
// state is recomputed, never used.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/deepseek41/sequence_state.h"
#include "util/hash.h"
#include "util/siphash.h"
#include "util/token_id.h"

namespace sluice {

// Raise with any change to the layout below or to what a state means (the numerics that
// produce it): files of another version are ignored, never read.
inline constexpr uint32_t kStateFormatVersion = 2;  // 2: the checksum became a keyed MAC
inline constexpr char kStateMagic[8] = {'S', 'L', 'U', 'I', 'C', 'E', 'S', 'T'};
inline constexpr uint32_t kStateHeaderBytes = 128;

// The shapes a snapshot of one model has (from its config; runtime/state_disk.h makes it).
struct StateShape {
  struct Source {
    uint32_t ratio = 1;
    uint32_t kv_row_bytes = 0, index_row_bytes = 0;
  };
  uint32_t layers = 0, window = 0, head_dim = 0;
  uint32_t ctx = 0;          // positions a state may hold (this session's context)
  uint32_t vocab = 0;        // a logits row's length
  uint32_t engram_tail = 0;  // Engram history entries
  std::vector<Source> sources;
};

// The file's size for a state at pos (pos tokens), with or without its logits row.
uint64_t state_file_bytes(const StateShape& s, uint32_t pos, bool with_logits);

// The key of a token prefix on a model, in a scope (serve: the API key's; 0: shared): the file's
// name. A scope's keys are not another's, so a prompt finds only its own scope's files.
Digest128 state_key(const Digest128& model_identity, std::span<const TokenId> tokens, uint64_t scope = 0);
// Keys of the prefixes of `tokens` of each length in `lengths` (ascending, each <= tokens.size()),
// in one pass over the tokens.
std::vector<Digest128> state_keys_at(const Digest128& model_identity, std::span<const TokenId> tokens,
                                     std::span<const uint32_t> lengths, uint64_t scope = 0);

// Writes the file to fd (at offset 0, an empty file) and checks every write. Throws Error
// naming `name` and the cause.
void write_state_file(int fd, const std::string& name, const StateShape& shape, const Digest128& model_identity,
                      const SipKey& mac_key, std::span<const TokenId> tokens, const SequenceSnapshot& snap,
                      std::span<const float> logits, uint64_t scope = 0);

// What a header says, once it is known to be a file of this format, build and model whose
// sizes agree with the shape and the file's length.
struct StateFileSummary {
  Digest128 key{};
  uint32_t pos = 0;
  bool with_logits = false;
  uint64_t bytes = 0;
};
// Why a file is not used. NotState, OtherFormat, OtherBuild and OtherModel are files that are not
// this model's states (left alone); the others are this model's and damaged.
enum class StateReject : uint8_t {
  None, NotState, OtherFormat, OtherBuild, OtherModel, BadShape, Truncated, Checksum, Tokens, Values, Io
};
const char* state_reject_name(StateReject r);

struct StateCheck {
  StateReject reject = StateReject::None;
  std::string why;  // the cause in words
  explicit operator bool() const { return reject == StateReject::None; }
};

// Reads and checks the header only (and the file's length).
StateCheck read_state_summary(int fd, const StateShape& shape, const Digest128& model_identity, StateFileSummary* out);

struct LoadedState {
  std::vector<TokenId> tokens;
  SequenceSnapshot snap;
  std::vector<float> logits;  // empty without a logits row
};
// Reads the whole file, checks the header, the MAC under mac_key, that the tokens hash to the key
// and that the logits row is finite.
// expect_pos (0: any): the position the caller looked it up at; a header with another position
// is refused before anything past the header is read.
StateCheck read_state_file(int fd, const StateShape& shape, const Digest128& model_identity, const SipKey& mac_key,
                           LoadedState* out, uint32_t expect_pos = 0, uint64_t scope = 0);

}  // namespace sluice
