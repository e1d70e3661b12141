// The Engine: chunking, the block loop with lagged hyper-connections (spec 3.1-3.3, 3.7), state
// allocation and the transactional commit. The sublayers live in forward_{engram,attention,moe}.cpp.
#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/cpu.h"
#include "kernels/fp.h"
#include "model/forward_impl.h"
#include "model/linear.h"
#include "util/error.h"

namespace sluice {

Engine::Impl::Impl(const Model& model, const EngineOptions& o)
    : m(model), c(model.config), roles(model.roles), opt(o), pool(std::max(1, o.threads)),
      experts(o.experts ? o.experts : nullptr) {
  if (!experts) experts = &resident_expert_source(m);
  freqs.resize(c.num_hidden_layers);
  slot.assign(c.num_hidden_layers, -1);
  for (uint32_t L = 0; L < c.num_hidden_layers; ++L) freqs[L] = rope_frequencies(c, roles[L].ratio);
  for (size_t i = 0; i < c.kv_source_layer_ids.size(); ++i) slot[c.kv_source_layer_ids[i]] = (int)i;
  dot_bf16 = dot_for(type_traits(GgmlType::BF16));
}

Engine::Engine(const Model& m, EngineOptions o) : model_(m), opt_(o) {
  if (o.ctx == 0) throw Error("engine: ctx must be at least 1");
  if (o.chunk == 0) throw Error("engine: chunk must be at least 1");
  impl_ = std::make_unique<Impl>(m, o);
}

Engine::~Engine() = default;

uint32_t sequence_position(const SequenceState& s) { return s.pos; }

SequenceState Engine::new_sequence() const { return impl_->new_sequence(); }

EngineFootprint Engine::footprint() const {
  return engine_footprint(model_.config, opt_.ctx, opt_.chunk, model_.loaded_bytes);
}

void Engine::reset(SequenceState& s) const {
  impl_->check_state(s);
  s.pos = 0;
  std::fill(s.window_kv.begin(), s.window_kv.end(), 0);
  for (SourceCache& sc : s.sources) {
    std::fill(sc.kv.begin(), sc.kv.end(), 0);
    std::fill(sc.index_k.begin(), sc.index_k.end(), 0);
    std::fill(sc.carry_k.begin(), sc.carry_k.end(), 0.0f);
    std::fill(sc.carry_s.begin(), sc.carry_s.end(), 0.0f);
  }
  std::fill(s.engram_tail.begin(), s.engram_tail.end(), kEngramDead);
}

// spec 7: everything sized for ctx up front, so a copy is a full snapshot. The sizes come from
// sequence_shape, which admission's figures come from too (model/engine_footprint.h).
SequenceState Engine::Impl::new_sequence() const {
  const SequenceShape sh = sequence_shape(c, roles, opt.ctx);
  SequenceState s;
  s.ctx = sh.ctx;
  s.window = sh.window;
  s.head_dim = sh.head_dim;
  s.window_kv.assign(sh.window_values, 0);
  for (const SourceShape& ss : sh.sources) {
    SourceCache sc;
    sc.layer = ss.layer;
    sc.ratio = ss.ratio;
    sc.kv.assign(ss.rows * ss.kv_width, 0);
    sc.index_k.assign(ss.rows * ss.index_width, 0);
    sc.carry_k.assign(ss.carry_values, 0.0f);
    sc.carry_s.assign(ss.carry_values, 0.0f);
    s.sources.push_back(std::move(sc));
  }
  s.engram_tail.assign(sh.engram_history, kEngramDead);
  return s;
}

void Engine::Impl::check_state(const SequenceState& s) const {
  bool ok = s.window == c.sliding_window && s.head_dim == c.head_dim &&
            s.window_kv.size() == (size_t)c.num_hidden_layers * c.sliding_window * c.head_dim &&
            s.sources.size() == c.kv_source_layer_ids.size() &&
            s.engram_tail.size() == c.engram_max_ngram_size - 1 && s.pos <= s.ctx;
  for (size_t i = 0; ok && i < s.sources.size(); ++i) {
    const SourceCache& sc = s.sources[i];
    const size_t rows = s.ctx / std::max<uint32_t>(1, sc.ratio);
    ok = sc.layer == c.kv_source_layer_ids[i] && sc.ratio == roles[sc.layer].ratio &&
         sc.kv.size() == rows * c.head_dim && sc.index_k.size() == rows * c.index_head_dim;
  }
  if (!ok) throw Error("engine: the sequence state was not made by an engine for this model");
}

const uint16_t* Engine::Impl::comp_kv_row(const SequenceState& s, const Chunk& ch, int sl, uint32_t g) const {
  const NewSourceRows& nr = ch.src[(size_t)sl];
  if (g < nr.first) return s.sources[(size_t)sl].kv.data() + (size_t)g * c.head_dim;
  return nr.kv.data() + (size_t)(g - nr.first) * c.head_dim;
}

const uint16_t* Engine::Impl::index_k_row(const SequenceState& s, const Chunk& ch, int sl, uint32_t g) const {
  const NewSourceRows& nr = ch.src[(size_t)sl];
  if (g < nr.first) return s.sources[(size_t)sl].index_k.data() + (size_t)g * c.index_head_dim;
  return nr.ik.data() + (size_t)(g - nr.first) * c.index_head_dim;
}

void Engine::Impl::name(const Chunk& ch, int L, const char* what, const float* data, size_t width,
                        size_t stride) const {
  if (!opt.observer) return;
  std::string nm;
  if (L >= 0) {
    nm = std::to_string(L);
    nm.insert(nm.begin(), 'l');
    nm.push_back('.');
  }
  nm.append(what);
  if (opt.observer->wants(nm)) opt.observer->observe(nm, ch.p0, ch.n, data, width, stride);
}

namespace {

// spec 3.2 hc_mixes for every token of the chunk: the projections are one linear layer over the
// flattened streams (f32, no rounding), scaled by the f32 rms factor of the streams.
std::vector<HcMix> hc_mixes(ThreadPool& pool, const ModelConfig& c, const Weight& fn,
                            const std::vector<float>& base, const std::vector<float>& scale,
                            const float* X, uint32_t n) {
  const size_t flat = (size_t)c.hc_mult * c.hidden_size;
  const size_t nmix = fn.rows;
  std::vector<float> raw(n * nmix);
  lin(pool, fn, X, flat, n, raw.data(), nmix, /*round=*/false);
  std::vector<HcMix> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    const float r = rms_factor(X + i * flat, flat, c.rms_norm_eps);
    float* mi = raw.data() + i * nmix;
    for (size_t k = 0; k < nmix; ++k) mi[k] = mi[k] * r;
    out.push_back(hc_mix_from_projections(mi, base.data(), scale.data(), c.hc_mult,
                                          c.hc_sinkhorn_iters, c.hc_eps));
  }
  return out;
}

}  // namespace

void Engine::Impl::run_chunk(SequenceState& s, Chunk& ch, float* logits) const {
  const uint32_t n = ch.n, H = c.hidden_size, hc = c.hc_mult, nl = c.num_hidden_layers;
  const size_t flat = (size_t)hc * H;
  ch.src.resize(s.sources.size());
  for (size_t i = 0; i < s.sources.size(); ++i) {
    const SourceCache& sc = s.sources[i];
    NewSourceRows& nr = ch.src[i];
    nr.first = ch.p0 / sc.ratio;
    nr.carry_k = sc.carry_k;
    nr.carry_s = sc.carry_s;
  }
  ch.win.assign((size_t)nl * n * c.head_dim, 0);
  ch.sel.assign(nl, {});
  ch.cand.assign(n, {});
  if (ch.tracing) {
    ch.trace.assign(n, {});
    for (TokenTrace& t : ch.trace) {
      t.experts.assign(nl, {});
      t.expert_weights.assign(nl, {});
      t.selected_rows.assign(nl, {});
      t.engram_rows.assign(c.engram_layer_ids.size(), {});
    }
  }
  engram_ids(ch, s);

  // spec 3.1: X = 4 copies of bf16(embedding row); P = [1, 0, 0, 0].
  std::vector<float> X(n * flat), X2(n * flat), xin(n * (size_t)H), out(n * (size_t)H);
  std::vector<float> P(n * (size_t)hc, 0.0f);
  {
    const TypeTraits& tt = *m.token_embd.traits;
    std::vector<float> e(H);
    for (uint32_t i = 0; i < n; ++i) {
      tt.dequant(m.token_embd.row(ch.tokens[i]), e.data(), H);
      for (uint32_t k = 0; k < H; ++k) e[k] = round_bf16(e[k]);
      for (uint32_t h = 0; h < hc; ++h) std::copy(e.begin(), e.end(), X.begin() + i * flat + (size_t)h * H);
      P[i * hc] = 1.0f;
    }
  }
  name(ch, -1, "embd", X.data(), flat, flat);

  for (uint32_t L = 0; L < nl; ++L) {
    if (opt.fail_at_layer == (int)L && opt.fail_at_chunk == ch.index)
      throw Error("injected failure at layer " + std::to_string(L) + " of chunk " + std::to_string(ch.index));
    const LayerWeights& w = m.layers[L];
    if (roles[L].engram_index >= 0) {
      engram(ch, L, X.data());  // spec 3.3: before the attention mixes
      name(ch, (int)L, "engram_out", X.data(), flat, flat);
    }

    // Attention sublayer: collapse with the incoming (lagged) pre-weights P.
    const std::vector<HcMix> A = hc_mixes(pool, c, w.hc_attn_fn, w.hc_attn_base, w.hc_attn_scale, X.data(), n);
    for (uint32_t i = 0; i < n; ++i) {
      float* xi = xin.data() + (size_t)i * H;
      hc_pre(X.data() + i * flat, P.data() + (size_t)i * hc, hc, H, xi);
      rms_norm(xi, w.attn_norm.data(), xi, H, c.rms_norm_eps);
    }
    name(ch, (int)L, "attn_in", xin.data(), H, H);
    attention(ch, s, L, xin.data(), out.data());
    name(ch, (int)L, "attn_out", out.data(), H, H);
    for (uint32_t i = 0; i < n; ++i)
      hc_post(out.data() + (size_t)i * H, X.data() + i * flat, A[i], hc, H, X2.data() + i * flat);

    // FFN sublayer: collapse with the attention's own pre-weights.
    const std::vector<HcMix> F = hc_mixes(pool, c, w.hc_ffn_fn, w.hc_ffn_base, w.hc_ffn_scale, X2.data(), n);
    for (uint32_t i = 0; i < n; ++i) {
      float* xi = xin.data() + (size_t)i * H;
      hc_pre(X2.data() + i * flat, A[i].pre.data(), hc, H, xi);
      rms_norm(xi, w.ffn_norm.data(), xi, H, c.rms_norm_eps);
    }
    name(ch, (int)L, "ffn_in", xin.data(), H, H);
    moe(ch, L, xin.data(), out.data());
    name(ch, (int)L, "ffn_out", out.data(), H, H);
    for (uint32_t i = 0; i < n; ++i) {
      hc_post(out.data() + (size_t)i * H, X2.data() + i * flat, F[i], hc, H, X.data() + i * flat);
      std::copy(F[i].pre.begin(), F[i].pre.end(), P.begin() + (size_t)i * hc);
    }
    name(ch, (int)L, "hc_attn", X2.data(), flat, flat);
    name(ch, (int)L, "out", X.data(), flat, flat);
  }

  // spec 3.7: the last FFN pre-weights collapse the streams (rounded like hc_pre, numerics.md 3).
  if (logits) {
    for (uint32_t i = 0; i < n; ++i) {
      float* xi = xin.data() + (size_t)i * H;
      hc_pre(X.data() + i * flat, P.data() + (size_t)i * hc, hc, H, xi);
      rms_norm(xi, m.output_norm.data(), xi, H, c.rms_norm_eps);
    }
    name(ch, -1, "out_norm", xin.data(), H, H);
    lin(pool, m.output, xin.data(), H, n, logits, c.vocab_size, /*round=*/false);  // f32 logits
    name(ch, -1, "logits", logits, c.vocab_size, c.vocab_size);
  }
}

void Engine::Impl::commit_chunk(SequenceState& s, Chunk& ch) const {
  const uint32_t W = c.sliding_window, hd = c.head_dim, n = ch.n;
  for (uint32_t L = 0; L < c.num_hidden_layers; ++L)
    for (uint32_t i = n > W ? n - W : 0; i < n; ++i) {
      const uint32_t pos = ch.p0 + i;
      std::memcpy(s.window_kv.data() + ((size_t)L * W + pos % W) * hd,
                  ch.win.data() + ((size_t)L * n + i) * hd, hd * sizeof(uint16_t));
    }
  for (size_t sl = 0; sl < s.sources.size(); ++sl) {
    SourceCache& sc = s.sources[sl];
    NewSourceRows& nr = ch.src[sl];
    std::copy(nr.kv.begin(), nr.kv.end(), sc.kv.begin() + (size_t)nr.first * hd);
    std::copy(nr.ik.begin(), nr.ik.end(), sc.index_k.begin() + (size_t)nr.first * c.index_head_dim);
    sc.carry_k = nr.carry_k;
    sc.carry_s = nr.carry_s;
  }
  s.engram_tail = ch.tail;
  s.pos = ch.p0 + n;
}

void Engine::eval(SequenceState& s, std::span<const uint32_t> tokens, float* logits,
                  std::vector<TokenTrace>* trace) const {
  eval_masked(s, tokens, {}, logits, trace);
}

void Engine::eval_masked(SequenceState& s, std::span<const uint32_t> tokens,
                         std::span<const uint8_t> masked, float* logits,
                         std::vector<TokenTrace>* trace) const {
  const Impl& im = *impl_;
  const ModelConfig& c = im.c;
  if (tokens.empty()) return;
  im.check_state(s);
  if (!masked.empty() && masked.size() != tokens.size())
    throw Error("engine: " + std::to_string(masked.size()) + " mask entries for " + std::to_string(tokens.size()) + " tokens");
  if ((uint64_t)s.pos + tokens.size() > s.ctx)
    throw Error("engine: context exceeded: position " + std::to_string(s.pos) + " + " + std::to_string(tokens.size()) +
                " tokens > ctx " + std::to_string(s.ctx));
  for (uint32_t t : tokens)
    if (t >= c.vocab_size) throw Error("engine: token id " + std::to_string(t) + " >= vocab size " + std::to_string(c.vocab_size));

  // Several chunks commit one by one; keep what a later failure must undo. Compressed rows are
  // append-only, so only the rows this call may write are saved.
  const size_t n_chunks = (tokens.size() + opt_.chunk - 1) / opt_.chunk;
  struct Undo {
    uint32_t pos = 0;
    std::vector<uint16_t> window_kv;
    std::vector<SourceCache> sources;  // kv / index_k hold only rows [first, end)
    std::vector<int64_t> tail;
  } undo;
  if (n_chunks > 1) {
    undo.pos = s.pos;
    undo.window_kv = s.window_kv;
    undo.tail = s.engram_tail;
    const uint32_t end = s.pos + (uint32_t)tokens.size();
    for (const SourceCache& sc : s.sources) {
      SourceCache u;
      u.carry_k = sc.carry_k;
      u.carry_s = sc.carry_s;
      const size_t r0 = s.pos / sc.ratio, r1 = end / sc.ratio;
      u.kv.assign(sc.kv.begin() + r0 * c.head_dim, sc.kv.begin() + r1 * c.head_dim);
      u.index_k.assign(sc.index_k.begin() + r0 * c.index_head_dim, sc.index_k.begin() + r1 * c.index_head_dim);
      undo.sources.push_back(std::move(u));
    }
  }
  std::vector<TokenTrace> traces;
  try {
    for (size_t k = 0; k < n_chunks; ++k) {
      Chunk ch;
      ch.index = (uint32_t)k;
      ch.p0 = s.pos;
      const size_t off = k * opt_.chunk;
      ch.n = (uint32_t)std::min<size_t>(opt_.chunk, tokens.size() - off);
      ch.tokens = tokens.data() + off;
      ch.masked = masked.empty() ? nullptr : masked.data() + off;
      ch.tracing = trace != nullptr;
      im.run_chunk(s, ch, logits ? logits + off * c.vocab_size : nullptr);
      im.commit_chunk(s, ch);
      for (TokenTrace& t : ch.trace) traces.push_back(std::move(t));
    }
  } catch (...) {
    if (n_chunks > 1) {
      const uint32_t start = undo.pos;
      s.pos = undo.pos;
      s.window_kv = std::move(undo.window_kv);
      s.engram_tail = std::move(undo.tail);
      for (size_t i = 0; i < s.sources.size(); ++i) {
        SourceCache& sc = s.sources[i];
        SourceCache& u = undo.sources[i];
        sc.carry_k = std::move(u.carry_k);
        sc.carry_s = std::move(u.carry_s);
        const size_t r0 = start / sc.ratio;
        std::copy(u.kv.begin(), u.kv.end(), sc.kv.begin() + r0 * c.head_dim);
        std::copy(u.index_k.begin(), u.index_k.end(), sc.index_k.begin() + r0 * c.index_head_dim);
      }
    }
    throw;
  }
  if (trace)
    for (TokenTrace& t : traces) trace->push_back(std::move(t));
}

}  // namespace sluice
