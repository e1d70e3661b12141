// The Engine: chunking, the block loop with lagged hyper-connections (spec 3.1-3.3, 3.7), state
// allocation and the transactional commit. The sublayers live in forward_{engram,attention,moe}.cpp.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "model/deepseek41/forward_impl.h"
#include "util/error.h"

namespace sluice {

Engine::Impl::Impl(const Model& model, const EngineOptions& o)
    : m(model), c(model.config), roles(model.roles), opt(o),
      own_backend(o.backend ? nullptr : std::make_unique<CpuBackend>(o.threads)),
      be(o.backend ? *o.backend : *own_backend), ws(be, model.config, o.chunk),
      experts(o.experts ? o.experts : nullptr) {
  if (!experts) experts = &resident_expert_source(m);
  freqs.resize(c.num_hidden_layers);
  slot.assign(c.num_hidden_layers, -1);
  for (uint32_t L = 0; L < c.num_hidden_layers; ++L) freqs[L] = rope_frequencies(c, roles[L].ratio);
  for (size_t i = 0; i < c.kv_source_layer_ids.size(); ++i) slot[c.kv_source_layer_ids[i]] = (int)i;
  if (!o.capture_layers.empty()) capture = be.tensor(o.chunk, capture_width());
  if (o.engram_cache_rows && !c.engram_layer_ids.empty())
    engram_cache = std::make_unique<EngramRowCache>(o.engram_cache_rows, (uint32_t)c.engram_layer_ids.size(),
                                                    (uint32_t)c.engram_row_bytes());
}

namespace {
void check_route_bias(float d) {
  if (!(d >= 0.0f && d <= 1e6f)) throw Error("engine: route_bias must be in [0, 1e6] (got " + std::to_string(d) + ")");
}
}  // namespace

Engine::Engine(const Model& m, EngineOptions o) : model_(m), opt_(o) {
  if (o.ctx == 0) throw Error("engine: ctx must be at least 1");
  if (o.chunk == 0) throw Error("engine: chunk must be at least 1");
  check_route_bias(o.route_bias);
  for (uint32_t l : o.capture_layers)
    if (l >= m.config.num_hidden_layers)
      throw Error("engine: capture layer " + std::to_string(l) + " is not below the model's " +
                  std::to_string(m.config.num_hidden_layers) + " layers");
  impl_ = std::make_unique<Impl>(m, o);
}

Engine::~Engine() = default;

EngramReadStats Engine::engram_stats() const { return impl_->engram_stats; }
const Backend& Engine::backend() const { return impl_->be; }

void Engine::set_route_bias(float d) {
  check_route_bias(d);
  opt_.route_bias = d;
  impl_->opt.route_bias = d;
}

uint32_t sequence_position(const SequenceState& s) { return s.pos; }

SequenceState Engine::new_sequence() const { return impl_->new_sequence(); }

EngineFootprint Engine::footprint() const {
  EngineFootprint f = engine_footprint(model_.config, opt_.ctx, opt_.chunk, model_.loaded_bytes);
  f.scratch.capture = impl_->capture.bytes();
  return f;
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
// sequence_shape, which admission's figures come from too (model/deepseek41/engine_footprint.h).
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
    sc.kv.assign(ss.rows * ss.kv_row_bytes, 0);
    sc.index_k.assign(ss.rows * ss.index_row_bytes, 0);
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
         sc.kv.size() == rows * fp4_row_bytes(kKvGrid, c.head_dim) &&
         sc.index_k.size() == rows * fp4_row_bytes(kIndexGrid, c.index_head_dim);
  }
  if (!ok) throw Error("engine: the sequence state was not made by an engine for this model");
}

void Engine::Impl::check_request(const SequenceState& s, std::span<const TokenId> tokens,
                                 std::span<const uint8_t> masked, const std::string& who) const {
  check_state(s);
  const std::string of = who.empty() ? "" : who + ": ";
  if (!masked.empty() && masked.size() != tokens.size())
    throw Error("engine: " + of + std::to_string(masked.size()) + " mask entries for " + std::to_string(tokens.size()) +
                " tokens");
  if ((uint64_t)s.pos + tokens.size() > s.ctx)
    throw Error("engine: context exceeded" + (who.empty() ? std::string() : " by " + who) + ": position " +
                std::to_string(s.pos) + " + " + std::to_string(tokens.size()) + " tokens > ctx " + std::to_string(s.ctx));
  for (uint32_t t : tokens)
    if (t >= c.vocab_size) throw Error("engine: token id " + std::to_string(t) + " >= vocab size " + std::to_string(c.vocab_size));
}

void Engine::Impl::name(const Pass& p, int L, const char* what, CMat t) const {
  if (!opt.observer) return;
  std::string nm;
  if (L >= 0) {
    nm = std::to_string(L);
    nm.insert(nm.begin(), 'l');
    nm.push_back('.');
  }
  nm.append(what);
  if (!opt.observer->wants(nm)) return;
  be.sync();
  opt.observer->observe(nm, p.parts.front()->p0, p.n, t.p, t.width, t.stride);
}

// spec 3.1-3.3, 3.7: the block loop. X holds the hc residual streams of every token; each
// sublayer mixes them (hc_mix), collapses them with pre-weights into its input (hc_pre_norm),
// and writes its output back through post/comb (hc_post). The attention collapse uses the
// previous FFN's pre-weights (lagged), the FFN collapse the attention's own.
void Engine::Impl::run_pass(Pass& p, float* logits, const std::vector<uint32_t>* rows, bool capture_rows) const {
  // A backend may hold ops back until a sync (the Vulkan backend's deferred batch, whose stores
  // write the pass's chunk buffers): an error drops them before those buffers go.
  try {
    layer_loop(p, logits, rows, capture_rows);
  } catch (...) {
    be.drop_pending();
    throw;
  }
}

void Engine::Impl::layer_loop(Pass& p, float* logits, const std::vector<uint32_t>* rows, bool capture_rows) const {
  const uint32_t n = p.n, hc = c.hc_mult, nl = c.num_hidden_layers;
  const HcParams hp = hc_params();
  engram_ids(p);

  const Mat X = ws(Ws::X, n), X2 = ws(Ws::X2, n), xin = ws(Ws::Xin, n), out = ws(Ws::Out, n);
  const Mat A = ws(Ws::MixA, n), F = ws(Ws::MixF, n), P0 = ws(Ws::P0, n);
  // spec 3.1: X = hc copies of bf16(embedding row); P = [1, 0, 0, 0].
  be.embed(m.token_embd, std::span<const TokenId>(p.tokens.data(), n), hc, X);
  std::vector<float> first(hc, 0.0f);
  first[0] = 1.0f;
  be.fill_rows(P0, first);
  CMat P = P0;
  name(p, -1, "embd", X);

  for (uint32_t L = 0; L < nl; ++L) {
    if (opt.fail_at_layer == (int)L && opt.fail_at_chunk == p.index)
      throw Error("injected failure at layer " + std::to_string(L) + " of chunk " + std::to_string(p.index));
    const LayerWeights& w = m.layers[L];
    const int l = (int)L;
    if (roles[L].engram_index >= 0) {
      engram(p, L, X);  // spec 3.3: before the attention mixes
      name(p, l, "engram_out", X);
    }
    // DSpark target capture (spec 6.3 step 1): the streams entering layer L, after any Engram of
    // L: the previous block's output, with this layer's Engram added when it has one.
    for (size_t k = 0; capture_rows && k < opt.capture_layers.size(); ++k)
      if (opt.capture_layers[k] == L) {
        const Mat m_l = capture.m().rows(0, n).cols(k * c.hidden_size, c.hidden_size);
        be.hc_mean(X, hc, m_l);
        name(p, l, "dspark_capture", m_l);
      }

    be.hc_mix(w.hc_attn_fn, w.hc_attn_base.data(), w.hc_attn_scale.data(), hp, X, A);
    be.hc_pre_norm(X, P, w.attn_norm.data(), hp, xin);
    name(p, l, "attn_in", xin);
    attention(p, L, xin, out);
    name(p, l, "attn_out", out);
    be.hc_post(out, X, A, hc, X2);
    name(p, l, "hc_attn", X2);

    be.hc_mix(w.hc_ffn_fn, w.hc_ffn_base.data(), w.hc_ffn_scale.data(), hp, X2, F);
    be.hc_pre_norm(X2, A.cols(0, hc), w.ffn_norm.data(), hp, xin);
    name(p, l, "ffn_in", xin);
    moe(p, L, xin, out);
    name(p, l, "ffn_out", out);
    be.hc_post(out, X2, F, hc, X);
    P = F.cols(0, hc);  // the next attention's (lagged) pre-weights
    name(p, l, "out", X);
  }

  // spec 3.7: the last FFN pre-weights collapse the streams (rounded like hc_pre, numerics.md 3).
  if (logits && !rows) {
    be.hc_pre_norm(X, P, m.output_norm.data(), hp, xin);
    name(p, -1, "out_norm", xin);
    const Mat lg{logits, n, c.vocab_size, c.vocab_size};
    be.linear(m.output, xin, lg, /*round=*/false);  // f32 logits
    name(p, -1, "logits", lg);
  } else if (logits && !rows->empty()) {
    // Only some rows are wanted (the last of each sequence in a batched step): gather their
    // streams and pre-weights into the first rows of two tensors the layer loop is done with,
    // so the output head, the largest matrix, is read once for all of them. Each row's math is
    // the same as over the whole pass (the head's rows are independent of their neighbours).
    const size_t k = rows->size();
    const Mat Xg = X2.rows(0, k), Pg = A.cols(0, hc).rows(0, k);
    be.gather_rows(X, *rows, Xg);
    be.gather_rows(P, *rows, Pg);
    const Mat xg = xin.rows(0, k);
    be.hc_pre_norm(Xg, Pg, m.output_norm.data(), hp, xg);
    const Mat lg{logits, k, c.vocab_size, c.vocab_size};
    be.linear(m.output, xg, lg, /*round=*/false);
  }
  be.sync();
}

void Engine::eval(SequenceState& s, std::span<const TokenId> tokens, float* logits,
                  std::vector<TokenTrace>* trace) const {
  eval_masked(s, tokens, {}, logits, trace);
}

void Engine::eval_masked(SequenceState& s, std::span<const TokenId> tokens,
                         std::span<const uint8_t> masked, float* logits,
                         std::vector<TokenTrace>* trace) const {
  eval_one(s, tokens, masked, logits, trace, BatchItem::Logits::All, nullptr);
}

void Engine::eval_one(SequenceState& s, std::span<const TokenId> tokens, std::span<const uint8_t> masked,
                      float* logits, std::vector<TokenTrace>* trace, BatchItem::Logits rows, float* hidden,
                      VerifyRecord* verify) const {
  const Impl& im = *impl_;
  const ModelConfig& c = im.c;
  if (tokens.empty()) return;
  im.check_request(s, tokens, masked, "");

  const size_t n_chunks = (tokens.size() + opt_.chunk - 1) / opt_.chunk;
  // A multi-chunk call commits chunk by chunk; if a later chunk fails, rolling back to a
  // checkpoint of the start undoes the earlier ones (the compressed rows are append-only, so
  // the ring rows, the carries and the Engram history are all it must keep).
  std::optional<SequenceCheckpoint> undo;
  if (n_chunks > 1) undo = checkpoint(s);
  std::vector<TokenTrace> traces;
  try {
    for (size_t k = 0; k < n_chunks; ++k) {
      Chunk ch;
      ch.p0 = s.pos;
      const size_t off = k * opt_.chunk;
      ch.n = (uint32_t)std::min<size_t>(opt_.chunk, tokens.size() - off);
      ch.tokens = tokens.data() + off;
      ch.masked = masked.empty() ? nullptr : masked.data() + off;
      ch.tracing = trace != nullptr;
      ch.keep_projections = verify != nullptr;
      begin_chunk(ch, s, c.num_hidden_layers, c.engram_layer_ids.size());
      Pass p;
      p.index = (uint32_t)k;
      SequenceState* const sp = &s;
      begin_pass(p, std::span<Chunk>(&ch, 1), std::span<SequenceState* const>(&sp, 1));
      const bool capture = hidden && !opt_.capture_layers.empty();
      if (rows == BatchItem::Logits::All) {
        im.run_pass(p, logits ? logits + off * c.vocab_size : nullptr, nullptr, capture);
      } else {
        // Last: only the final chunk's last row; None: no head at all.
        const bool last = rows == BatchItem::Logits::Last && k + 1 == n_chunks;
        const std::vector<uint32_t> want = last ? std::vector<uint32_t>{ch.n - 1} : std::vector<uint32_t>{};
        im.run_pass(p, logits, &want, capture);
      }
      if (capture)
        std::memcpy(hidden + off * im.capture_width(), im.capture.c().p, (size_t)ch.n * im.capture_width() * sizeof(float));
      if (verify) {
        verify->proj_k.clear();
        verify->proj_s.clear();
        for (NewSourceRows& nr : ch.src) {
          verify->proj_k.push_back(std::move(nr.proj_k));
          verify->proj_s.push_back(std::move(nr.proj_s));
        }
      }
      commit_chunk(s, ch, c.index_head_dim);
      for (TokenTrace& t : ch.trace) traces.push_back(std::move(t));
    }
  } catch (...) {
    if (undo) rollback(s, *undo);
    throw;
  }
  if (trace)
    for (TokenTrace& t : traces) trace->push_back(std::move(t));
}

// Batched decode: every item's chunk goes through one pass of the layer loop (forward_chunk.h
// Pass), so the dense weights and each layer's union of routed experts are read once for the
// whole batch. The per-row math is eval()'s, so each item's logits, trace and state are bit for
// bit what evaluating it alone gives.
void Engine::eval_batch(std::span<const BatchItem> items, float* logits) const {
  const Impl& im = *impl_;
  const ModelConfig& c = im.c;
  if (items.empty()) return;
  if (items.size() == 1)
    return eval_one(*items[0].state, items[0].tokens, items[0].masked, logits, items[0].trace, items[0].logits,
                    items[0].hidden);
  if (opt_.observer) throw Error("engine: eval_batch shows no intermediates to an observer; evaluate one sequence at a time");
  size_t total = 0;
  bool tracing = false;
  for (size_t k = 0; k < items.size(); ++k) {
    const BatchItem& it = items[k];
    if (!it.state) throw Error("engine: batch item " + std::to_string(k) + " has no sequence state");
    for (size_t j = 0; j < k; ++j)
      if (items[j].state == it.state)
        throw Error("engine: batch items " + std::to_string(j) + " and " + std::to_string(k) + " share one sequence state");
    if (it.tokens.empty()) throw Error("engine: batch item " + std::to_string(k) + " has no tokens");
    im.check_request(*it.state, it.tokens, it.masked, "batch item " + std::to_string(k));
    total += it.tokens.size();
    tracing = tracing || it.trace != nullptr;
  }
  // The pass runs in the workspace sized for options.chunk rows.
  if (total > opt_.chunk)
    throw Error("engine: a batch of " + std::to_string(total) + " tokens exceeds the chunk of " + std::to_string(opt_.chunk) +
                " rows the engine was made for");

  std::vector<Chunk> parts(items.size());
  std::vector<SequenceState*> states(items.size());
  for (size_t k = 0; k < items.size(); ++k) {
    Chunk& ch = parts[k];
    SequenceState& s = *items[k].state;
    states[k] = &s;
    ch.p0 = s.pos;
    ch.n = (uint32_t)items[k].tokens.size();
    ch.tokens = items[k].tokens.data();
    ch.masked = items[k].masked.empty() ? nullptr : items[k].masked.data();
    ch.tracing = tracing;  // a pass is traced whole; items without a trace drop theirs
    begin_chunk(ch, s, c.num_hidden_layers, c.engram_layer_ids.size());
  }
  // The pass's rows whose logits are wanted, unless every item wants all of its rows.
  std::vector<uint32_t> want;
  bool all = true;
  for (size_t k = 0, row = 0; k < items.size(); row += items[k].tokens.size(), ++k) {
    const BatchItem::Logits mode = items[k].logits;
    all = all && mode == BatchItem::Logits::All;
    if (mode == BatchItem::Logits::All)
      for (size_t i = 0; i < items[k].tokens.size(); ++i) want.push_back((uint32_t)(row + i));
    else if (mode == BatchItem::Logits::Last)
      want.push_back((uint32_t)(row + items[k].tokens.size() - 1));
  }
  Pass p;
  begin_pass(p, parts, states);
  bool capture = false;
  for (const BatchItem& it : items) capture = capture || (it.hidden && !opt_.capture_layers.empty());
  im.run_pass(p, logits, all ? nullptr : &want, capture);  // nothing is written to any state before this returns
  for (size_t k = 0; k < items.size(); ++k) {
    if (capture && items[k].hidden)
      std::memcpy(items[k].hidden, im.capture.c().row(parts[k].row0), (size_t)parts[k].n * im.capture_width() * sizeof(float));
    commit_chunk(*states[k], parts[k], c.index_head_dim);
    if (items[k].trace)
      for (TokenTrace& t : parts[k].trace) items[k].trace->push_back(std::move(t));
  }
}

}  // namespace sluice
