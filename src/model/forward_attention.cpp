// Attention of one layer for a chunk (spec 3.4, docs/numerics.md 4-6): queries, the raw window,
// compressed KV production on KV-source layers, the lightning indexer and candidate pool on
// index-source layers, sparse attention with sinks, inverse RoPE and the grouped output.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/fp.h"
#include "model/forward_impl.h"
#include "model/linear.h"

namespace sluice {

namespace {

void store_bf16(const float* x, size_t n, uint16_t* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(x[i]);  // x is BF16-exact: lossless
}

}  // namespace

// KV-source layer: pools the compressor projections of complete groups (ratio m: a per-channel
// softmax over the group's gate logits; ratio 1: the projection itself) into compressed rows and
// their index keys. The open group's f32 projections are the carry.
void Engine::Impl::compress(Chunk& ch, uint32_t L, const float* x) const {
  const LayerWeights& w = m.layers[L];
  const uint32_t n = ch.n, H = c.hidden_size, hd = c.head_dim, ihd = c.index_head_dim;
  const uint32_t ratio = roles[L].ratio;
  NewSourceRows& nr = ch.src[(size_t)slot[L]];
  std::vector<float> k(n * (size_t)hd), g;
  lin(pool, w.comp_kv, x, H, n, k.data(), hd, /*round=*/false);  // f32 until pooling (numerics.md 2)
  if (ratio > 1) {
    g.resize(n * (size_t)hd);
    lin(pool, w.comp_gate, x, H, n, g.data(), hd, /*round=*/false);
  }
  std::vector<float> latents;  // [groups][hd]
  std::vector<uint32_t> groups;
  std::vector<float> pooled(hd), ex((size_t)ratio * hd);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t t = ch.p0 + i;
    const float* ki = k.data() + (size_t)i * hd;
    if (ratio == 1) {
      std::copy(ki, ki + hd, pooled.begin());
    } else {
      const uint32_t j = t % ratio;
      const float* gi = g.data() + (size_t)i * hd;
      if (j + 1 < ratio) {  // group still open: carry the f32 projections
        std::copy(ki, ki + hd, nr.carry_k.begin() + (size_t)j * hd);
        std::copy(gi, gi + hd, nr.carry_s.begin() + (size_t)j * hd);
        continue;
      }
      // Per-channel softmax over the group's members (in position order), then the weighted sum.
      auto kv_of = [&](uint32_t a) { return a + 1 < ratio ? nr.carry_k.data() + (size_t)a * hd : ki; };
      auto s_of = [&](uint32_t a) { return a + 1 < ratio ? nr.carry_s.data() + (size_t)a * hd : gi; };
      for (uint32_t d = 0; d < hd; ++d) {
        float mx = s_of(0)[d];
        for (uint32_t a = 1; a < ratio; ++a) mx = std::max(mx, s_of(a)[d]);
        float den = 0.0f;
        for (uint32_t a = 0; a < ratio; ++a) {
          ex[(size_t)a * hd + d] = std::exp(s_of(a)[d] - mx);
          den += ex[(size_t)a * hd + d];
        }
        float acc = 0.0f;
        for (uint32_t a = 0; a < ratio; ++a) acc += kv_of(a)[d] * (ex[(size_t)a * hd + d] / den);
        pooled[d] = acc;
      }
    }
    const size_t at = latents.size();
    latents.resize(at + hd);
    for (uint32_t d = 0; d < hd; ++d) latents[at + d] = round_bf16(pooled[d]);  // bf16(pooled)
    rms_norm(latents.data() + at, w.comp_norm.data(), latents.data() + at, hd, c.rms_norm_eps);
    groups.push_back(t / ratio);
  }
  const uint32_t G = (uint32_t)groups.size();
  if (G == 0) return;
  // Index keys use the latent before RoPE.
  std::vector<float> ik((size_t)G * ihd);
  lin(pool, w.idx_k, latents.data(), hd, G, ik.data(), ihd, /*round=*/true);
  const size_t base = nr.kv.size() / hd;
  nr.kv.resize((base + G) * hd);
  nr.ik.resize((base + G) * ihd);
  for (uint32_t q = 0; q < G; ++q) {
    const RopeAngles a = rope_angles(freqs[L], (uint64_t)groups[q] * ratio);  // row g at position g*ratio
    float* iq = ik.data() + (size_t)q * ihd;
    rms_norm(iq, w.idx_k_norm.data(), iq, ihd, c.rms_norm_eps);
    rope_apply(iq, ihd, a);
    fake_quant_mxfp4(iq, ihd);
    float* lat = latents.data() + (size_t)q * hd;
    rope_apply(lat, hd, a);
    fake_quant_nvfp4(lat, hd);
    store_bf16(iq, ihd, nr.ik.data() + (base + q) * ihd);
    store_bf16(lat, hd, nr.kv.data() + (base + q) * hd);
  }
  nr.count = (uint32_t)(base + G);
}

// Index-source layer: scores every visible compressed row of its KV source, publishes the
// candidate pool (candidate source) or searches it (consumers), and selects the top-k rows.
void Engine::Impl::indexer(Chunk& ch, const SequenceState& s, uint32_t L, const float* x, const float* qr,
                           const std::vector<RopeAngles>& ang) const {
  const LayerWeights& w = m.layers[L];
  const LayerRole& r = roles[L];
  const uint32_t n = ch.n, H = c.hidden_size, ihd = c.index_head_dim, inh = c.index_n_heads;
  const size_t iw = (size_t)inh * ihd;
  std::vector<float> iq(n * iw), wt(n * (size_t)inh);
  lin(pool, w.idx_q_b, qr, c.q_lora_rank, n, iq.data(), iw, /*round=*/true);
  lin(pool, w.idx_proj, x, H, n, wt.data(), inh, /*round=*/true);  // w = bf16(x . proj)
  const float denom = std::sqrt((float)(ihd * inh));
  const int sl = slot[(size_t)r.kv_source];
  const uint32_t ratio = roles[(size_t)r.kv_source].ratio;
  ch.sel[L].assign(n, {});
  std::vector<float> scores;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t t = ch.p0 + i;
    float* q = iq.data() + i * iw;
    for (uint32_t h = 0; h < inh; ++h) rope_apply(q + (size_t)h * ihd, ihd, ang[i]);
    fake_quant_mxfp4(q, iw);
    float* wi = wt.data() + (size_t)i * inh;
    for (uint32_t h = 0; h < inh; ++h) wi[h] = wi[h] / denom;  // w' (numerics.md 6)
    const uint32_t n_vis = (t + 1) / ratio;
    scores.assign(n_vis, 0.0f);
    pool.parallel_for(n_vis, [&](size_t b, size_t e) {
      for (size_t j = b; j < e; ++j) {
        const uint16_t* kj = index_k_row(s, ch, sl, (uint32_t)j);
        float acc = 0.0f;
        for (uint32_t h = 0; h < inh; ++h) {
          const float d = dot_bf16(kj, q + (size_t)h * ihd, ihd);
          acc += std::max(d, 0.0f) * wi[h];
        }
        scores[j] = acc;
      }
    }, 64);
    if (r.is_candidate_source)
      ch.cand[i] = candidate_blocks(scores, n_vis, c.candidate_block_size, c.candidate_topk_blocks);
    if (r.is_candidate_consumer) {
      const std::vector<uint8_t>& keep = ch.cand[i];
      for (uint32_t j = 0; j < n_vis; ++j)
        if (!keep[j / c.candidate_block_size]) scores[j] = -std::numeric_limits<float>::infinity();
    }
    ch.sel[L][i] = topk_ascending(scores, c.index_topk);
    if (ch.tracing) ch.trace[i].selected_rows[L] = ch.sel[L][i];
  }
}

void Engine::Impl::attention(Chunk& ch, const SequenceState& s, uint32_t L, const float* x, float* out) const {
  const LayerWeights& w = m.layers[L];
  const LayerRole& r = roles[L];
  const uint32_t n = ch.n, H = c.hidden_size, hd = c.head_dim, nh = c.num_attention_heads;
  const uint32_t qlr = c.q_lora_rank, W = c.sliding_window;
  const size_t qw = (size_t)nh * hd;
  std::vector<RopeAngles> ang(n);
  for (uint32_t i = 0; i < n; ++i) ang[i] = rope_angles(freqs[L], ch.p0 + i);

  // Queries: q = rope(lin(rms(lin(x, q_a)), q_b)); no per-head norm in V4.1.
  std::vector<float> qr(n * (size_t)qlr), q(n * qw);
  lin(pool, w.q_a, x, H, n, qr.data(), qlr, true);
  for (uint32_t i = 0; i < n; ++i) rms_norm(qr.data() + (size_t)i * qlr, w.q_a_norm.data(), qr.data() + (size_t)i * qlr, qlr, c.rms_norm_eps);
  lin(pool, w.q_b, qr.data(), qlr, n, q.data(), qw, true);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t h = 0; h < nh; ++h) rope_apply(q.data() + i * qw + (size_t)h * hd, hd, ang[i]);

  // This chunk's raw window rows: FP8 fake-quantized after RoPE.
  std::vector<float> kv(n * (size_t)hd);
  lin(pool, w.kv, x, H, n, kv.data(), hd, true);
  for (uint32_t i = 0; i < n; ++i) {
    float* ki = kv.data() + (size_t)i * hd;
    rms_norm(ki, w.kv_norm.data(), ki, hd, c.rms_norm_eps);
    rope_apply(ki, hd, ang[i]);
    fake_quant_fp8_window(ki, hd);
    store_bf16(ki, hd, ch.win.data() + ((size_t)L * n + i) * hd);
  }

  if (r.is_kv_source) compress(ch, L, x);
  if (r.is_index_source) indexer(ch, s, L, x, qr.data(), ang);

  // Rows per query: window rows ascending, then the selected compressed rows ascending.
  std::vector<std::vector<const uint16_t*>> rows(n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t t = ch.p0 + i;
    for (uint32_t p = t + 1 > W ? t + 1 - W : 0; p <= t; ++p)
      rows[i].push_back(p < ch.p0 ? s.window_kv.data() + ((size_t)L * W + p % W) * hd
                                  : ch.win.data() + ((size_t)L * n + (p - ch.p0)) * hd);
    if (r.ratio > 0) {
      const int sl = slot[(size_t)r.kv_source];
      const uint32_t n_vis = (t + 1) / roles[(size_t)r.kv_source].ratio;
      for (int32_t g : ch.sel[(size_t)r.topk_source][i])
        if ((uint32_t)g < n_vis) rows[i].push_back(comp_kv_row(s, ch, sl, (uint32_t)g));
    }
  }

  // Sparse attention per (token, head), numerics.md 6.
  std::vector<float> o(n * qw);
  const float scale = (float)(1.0 / std::sqrt((double)hd));
  pool.parallel_for((size_t)n * nh, [&](size_t b, size_t e) {
    std::vector<float> sc, acc(hd);
    for (size_t th = b; th < e; ++th) {
      const size_t i = th / nh, h = th % nh;
      const float* qh = q.data() + i * qw + h * hd;
      const std::vector<const uint16_t*>& rw = rows[i];
      sc.resize(rw.size());
      float mx = -std::numeric_limits<float>::infinity();
      for (size_t k = 0; k < rw.size(); ++k) {
        sc[k] = dot_bf16(rw[k], qh, hd) * scale;
        mx = std::max(mx, sc[k]);
      }
      float den = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (size_t k = 0; k < rw.size(); ++k) {
        const float p = std::exp(sc[k] - mx);
        den += p;
        const float pb = round_bf16(p);  // BF16 probability in the numerator only
        for (uint32_t d = 0; d < hd; ++d) acc[d] += pb * bf16_to_f32(rw[k][d]);
      }
      den += std::exp(w.attn_sinks[h] - mx);
      float* oh = o.data() + i * qw + h * hd;
      for (uint32_t d = 0; d < hd; ++d) oh[d] = round_bf16(acc[d] / den);
    }
  }, 1);

  // Inverse RoPE, then the grouped low-rank output projection.
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t h = 0; h < nh; ++h) rope_apply(o.data() + i * qw + (size_t)h * hd, hd, ang[i], /*inverse=*/true);
  const uint32_t og = c.o_groups, olr = c.o_lora_rank;
  const size_t gin = qw / og, zw = (size_t)og * olr;
  std::vector<float> z(n * zw);
  for (uint32_t g = 0; g < og; ++g)
    lin(pool, w.out_a, o.data() + g * gin, qw, n, z.data() + (size_t)g * olr, zw, true, (uint64_t)g * olr, olr);
  lin(pool, w.out_b, z.data(), zw, n, out, H, true);
}

}  // namespace sluice
