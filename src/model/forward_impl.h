// Internals of the Engine shared by forward*.cpp (not part of the public API).
//
// A chunk of tokens is processed layer by layer. Nothing in the SequenceState is written until
// the whole chunk has been computed: new window rows, new compressed rows, the compressor carry
// and the Engram history live in the Chunk and are committed at its end (commit_chunk), so a
// throw anywhere leaves the state as it was.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/types.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/primitives.h"
#include "backend/thread_pool.h"

namespace sluice {

struct NewSourceRows {         // compressed rows a KV-source layer produced in this chunk
  uint32_t first = 0;          // row index of the first new row (= committed rows)
  uint32_t count = 0;
  std::vector<uint16_t> kv;    // [count][head_dim] BF16 bits
  std::vector<uint16_t> ik;    // [count][index_head_dim]
  std::vector<float> carry_k, carry_s;  // working copy of the compressor carry
};

struct Chunk {
  uint32_t index = 0;          // chunk number within the eval() call (test hook)
  uint32_t p0 = 0, n = 0;      // positions p0 .. p0 + n - 1
  const uint32_t* tokens = nullptr;
  const uint8_t* masked = nullptr;  // may be null: nothing masked
  bool tracing = false;
  std::vector<std::vector<uint64_t>> engram_rows;  // [engram index][n * columns]
  std::vector<int64_t> tail;                       // Engram history after this chunk
  std::vector<NewSourceRows> src;                  // per KV-source slot
  std::vector<uint16_t> win;                       // [layer][n][head_dim] new window rows
  std::vector<std::vector<std::vector<int32_t>>> sel;  // [layer][token] selected compressed rows
  std::vector<std::vector<uint8_t>> cand;          // [token] candidate block mask
  std::vector<TokenTrace> trace;                   // n entries when tracing
  bool is_masked(uint32_t i) const { return masked && masked[i]; }
};

struct Engine::Impl {
  const Model& m;
  const ModelConfig& c;
  const std::vector<LayerRole>& roles;
  EngineOptions opt;
  mutable ThreadPool pool;
  const ExpertSource* experts;
  std::vector<std::vector<double>> freqs;  // per layer RoPE table
  std::vector<int> slot;                   // per layer: KV-source slot, -1 if not a source
  DotFn dot_bf16 = nullptr;                // BF16 cache rows x f32 vectors

  Impl(const Model& model, const EngineOptions& o);

  SequenceState new_sequence() const;
  void check_state(const SequenceState& s) const;
  void run_chunk(SequenceState& s, Chunk& ch, float* logits) const;
  void commit_chunk(SequenceState& s, Chunk& ch) const;

  // Stages (forward_engram.cpp, forward_attention.cpp, forward_moe.cpp). X: [n][hc][hidden].
  void engram_ids(Chunk& ch, const SequenceState& s) const;
  void engram(Chunk& ch, uint32_t L, float* X) const;
  void attention(Chunk& ch, const SequenceState& s, uint32_t L, const float* x, float* out) const;
  void compress(Chunk& ch, uint32_t L, const float* x) const;
  void indexer(Chunk& ch, const SequenceState& s, uint32_t L, const float* x, const float* qr,
               const std::vector<RopeAngles>& ang) const;
  void moe(Chunk& ch, uint32_t L, const float* x, float* out) const;
  bool prefetching() const;
  // Experts layer L's router picks for the chunk's tokens given FFN input x (ascending, distinct).
  std::vector<uint32_t> predict_experts(uint32_t L, const Chunk& ch, const float* x) const;

  // Shows a named intermediate to the observer, if any: "l<L>.<what>" (L < 0: "<what>").
  void name(const Chunk& ch, int L, const char* what, const float* data, size_t width, size_t stride) const;

  // Row g of the compressed stream of KV-source slot `sl` (committed or new in this chunk).
  const uint16_t* comp_kv_row(const SequenceState& s, const Chunk& ch, int sl, uint32_t g) const;
  const uint16_t* index_k_row(const SequenceState& s, const Chunk& ch, int sl, uint32_t g) const;
};

}  // namespace sluice
