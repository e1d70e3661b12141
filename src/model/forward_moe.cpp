// MoE FFN for a chunk (spec 3.6, docs/numerics.md 7): sqrt(softplus) router with the
// selection-only bias, clamped SwiGLU experts, the shared expert. Routed experts are fetched
// through the ExpertSource once per layer per chunk and run in ascending expert id, which is
// also the order each token's routed sum is accumulated in.
#include <algorithm>
#include <cmath>
#include <map>

#include "kernels/fp.h"
#include "model/forward_impl.h"
#include "model/linear.h"

namespace sluice {

namespace {

// h = bf16(silu(min(g, lim)) * clamp(u, -lim, lim) * wk); g and u are BF16 already.
inline float swiglu(float g, float u, float lim, float wk) {
  g = std::min(g, lim);
  u = std::clamp(u, -lim, lim);
  return round_bf16((silu(g) * u) * wk);
}

}  // namespace

bool Engine::Impl::prefetching() const { return opt.experts != nullptr && opt.prefetch; }

std::vector<uint32_t> Engine::Impl::predict_experts(uint32_t L, const Chunk& ch, const float* x) const {
  const LayerWeights& w = m.layers[L];
  const uint32_t n = ch.n, H = c.hidden_size, E = c.n_routed_experts;
  std::vector<float> logits(n * (size_t)E);
  lin(pool, w.gate_inp, x, H, n, logits.data(), E, /*round=*/false);
  std::vector<uint8_t> want(E, 0);
  for (uint32_t i = 0; i < n; ++i) {
    const std::vector<float>& bias = ch.is_masked(i) ? w.exp_bias_vl : w.exp_bias;
    const Routing rt = route(std::span<const float>(logits.data() + (size_t)i * E, E), bias,
                             c.num_experts_per_tok, c.norm_topk_prob, c.routed_scaling_factor);
    for (uint32_t e : rt.experts) want[e] = 1;
  }
  std::vector<uint32_t> out;
  for (uint32_t e = 0; e < E; ++e)
    if (want[e]) out.push_back(e);
  return out;
}

void Engine::Impl::moe(Chunk& ch, uint32_t L, const float* x, float* out) const {
  const LayerWeights& w = m.layers[L];
  const uint32_t n = ch.n, H = c.hidden_size, E = c.n_routed_experts;
  const float lim = c.swiglu_limit;

  // Router: f32 logits (not rounded), routing per token.
  std::vector<float> logits(n * (size_t)E);
  lin(pool, w.gate_inp, x, H, n, logits.data(), E, /*round=*/false);
  std::map<uint32_t, std::vector<std::pair<uint32_t, float>>> by_expert;  // ascending expert id
  for (uint32_t i = 0; i < n; ++i) {
    const std::vector<float>& bias = ch.is_masked(i) ? w.exp_bias_vl : w.exp_bias;
    const Routing rt = route(std::span<const float>(logits.data() + (size_t)i * E, E), bias,
                             c.num_experts_per_tok, c.norm_topk_prob, c.routed_scaling_factor);
    for (size_t k = 0; k < rt.experts.size(); ++k) by_expert[rt.experts[k]].push_back({i, rt.weights[k]});
    if (ch.tracing) {
      ch.trace[i].experts[L] = rt.experts;
      ch.trace[i].expert_weights[L] = rt.weights;
      if (opt.trace_ffn_inputs) {  // lets tests re-run a router on exactly this input
        std::vector<std::vector<float>>& fi = ch.trace[i].ffn_inputs;
        fi.resize(c.num_hidden_layers);
        fi[L].assign(x + (size_t)i * H, x + (size_t)(i + 1) * H);
      }
    }
  }

  // Start reading this layer's experts now, so the I/O overlaps the shared expert below, and
  // guess the next layer's: its router applied to this layer's FFN input (the residual stream
  // changes little from one layer to the next). Hints never change results, only what is read.
  std::vector<uint32_t> used;
  for (const auto& kv : by_expert) used.push_back(kv.first);
  if (prefetching()) {
    experts->hint(L, used);
    if (L + 1 < c.num_hidden_layers) experts->hint(L + 1, predict_experts(L + 1, ch, x));
  }

  // Shared expert (weight 1).
  const uint32_t Fs = (uint32_t)w.gate_sh.rows;
  std::vector<float> g(n * (size_t)Fs), u(n * (size_t)Fs), sh(n * (size_t)H);
  lin(pool, w.gate_sh, x, H, n, g.data(), Fs, true);
  lin(pool, w.up_sh, x, H, n, u.data(), Fs, true);
  for (size_t k = 0; k < g.size(); ++k) g[k] = swiglu(g[k], u[k], lim, 1.0f);
  lin(pool, w.down_sh, g.data(), Fs, n, sh.data(), H, true);

  // Routed experts.
  std::vector<float> routed(n * (size_t)H, 0.0f);
  experts->prepare(L, used);
  const ExpertLayout& lay = w.experts;
  const uint32_t F = (uint32_t)lay.gate.rows;
  const ActRows xg = quantize_rows(lay.gate.act(), x, H, n, H);
  const ActRows xu = lay.up.act() == lay.gate.act() ? ActRows{} : quantize_rows(lay.up.act(), x, H, n, H);
  const ActRows& xu_ref = lay.up.act() == lay.gate.act() ? xg : xu;
  std::vector<float> eg, eu, ed;
  std::vector<const uint8_t*> ag, au, ad;
  for (const auto& [e, toks] : by_expert) {
    const ExpertWeights ew = experts->get(L, e);
    Weight Wg = lay.gate, Wu = lay.up, Wd = lay.down;
    Wg.data = ew.gate;
    Wu.data = ew.up;
    Wd.data = ew.down;
    const size_t ne = toks.size();
    ag.resize(ne);
    au.resize(ne);
    for (size_t j = 0; j < ne; ++j) {
      ag[j] = xg.row(toks[j].first);
      au[j] = xu_ref.row(toks[j].first);
    }
    eg.resize(ne * F);
    eu.resize(ne * F);
    matmul(pool, Wg, ag, eg.data(), F, true, 0, F);
    matmul(pool, Wu, au, eu.data(), F, true, 0, F);
    for (size_t j = 0; j < ne; ++j)
      for (uint32_t k = 0; k < F; ++k) eg[j * F + k] = swiglu(eg[j * F + k], eu[j * F + k], lim, toks[j].second);
    const ActRows hq = quantize_rows(Wd.act(), eg.data(), F, ne, F);
    ad.resize(ne);
    for (size_t j = 0; j < ne; ++j) ad[j] = hq.row(j);
    ed.resize(ne * H);
    matmul(pool, Wd, ad, ed.data(), H, true, 0, H);
    for (size_t j = 0; j < ne; ++j) {
      float* ri = routed.data() + (size_t)toks[j].first * H;
      const float* d = ed.data() + j * H;
      for (uint32_t k = 0; k < H; ++k) ri[k] += d[k];
    }
  }
  for (size_t k = 0; k < routed.size(); ++k) out[k] = round_bf16(routed[k] + sh[k]);  // f_out
}

}  // namespace sluice
