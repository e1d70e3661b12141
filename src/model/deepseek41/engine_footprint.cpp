#include "model/deepseek41/engine_footprint.h"

#include <algorithm>

#include "backend/cpu_backend.h"
#include "kernels/index_scores.h"
#include "kernels/numerics.h"
#include "model/deepseek41/engram.h"
#include "model/deepseek41/sequence_state.h"
#include "model/deepseek41/forward_workspace.h"

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
    sc.kv_row_bytes = (uint32_t)fp4_row_bytes(kKvGrid, c.head_dim);
    sc.index_row_bytes = (uint32_t)fp4_row_bytes(kIndexGrid, c.index_head_dim);
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
  // The element types of SequenceState: BF16 bits (uint16_t) window rows, packed FP4 bytes,
  // f32 carry, int64 Engram ids.
  SequenceStateBytes b;
  b.window = s.window_values * sizeof(uint16_t);
  for (const SourceShape& sc : s.sources) {
    b.compressed_kv += sc.rows * sc.kv_row_bytes;
    b.index_keys += sc.rows * sc.index_row_bytes;
    b.carry += 2 * sc.carry_values * sizeof(float);
  }
  b.engram_history = (uint64_t)s.engram_history * sizeof(int64_t);
  return b;
}

uint64_t checkpoint_bytes(const ModelConfig& c, uint32_t pos) {
  const std::vector<LayerRole> roles = layer_roles(c);
  uint64_t b = (uint64_t)c.num_hidden_layers * std::min(pos, c.sliding_window) * c.head_dim * sizeof(uint16_t);
  for (uint32_t L : c.kv_source_layer_ids) b += 2ull * (std::max<uint32_t>(1, roles[L].ratio) - 1) * c.head_dim * sizeof(float);
  b += (uint64_t)(c.engram_max_ngram_size > 0 ? c.engram_max_ngram_size - 1 : 0) * sizeof(int64_t);
  return b;
}

uint64_t snapshot_bytes(const ModelConfig& c, uint32_t pos) {
  uint64_t b = checkpoint_bytes(c, pos);
  for (const SourceShape& sc : sequence_shape(c, pos).sources)
    b += (uint64_t)(pos / sc.ratio) * (sc.kv_row_bytes + sc.index_row_bytes);
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
  const uint64_t ecols = (uint64_t)c.engram_columns() * c.engram_head_dim;

  ScratchBytes s;
  // The forward pass's activation tensors, exactly as the Engine allocates them (once).
  s.workspace = workspace_bytes(c, chunk);
  // Plus the CPU backend's own temporaries of its widest op, f32 values per token (an
  // activation row quantized for a weight is at most its f32 size; pointers count 2).
  const uint64_t widest_input = std::max({hc * H, H, (uint64_t)c.q_lora_rank, qw, Fs, F, ecols,
                                          (uint64_t)c.o_groups * c.o_lora_rank});
  const uint64_t linear = widest_input + 2;
  const uint64_t mix = nmix + hc * H + 2;                                   // hc_mix: projections + input
  const uint64_t shared = 2 * Fs + std::max(H, Fs) + 2;                      // gate, up, quantized input
  const uint64_t routed = 2 * H + 3 * F + H + 6;                             // inputs, gate/up/h, down rows
  // sparse_attention works on groups of queries: their row pointers, and the compressed rows
  // they selected unpacked to BF16 with their ids (cpu_attention.cpp).
  const uint64_t group = std::min<uint64_t>(n, kAttentionGroup);
  const uint64_t attention = group * ((uint64_t)(c.sliding_window + c.index_topk) * 8 + (uint64_t)c.index_topk * (hd * 2 + 4));
  s.op_temporaries = std::max(n * std::max({linear, mix, shared, routed}) * 4, attention);

  // The chunk's own rows until commit: window rows (BF16) of every layer, new compressed rows and
  // index keys per KV source, top-k selections (int32) of index layers, candidate masks, Engram ids.
  uint64_t rows = n * c.num_hidden_layers * hd * 2;
  for (uint32_t L : c.kv_source_layer_ids) {
    const uint32_t ratio = std::max<uint32_t>(1, roles[L].ratio);
    rows += (n / ratio + 1) * (fp4_row_bytes(kKvGrid, hd) + fp4_row_bytes(kIndexGrid, c.index_head_dim)) +
            2ull * (ratio - 1) * hd * 4;
  }
  rows += n * c.index_source_layer_ids.size() * c.index_topk * 4;
  const uint64_t vis = max_visible_rows(c, roles, ctx);
  rows += n * (vis / std::max<uint32_t>(1, c.candidate_block_size) + 1);
  rows += n * c.engram_layer_ids.size() * c.engram_columns() * 8;
  s.chunk_rows = rows;

  // The indexer scores every visible compressed row of one query at a time (cpu_attention.cpp):
  // one row of scores, whatever the chunk, then the top-k selection's index buffer over them, and
  // the query in integer form (kernels/index_scores.h). (A batched indexer would hold chunk x
  // visible rows and must say so here; reserving that unused cost 512 MiB at 524,288 positions,
  // chunk 256.) The candidate source's block maxima and their selection, over visible / block
  // rows, come before the top-k and are smaller than its buffer.
  s.indexer_scores = vis * 4 + topk_scratch_bytes(vis) + index_query_bytes(c.index_n_heads, c.index_head_dim);

  // engram_gather (model/deepseek41/engram.cpp) per Engram layer, one at a time: a staging buffer of whole
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
  // eval() of more than one chunk keeps a checkpoint of its start to roll back to (the window
  // rings, every carry and the Engram history; the compressed rows are append-only): at most
  // its size at a full window.
  f.rollback = ctx > chunk ? checkpoint_bytes(c, ctx) : 0;
  f.scratch = scratch_bytes(c, std::min(chunk, ctx), ctx);
  f.weights = weight_bytes;
  return f;
}

uint64_t split_moe_bytes(const ModelConfig& c, uint64_t triples) {
  // terms + mine + theirs (together triples x 2 rows of hidden f32), the two triple lists and
  // four index vectors.
  return triples * (2ull * c.hidden_size * 4 + 2 * sizeof(ExpertTriple) + 4 * sizeof(uint32_t));
}

}  // namespace sluice
