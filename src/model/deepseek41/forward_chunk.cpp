#include "model/deepseek41/forward_chunk.h"

#include <algorithm>
#include <cstring>

namespace sluice {

void begin_chunk(Chunk& ch, const SequenceState& s, uint32_t n_layer, size_t engram_layers) {
  const uint32_t n = ch.n;
  ch.src.resize(s.sources.size());
  for (size_t i = 0; i < s.sources.size(); ++i) {
    const SourceCache& sc = s.sources[i];
    NewSourceRows& nr = ch.src[i];
    nr.first = ch.p0 / sc.ratio;
    nr.carry_k = sc.carry_k;
    nr.carry_s = sc.carry_s;
  }
  ch.win.assign((size_t)n_layer * n * s.head_dim, 0);
  ch.sel.assign(n_layer, {});
  ch.cand.assign(n, {});
  if (ch.tracing) {
    ch.trace.assign(n, {});
    for (TokenTrace& t : ch.trace) {
      t.experts.assign(n_layer, {});
      t.expert_weights.assign(n_layer, {});
      t.guessed_experts.assign(n_layer, {});
      t.selected_rows.assign(n_layer, {});
      t.engram_rows.assign(engram_layers, {});
    }
  }
}

void begin_pass(Pass& p, std::span<Chunk> parts, std::span<SequenceState* const> states) {
  p.parts.clear();
  p.states.assign(states.begin(), states.end());
  p.tokens.clear();
  p.masked.clear();
  p.pos.clear();
  p.trace.clear();
  p.tracing = false;
  bool any_mask = false;
  for (const Chunk& ch : parts) any_mask = any_mask || ch.masked != nullptr;
  uint32_t row = 0;
  for (Chunk& ch : parts) {
    ch.row0 = row;
    row += ch.n;
    p.parts.push_back(&ch);
    p.tokens.insert(p.tokens.end(), ch.tokens, ch.tokens + ch.n);
    if (any_mask)
      for (uint32_t i = 0; i < ch.n; ++i) p.masked.push_back(ch.masked ? ch.masked[i] : 0);
    for (uint32_t i = 0; i < ch.n; ++i) p.pos.push_back((uint64_t)ch.p0 + i);
    p.tracing = p.tracing || ch.tracing;
  }
  p.n = row;
  if (p.tracing) {
    // Every part traces when one does (a batch is traced whole), so each row has an entry.
    for (Chunk& ch : parts)
      for (uint32_t i = 0; i < ch.n; ++i) p.trace.push_back(&ch.trace[i]);
  }
}

void commit_chunk(SequenceState& s, Chunk& ch, uint32_t index_head_dim) {
  const uint32_t W = s.window, hd = s.head_dim, n = ch.n;
  const uint32_t n_layer = (uint32_t)(ch.win.size() / ((size_t)n * hd));
  for (uint32_t L = 0; L < n_layer; ++L)
    for (uint32_t i = n > W ? n - W : 0; i < n; ++i) {
      const uint32_t pos = ch.p0 + i;
      std::memcpy(s.window_kv.data() + ((size_t)L * W + pos % W) * hd,
                  ch.win.data() + ((size_t)L * n + i) * hd, hd * sizeof(uint16_t));
    }
  for (size_t sl = 0; sl < s.sources.size(); ++sl) {
    SourceCache& sc = s.sources[sl];
    NewSourceRows& nr = ch.src[sl];
    std::copy(nr.kv.begin(), nr.kv.end(), sc.kv.begin() + (size_t)nr.first * fp4_row_bytes(kKvGrid, hd));
    std::copy(nr.ik.begin(), nr.ik.end(), sc.index_k.begin() + (size_t)nr.first * fp4_row_bytes(kIndexGrid, index_head_dim));
    sc.carry_k = nr.carry_k;
    sc.carry_s = nr.carry_s;
  }
  s.engram_tail = ch.tail;
  s.pos = ch.p0 + n;
}

}  // namespace sluice
