// Per-sequence state of the forward pass (spec section 7): raw window rings, per-KV-source
// compressed caches and index keys, the ratio-m compressor carry and the Engram history.
// Everything is allocated for the context length up front, so a copy is a complete snapshot and
// restore is assignment. A SequenceCheckpoint is the cheap form of a snapshot at one position
// (Engine::checkpoint / Engine::rollback). Window rows are stored as BF16 bits: every value is BF16-exact
// (docs/numerics.md section 5: fake-quant outputs are bf16(q*s)), so this is lossless. Compressed
// rows and index keys are on FP4 grids and stored packed (kernels/fp4_rows.h: codes + scales,
// 288 B per 512-wide row, 68 B per 128-wide key), which unpack to the same BF16 bits.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/fp4_rows.h"

namespace sluice {

// The grids of the cached compressed rows and index keys (docs/numerics.md 5).
inline constexpr Fp4Grid kKvGrid = Fp4Grid::Nvfp4;
inline constexpr Fp4Grid kIndexGrid = Fp4Grid::Mxfp4;

struct SourceCache {              // one per KV-source layer
  uint32_t layer = 0;
  uint32_t ratio = 1;
  std::vector<uint8_t> kv;        // [rows_cap][fp4_row_bytes(Nvfp4, head_dim)] compressed KV
  std::vector<uint8_t> index_k;   // [rows_cap][fp4_row_bytes(Mxfp4, index_head_dim)] index keys
  // Ratio m > 1: the f32 projections k, s of the first (pos mod m) tokens of the open group.
  std::vector<float> carry_k;     // [m-1][head_dim]
  std::vector<float> carry_s;     // [m-1][head_dim]

  bool operator==(const SourceCache&) const = default;
};

class SequenceState {
 public:
  SequenceState() = default;
  uint32_t position() const { return pos; }
  uint32_t context() const { return ctx; }

  // Implementation data (the Engine owns the layout; tests may compare states).
  uint32_t pos = 0;                       // next position; committed only at the end of a chunk
  uint32_t ctx = 0;
  uint32_t window = 0;                    // ring rows per layer
  uint32_t head_dim = 0;
  std::vector<uint16_t> window_kv;        // [n_layer][window][head_dim] ring, row = pos mod window
  std::vector<SourceCache> sources;       // in kv_source_layer_ids order
  std::vector<int64_t> engram_tail;       // compressed ids of the previous tokens, newest first (-1 = DEAD)

  bool operator==(const SequenceState&) const = default;
};

// What a state at `pos` holds that later evaluation overwrites: the window rings (row = position
// mod window, so positions after `pos` reuse them), every KV source's compressor carry and the
// Engram history. The compressed rows and index keys are not saved: they are append-only, and
// the rows of complete groups before `pos` are the same in any later state of the same tokens,
// so truncating them (rollback) recovers the rest.
struct SequenceCheckpoint {
  uint32_t pos = 0;
  std::vector<uint16_t> window_kv;        // [n_layer][min(pos, window)][head_dim]: ring rows 0..
  std::vector<std::vector<float>> carry_k, carry_s;  // per KV source, as in SourceCache
  std::vector<int64_t> engram_tail;

  // Bytes held (the vectors' payloads); equals checkpoint_bytes(config, pos) (model/deepseek41/forward.h).
  uint64_t bytes() const {
    uint64_t b = window_kv.size() * sizeof(uint16_t) + engram_tail.size() * sizeof(int64_t);
    for (const std::vector<float>& v : carry_k) b += v.size() * sizeof(float);
    for (const std::vector<float>& v : carry_s) b += v.size() * sizeof(float);
    return b;
  }
  bool operator==(const SequenceCheckpoint&) const = default;
};

// A complete state at a position in compact form: a checkpoint's parts plus each KV source's
// compressed rows and index keys of the groups before pos (rows 0 .. pos/ratio - 1). A
// checkpoint can only roll back the state it was taken from (the compressed rows must already
// be there); a snapshot restores any state of the same engine (Engine::restore), so the prefix
// cache (runtime/prefix_cache.h) can start one slot's sequence from another slot's prompt.
struct SequenceSnapshot {
  SequenceCheckpoint ck;
  std::vector<std::vector<uint8_t>> kv, index_k;  // per KV source, in kv_source_layer_ids order

  uint32_t pos() const { return ck.pos; }
  // Bytes held; equals snapshot_bytes(config, pos) (model/deepseek41/engine_footprint.h).
  uint64_t bytes() const {
    uint64_t b = ck.bytes();
    for (const std::vector<uint8_t>& v : kv) b += v.size();
    for (const std::vector<uint8_t>& v : index_k) b += v.size();
    return b;
  }
  bool operator==(const SequenceSnapshot&) const = default;
};

// What a DSpark verify pass (Engine::eval_verify) keeps so that Engine::keep_verified can cut
// it back to any prefix of its tokens: the checkpoint of its start and, per KV source of ratio
// > 1, the f32 compressor projections of its tokens (the carry of a position inside the pass).
struct VerifyRecord {
  SequenceCheckpoint before;
  std::vector<uint32_t> tokens;
  std::vector<std::vector<float>> proj_k, proj_s;  // per KV source: [tokens][head_dim] (empty for ratio 1)
};

}  // namespace sluice
