// MoE FFN for a chunk (spec 3.6, docs/numerics.md 7).
//
// The router scores every routed expert with sqrt(softplus(logit)); a per-expert bias (the
// image bias for masked tokens) only decides which top-k experts are chosen, the weights are
// the unbiased scores normalized and scaled. Each chosen expert is a clamped SwiGLU; the shared
// expert (weight 1) runs for every token. Routed experts are fetched through the ExpertSource
// once per layer per chunk and run in ascending expert id, which is also the order each token's
// routed sum is accumulated in.
//
// Cache-aware routing (EngineOptions::route_bias, off by default, lossy) adds D to the selection
// bias of the experts the source already holds, taken once per layer per chunk; like the image
// bias it moves only the choice, never the weights.
#include <algorithm>

#include "model/deepseek41/forward_impl.h"

namespace sluice {

bool Engine::Impl::prefetching() const { return opt.experts != nullptr && opt.prefetch; }

std::vector<float> Engine::Impl::selection_bias(uint32_t L, const std::vector<float>& base) const {
  std::vector<float> b = base;
  if (opt.route_bias == 0.0f || opt.experts == nullptr) return b;
  for (uint32_t e : experts->cached(L))
    if (e < b.size()) b[e] += opt.route_bias;
  return b;
}

// Layer L's router logits on the previous layer's FFN input are in RouterNext (moe() projects
// them beside its own router's, and has synced).
std::vector<uint32_t> Engine::Impl::predict_experts(uint32_t L, const Pass& p) const {
  const LayerWeights& w = m.layers[L];
  const uint32_t n = p.n, E = c.n_routed_experts;
  const Mat logits = ws(Ws::RouterNext, n);
  std::vector<uint8_t> want(E, 0);
  const std::vector<float> text_bias = selection_bias(L, w.exp_bias), image_bias = selection_bias(L, w.exp_bias_vl);
  for (uint32_t i = 0; i < n; ++i) {
    const std::vector<float>& bias = p.is_masked(i) ? image_bias : text_bias;
    const Routing rt = route(std::span<const float>(logits.row(i), E), bias, c.num_experts_per_tok,
                             c.norm_topk_prob, c.routed_scaling_factor);
    for (uint32_t e : rt.experts) want[e] = 1;
    if (p.tracing) {  // each row's own guess, so its recall can be measured (bench/bench_routing.cpp)
      std::vector<uint32_t>& g = p.trace[i]->guessed_experts[L];
      g = rt.experts;
      std::sort(g.begin(), g.end());
    }
  }
  std::vector<uint32_t> out;
  for (uint32_t e = 0; e < E; ++e)
    if (want[e]) out.push_back(e);
  return out;
}

void Engine::Impl::moe(Pass& p, uint32_t L, CMat x, Mat out) const {
  const LayerWeights& w = m.layers[L];
  const uint32_t n = p.n, H = c.hidden_size, E = c.n_routed_experts;
  const float lim = c.swiglu_limit;

  // Router: f32 logits (not rounded); the choice is made on the host, where the expert I/O is.
  // With read-ahead, the next layer's router on the same input guesses its experts: both in one
  // batch.
  const Mat logits = ws(Ws::Router, n);
  const bool device_hints = opt.prefetch && !opt.remote && be.prefetches_experts();
  const bool guess = (prefetching() || device_hints) && L + 1 < c.num_hidden_layers;
  std::vector<LinearCall> routers = {{&w.gate_inp, x, logits, false}};
  if (guess) routers.push_back({&m.layers[L + 1].gate_inp, x, ws(Ws::RouterNext, n), false});
  be.linears(routers);
  be.sync();
  std::vector<ExpertTriple> triples;
  const std::vector<float> text_bias = selection_bias(L, w.exp_bias), image_bias = selection_bias(L, w.exp_bias_vl);
  for (uint32_t i = 0; i < n; ++i) {
    const std::vector<float>& bias = p.is_masked(i) ? image_bias : text_bias;
    const Routing rt = route(std::span<const float>(logits.row(i), E), bias, c.num_experts_per_tok,
                             c.norm_topk_prob, c.routed_scaling_factor);
    for (size_t k = 0; k < rt.experts.size(); ++k) triples.push_back({rt.experts[k], i, rt.weights[k]});
    if (p.tracing) {
      p.trace[i]->experts[L] = rt.experts;
      p.trace[i]->expert_weights[L] = rt.weights;
      if (opt.trace_ffn_inputs) {  // lets tests re-run a router on exactly this input
        std::vector<std::vector<float>>& fi = p.trace[i]->ffn_inputs;
        fi.resize(c.num_hidden_layers);
        fi[L].assign(x.row(i), x.row(i) + H);
      }
    }
  }
  // Ascending expert, tokens in order within an expert.
  std::stable_sort(triples.begin(), triples.end(),
                   [](const ExpertTriple& a, const ExpertTriple& b) { return a.expert < b.expert; });
  if (opt.remote) return moe_split(p, L, x, triples, out);
  std::vector<uint32_t> used;
  for (const ExpertTriple& t : triples)
    if (used.empty() || used.back() != t.expert) used.push_back(t.expert);

  // Start reading this layer's experts now, so the I/O overlaps the shared expert below, and
  // guess the next layer's: its router applied to this layer's FFN input (the residual stream
  // changes little from one layer to the next). Hints never change results, only what is read.
  const std::vector<uint32_t> next = guess ? predict_experts(L + 1, p) : std::vector<uint32_t>{};
  if (prefetching()) {
    experts->hint(L, be.unheld_experts(*experts, L, used));
    if (guess) experts->hint(L + 1, be.unheld_experts(*experts, L + 1, next));
  }
  // A device with expert copies of its own starts copying in this layer's misses and the guessed
  // next layer's that the source holds, while the shared expert and this layer's routed
  // experts run.
  if (device_hints) {
    const ExpertLayout& here = w.experts;
    const ExpertLayout* after = guess ? &m.layers[L + 1].experts : nullptr;
    be.prefetch_experts(*experts, L, ExpertTensors{&here.gate, &here.up, &here.down}, used,
                        after ? ExpertTensors{&after->gate, &after->up, &after->down} : ExpertTensors{}, next);
  }

  // The shared expert just before the routed ones: a backend that defers work may send its last
  // projection with the routed experts' first.
  const Mat sh = ws(Ws::Shared, n), routed = ws(Ws::Routed, n);
  be.fill_rows(routed, std::vector<float>(H, 0.0f));  // the routed sums start at zero
  be.shared_ffn(w.gate_sh, w.up_sh, w.down_sh, lim, x, sh);
  const ExpertLayout& lay = w.experts;  // routed_ffn prepares the experts it reads from the source
  be.routed_ffn(ExpertTensors{&lay.gate, &lay.up, &lay.down}, *experts, L, triples, lim, x, routed);
  name(p, (int)L, "ffn_routed", routed);
  be.add_round(routed, sh, out);  // f_out
}

// Expert parallelism: the triples of experts other processes own go out first, so they compute
// while this one runs the shared expert and its own experts; then every term, local or remote,
// is added in the sorted triple order, the order routed_ffn adds them in.
void Engine::Impl::moe_split(Pass& p, uint32_t L, CMat x, const std::vector<ExpertTriple>& triples, Mat out) const {
  const LayerWeights& w = m.layers[L];
  const uint32_t n = p.n, H = c.hidden_size;
  const float lim = c.swiglu_limit;
  std::vector<ExpertTriple> mine, theirs;
  std::vector<uint32_t> at_mine, at_theirs, tokens(triples.size());
  for (uint32_t j = 0; j < triples.size(); ++j) {
    const bool local = opt.remote->local(L, triples[j].expert);
    (local ? mine : theirs).push_back(triples[j]);
    (local ? at_mine : at_theirs).push_back(j);
    tokens[j] = triples[j].token;
  }
  std::vector<uint32_t> used;
  for (const ExpertTriple& t : mine)
    if (used.empty() || used.back() != t.expert) used.push_back(t.expert);
  if (!theirs.empty()) opt.remote->begin(L, theirs, x);
  if (prefetching()) {
    experts->hint(L, be.unheld_experts(*experts, L, used));
    if (L + 1 < c.num_hidden_layers) {
      std::vector<uint32_t> next, theirs_next;
      for (uint32_t e : predict_experts(L + 1, p)) (opt.remote->local(L + 1, e) ? next : theirs_next).push_back(e);
      experts->hint(L + 1, be.unheld_experts(*experts, L + 1, next));
      // The other processes' predicted experts: they read them while this one finishes layer L
      // and runs layer L + 1's attention.
      std::sort(theirs_next.begin(), theirs_next.end());
      theirs_next.erase(std::unique(theirs_next.begin(), theirs_next.end()), theirs_next.end());
      if (!theirs_next.empty()) opt.remote->hint(L + 1, theirs_next);
    }
  }
  const Mat sh = ws(Ws::Shared, n), routed = ws(Ws::Routed, n);
  be.shared_ffn(w.gate_sh, w.up_sh, w.down_sh, lim, x, sh);
  // One term per triple (triples x hidden f32: the decode step's 6 rows, a prefill chunk's
  // chunk x top-k), in the order they are added.
  const Tensor terms = be.tensor(triples.size(), H);
  if (!mine.empty()) {
    const Tensor t = be.tensor(mine.size(), H);
    const ExpertLayout& lay = w.experts;
    be.routed_ffn_rows(ExpertTensors{&lay.gate, &lay.up, &lay.down}, *experts, L, mine, lim, x, t.m());
    be.scatter_rows(t.c(), at_mine, terms.m());
  }
  if (!theirs.empty()) {
    const Tensor t = be.tensor(theirs.size(), H);
    be.sync();
    opt.remote->finish(L, t.m());
    be.scatter_rows(t.c(), at_theirs, terms.m());
  }
  be.fill_rows(routed, std::vector<float>(H, 0.0f));
  be.add_rows(terms.c(), tokens, routed);
  name(p, (int)L, "ffn_routed", routed);
  be.add_round(routed, sh, out);  // f_out
}

}  // namespace sluice
