// Checkpoints of a sequence (spec 7): what a rollback to an earlier position cannot recover by
// truncating the append-only compressed caches.
//
// Why this is exact. For a chunk starting at position P the forward pass reads from the state:
//   window ring   rows of positions P-window .. P-1 (attention, forward_attention.cpp); the rows
//                 of positions >= P are the chunk's own;
//   compressed    rows g < P / ratio of each KV source (comp_kv_row / index_k_row take rows from
//                 the chunk for g >= P / ratio, which it writes before reading);
//   carry         the first P mod ratio rows (compress() writes row j at position j of a group
//                 before the group's last position reads it);
//   Engram tail   the last max_ngram - 1 compressed ids (engram_ids);
// and nothing else. Positions after P overwrite ring rows, carry rows and the tail, never a
// compressed row before P / ratio. So a checkpoint saves the ring, the carry and the tail, and a
// rollback restores them and truncates the compressed rows. Rows the rollback does not restore
// (ring rows >= P while P < window; compressed rows >= P / ratio) are zeroed because a fresh
// state has zeros there; they are never read before being rewritten either way.
#include <algorithm>
#include <cstring>
#include <string>

#include "model/deepseek41/forward_impl.h"
#include "util/error.h"

namespace sluice {

SequenceCheckpoint Engine::checkpoint(const SequenceState& s) const {
  const Impl& im = *impl_;
  im.check_state(s);
  const uint32_t W = s.window, hd = s.head_dim, nl = im.c.num_hidden_layers;
  const uint32_t rows = std::min(s.pos, W);
  SequenceCheckpoint ck;
  ck.pos = s.pos;
  ck.window_kv.resize((size_t)nl * rows * hd);
  for (uint32_t L = 0; rows && L < nl; ++L)  // rows 0 (position 0): nothing, and no null memcpy
    std::memcpy(ck.window_kv.data() + (size_t)L * rows * hd, s.window_kv.data() + (size_t)L * W * hd,
                (size_t)rows * hd * sizeof(uint16_t));
  for (const SourceCache& sc : s.sources) {
    ck.carry_k.push_back(sc.carry_k);
    ck.carry_s.push_back(sc.carry_s);
  }
  ck.engram_tail = s.engram_tail;
  return ck;
}

namespace {

// Whether ck has the shapes of a checkpoint of s's model (s's position aside).
bool fits(const SequenceState& s, const SequenceCheckpoint& ck, uint32_t layers) {
  const size_t rows = std::min(ck.pos, s.window);
  bool ok = ck.window_kv.size() == (size_t)layers * rows * s.head_dim && ck.carry_k.size() == s.sources.size() &&
            ck.carry_s.size() == s.sources.size() && ck.engram_tail.size() == s.engram_tail.size();
  for (size_t i = 0; ok && i < s.sources.size(); ++i)
    ok = ck.carry_k[i].size() == s.sources[i].carry_k.size() && ck.carry_s[i].size() == s.sources[i].carry_s.size();
  return ok;
}

// Writes ck's ring rows, carries and Engram tail into s, zeroing the ring rows it does not
// cover; every compressed row from old_rows(i) on is zeroed (the caller writes those before).
void put_checkpoint(SequenceState& s, const SequenceCheckpoint& ck, uint32_t layers) {
  const uint32_t W = s.window, hd = s.head_dim;
  const uint32_t rows = std::min(ck.pos, W);
  for (uint32_t L = 0; L < layers; ++L) {
    uint16_t* ring = s.window_kv.data() + (size_t)L * W * hd;
    if (rows) std::memcpy(ring, ck.window_kv.data() + (size_t)L * rows * hd, (size_t)rows * hd * sizeof(uint16_t));
    std::fill(ring + (size_t)rows * hd, ring + (size_t)W * hd, uint16_t{0});
  }
  for (size_t i = 0; i < s.sources.size(); ++i) {
    s.sources[i].carry_k = ck.carry_k[i];
    s.sources[i].carry_s = ck.carry_s[i];
  }
  s.engram_tail = ck.engram_tail;
  s.pos = ck.pos;
}

}  // namespace

void Engine::rollback(SequenceState& s, const SequenceCheckpoint& ck) const {
  const Impl& im = *impl_;
  im.check_state(s);
  const uint32_t hd = s.head_dim, nl = im.c.num_hidden_layers, ihd = im.c.index_head_dim;
  if (!fits(s, ck, nl)) throw Error("engine: the checkpoint was not taken by an engine for this model");
  if (ck.pos > s.pos)
    throw Error("engine: cannot roll back to position " + std::to_string(ck.pos) + ", beyond the sequence's " +
                std::to_string(s.pos));
  const size_t kb = fp4_row_bytes(kKvGrid, hd), ib = fp4_row_bytes(kIndexGrid, ihd);
  for (SourceCache& sc : s.sources) {
    const size_t r0 = ck.pos / sc.ratio, r1 = s.pos / sc.ratio;
    std::fill(sc.kv.begin() + r0 * kb, sc.kv.begin() + r1 * kb, uint8_t{0});
    std::fill(sc.index_k.begin() + r0 * ib, sc.index_k.begin() + r1 * ib, uint8_t{0});
  }
  put_checkpoint(s, ck, nl);
}

SequenceSnapshot Engine::snapshot(const SequenceState& s) const {
  const Impl& im = *impl_;
  SequenceSnapshot snap;
  snap.ck = checkpoint(s);  // checks s
  const size_t kb = fp4_row_bytes(kKvGrid, s.head_dim), ib = fp4_row_bytes(kIndexGrid, im.c.index_head_dim);
  for (const SourceCache& sc : s.sources) {
    const size_t rows = s.pos / sc.ratio;
    snap.kv.emplace_back(sc.kv.begin(), sc.kv.begin() + (std::ptrdiff_t)(rows * kb));
    snap.index_k.emplace_back(sc.index_k.begin(), sc.index_k.begin() + (std::ptrdiff_t)(rows * ib));
  }
  return snap;
}

// Unlike rollback, every compressed row is rewritten (the snapshot's, then zeros to the end of
// the allocation), so nothing of what s held before survives.
void Engine::restore(SequenceState& s, const SequenceSnapshot& snap) const {
  const Impl& im = *impl_;
  im.check_state(s);
  const uint32_t nl = im.c.num_hidden_layers;
  const size_t kb = fp4_row_bytes(kKvGrid, s.head_dim), ib = fp4_row_bytes(kIndexGrid, im.c.index_head_dim);
  bool ok = fits(s, snap.ck, nl) && snap.kv.size() == s.sources.size() && snap.index_k.size() == s.sources.size();
  for (size_t i = 0; ok && i < s.sources.size(); ++i) {
    const size_t rows = snap.pos() / s.sources[i].ratio;
    ok = snap.kv[i].size() == rows * kb && snap.index_k[i].size() == rows * ib;
  }
  if (!ok) throw Error("engine: the snapshot was not taken by an engine for this model");
  if (snap.pos() > s.ctx)
    throw Error("engine: a snapshot at position " + std::to_string(snap.pos()) + " does not fit a context of " +
                std::to_string(s.ctx));
  for (size_t i = 0; i < s.sources.size(); ++i) {
    SourceCache& sc = s.sources[i];
    std::copy(snap.kv[i].begin(), snap.kv[i].end(), sc.kv.begin());
    std::fill(sc.kv.begin() + (std::ptrdiff_t)snap.kv[i].size(), sc.kv.end(), uint8_t{0});
    std::copy(snap.index_k[i].begin(), snap.index_k[i].end(), sc.index_k.begin());
    std::fill(sc.index_k.begin() + (std::ptrdiff_t)snap.index_k[i].size(), sc.index_k.end(), uint8_t{0});
  }
  put_checkpoint(s, snap.ck, nl);
}

}  // namespace sluice
