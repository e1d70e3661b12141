// Attention of one layer for a chunk (spec 3.4, docs/numerics.md 4-6).
//
// Queries come from a low-rank projection; every layer keeps a raw sliding window of its
// keys/values (one shared KV head, FP8-grid after RoPE). KV-source layers also pool groups of
// `ratio` tokens into compressed rows (NVFP4 grid) with index keys beside them (MXFP4 grid);
// index-source layers score all visible compressed rows with the lightning indexer and select
// the top k, and the candidate-pool layers narrow that search to the blocks the candidate
// source kept. Each query then attends its window and its selected rows with a per-head sink,
// the output is rotated back (inverse RoPE) and projected through grouped low-rank outputs.
#include <algorithm>
#include <cmath>

#include "model/deepseek41/forward_impl.h"
#include "model/deepseek41/grouped_output.h"

namespace sluice {

// The compressor's projections k (and g) of the chunk are in CompK (CompG): attention() made them
// with the layer's other projections of its input.
void Engine::Impl::compress(Pass& p, uint32_t L) const {
  const LayerWeights& w = m.layers[L];
  const uint32_t hd = c.head_dim, ihd = c.index_head_dim, ratio = roles[L].ratio;
  const float eps = c.rms_norm_eps;
  const Mat k = ws(Ws::CompK, p.n), g = ws(Ws::CompG, p.n);
  // Pooling reads and writes each sequence's carry, so it runs part by part.
  for (Chunk* part : p.parts) {
    Chunk& ch = *part;
    NewSourceRows& nr = ch.src[(size_t)slot[L]];
    if (ch.keep_projections && ratio > 1) {
      be.sync();
      const size_t w = k.width;
      nr.proj_k.resize((size_t)ch.n * w);
      nr.proj_s.resize((size_t)ch.n * w);
      for (uint32_t i = 0; i < ch.n; ++i) {
        std::copy(k.row(ch.row0 + i), k.row(ch.row0 + i) + w, nr.proj_k.begin() + (ptrdiff_t)(i * w));
        std::copy(g.row(ch.row0 + i), g.row(ch.row0 + i) + w, nr.proj_s.begin() + (ptrdiff_t)(i * w));
      }
    }
    const std::vector<uint32_t> groups =
        be.compress_pool(CMat(k).rows(ch.row0, ch.n), ratio > 1 ? CMat(g).rows(ch.row0, ch.n) : CMat{}, ratio, ch.p0,
                         nr.carry_k.data(), nr.carry_s.data(), ws(Ws::Latents, ch.n));
    const uint32_t G = (uint32_t)groups.size();
    if (G == 0) continue;
    const Mat latents = ws(Ws::Latents, G);
    be.rms_norm(latents, w.comp_norm.data(), eps);
    std::vector<uint64_t> pos(G);  // row g sits at position g * ratio
    for (uint32_t q = 0; q < G; ++q) pos[q] = (uint64_t)groups[q] * ratio;

    // Index keys use the latent before RoPE.
    const Mat ik = ws(Ws::IndexK, G);
    be.linear(w.idx_k, latents, ik, /*round=*/true);
    be.rms_norm(ik, w.idx_k_norm.data(), eps);
    be.rope(ik, ihd, rope_table(L), pos, false);
    be.rope(latents, hd, rope_table(L), pos, false);

    // Both are cached on their FP4 grids, packed (store_fp4 fake-quantizes as it packs).
    const size_t kb = fp4_row_bytes(kKvGrid, hd), ib = fp4_row_bytes(kIndexGrid, ihd);
    const size_t base = nr.kv.size() / kb;
    nr.kv.resize((base + G) * kb);
    nr.ik.resize((base + G) * ib);
    be.store_fp4(ik, kIndexGrid, nr.ik.data() + base * ib);
    be.store_fp4(latents, kKvGrid, nr.kv.data() + base * kb);
    nr.count = (uint32_t)(base + G);
  }
}

// The indexer's queries (IndexQ, from the normalized low rank qr) and head weights (IndexW,
// w = bf16(x . proj)) are projected by attention() beside the layer's own.
void Engine::Impl::indexer(Pass& p, uint32_t L) const {
  const LayerRole& r = roles[L];
  const uint32_t ihd = c.index_head_dim, inh = c.index_n_heads;
  const Mat iq = ws(Ws::IndexQ, p.n), wt = ws(Ws::IndexW, p.n);
  be.rope(iq, ihd, rope_table(L), p.pos, false);
  be.fake_quant(iq, FakeQuant::Mxfp4);
  const int sl = slot[(size_t)r.kv_source];
  for (size_t k = 0; k < p.parts.size(); ++k) {  // each sequence's own index keys
    Chunk& ch = *p.parts[k];
    IndexSelect a;
    a.q = CMat(iq).rows(ch.row0, ch.n);
    a.w = CMat(wt).rows(ch.row0, ch.n);
    a.heads = inh;
    a.head_dim = ihd;
    a.denom = std::sqrt((float)(ihd * inh));
    a.keys = ch.index_keys(*p.states[k], sl, ihd);
    a.ratio = roles[(size_t)r.kv_source].ratio;
    a.p0 = ch.p0;
    a.topk = c.index_topk;
    a.candidate_source = r.is_candidate_source;
    a.candidate_consumer = r.is_candidate_consumer;
    a.block = c.candidate_block_size;
    a.keep_blocks = c.candidate_topk_blocks;
    be.index_select(a, ch.cand, ch.sel[L]);
    if (ch.tracing)
      for (uint32_t i = 0; i < ch.n; ++i) ch.trace[i].selected_rows[L] = ch.sel[L][i];
  }
}

void Engine::Impl::attention(Pass& p, uint32_t L, CMat x, Mat out) const {
  const LayerWeights& w = m.layers[L];
  const LayerRole& r = roles[L];
  const uint32_t n = p.n, hd = c.head_dim, nh = c.num_attention_heads;
  const size_t qw = (size_t)nh * hd;
  const float eps = c.rms_norm_eps;
  const int l = (int)L;

  // Every projection of x in one batch (independent linears: a GPU submits them together): the
  // queries' low rank, the window row, the compressor's k and g (f32 until pooling, numerics.md
  // 2) and the indexer's head weights; then both projections of the normalized low rank.
  const Mat qr = ws(Ws::Qr, n), q = ws(Ws::Q, n), kv = ws(Ws::Kv, n);
  std::vector<LinearCall> of_x = {{&w.q_a, x, qr, true}, {&w.kv, x, kv, true}};
  if (r.is_kv_source) {
    of_x.push_back({&w.comp_kv, x, ws(Ws::CompK, n), false});
    if (r.ratio > 1) of_x.push_back({&w.comp_gate, x, ws(Ws::CompG, n), false});
  }
  if (r.is_index_source) of_x.push_back({&w.idx_proj, x, ws(Ws::IndexW, n), true});
  be.linears(of_x);

  // Queries: q = rope(lin(rms(lin(x, q_a)), q_b)); no per-head norm in V4.1.
  be.rms_norm(qr, w.q_a_norm.data(), eps);
  std::vector<LinearCall> of_qr = {{&w.q_b, qr, q, true}};
  if (r.is_index_source) of_qr.push_back({&w.idx_q_b, qr, ws(Ws::IndexQ, n), true});
  be.linears(of_qr);
  be.rope(q, hd, rope_table(L), p.pos, false);
  name(p, l, "q", q);

  // This chunk's raw window rows: FP8 fake-quantized after RoPE.
  be.rms_norm(kv, w.kv_norm.data(), eps);
  be.rope(kv, hd, rope_table(L), p.pos, false);
  be.fake_quant(kv, FakeQuant::Fp8Window);
  name(p, l, "kv", kv);
  for (Chunk* ch : p.parts) be.store_bf16(CMat(kv).rows(ch->row0, ch->n), ch->new_window_rows(L, hd), hd);

  if (r.is_kv_source) compress(p, L);
  if (r.is_index_source) indexer(p, L);

  // Each sequence attends its own window and compressed rows (the batch's sequences handed over together).
  const Mat o = ws(Ws::Heads, n);
  std::vector<SparseAttention> as(p.parts.size());
  std::vector<Mat> outs(p.parts.size());
  for (size_t k = 0; k < p.parts.size(); ++k) {
    const Chunk& ch = *p.parts[k];
    const SequenceState& s = *p.states[k];
    SparseAttention& a = as[k];
    a.q = CMat(q).rows(ch.row0, ch.n);
    a.heads = nh;
    a.head_dim = hd;
    a.p0 = ch.p0;
    a.window = ch.window(s, L);
    if (r.ratio > 0) {
      a.comp = ch.comp_kv(s, slot[(size_t)r.kv_source]);
      a.comp_ratio = roles[(size_t)r.kv_source].ratio;
      a.sel = &ch.sel[(size_t)r.topk_source];
    }
    a.sinks = w.attn_sinks.data();
    outs[k] = o.rows(ch.row0, ch.n);
  }
  be.sparse_attentions(as, outs);
  be.rope(o, hd, rope_table(L), p.pos, /*inverse=*/true);
  name(p, l, "attn_heads", o);

  grouped_output(be, c, w, CMat(o).cols(0, qw), ws(Ws::Z, n), out);
}

}  // namespace sluice
