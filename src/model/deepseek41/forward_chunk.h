// The transactional bookkeeping of the forward pass, kept apart from its math. A chunk of
// tokens is processed layer by layer; nothing in the SequenceState is written until the whole
// chunk has been computed: new window rows, new compressed rows, the compressor carry and the
// Engram history live in the Chunk and are committed at its end (commit_chunk), so a throw
// anywhere leaves the state as it was. An eval() of several chunks commits them one by one and
// rolls back to a checkpoint of its start (forward_checkpoint.cpp) if a later chunk fails.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "model/deepseek41/config.h"
#include "model/deepseek41/forward.h"
#include "model/deepseek41/sequence_state.h"

namespace sluice {

struct NewSourceRows {         // compressed rows a KV-source layer produced in this chunk
  uint32_t first = 0;          // row index of the first new row (= committed rows)
  uint32_t count = 0;
  std::vector<uint8_t> kv;     // [count] packed compressed rows (kKvGrid)
  std::vector<uint8_t> ik;     // [count] packed index keys (kIndexGrid)
  std::vector<float> carry_k, carry_s;  // working copy of the compressor carry
  std::vector<float> proj_k, proj_s;    // a verify pass's compressor projections (Chunk::keep_projections)
};

// One sequence's share of a Pass: its tokens at positions p0 .. p0 + n - 1, the pass's rows
// row0 .. row0 + n - 1, and the working copies of everything it will commit to its state.
struct Chunk {
  uint32_t p0 = 0, n = 0;      // positions p0 .. p0 + n - 1
  uint32_t row0 = 0;           // its first row in the pass
  const TokenId* tokens = nullptr;
  const uint8_t* masked = nullptr;  // may be null: nothing masked
  bool tracing = false;
  bool keep_projections = false;                   // a verify pass: keep NewSourceRows::proj_k/_s
  std::vector<int64_t> tail;                       // Engram history after this chunk
  std::vector<NewSourceRows> src;                  // per KV-source slot
  std::vector<uint16_t> win;                       // [layer][n][head_dim] new window rows
  std::vector<std::vector<std::vector<int32_t>>> sel;  // [layer][token] selected compressed rows
  std::vector<std::vector<uint8_t>> cand;          // [token] candidate block mask
  std::vector<TokenTrace> trace;                   // n entries when tracing
  bool is_masked(uint32_t i) const { return masked && masked[i]; }

  uint16_t* new_window_rows(uint32_t L, uint32_t head_dim) { return win.data() + (size_t)L * n * head_dim; }
  // Layer L's window: the committed ring of s and this chunk's new rows.
  WindowRows window(const SequenceState& s, uint32_t L) const {
    return WindowRows{s.window_kv.data() + (size_t)L * s.window * s.head_dim,
                      win.data() + (size_t)L * n * s.head_dim, s.window, p0, s.head_dim};
  }
  // KV-source slot sl's compressed rows / index keys: committed in s, new in this chunk.
  CacheRows comp_kv(const SequenceState& s, int sl) const {
    const NewSourceRows& nr = src[(size_t)sl];
    return CacheRows{s.sources[(size_t)sl].kv.data(), nr.kv.data(), nr.first, s.head_dim, kKvGrid};
  }
  CacheRows index_keys(const SequenceState& s, int sl, uint32_t index_head_dim) const {
    const NewSourceRows& nr = src[(size_t)sl];
    return CacheRows{s.sources[(size_t)sl].index_k.data(), nr.ik.data(), nr.first, index_head_dim, kIndexGrid};
  }
};

// One run of the layer loop over the rows of one or more sequences' chunks. eval() runs one
// sequence per pass; eval_batch() several (batched decode), so each layer's weights and routed
// experts are read once for all of them. Per-token ops run over all n rows at once: their
// result for a row depends on that row alone (the linear kernels give the same bits for any
// number of rows, docs/numerics.md), so a sequence's rows are the same in a batch as alone. The
// ops that read or write a sequence's state (window rows, compressor, indexer, attention,
// Engram history) run part by part.
struct Pass {
  uint32_t index = 0;                              // chunk number within the eval() call (test hook)
  uint32_t n = 0;                                  // rows (tokens of all parts)
  std::vector<Chunk*> parts;
  std::vector<SequenceState*> states;              // [part]
  std::vector<TokenId> tokens;                     // [n]
  std::vector<uint8_t> masked;                     // [n]; empty: nothing masked
  std::vector<uint64_t> pos;                       // [n] each row's position in its sequence
  std::vector<std::vector<uint64_t>> engram_rows;  // [engram index][n * columns]
  bool tracing = false;
  std::vector<TokenTrace*> trace;                  // [n] when tracing: the row's part's entry
  bool is_masked(uint32_t i) const { return !masked.empty() && masked[i]; }
  const uint8_t* mask() const { return masked.empty() ? nullptr : masked.data(); }
};

// Lays the parts' rows out one after another (sets each part's row0) and gathers their tokens,
// masks, positions and trace entries. The parts must have been through begin_chunk.
void begin_pass(Pass& p, std::span<Chunk> parts, std::span<SequenceState* const> states);

// Sizes the chunk's working copies for state s (n_layer layers, Engram tables of engram_layers).
void begin_chunk(Chunk& ch, const SequenceState& s, uint32_t n_layer, size_t engram_layers);
// Writes the chunk's new rows, carries and Engram history into s and advances its position.
void commit_chunk(SequenceState& s, Chunk& ch, uint32_t index_head_dim);


}  // namespace sluice
