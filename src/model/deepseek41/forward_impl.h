// Internals of the Engine shared by forward*.cpp (not part of the public API). The stages say
// what to compute, as Backend ops on backend Tensors; forward_chunk.h keeps the chunk's working
// copies and commits them.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu_backend.h"
#include "model/deepseek41/forward.h"
#include "model/deepseek41/forward_chunk.h"
#include "model/deepseek41/forward_workspace.h"
#include "model/model.h"
#include "model/deepseek41/engram_cache.h"
#include "model/deepseek41/primitives.h"

namespace sluice {

struct Engine::Impl {
  const Model& m;
  const ModelConfig& c;
  const std::vector<LayerRole>& roles;
  EngineOptions opt;
  std::unique_ptr<CpuBackend> own_backend;  // when the options name none
  const Backend& be;
  Workspace ws;                            // activation tensors for options.chunk tokens
  const ExpertSource* experts;
  std::vector<std::vector<double>> freqs;  // per layer RoPE table
  std::vector<int> slot;                   // per layer: KV-source slot, -1 if not a source
  mutable std::unique_ptr<EngramRowCache> engram_cache;  // null: opt.engram_cache_rows == 0
  mutable EngramReadStats engram_stats;     // since construction
  Tensor capture;                           // [chunk][capture layers x hidden] when capturing

  Impl(const Model& model, const EngineOptions& o);

  SequenceState new_sequence() const;
  void check_state(const SequenceState& s) const;
  // What eval() refuses before touching s: a state not of this engine, a mask of the wrong
  // length, the context exceeded, a token id out of range. who names the batch item ("": none).
  void check_request(const SequenceState& s, std::span<const TokenId> tokens, std::span<const uint8_t> masked,
                     const std::string& who) const;
  // logits null: the output head is skipped. rows null: logits of every row of the pass;
  // otherwise of those rows only, in that order (empty: the head is skipped).
  // capture: fill `capture` for the pass's rows (EngineOptions::capture_layers).
  void run_pass(Pass& p, float* logits, const std::vector<uint32_t>* rows = nullptr, bool capture = false) const;
  void layer_loop(Pass& p, float* logits, const std::vector<uint32_t>* rows, bool capture) const;  // run_pass's body
  size_t capture_width() const { return opt.capture_layers.size() * c.hidden_size; }

  // Stages (forward_engram.cpp, forward_attention.cpp, forward_moe.cpp). X: [n][hc x hidden].
  void engram_ids(Pass& p) const;
  void engram(Pass& p, uint32_t L, Mat X) const;
  void attention(Pass& p, uint32_t L, CMat x, Mat out) const;
  void compress(Pass& p, uint32_t L) const;
  void indexer(Pass& p, uint32_t L) const;
  void moe(Pass& p, uint32_t L, CMat x, Mat out) const;
  bool prefetching() const;
  // The layer's selection bias (text or image), plus route_bias on the experts the source holds.
  std::vector<float> selection_bias(uint32_t L, const std::vector<float>& base) const;
  // moe() when some experts are computed by other processes (EngineOptions::remote).
  void moe_split(Pass& p, uint32_t L, CMat x, const std::vector<ExpertTriple>& triples, Mat out) const;
  // Layer L's router picks for the pass's tokens (ascending, distinct) from the logits moe() left
  // in RouterNext.
  std::vector<uint32_t> predict_experts(uint32_t L, const Pass& p) const;

  RopeTable rope_table(uint32_t L) const { return RopeTable{freqs[L].data(), freqs[L].size()}; }
  HcParams hc_params() const { return HcParams{c.hc_mult, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps}; }
  // Shows a named intermediate to the observer, if any: "l<L>.<what>" (L < 0: "<what>").
  void name(const Pass& p, int L, const char* what, CMat t) const;
};

}  // namespace sluice
