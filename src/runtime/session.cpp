#include "runtime/session.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>

#include "format/gguf.h"
#include "model/architecture.h"
#include "model/deepseek41/forward.h"
#include "model/deepseek41/load_checks.h"
#include "model/model.h"
#include "model/streamed_experts.h"
#include "runtime/checkpoint_set.h"
#include "runtime/meminfo.h"
#include "runtime/prompt_cache.h"
#include "runtime/store_plan.h"
#include "text/tokenizer.h"
#include "util/error.h"

namespace sluice {

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::None: return "none";
    case Finish::Stop: return "stop";
    case Finish::Length: return "length";
    case Finish::Context: return "context";
    case Finish::Cancelled: return "cancelled";
  }
  return "none";
}


namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

struct Session::Impl {
  SessionOptions opt;
  const Architecture* arch = nullptr;
  Plan plan;
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::unique_ptr<Model> model;
  std::unique_ptr<storage::ExpertStore> store;
  std::unique_ptr<StreamedExperts> streamed;
  std::unique_ptr<Engine> engine;
  SequenceState state;
  std::vector<SequenceState> slots;  // --parallel: slots 1 .. N-1 (slot 0 is `state`)
  std::vector<TokenId> history;  // tokens evaluated into `state`
  std::vector<float> last_logits; // the row after history.back()
  mutable std::mutex prompt_mu;   // prompt_cache is read by handler threads
  PromptCache prompt_cache;
  CheckpointSet checkpoints{0};   // of prefixes of `history`
  // Read by stats() from other threads while generate() runs.
  std::atomic<uint64_t> requests{0}, prompt_tokens{0}, generated_tokens{0}, prefill_ns{0}, decode_ns{0};
  std::atomic<uint64_t> ck_count{0}, ck_bytes{0}, ck_taken{0}, ck_dropped{0}, ck_skipped{0}, ck_rollbacks{0};
  std::atomic<uint64_t> engram_rows{0}, engram_unique{0}, engram_hits{0}, engram_reads{0}, engram_bytes{0};

  // Evaluates tokens at the end of the sequence. With want_logits (or an observer that sees
  // them, or a tensor observer) the output head runs and the last row is kept; otherwise it is
  // skipped, which saves chunk x vocab x hidden work per prefill chunk that no one reads. With
  // interval_checkpoint, passing a multiple of checkpoint_interval takes a checkpoint.
  void eval(std::span<const TokenId> toks, const EvalObserver* obs, bool want_logits, bool interval_checkpoint) {
    const uint32_t V = model->config.vocab_size;
    const uint32_t pos = state.position();
    const bool observed = obs && obs->on_eval;
    std::vector<float> logits(want_logits || observed || opt.tensors ? toks.size() * (size_t)V : 0);
    std::vector<TokenTrace> trace;
    const bool tracing = obs && obs->want_trace;
    try {
      engine->eval(state, toks, logits.empty() ? nullptr : logits.data(), tracing ? &trace : nullptr);
    } catch (...) {
      publish_engram();  // the rows a failed eval read are in the cache and the counts
      throw;
    }
    publish_engram();
    history.insert(history.end(), toks.begin(), toks.end());
    if (logits.empty()) last_logits.clear();
    else last_logits.assign(logits.end() - V, logits.end());
    if (observed) obs->on_eval(pos, toks, logits.data(), tracing ? &trace : nullptr);
    const uint32_t every = opt.checkpoint_interval;
    if (interval_checkpoint && every && state.position() / every > pos / every) take_checkpoint(false);
  }
  void publish_engram() {
    const EngramReadStats es = engine->engram_stats();
    engram_rows = es.requested, engram_unique = es.unique, engram_hits = es.hits, engram_reads = es.reads;
    engram_bytes = es.bytes;
  }
  // A checkpoint of the sequence as it is; at a prompt's end with its logits row. Room is made
  // (older ones dropped) before anything is copied.
  void take_checkpoint(bool prompt_end) {
    const uint32_t pos = state.position();
    if (pos == 0) return;
    const bool with_logits = prompt_end && !last_logits.empty();
    if (const SessionCheckpoint* held = checkpoints.at(pos)) {
      if (prompt_end) checkpoints.mark_prompt_end(pos);
      if (!with_logits || !held->logits.empty()) return;
    }
    const uint64_t need = checkpoint_bytes(model->config, pos) + (with_logits ? last_logits.size() * sizeof(float) : 0);
    if (checkpoints.make_room(pos, need)) {
      SessionCheckpoint c;
      c.seq = engine->checkpoint(state);
      if (with_logits) c.logits = last_logits;
      c.prompt_end = prompt_end;
      checkpoints.add(std::move(c));
      ++ck_taken;
    }
    publish_checkpoints();
  }
  // Where a prompt starts: the kept sequence when the prompt extends it, else the newest
  // checkpoint at or before the first differing token, else position 0.
  void start_for(std::span<const TokenId> prompt) {
    const size_t n = std::min(history.size(), prompt.size());
    const size_t common = (size_t)(std::mismatch(history.begin(), history.begin() + (std::ptrdiff_t)n, prompt.begin()).first -
                                   history.begin());
    // A prompt equal to the kept sequence needs its last row of logits, which a cancelled
    // prefill may not have computed.
    const bool extends = !history.empty() && common == history.size() &&
                         (history.size() < prompt.size() || !last_logits.empty());
    if (extends) return;
    const SessionCheckpoint* c = checkpoints.best_for((uint32_t)common, (uint32_t)prompt.size());
    if (!c) {
      forget();
      return;
    }
    const uint32_t pos = c->pos();
    engine->rollback(state, c->seq);
    history.resize(pos);
    last_logits = c->logits;
    checkpoints.drop_after(pos);
    ++ck_rollbacks;
    publish_checkpoints();
  }
  void publish_checkpoints() {
    ck_count = checkpoints.items().size();
    ck_bytes = checkpoints.bytes();
    ck_dropped = checkpoints.dropped();
    ck_skipped = checkpoints.skipped();
  }
  void forget() {
    engine->reset(state);
    forget_record();
  }
  // What is remembered of `state` (its tokens, last row, checkpoints), not the state itself.
  void forget_record() {
    history.clear();
    last_logits.clear();
    checkpoints.clear();
    publish_checkpoints();
  }
};

ModelHeader open_model_header(const std::string& path) {
  try {
    ModelHeader h{path, gguf::File::open(path), nullptr, {}, nullptr};
    h.arch = &architecture_of(h.file);
    h.config = h.arch->config(h.file, nullptr);
    h.tokenizer = std::make_shared<const text::Tokenizer>(text::Tokenizer::from_gguf(h.file));
    // Before planning and loading, as inspect reports it (model/deepseek41/load_checks.h).
    if (const std::string p = vocab_fit_problem(*h.tokenizer, h.config); !p.empty()) throw Error(p);
    return h;
  } catch (const Error& e) {  // every error about the file names it once, as run's do
    throw Error(with_path(path, e.what()));
  }
}

Session::Session(SessionOptions o) : Session(o, open_model_header(o.model_path)) {}

Session::Session(SessionOptions o, const ModelHeader& header) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.opt = std::move(o);
  const SessionOptions& opt = s.opt;
  if (opt.threads < 0) throw Error("threads must not be negative");
  if (header.path != opt.model_path)
    throw Error("session for " + opt.model_path + " given the header of " + header.path);
  const ModelConfig& cfg = header.config;
  s.arch = header.arch ? header.arch : &architecture_of(header.file);  // a header built by hand
  s.tokenizer = header.tokenizer;
  try {
    StorePlanOptions spo;
    spo.plan.ctx = opt.ctx ? opt.ctx : default_context(cfg.max_position_embeddings);
    spo.plan.chunk = opt.chunk;
    spo.plan.threads = opt.threads;
    spo.plan.budget = opt.budget;
    spo.plan.allow_swap = opt.allow_swap;
    spo.plan.checkpoint_budget = opt.checkpoint_budget;
    if (opt.parallel == 0) throw Error("--parallel must be at least 1");
    spo.plan.sequences = opt.parallel;
    spo.plan.max_cache_experts = opt.max_cache_experts;
    spo.store.policy = opt.policy;
    spo.store.queue_depth = opt.io_depth;
    spo.store.direct_io = opt.direct_io;
    spo.stream_experts = opt.stream_experts;
    s.plan = plan_for_file(header.file, spo);
    require_admitted(s.plan);
  } catch (const Error& e) {  // every error about the file names it once, as run's do
    throw Error(with_path(opt.model_path, e.what()));
  }
  LoadOptions lo;
  lo.resident_experts = !opt.stream_experts;
  if (opt.progress) lo.progress = [&](uint64_t done, uint64_t total) { opt.progress("loading weights", done, total); };
  s.model = load_model(opt.model_path, lo);
  EngineOptions eo;
  eo.threads = s.plan.threads;
  eo.ctx = s.plan.ctx;
  eo.chunk = s.plan.chunk;
  eo.prefetch = opt.prefetch;
  eo.observer = opt.tensors;
  if (opt.route_bias != 0.0f && !opt.stream_experts)
    throw Error("route bias needs streamed experts (with resident experts every expert is cached)");
  eo.route_bias = opt.route_bias;
  eo.engram_cache_rows = s.plan.engram_cache_rows;
  if (opt.stream_experts) {
    storage::StoreOptions so;
    so.policy = opt.policy;
    so.queue_depth = opt.io_depth;
    so.direct_io = opt.direct_io;
    s.store = open_expert_store(*s.model, store_options_for(s.plan, so));
    s.streamed = std::make_unique<StreamedExperts>(*s.store);
    eo.experts = s.streamed.get();
  }
  s.engine = s.arch->make_engine(*s.model, eo);
  // One decode step of every slot is one pass of parallel rows, which the chunk's scratch holds.
  if (s.plan.chunk < opt.parallel)
    throw Error(with_path(opt.model_path, "--parallel " + std::to_string(opt.parallel) + " needs a chunk of at least " +
                                              std::to_string(opt.parallel) + " rows; the plan has " +
                                              std::to_string(s.plan.chunk) + (s.plan.chunk_auto ? " (the most the budget admits)" : " (--chunk)")));
  s.state = s.engine->new_sequence();
  for (uint32_t k = 1; k < opt.parallel; ++k) s.slots.push_back(s.engine->new_sequence());
  s.checkpoints = CheckpointSet(opt.checkpoint_budget);
}

Session::~Session() {
  if (impl_ && impl_->streamed) impl_->streamed->release();
}

const text::Tokenizer& Session::tokenizer() const { return *impl_->tokenizer; }
const ModelConfig& Session::config() const { return impl_->model->config; }
const Architecture& Session::architecture() const { return *impl_->arch; }
const Plan& Session::plan() const { return impl_->plan; }
const SessionOptions& Session::options() const { return impl_->opt; }
uint32_t Session::ctx() const { return impl_->plan.ctx; }

std::string Session::model_id() const {
  std::string name = std::filesystem::path(impl_->opt.model_path).filename().string();
  if (name.size() > 5 && name.substr(name.size() - 5) == ".gguf") name.resize(name.size() - 5);
  return name;
}

void Session::reset() {
  impl_->forget();
  const std::lock_guard<std::mutex> lock(impl_->prompt_mu);
  impl_->prompt_cache.clear();
}

uint32_t Session::parallel() const { return impl_->opt.parallel; }

uint32_t Session::slot_position(uint32_t k) const {
  if (k >= impl_->opt.parallel) throw Error("slot " + std::to_string(k) + " of " + std::to_string(impl_->opt.parallel));
  return k == 0 ? impl_->state.position() : impl_->slots[k - 1].position();
}

void Session::reset_slot(uint32_t k) {
  if (k >= impl_->opt.parallel) throw Error("slot " + std::to_string(k) + " of " + std::to_string(impl_->opt.parallel));
  if (k == 0) return reset();
  impl_->engine->reset(impl_->slots[k - 1]);
}

void Session::eval_slots(std::span<const std::span<const TokenId>> tokens, float* logits) {
  Impl& s = *impl_;
  if (tokens.size() != s.opt.parallel)
    throw Error(std::to_string(tokens.size()) + " token lists for " + std::to_string(s.opt.parallel) + " slots");
  std::vector<Engine::BatchItem> items;
  for (uint32_t k = 0; k < tokens.size(); ++k)
    if (!tokens[k].empty()) items.push_back({k == 0 ? &s.state : &s.slots[k - 1], tokens[k]});
  if (items.empty()) return;
  if (!tokens[0].empty()) {
    // The kept sequence moves past what generate() remembers of it: drop that record (the
    // state itself is the batch's), so a later prompt cannot be matched against it.
    s.forget_record();
    const std::lock_guard<std::mutex> lock(s.prompt_mu);
    s.prompt_cache.clear();
  }
  s.engine->eval_batch(items, logits);
}

void Session::set_route_bias(float d) {
  if (d != 0.0f && !impl_->opt.stream_experts)
    throw Error("route bias needs streamed experts (with resident experts every expert is cached)");
  impl_->engine->set_route_bias(d);
  impl_->opt.route_bias = d;
}

std::vector<TokenId> Session::tokenize_prompt(std::string_view text, bool add_bos) const {
  const std::lock_guard<std::mutex> lock(impl_->prompt_mu);
  return impl_->prompt_cache.tokens_for(*impl_->tokenizer, text, add_bos);
}

GenerateResult Session::generate(const GenerateRequest& r, const std::function<bool(uint32_t, uint32_t)>& on_prefill,
                                 const std::function<bool(TokenId)>& on_token) {
  using Clock = std::chrono::steady_clock;
  Impl& s = *impl_;
  const ModelConfig& c = s.model->config;
  const uint32_t ctx = s.plan.ctx;
  if (r.prompt.empty()) throw Error("the prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] >= c.vocab_size)
      throw Error("prompt token " + std::to_string(i) + " is " + std::to_string(r.prompt[i]) +
                  ", not below the vocabulary size " + std::to_string(c.vocab_size));
  if (r.prompt.size() > ctx)
    throw Error("the prompt has " + std::to_string(r.prompt.size()) + " tokens but the context is " +
                std::to_string(ctx));
  validate(r.sampling);

  GenerateResult res;
  res.prompt_tokens = (uint32_t)r.prompt.size();
  s.start_for(r.prompt);
  res.reused_tokens = (uint32_t)s.history.size();
  ++s.requests;
  s.prompt_tokens += r.prompt.size();

  const auto t_prefill = Clock::now();
  const uint32_t total = (uint32_t)r.prompt.size();
  bool cancelled = on_prefill && !on_prefill((uint32_t)s.history.size(), total);
  // The prompt's end gets two checkpoints: after its last token (with the logits row: the same
  // prompt again needs no prefill) and before it, where the next turn of a thinking
  // conversation diverges (the generation prompt's `<think>` becomes `</think>` once the chat
  // format drops the reasoning). The second costs one extra one-token chunk per request.
  const size_t before_last = r.prompt.size() - 1;
  while (!cancelled && s.history.size() < r.prompt.size()) {
    size_t n = std::min<size_t>(s.plan.chunk, r.prompt.size() - s.history.size());
    if (s.history.size() < before_last && s.history.size() + n > before_last) n = before_last - s.history.size();
    const bool last_piece = s.history.size() + n == r.prompt.size();
    s.eval(std::span<const TokenId>(r.prompt.data() + s.history.size(), n), r.observer, last_piece, !last_piece);
    if (s.history.size() == before_last) s.take_checkpoint(/*prompt_end=*/true);
    cancelled = on_prefill && !on_prefill((uint32_t)s.history.size(), total);
  }
  if (s.history.size() == r.prompt.size()) s.take_checkpoint(/*prompt_end=*/true);
  res.prompt_evaluated = (uint32_t)s.history.size();
  res.prefill_s = seconds_since(t_prefill);
  s.prefill_ns += (uint64_t)(res.prefill_s * 1e9);

  const auto t_decode = Clock::now();
  Sampler sampler(r.sampling);
  const uint32_t V = c.vocab_size;
  if (cancelled) res.finish = Finish::Cancelled;
  while (!cancelled) {
    if (res.tokens.size() >= r.max_tokens) { res.finish = Finish::Length; break; }
    const TokenId next = sampler.sample(std::span<const float>(s.last_logits.data(), V));
    res.tokens.push_back(next);
    ++s.generated_tokens;
    const bool keep_going = !on_token || on_token(next);
    const bool is_stop = std::find(r.stop_tokens.begin(), r.stop_tokens.end(), next) != r.stop_tokens.end();
    if ((!r.ignore_eos && next == c.eos_token_id) || is_stop) { res.finish = Finish::Stop; break; }
    if (!keep_going) { res.finish = Finish::Cancelled; break; }
    if (res.tokens.size() >= r.max_tokens) { res.finish = Finish::Length; break; }
    if (s.history.size() >= ctx) { res.finish = Finish::Context; break; }
    s.eval(std::span<const TokenId>(&next, 1), r.observer, true, true);
    ++res.decode_steps;
  }
  res.decode_s = seconds_since(t_decode);
  if (!r.prompt_text.empty()) {
    const std::lock_guard<std::mutex> lock(s.prompt_mu);
    s.prompt_cache.remember(*s.tokenizer, r.prompt_text, r.prompt, res.tokens);
  }
  s.decode_ns += (uint64_t)(res.decode_s * 1e9);
  return res;
}

SessionStats Session::stats() const {
  const Impl& s = *impl_;
  SessionStats st;
  st.streaming = s.store != nullptr;
  if (s.store) st.store = s.store->stats();
  st.budget_bytes = s.plan.budget;
  st.planned_bytes = s.plan.planned_bytes();
  st.rss_bytes = read_self_status().rss;
  st.requests = s.requests;
  st.prompt_tokens = s.prompt_tokens;
  st.generated_tokens = s.generated_tokens;
  st.prefill_s = (double)s.prefill_ns.load() / 1e9;
  st.decode_s = (double)s.decode_ns.load() / 1e9;
  st.checkpoints = s.ck_count;
  st.checkpoint_bytes = s.ck_bytes;
  st.checkpoint_budget = s.opt.checkpoint_budget;
  st.checkpoints_taken = s.ck_taken;
  st.checkpoints_dropped = s.ck_dropped;
  st.checkpoints_skipped = s.ck_skipped;
  st.checkpoint_rollbacks = s.ck_rollbacks;
  st.engram_rows = s.engram_rows;
  st.engram_unique = s.engram_unique;
  st.engram_hits = s.engram_hits;
  st.engram_reads = s.engram_reads;
  st.engram_bytes = s.engram_bytes;
  st.engram_cache_rows = s.plan.engram_cache_rows;
  return st;
}

}  // namespace sluice
