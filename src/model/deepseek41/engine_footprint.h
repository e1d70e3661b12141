// What an Engine allocates, from the shapes alone (no model loaded): the per-sequence state, the
// checkpoint a multi-chunk eval() keeps to roll back to, one chunk's scratch and the resident weights. Engine's
// new_sequence allocates from sequence_shape(), so the state's reported bytes cannot drift from
// what it holds (tests/engine_footprint_test.cpp checks both, and tests/eval_heap_test.cpp
// bounds eval()'s live heap by the scratch and rollback figures). Memory admission
// (runtime/admission.*) plans with these figures.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "format/tensor_type.h"
#include "model/deepseek41/config.h"

namespace sluice {

class Model;

// One KV-source layer's part of a SequenceState (SourceCache).
struct SourceShape {
  uint32_t layer = 0;
  uint32_t ratio = 1;           // compress ratio m: ctx / m compressed rows
  uint64_t rows = 0;            // compressed rows (and index-key rows) held
  uint32_t kv_row_bytes = 0;    // one packed compressed row: head_dim values on the NVFP4 grid
  uint32_t index_row_bytes = 0; // one packed index key: index_head_dim values on the MXFP4 grid
  uint64_t carry_values = 0;    // (m - 1) x head_dim f32 each for carry_k and carry_s
};

// Every array of a SequenceState for ctx positions, in element counts.
struct SequenceShape {
  uint32_t ctx = 0, window = 0, head_dim = 0;
  uint64_t window_values = 0;   // n_layer x window x head_dim BF16 ring rows
  std::vector<SourceShape> sources;  // in kv_source_layer_ids order
  uint32_t engram_history = 0;  // max_ngram - 1 int64 ids
};
SequenceShape sequence_shape(const ModelConfig& c, std::span<const LayerRole> roles, uint32_t ctx);
SequenceShape sequence_shape(const ModelConfig& c, uint32_t ctx);

// Payload bytes of a SequenceState of that shape (the vectors' sizes x element sizes).
struct SequenceStateBytes {
  uint64_t window = 0;          // BF16 window rings
  uint64_t compressed_kv = 0;   // per KV source: ctx/ratio packed rows (head_dim/2 + head_dim/16 B)
  uint64_t index_keys = 0;      // per KV source: ctx/ratio packed keys (index_head_dim/2 + /32 B)
  uint64_t carry = 0;           // per KV source: 2 x (ratio-1) x head_dim f32
  uint64_t engram_history = 0;  // (max_ngram-1) int64
  uint64_t total() const { return window + compressed_kv + index_keys + carry + engram_history; }
};
SequenceStateBytes sequence_state_bytes(const SequenceShape& s);
SequenceStateBytes sequence_state_bytes(const ModelConfig& c, uint32_t ctx);

// One chunk's working set: what eval() allocates for a chunk of `chunk` tokens at positions up
// to ctx, plus the caller's logits rows. An upper bound of the live heap of one chunk (measured:
// tests/eval_heap_test.cpp).
struct ScratchBytes {
  uint64_t workspace = 0;       // the forward's activation tensors (forward_workspace.h), exactly
  uint64_t op_temporaries = 0;  // the CPU backend's temporaries of its widest op
  uint64_t chunk_rows = 0;      // new window / compressed rows, selections, candidate masks, Engram ids
  uint64_t indexer_scores = 0;  // visible compressed rows x 4: one query's scores at a time
  uint64_t engram_reads = 0;    // engram_gather's staging buffer, sorted references and row ids
  uint64_t logits = 0;          // chunk x vocab x 4 (the caller's buffer)
  uint64_t capture = 0;         // DSpark target capture: chunk x capture layers x hidden x 4 (Engine::footprint)
  uint64_t total() const {
    return workspace + op_temporaries + chunk_rows + indexer_scores + engram_reads + logits + capture;
  }
};
ScratchBytes scratch_bytes(const ModelConfig& c, uint32_t chunk, uint32_t ctx);

// Bytes the loader allocates for one resident tensor of `nbytes` (model/model.cpp): F32 vectors
// are decoded into float vectors of the same size, every other tensor is read into a 64-byte
// aligned buffer whose size is rounded up to 64 (aligned_alloc requires a multiple).
uint64_t loaded_tensor_bytes(GgmlType type, uint64_t nbytes);
// The size passed to aligned_alloc for a tensor of nbytes (the same rounding).
uint64_t aligned_tensor_bytes(uint64_t nbytes);

// Everything one engine with one sequence holds.
struct EngineFootprint {
  SequenceStateBytes sequence;  // one sequence
  uint64_t rollback = 0;        // a multi-chunk eval's checkpoint of its start (0 when ctx <= chunk)
  ScratchBytes scratch;
  uint64_t weights = 0;         // resident weights (given: from the tensor list or the loaded model)
  uint64_t total() const { return sequence.total() + rollback + scratch.total() + weights; }
};
// Bytes of Engine::checkpoint at position pos, from the shapes alone (for budgets before any
// checkpoint exists): min(pos, window) ring rows per layer (BF16), each KV source's carry
// (2 x (ratio - 1) x head_dim f32), the Engram history (int64).
uint64_t checkpoint_bytes(const ModelConfig& c, uint32_t pos);
// With routed experts split over processes (EngineOptions::remote): what the forward pass holds
// for one layer's split of `triples` terms (moe_split: every term in order, the local and the
// remote terms as computed, and their index vectors).
uint64_t split_moe_bytes(const ModelConfig& c, uint64_t triples);
// Bytes of Engine::snapshot at pos: checkpoint_bytes plus, per KV source, pos / ratio compressed
// rows and index keys.
uint64_t snapshot_bytes(const ModelConfig& c, uint32_t pos);

EngineFootprint engine_footprint(const ModelConfig& c, uint32_t ctx, uint32_t chunk, uint64_t weight_bytes);

}  // namespace sluice
