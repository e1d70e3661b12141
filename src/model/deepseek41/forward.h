// sluice's CPU forward pass of DeepSeek-V4.1 (spec sections 3-4, precision per docs/numerics.md).
//
// Determinism contract: the logits and every cache row of a position depend only on the tokens
// before it, never on how they were split into eval() calls or chunks, on the thread count or on
// the run. Each per-token computation is one function whatever the chunk; threads split output
// rows (each output element is computed by one thread with the scalar-defined kernel).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/deepseek41/config.h"
#include "model/deepseek41/engine_footprint.h"
#include "model/deepseek41/engram.h"
#include "model/model.h"
#include "model/remote_experts.h"
#include "model/deepseek41/sequence_state.h"
#include "util/token_id.h"

namespace sluice {

class Backend;

// Named intermediates of the forward pass (`sluice run --dump-tensors`, docs/backends.md): each
// one is shown once per chunk as n positions p0 .. p0 + n - 1 of `width` floats (position i at
// data + i * stride), named "<tensor>" or "l<layer>.<tensor>". Observing never changes a result.
class TensorObserver {
 public:
  virtual ~TensorObserver() = default;
  virtual bool wants(std::string_view name) const = 0;
  virtual void observe(std::string_view name, uint32_t p0, uint32_t n, const float* data, size_t width,
                       size_t stride) = 0;
};

struct EngineOptions {
  int threads = 1;        // of the CPU backend the Engine makes when `backend` is null
  // Where the ops run (src/backend). Null: a CpuBackend of `threads` threads owned by the Engine.
  // Must outlive the Engine, and be the backend that prepared the model's weights.
  const Backend* backend = nullptr;
  uint32_t ctx = 4096;    // positions a sequence may hold (state is allocated for it up front)
  uint32_t chunk = 64;    // tokens processed together, layer by layer (weights streamed once)
  // Test hooks: throw sluice::Error when processing layer fail_at_layer of the
  // fail_at_chunk-th chunk (0-based) of one eval() call. -1: never.
  int fail_at_layer = -1;
  uint32_t fail_at_chunk = 0;
  // Routed experts come from here when set (a streaming store); otherwise from the model's
  // resident weights. Must outlive the Engine.
  const ExpertSource* experts = nullptr;
  // With `experts` set: hint each layer's experts before computing its shared expert (so reads
  // overlap it) and the next layer's predicted experts (its router on this layer's FFN input).
  // Results are the same either way; only what is read, and when, changes.
  bool prefetch = true;
  // Cache-aware routing, LOSSY, off at 0 (--route-bias D): with `experts` set, D is added to the
  // selection score of each expert the source already holds (ExpertSource::cached, one snapshot
  // per layer per chunk), so a near-tie goes to an expert that costs no read. Only the choice
  // moves; the mixing weights of the chosen experts are still their unbiased scores, normalized.
  // With it on, results depend on what the cache holds (its size, its history, prefetch), so the
  // bit-identity guarantees across cache sizes and chunkings no longer hold.
  float route_bias = 0.0f;
  // Engram rows kept per Engram table after they are read (model/deepseek41/engram_cache.h;
  // engram_cache_bytes() is its size, allocated at construction); 0: none. Only I/O changes.
  uint64_t engram_cache_rows = 0;
  // Test hook: fill TokenTrace::ffn_inputs (copies; results are unchanged).
  bool trace_ffn_inputs = false;
  // Shown every named intermediate when set (one eval() at a time). Must outlive the Engine.
  TensorObserver* observer = nullptr;
  // DSpark target capture (spec 6.3 step 1): for each listed layer, in this order, the plain
  // mean of the hc streams entering it (after its Engram when it has one), BF16, written to
  // BatchItem::hidden of the items that give one (capture_layers.size() x hidden_size floats per
  // token). Empty: nothing is captured.
  std::vector<uint32_t> capture_layers;
  // Expert parallelism (docs/scale-out.md): the routed experts `remote` does not call local are
  // computed by other processes; results have the same bits. Null: every expert here. Must
  // outlive the Engine.
  const RemoteExperts* remote = nullptr;
};

struct TokenTrace {                                   // one per evaluated position
  std::vector<std::vector<uint64_t>> engram_rows;     // [engram layer][columns] row ids
  std::vector<std::vector<uint32_t>> experts;         // [layer][k] routed expert ids (selection order: descending score)
  std::vector<std::vector<float>> expert_weights;     // [layer][k]
  std::vector<std::vector<uint32_t>> guessed_experts; // [layer] ascending: what the read-ahead guessed for
                                                      // this layer from the previous layer's FFN input
                                                      // (its router there; forward_moe.cpp), made only
                                                      // with streamed experts and prefetch on; empty for
                                                      // layer 0 and otherwise
  std::vector<std::vector<int32_t>> selected_rows;    // [layer] compressed row indices selected
                                                      // (index-source layers; empty otherwise), ascending
  std::vector<std::vector<float>> ffn_inputs;         // [layer][hidden] the router's input f_in, filled
                                                      // only when EngineOptions::trace_ffn_inputs
};

// Model, LoadOptions, load_model() and model_config() are declared in model/model.h:
//   std::unique_ptr<Model> load_model(const std::string& gguf_path, const LoadOptions& o = {});
//   const ModelConfig& model_config(const Model&);

class Engine {
 public:
  Engine(const Model& m, EngineOptions o);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // A fresh sequence at position 0, allocated for options.ctx positions. Copying a state is a
  // snapshot; assigning a copy back restores it.
  SequenceState new_sequence() const;
  // What this engine allocates: one sequence's state, eval()'s rollback checkpoint, one chunk's scratch,
  // and the weights its model loaded (model/deepseek41/engine_footprint.h).
  EngineFootprint footprint() const;
  // Back to position 0 without reallocating (same result as new_sequence() for s's ctx).
  void reset(SequenceState& s) const;
  // The parts of s that a later eval overwrites (see SequenceCheckpoint), at s's position.
  SequenceCheckpoint checkpoint(const SequenceState& s) const;
  // Back to the checkpoint's position: restores its parts and truncates the compressed rows
  // (zeroing the rows past it, as a fresh state has them), so s equals, bit for bit, the state
  // a fresh sequence reaches by evaluating the same first ck.pos tokens. The caller guarantees
  // that s holds those tokens: ck was taken from s or from a state s grew from without being
  // rolled back before ck.pos since. Throws Error (s unchanged) when ck is not this model's or
  // lies beyond s's position.
  void rollback(SequenceState& s, const SequenceCheckpoint& ck) const;
  // The whole of s at its position, compactly (see SequenceSnapshot).
  SequenceSnapshot snapshot(const SequenceState& s) const;
  // s becomes, bit for bit, the state a fresh sequence reaches by evaluating the snapshot's
  // tokens, whatever s held before (its context must hold the snapshot's position). Throws
  // Error (s unchanged) when the snapshot is not this model's or does not fit s.
  void restore(SequenceState& s, const SequenceSnapshot& snap) const;
  // Appends tokens at the state's position, in chunks of at most options.chunk. logits (may be
  // null) receives tokens.size() x vocab floats; trace (may be null) gets one entry per
  // position (appended). Throws Error when the context would be exceeded or a token id is out of
  // range; on any exception the state is left exactly as it was before the call.
  // One call at a time per Engine (its thread pool is shared); use one Engine per thread.
  void eval(SequenceState& s, std::span<const TokenId> tokens, float* logits,
            std::vector<TokenTrace>* trace = nullptr) const;
  // Same with a per-token "masked" (non-text, e.g. image) flag: Engram ids DEAD / gate 0 and
  // the image routing bias exp_probs_b_vl (spec 3.6, 4.3, 4.5). masked.size() == tokens.size().
  void eval_masked(SequenceState& s, std::span<const TokenId> tokens,
                   std::span<const uint8_t> masked, float* logits,
                   std::vector<TokenTrace>* trace = nullptr) const;

  // One step of several sequences together (batched decode, or a prefill chunk beside them):
  // item k appends its tokens to its own state. All items go through one pass of the layer
  // loop, so the dense weights and each layer's union of routed experts are read once for the
  // batch. Each item's logits, trace and new state are bit for bit what eval() of that item
  // alone gives. logits (may be null) receives each item's rows of logits, items in order: all
  // of its tokens' (Logits::All, the default: sum(tokens) x vocab floats when every item is),
  // its last token's only (Last: what a decode step or a prompt's last piece samples from), or
  // none (None: a prompt piece before its last). When no item wants a row, the head is skipped.
  // Throws Error (every state unchanged) on any item eval() would refuse, on two items sharing a
  // state, on an item without tokens, and when a batch of two or more items holds more than
  // options.chunk tokens (one pass runs in the chunk's scratch; a single item is eval_masked,
  // which splits any length into chunks). With an observer set, only single items are accepted.
  struct BatchItem {
    SequenceState* state = nullptr;
    std::span<const TokenId> tokens;
    std::span<const uint8_t> masked = {};    // empty: nothing masked (see eval_masked)
    std::vector<TokenTrace>* trace = nullptr;  // appended when set
    enum class Logits : uint8_t { All, Last, None };
    Logits logits = Logits::All;
    // With EngineOptions::capture_layers: receives every token's captured rows
    // (tokens.size() x capture_layers.size() x hidden_size floats). May be null.
    float* hidden = nullptr;
  };
  void eval_batch(std::span<const BatchItem> items, float* logits) const;

  // A DSpark verify pass (spec 6.4): tokens (at most options.chunk and the window) evaluated in
  // one chunk, exactly as eval() would, with every row's logits (may be null) and, with
  // capture_layers, captured rows (may be null) and every row's routing trace (may be null);
  // rec receives what keep_verified needs. Row i equals a single-token decode at its position,
  // bit for bit (the determinism contract).
  void eval_verify(SequenceState& s, std::span<const TokenId> tokens, float* logits, float* hidden,
                   VerifyRecord& rec, std::vector<TokenTrace>* trace = nullptr) const;
  // Straight after eval_verify(s, ..., rec): s becomes, bit for bit, the state after only the
  // first n of its tokens (0 <= n <= all): the window slots the rest overwrote come back from
  // rec's checkpoint, their compressed rows are zeroed, the compressor carry is the one at the
  // new position, the Engram history holds the kept tokens. Throws Error (s unchanged) when s is
  // not where that pass left it or n is too large.
  void keep_verified(SequenceState& s, const VerifyRecord& rec, uint32_t n) const;

  const EngineOptions& options() const { return opt_; }
  // Changes EngineOptions::route_bias between evals (bench compares exact and biased routing on
  // one loaded model). Throws Error for a negative or non-finite d.
  void set_route_bias(float d);
  // Engram rows looked up, read and found in the row cache since construction. Same thread as eval().
  EngramReadStats engram_stats() const;
  const Model& model() const { return model_; }
  // The backend the ops run on (the options', or the engine's own CPU backend): a drafter
  // beside the engine runs on it too.
  const Backend& backend() const;

 private:
  void eval_one(SequenceState& s, std::span<const TokenId> tokens, std::span<const uint8_t> masked, float* logits,
                std::vector<TokenTrace>* trace, BatchItem::Logits rows, float* hidden,
                VerifyRecord* verify = nullptr) const;
  struct Impl;
  const Model& model_;
  EngineOptions opt_;
  std::unique_ptr<Impl> impl_;
};

uint32_t sequence_position(const SequenceState&);

// checkpoint_bytes(config, pos), the size of Engine::checkpoint at pos, is in engine_footprint.h.

}  // namespace sluice
