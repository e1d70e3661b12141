#include "model/engine_footprint.h"

#include <algorithm>

#include "model/engram.h"

namespace sluice {

SequenceShape sequence_shape(const ModelConfig& c, std::span<const LayerRole> roles, uint32_t ctx) {
  SequenceShape s;
  s.ctx = ctx;
  s.window = c.sliding_window;
  s.head_dim = c.head_dim;
  s.window_values = (uint64_t)c.num_hidden_layers * c.sliding_window * c.head_dim;
  for (uint32_t L : c.kv_source_layer_ids) {
    SourceShape sc;
    sc.layer = L;
    sc.ratio = std::max<uint32_t>(1, roles[L].ratio);
    sc.rows = ctx / sc.ratio;
    sc.kv_width = c.head_dim;
    sc.index_width = c.index_head_dim;
    sc.carry_values = (uint64_t)(sc.ratio - 1) * c.head_dim;
    s.sources.push_back(sc);
  }
  s.engram_history = c.engram_max_ngram_size > 0 ? c.engram_max_ngram_size - 1 : 0;
  return s;
}

SequenceShape sequence_shape(const ModelConfig& c, uint32_t ctx) {
  const std::vector<LayerRole> roles = layer_roles(c);
  return sequence_shape(c, roles, ctx);
}

SequenceStateBytes sequence_state_bytes(const SequenceShape& s) {
  // The element types of SequenceState: BF16 bits (uint16_t) rows, f32 carry, int64 Engram ids.
  SequenceStateBytes b;
  b.window = s.window_values * sizeof(uint16_t);
  for (const SourceShape& sc : s.sources) {
    b.compressed_kv += sc.rows * sc.kv_width * sizeof(uint16_t);
    b.index_keys += sc.rows * sc.index_width * sizeof(uint16_t);
    b.carry += 2 * sc.carry_values * sizeof(float);
  }
  b.engram_history = (uint64_t)s.engram_history * sizeof(int64_t);
  return b;
}

SequenceStateBytes sequence_state_bytes(const ModelConfig& c, uint32_t ctx) {
  return sequence_state_bytes(sequence_shape(c, ctx));
}

namespace {

// Largest KV-source ratio divisor seen by any index-source layer: visible rows <= ctx / ratio.
uint64_t max_visible_rows(const ModelConfig& c, const std::vector<LayerRole>& roles, uint32_t ctx) {
  uint64_t rows = 0;
  for (uint32_t L = 0; L < c.num_hidden_layers; ++L) {
    const LayerRole& r = roles[L];
    if (!r.is_index_source || r.kv_source < 0) continue;
    const uint32_t ratio = std::max<uint32_t>(1, roles[(size_t)r.kv_source].ratio);
    rows = std::max<uint64_t>(rows, ctx / ratio);
  }
  return rows;
}

}  // namespace

ScratchBytes scratch_bytes(const ModelConfig& c, uint32_t chunk, uint32_t ctx) {
  const std::vector<LayerRole> roles = layer_roles(c);
  const uint64_t n = chunk, H = c.hidden_size, hc = c.hc_mult, hd = c.head_dim;
  const uint64_t qw = (uint64_t)c.num_attention_heads * hd;
  const uint64_t nmix = (2 + hc) * hc;
  const uint64_t F = c.moe_intermediate_size, Fs = F * std::max<uint32_t>(1, c.n_shared_experts);
  const uint64_t iw = (uint64_t)c.index_n_heads * c.index_head_dim;
  const uint64_t ecols = (uint64_t)c.engram_columns() * c.engram_head_dim;

  // f32 values per token. Alive for the whole chunk: the two stream buffers, the collapsed
  // input/output rows, the pre-weights and two sets of mixes. Then the widest sublayer.
  const uint64_t persistent = 2 * hc * H + 2 * H + hc + 3 * nmix;
  // Attention: q_a rows, q and o (heads x head_dim), the new KV row, the grouped output-a rows,
  // indexer queries and weights, row pointers (8 B each), the quantized copy of the widest input.
  const uint64_t attention = c.q_lora_rank + 2 * qw + hd + (uint64_t)c.o_groups * c.o_lora_rank + iw +
                             c.index_n_heads + 2ull * (c.sliding_window + c.index_topk) + qw;
  // MoE: router logits, shared gate/up/out, routed sum, one expert's gate/up/down rows (at most
  // every token of the chunk), routing pairs, quantized input.
  const uint64_t moe = c.n_routed_experts + 2 * Fs + H + H + 2 * F + H + 2ull * c.num_experts_per_tok + std::max(H, F);
  // Engram: gathered rows decoded to f32, the key/value projection, quantized input.
  const uint64_t engram = ecols + (hc + 1) * H + ecols;
  ScratchBytes s;
  s.activations = n * (persistent + std::max({attention, moe, engram})) * 4;

  // The chunk's own rows until commit: window rows (BF16) of every layer, new compressed rows and
  // index keys per KV source, top-k selections (int32) of index layers, candidate masks, Engram ids.
  uint64_t rows = n * c.num_hidden_layers * hd * 2;
  for (uint32_t L : c.kv_source_layer_ids) {
    const uint32_t ratio = std::max<uint32_t>(1, roles[L].ratio);
    rows += (n / ratio + 1) * (hd + c.index_head_dim) * 2 + 2ull * (ratio - 1) * hd * 4;
  }
  rows += n * c.index_source_layer_ids.size() * c.index_topk * 4;
  const uint64_t vis = max_visible_rows(c, roles, ctx);
  rows += n * (vis / std::max<uint32_t>(1, c.candidate_block_size) + 1);
  rows += n * c.engram_layer_ids.size() * c.engram_columns() * 8;
  s.chunk_rows = rows;

  // The indexer scores every visible compressed row for each query; reserved in the batched
  // form (all queries of the chunk at once) so a faster indexer needs no new admission.
  s.indexer_scores = n * vis * 4;

  // engram_gather (model/engram.cpp) per Engram layer, one at a time: a staging buffer of whole
  // rows within kEngramStagingBytes, a sorted reference per row id (4 B) and the distinct ids of
  // a batch (8 B each, at most one per reference).
  if (!c.engram_layer_ids.empty()) {
    const uint64_t rb = c.engram_row_bytes(), refs = n * c.engram_columns();
    const uint64_t staging = std::max<uint64_t>(1, kEngramStagingBytes / std::max<uint64_t>(1, rb)) * rb;
    s.engram_reads = staging + refs * (4 + 8) + (uint64_t)c.engram_head_dim * 4;
  }
  s.logits = n * c.vocab_size * 4;
  return s;
}

uint64_t aligned_tensor_bytes(uint64_t nbytes) { return std::max<uint64_t>((nbytes + 63) / 64 * 64, 64); }

uint64_t loaded_tensor_bytes(GgmlType type, uint64_t nbytes) {
  return type == GgmlType::F32 ? nbytes : aligned_tensor_bytes(nbytes);
}

EngineFootprint engine_footprint(const ModelConfig& c, uint32_t ctx, uint32_t chunk, uint64_t weight_bytes) {
  EngineFootprint f;
  f.sequence = sequence_state_bytes(c, ctx);
  // eval() of more than one chunk saves the window rings, the Engram history, every carry and
  // the compressed rows it may write; a prompt that fills the context writes all of them.
  f.undo = f.sequence.total();
  f.scratch = scratch_bytes(c, std::min(chunk, ctx), ctx);
  f.weights = weight_bytes;
  return f;
}

}  // namespace sluice
