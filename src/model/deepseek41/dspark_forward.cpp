#include "model/deepseek41/dspark_forward.h"

#include <algorithm>
#include <cstring>

#include "kernels/numerics.h"
#include "model/deepseek41/grouped_output.h"
#include "model/deepseek41/primitives.h"
#include "model/deepseek41/sequence_state.h"
#include "util/error.h"

namespace sluice {

std::vector<std::pair<size_t, size_t>> drafter_tensor_shapes(const ModelConfig& c, const DsparkConfig& d) {
  const size_t H = c.hidden_size, hc = c.hc_mult, q_dim = (size_t)c.num_attention_heads * c.head_dim;
  const size_t B = d.block_size, W = c.sliding_window, mix = (2 + hc) * hc;
  const size_t cw = d.target_layers.size() * H;
  return {{B, hc * H}, {B, hc * H}, {B, H}, {B, H},                                   // X, X2, xin, out
          {B, mix}, {B, mix}, {B, hc},                                                // A, F, P0
          {B, c.q_lora_rank}, {B, q_dim}, {B, c.head_dim}, {B, q_dim},                 // qr, q, kv, heads
          {B, (size_t)c.o_groups * c.o_lora_rank}, {B, d.expert_count}, {B, H}, {B, H},  // z, router, shared, routed
          {W, cw}, {W, H}, {W, c.head_dim},                                           // commit: rows, z, entries
          {B, H}, {B, H}, {B, c.vocab_size},                                          // h, normed h, logits
          {1, d.markov_rank}, {1, c.vocab_size}, {1, H + d.markov_rank}, {1, 1}};     // u, bias, [h, u], kappa
}

uint64_t drafter_scratch_bytes(const ModelConfig& c, const DsparkConfig& d) {
  uint64_t b = 0;
  for (auto [rows, width] : drafter_tensor_shapes(c, d)) b += (uint64_t)rows * width * sizeof(float);
  return b;
}

uint64_t draft_state_bytes(const ModelConfig& c, const DsparkConfig& d) {
  return (uint64_t)d.stages * c.sliding_window * c.head_dim * sizeof(uint16_t);
}

namespace {
const ExpertSource& drafter_experts(const DsparkModel& d, const ExpertSource* given) {
  if (given) return *given;
  if (!d.resident_experts) throw Error("dspark: the drafter's routed experts are not loaded and no expert store was given");
  return d.experts;
}
}  // namespace

Drafter::Drafter(const Model& target, const DsparkModel& d, const Backend& be, const ExpertSource* experts)
    : t_(target), d_(d), be_(be), experts_(drafter_experts(d, experts)), freqs_(rope_frequencies(target.config, 0)), B_(d.config.block_size),
      W_(target.config.sliding_window), hd_(target.config.head_dim) {
  std::vector<Tensor*> order = {&X_, &X2_, &xin_, &out_, &A_, &F_, &P0_, &qr_, &q_, &kv_, &heads_, &z_, &router_,
                                &sh_, &routed_, &cap_, &zc_, &ec_, &h_, &hn_, &lg_, &u_, &bias_, &hu_, &kappa_};
  const std::vector<std::pair<size_t, size_t>> shapes = drafter_tensor_shapes(t_.config, d_.config);
  for (size_t i = 0; i < order.size(); ++i) *order[i] = be_.tensor(shapes[i].first, shapes[i].second);
}

DraftState Drafter::new_state() const {
  DraftState st;
  st.rings.assign((size_t)d_.config.stages * W_ * hd_, 0);
  return st;
}

// spec 6.3 steps 2-3: z_p = rms(lin(H_p, main_proj), main_norm); per stage
// e_s(p) = fp8qdq(rope(rms(lin(z_p, attn_kv_s), kv_norm_s), p)) at ring slot p mod window.
void Drafter::commit(DraftState& st, const float* hidden, uint32_t n) const {
  if (st.rings.size() != (size_t)d_.config.stages * W_ * hd_) throw Error("dspark: the draft state is not this drafter's");
  const float eps = t_.config.rms_norm_eps;
  const RopeTable rt{freqs_.data(), freqs_.size()};
  const size_t cw = capture_width();
  // Only the last `window` positions can still be read; earlier ones would be overwritten.
  const uint32_t skip = n > W_ ? n - W_ : 0;
  for (uint32_t i0 = skip; i0 < n; i0 += W_) {
    const uint32_t k = std::min(W_, n - i0);
    const Mat cap = cap_.m().rows(0, k), z = zc_.m().rows(0, k), e = ec_.m().rows(0, k);
    std::memcpy(cap.p, hidden + (size_t)i0 * cw, (size_t)k * cw * sizeof(float));
    be_.linear(d_.main_proj, cap, z, /*round=*/true);
    be_.rms_norm(z, d_.main_norm.data(), eps);
    std::vector<uint64_t> pos(k);
    for (uint32_t i = 0; i < k; ++i) pos[i] = (uint64_t)st.committed + i0 + i;
    for (uint32_t s = 0; s < d_.config.stages; ++s) {
      const LayerWeights& w = d_.stages[s];
      be_.linear(w.kv, z, e, true);
      be_.rms_norm(e, w.kv_norm.data(), eps);
      be_.rope(e, hd_, rt, pos, false);
      be_.fake_quant(e, FakeQuant::Fp8Window);
      be_.sync();
      uint16_t* ring = st.rings.data() + (size_t)s * W_ * hd_;
      for (uint32_t i = 0; i < k; ++i) be_.store_bf16(CMat(e).rows(i, 1), ring + (size_t)(pos[i] % W_) * hd_, hd_);
    }
  }
  be_.sync();
  st.committed += n;
}

// spec 6.3 step 5, attention: queries of the block rows at c+1+j; every row sees the ring
// (slots 0 .. min(window, c+1) - 1, positions max(0, c-window+1) .. c) and all block keys.
void Drafter::stage_attention(uint32_t s, const DraftState& st, uint32_t c, Mat x, Mat out) const {
  const LayerWeights& w = d_.stages[s];
  const ModelConfig& mc = t_.config;
  const float eps = mc.rms_norm_eps;
  const RopeTable rt{freqs_.data(), freqs_.size()};
  std::vector<uint64_t> pos(B_);
  for (uint32_t j = 0; j < B_; ++j) pos[j] = (uint64_t)c + 1 + j;
  const Mat qr = qr_.m(), q = q_.m(), kv = kv_.m(), o = heads_.m(), z = z_.m();
  const LinearCall of_x[2] = {{&w.q_a, x, qr, true}, {&w.kv, x, kv, true}};  // one batch (independent)
  be_.linears(of_x);
  be_.rms_norm(qr, w.q_a_norm.data(), eps);
  be_.linear(w.q_b, qr, q, true);
  be_.rope(q, hd_, rt, pos, false);
  be_.rms_norm(kv, w.kv_norm.data(), eps);
  be_.rope(kv, hd_, rt, pos, false);
  be_.fake_quant(kv, FakeQuant::Fp8Window);
  std::vector<uint16_t> block((size_t)B_ * hd_);
  be_.store_bf16(kv, block.data(), hd_);
  be_.sync();
  const uint16_t* ring = st.rings.data() + (size_t)s * W_ * hd_;
  std::vector<const uint16_t*> rows;
  for (uint32_t slot = 0; slot < std::min(W_, c + 1); ++slot) rows.push_back(ring + (size_t)slot * hd_);
  for (uint32_t j = 0; j < B_; ++j) rows.push_back(block.data() + (size_t)j * hd_);
  RowAttention a;
  a.q = q;
  a.heads = mc.num_attention_heads;
  a.head_dim = hd_;
  a.rows = rows;
  a.sinks = w.attn_sinks.data();
  be_.attend_rows(a, o);
  be_.rope(o, hd_, rt, pos, /*inverse=*/true);
  grouped_output(be_, mc, w, CMat(o).cols(0, (size_t)mc.num_attention_heads * hd_), z, out);
}

// spec 6.3 step 5, MoE: top-k of sqrt(softplus(router)) + bias over the drafter's experts, the
// target's normalisation and route scale, plus the shared expert (forward_moe.cpp's math).
void Drafter::stage_moe(uint32_t s, Mat x, Mat out, DraftBlock& b) const {
  const LayerWeights& w = d_.stages[s];
  const ModelConfig& mc = t_.config;
  const uint32_t E = d_.config.expert_count, H = mc.hidden_size;
  const Mat logits = router_.m();
  be_.linear(w.gate_inp, x, logits, /*round=*/false);
  be_.sync();
  std::vector<ExpertTriple> triples;
  b.experts[s].resize(B_);
  for (uint32_t i = 0; i < B_; ++i) {
    const Routing rt = route(std::span<const float>(logits.row(i), E), w.exp_bias, d_.config.expert_used,
                             mc.norm_topk_prob, mc.routed_scaling_factor);
    for (size_t k = 0; k < rt.experts.size(); ++k) triples.push_back({rt.experts[k], i, rt.weights[k]});
    b.experts[s][i] = rt.experts;
  }
  std::stable_sort(triples.begin(), triples.end(),
                   [](const ExpertTriple& p, const ExpertTriple& q) { return p.expert < q.expert; });
  const Mat sh = sh_.m(), routed = routed_.m();
  be_.fill_rows(routed, std::vector<float>(H, 0.0f));
  be_.shared_ffn(w.gate_sh, w.up_sh, w.down_sh, mc.swiglu_limit, x, sh);  // beside the routed ones (forward_moe.cpp)
  const ExpertLayout& lay = w.experts;
  be_.routed_ffn(ExpertTensors{&lay.gate, &lay.up, &lay.down}, experts_, s, triples, mc.swiglu_limit, x, routed);
  be_.add_round(routed, sh, out);
}

DraftBlock Drafter::propose(const DraftState& st, TokenId anchor) const {
  if (st.committed == 0) throw Error("dspark: no committed position to draft after");
  if (anchor >= t_.config.vocab_size) throw Error("dspark: anchor token " + std::to_string(anchor) + " >= vocab size");
  const ModelConfig& mc = t_.config;
  const DsparkConfig& dc = d_.config;
  const uint32_t hc = mc.hc_mult, V = mc.vocab_size, H = mc.hidden_size, r = dc.markov_rank;
  const HcParams hp{mc.hc_mult, mc.hc_sinkhorn_iters, mc.hc_eps, mc.rms_norm_eps};
  DraftBlock b;
  b.c = st.committed - 1;
  b.anchor = anchor;
  b.experts.resize(dc.stages);

  // spec 6.3 step 4: y = [anchor, noise, ...]; X = hc copies of the embedding rows; P = [1, 0, ..].
  std::vector<TokenId> y(B_, dc.noise_token);
  y[0] = anchor;
  const Mat X = X_.m(), X2 = X2_.m(), xin = xin_.m(), out = out_.m(), A = A_.m(), F = F_.m();
  be_.embed(t_.token_embd, y, hc, X);
  std::vector<float> first(hc, 0.0f);
  first[0] = 1.0f;
  be_.fill_rows(P0_.m(), first);
  CMat P = P0_.m();
  for (uint32_t s = 0; s < dc.stages; ++s) {
    const LayerWeights& w = d_.stages[s];
    be_.hc_mix(w.hc_attn_fn, w.hc_attn_base.data(), w.hc_attn_scale.data(), hp, X, A);
    be_.hc_pre_norm(X, P, w.attn_norm.data(), hp, xin);
    stage_attention(s, st, b.c, xin, out);
    be_.hc_post(out, X, A, hc, X2);
    be_.hc_mix(w.hc_ffn_fn, w.hc_ffn_base.data(), w.hc_ffn_scale.data(), hp, X2, F);
    be_.hc_pre_norm(X2, A.cols(0, hc), w.ffn_norm.data(), hp, xin);
    stage_moe(s, xin, out, b);
    be_.hc_post(out, X2, F, hc, X);
    P = F.cols(0, hc);  // the next stage's attention collapses with this stage's FFN pre-weights
  }
  // Step 6: h = the last collapse (not normalised); logits = rms(h, norm) . output.
  const Mat h = h_.m(), hn = hn_.m(), lg = lg_.m();
  be_.hc_pre(X, P, hp, h);
  be_.sync();
  std::memcpy(hn.p, h.p, (size_t)B_ * H * sizeof(float));
  be_.rms_norm(hn, d_.norm.data(), mc.rms_norm_eps);
  be_.linear(t_.output, hn, lg, /*round=*/false);
  be_.sync();

  // Steps 7-8, row by row: the Markov bias of the token before (the anchor, then each draft),
  // the draft, and the confidence logit of [h_j, u_j].
  b.logits.resize((size_t)B_ * V);
  b.drafts.resize(B_);
  b.confidence.resize(B_);
  TokenId prev = anchor;
  for (uint32_t j = 0; j < B_; ++j) {
    const Mat u = u_.m(), bias = bias_.m(), hu = hu_.m();
    be_.embed(d_.markov_w1, std::span<const TokenId>(&prev, 1), 1, u);
    be_.linear(d_.markov_w2, u, bias, /*round=*/false);
    be_.sync();
    float* l = b.logits.data() + (size_t)j * V;
    const float* lj = lg.row(j);
    uint32_t best = 0;
    for (uint32_t v = 0; v < V; ++v) {
      l[v] = lj[v] + bias.p[v];
      if (l[v] > l[best]) best = v;  // strict: ties keep the lowest id
    }
    std::memcpy(hu.p, h.row(j), H * sizeof(float));
    std::memcpy(hu.p + H, u.p, r * sizeof(float));
    be_.linear(d_.confidence, hu, kappa_.m(), /*round=*/false);
    be_.sync();
    b.confidence[j] = kappa_.m().p[0];
    b.drafts[j] = best;
    prev = best;
  }
  return b;
}

}  // namespace sluice
