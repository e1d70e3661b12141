#include "runtime/session.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "backend/vulkan_backend.h"
#include "format/gguf.h"
#include "model/architecture.h"
#include "model/deepseek41/dspark_forward.h"
#include "model/deepseek41/dspark_model.h"
#include "model/deepseek41/engine_footprint.h"
#include "model/deepseek41/forward.h"
#include "model/deepseek41/load_checks.h"
#include "model/model.h"
#include "model/streamed_experts.h"
#include "runtime/checkpoint_set.h"
#include "runtime/device_plan.h"
#include "runtime/dspark_plan.h"
#include "runtime/prefix_cache.h"
#include "runtime/state_disk.h"
#include "runtime/meminfo.h"
#include "runtime/prompt_cache.h"
#include "runtime/request_boundaries.h"
#include "runtime/speculative.h"
#include "runtime/store_plan.h"
#include "text/tokenizer.h"
#include "util/error.h"

namespace sluice {

const char* phase_name(SlotStats::Phase p) {
  switch (p) {
    case SlotStats::Phase::Idle: return "idle";
    case SlotStats::Phase::Prefill: return "prefill";
    case SlotStats::Phase::Decode: return "decode";
  }
  return "idle";
}

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

// One slot of the session: a sequence, what is remembered of it, and the request running on it.
// A request is a small state machine driven by Session::step: it prefills its prompt in pieces
// (cut before the prompt's last token, where the prompt-end checkpoint goes), then decodes one
// token per step: the token sampled last is evaluated, and the next is sampled from its row.
struct ActiveRequest {
  ActiveRequest(GenerateRequest req, Session::SlotEvents e, uint64_t n)
      : r(std::move(req)), ev(std::move(e)), sampler(r.sampling), order(n) {}
  GenerateRequest r;
  Session::SlotEvents ev;
  GenerateResult res;
  Sampler sampler;
  uint64_t order;                  // start order: the oldest prompt is prefilled first
  std::chrono::steady_clock::time_point t_prefill, t_decode;
  bool decoding = false;
  TokenId pending = 0;             // decoding: the sampled token the next step evaluates
};

struct Slot {
  SequenceState state;
  std::vector<TokenId> history;    // tokens evaluated into `state`
  std::vector<float> last_logits;  // the row after history.back() (empty: not computed)
  CheckpointSet checkpoints{0};    // of prefixes of `history`
  PromptCache prompt_cache;        // guarded by Impl::prompt_mu (handler threads read it)
  uint64_t prompt_scope = 0;       // the scope of the text prompt_cache remembers (prompt_mu)
  uint64_t scope = 0;              // the scope of `history` and its checkpoints (GenerateRequest::scope)
  std::optional<ActiveRequest> job;
  // --dspark: the drafter's rings of `history`'s positions. Entries from draft_from on were
  // committed by this slot's evaluations; a state that jumped (rollback, restore, reset) leaves
  // older ring entries stale, so drafting waits until a window of new ones is in.
  DraftState draft;
  uint32_t draft_from = 0;
  std::deque<std::pair<uint32_t, uint32_t>> recent;  // the last cycles' (drafts verified, accepted)
  uint32_t pause_left = 0;                            // plain decode steps before drafting again
};

// A slot's SlotStats as atomics, written by the driving thread and read by stats() from any.
struct SlotGauge {
  std::atomic<uint8_t> phase{0};
  std::atomic<uint32_t> position{0}, prompt_tokens{0}, prompt_done{0}, reused{0}, generated{0}, max_tokens{0};
  std::atomic<uint64_t> request{0};
};

struct Session::Impl {
  SessionOptions opt;
  std::unique_ptr<SlotGauge[]> gauges;                 // one per slot
  std::unique_ptr<std::atomic<uint64_t>[]> step_sizes;  // parallel + 1 counters
  const Architecture* arch = nullptr;
  Plan plan;
  std::shared_ptr<const text::Tokenizer> tokenizer;
  std::unique_ptr<Backend> backend;  // --backend other than cpu; null: the Engine's own CPU backend. Outlives the model
  uint64_t gpu_slots = 0;  // routed-expert slots asked of the device (SessionOptions::gpu_experts, capped)
  bool gpu_slots_auto = false;  // by --gpu-experts auto: every expert, fewer when the budget holds fewer
  std::unique_ptr<Model> model;
  std::unique_ptr<storage::ExpertStore> store;
  std::unique_ptr<StreamedExperts> streamed;
  std::unique_ptr<Engine> engine;
  std::vector<Slot> slots;          // --parallel; slot 0 is generate()'s
  std::unique_ptr<PrefixCache> prefix;  // --cache-ram; null: none (driving thread only)
  mutable std::mutex prefix_mu;
  PrefixCacheStats prefix_stats;        // published for stats(), under prefix_mu
  std::unique_ptr<StateDisk> disk;      // --kv-disk-dir; null: none
  std::unique_ptr<DsparkModel> dspark;  // --dspark; null: none
  std::unique_ptr<storage::ExpertStore> dspark_store;  // its routed experts when the plan streams them
  std::unique_ptr<StreamedExperts> dspark_streamed;
  std::unique_ptr<Drafter> drafter;
  bool speculation = true;              // Session::set_speculation
  std::vector<float> step_hidden;       // a step's captured rows (chunk x capture width, planned)
  std::vector<float> verify_logits, verify_hidden;  // a verify pass's rows (block + 1, planned)
  std::atomic<uint64_t> spec_blocks{0}, spec_cycles{0}, spec_drafts{0}, spec_accepted{0}, spec_tokens{0},
      spec_pauses{0}, spec_propose_ns{0}, spec_verify_ns{0};
  mutable std::mutex prompt_mu;
  uint64_t started = 0;
  std::vector<float> step_logits;   // a step's rows of logits (at most chunk x vocab, planned)
  // Read by stats() from other threads while requests run.
  std::atomic<uint64_t> requests{0}, prompt_tokens{0}, generated_tokens{0}, prefill_ns{0}, decode_ns{0};
  std::atomic<uint64_t> ck_count{0}, ck_bytes{0}, ck_taken{0}, ck_dropped{0}, ck_skipped{0}, ck_rollbacks{0};
  std::atomic<uint64_t> engram_rows{0}, engram_unique{0}, engram_hits{0}, engram_reads{0}, engram_bytes{0};
  std::atomic<uint32_t> busy{0};

  // Before any member goes: a device that imported the weights' pages lets go of them while the
  // models' buffers still exist (Vulkan requires imported host memory to outlive the import).
  ~Impl() {
    if (backend) release_gpu_imports(*backend);
  }

  void publish_engram() {
    const EngramReadStats es = engine->engram_stats();
    engram_rows = es.requested, engram_unique = es.unique, engram_hits = es.hits, engram_reads = es.reads;
    engram_bytes = es.bytes;
  }
  // A checkpoint of the slot's sequence as it is; at a prompt's end with its logits row. Room
  // is made (older ones dropped) before anything is copied.
  // The shared cache (and the state directory) get both prompt-end states too: the one after the
  // last token with its logits row, and the one before it, where a re-rendered next turn
  // diverges when thinking mode drops this turn's reasoning ("<think>" becomes "</think>...").
  void take_checkpoint(Slot& sl, bool prompt_end) {
    add_checkpoint(sl, prompt_end);
    if (prompt_end) cache_prefix(sl, true);
  }
  void add_checkpoint(Slot& sl, bool prompt_end) {
    const uint32_t pos = sl.state.position();
    if (pos == 0) return;
    const bool with_logits = prompt_end && !sl.last_logits.empty();
    if (const SessionCheckpoint* held = sl.checkpoints.at(pos)) {
      if (prompt_end) sl.checkpoints.mark_prompt_end(pos);
      if (!with_logits || !held->logits.empty()) return;
    }
    const bool with_draft = drafter && sl.draft.committed == pos;
    const uint64_t need = checkpoint_bytes(model->config, pos) + (with_logits ? sl.last_logits.size() * sizeof(float) : 0) +
                          (with_draft ? sl.draft.rings.size() * sizeof(uint16_t) : 0);
    if (sl.checkpoints.make_room(pos, need)) {
      SessionCheckpoint c;
      c.seq = engine->checkpoint(sl.state);
      if (with_logits) c.logits = sl.last_logits;
      if (with_draft) {
        c.draft_rings = sl.draft.rings;
        c.draft_from = sl.draft_from;
      }
      c.prompt_end = prompt_end;
      sl.checkpoints.add(std::move(c));
      ++ck_taken;
    }
    publish_checkpoints();
  }
  void publish_prefix() {
    const PrefixCacheStats st = prefix->stats();
    const std::lock_guard<std::mutex> lock(prefix_mu);
    prefix_stats = st;
  }
  // A snapshot of the slot's state into the shared prefix cache (with the last row of logits at
  // a prompt's end), unless one is held. Room is made before the snapshot is copied.
  // The same snapshot is queued for the state directory when it has none of this prefix.
  void cache_prefix(Slot& sl, bool with_logits) {
    const uint32_t pos = sl.state.position();
    if ((!prefix && !disk) || pos == 0) return;
    with_logits = with_logits && !sl.last_logits.empty();
    const std::span<const TokenId> key(sl.history.data(), pos);
    const bool with_draft = drafter && sl.draft.committed == pos;
    bool ram = false;
    if (prefix && !prefix->contains(key, with_logits, sl.scope)) {
      const uint64_t need = prefix_entry_charge(snapshot_bytes(model->config, pos) +
                                                    (with_logits ? sl.last_logits.size() * sizeof(float) : 0) +
                                                    (with_draft ? sl.draft.rings.size() * sizeof(uint16_t) : 0),
                                                prefix_entry_blocks(sl.state.sources.size()), pos);
      ram = prefix->make_room(need);
    }
    const bool to_disk = disk && disk->wants(key, with_logits, sl.scope);
    if (ram || to_disk) {
      SequenceSnapshot snap = engine->snapshot(sl.state);
      if (to_disk)
        disk->put(std::vector<TokenId>(key.begin(), key.end()), ram ? snap : std::move(snap),
                  with_logits ? sl.last_logits : std::vector<float>{}, sl.scope);
      if (ram) {
        PrefixEntry e;
        e.snap = std::move(snap);
        if (with_logits) e.logits = sl.last_logits;
        if (with_draft) {
          e.draft_rings = sl.draft.rings;
          e.draft_from = sl.draft_from;
        }
        prefix->insert(key, std::move(e), sl.scope);
      }
    }
    if (prefix) publish_prefix();
  }
  // A state from the directory, when it holds a longer prefix of the prompt than `better_than`:
  // restored into the slot (and kept in the RAM cache when it has room). false: none usable. A
  // file that fails its checks leaves the index, so the next shorter one is tried.
  bool restore_from_disk(Slot& sl, std::span<const TokenId> prompt, size_t common, uint32_t better_than) {
    LoadedState ls;
    uint32_t pos = 0;
    while ((pos = disk->find(prompt, better_than, sl.scope)) != 0 && !disk->load(prompt, pos, &ls, sl.scope)) {
    }
    if (pos == 0) return false;
    engine->restore(sl.state, ls.snap);
    sl.history.assign(prompt.begin(), prompt.begin() + pos);
    draft_jump(sl);
    sl.last_logits = ls.logits;
    sl.checkpoints.drop_after((uint32_t)std::min<size_t>(common, pos));
    publish_checkpoints();
    if (prefix && !prefix->contains(prompt.first(pos), !ls.logits.empty(), sl.scope)) {
      const uint64_t need = prefix_entry_charge(ls.snap.bytes() + ls.logits.size() * sizeof(float),
                                                prefix_entry_blocks(sl.state.sources.size()), pos);
      if (prefix->make_room(need)) {
        PrefixEntry e;
        e.snap = std::move(ls.snap);
        e.logits = std::move(ls.logits);
        prefix->insert(prompt.first(pos), std::move(e), sl.scope);
      }
      publish_prefix();
    }
    return true;
  }
  static size_t common_prefix(const std::vector<TokenId>& a, std::span<const TokenId> b) {
    const size_t n = std::min(a.size(), b.size());
    return (size_t)(std::mismatch(a.begin(), a.begin() + (std::ptrdiff_t)n, b.begin()).first - a.begin());
  }
  // Where a prompt starts on a slot: its sequence when the prompt extends it, else the newest
  // checkpoint at or before the first differing token, else position 0 -- unless the state
  // directory or the RAM prefix cache holds a longer prefix of the prompt (the directory is
  // read only when it beats both).
  void start_for(Slot& sl, std::span<const TokenId> prompt) {
    const size_t common = common_prefix(sl.history, prompt);
    // A prompt equal to the kept sequence needs its last row of logits, which a cancelled
    // prefill may not have computed.
    const bool extends = !sl.history.empty() && common == sl.history.size() &&
                         (sl.history.size() < prompt.size() || !sl.last_logits.empty());
    const SessionCheckpoint* c = extends ? nullptr : sl.checkpoints.best_for((uint32_t)common, (uint32_t)prompt.size());
    const size_t own = extends ? sl.history.size() : c ? c->pos() : 0;
    if (disk) {
      const PrefixEntry* ram = prefix ? prefix->peek(prompt, sl.scope) : nullptr;
      if (restore_from_disk(sl, prompt, common, (uint32_t)std::max<size_t>(own, ram ? ram->pos() : 0))) return;
    }
    if (prefix) {
      const PrefixEntry* hit = prefix->lookup(prompt, sl.scope);
      if (hit && hit->pos() > own) {
        const uint32_t pos = hit->pos();
        engine->restore(sl.state, hit->snap);
        sl.history.assign(prompt.begin(), prompt.begin() + pos);
        draft_jump(sl);
        if (!hit->draft_rings.empty()) {  // the drafter's rings as they were at pos
          sl.draft.rings = hit->draft_rings;
          sl.draft_from = hit->draft_from;
        }
        sl.last_logits = hit->logits;
        // The slot's checkpoints of tokens the new sequence shares stay valid (the restored
        // state holds those tokens and the same compressed rows before them).
        sl.checkpoints.drop_after((uint32_t)std::min<size_t>(common, pos));
        prefix->count_hit(pos);
        publish_checkpoints();
        publish_prefix();
        return;
      }
      publish_prefix();
    }
    if (extends) return;
    if (!c) {
      forget(sl);
      return;
    }
    const uint32_t pos = c->pos();
    engine->rollback(sl.state, c->seq);
    sl.history.resize(pos);
    draft_jump(sl);
    if (!c->draft_rings.empty()) {  // the drafter's rings as they were at pos
      sl.draft.rings = c->draft_rings;
      sl.draft_from = c->draft_from;
    }
    sl.last_logits = c->logits;
    sl.checkpoints.drop_after(pos);
    ++ck_rollbacks;
    publish_checkpoints();
  }
  void publish_checkpoints() {
    uint64_t n = 0, b = 0, d = 0, sk = 0;
    for (const Slot& sl : slots) {
      n += sl.checkpoints.items().size();
      b += sl.checkpoints.bytes();
      d += sl.checkpoints.dropped();
      sk += sl.checkpoints.skipped();
    }
    ck_count = n, ck_bytes = b, ck_dropped = d, ck_skipped = sk;
  }
  void forget(Slot& sl) {
    engine->reset(sl.state);
    forget_record(sl);
    publish_slot(sl);
  }
  // What is remembered of a slot's state (its tokens, last row, checkpoints, prompt record),
  // not the state itself.
  void forget_record(Slot& sl) {
    sl.history.clear();
    draft_jump(sl);
    sl.last_logits.clear();
    sl.checkpoints.clear();
    publish_checkpoints();
    const std::lock_guard<std::mutex> lock(prompt_mu);
    sl.prompt_cache.clear();
  }
  void publish_slot(const Slot& sl) {
    SlotGauge& g = gauges[(size_t)(&sl - slots.data())];
    g.position = sl.state.position();
    if (!sl.job) {
      g.phase = (uint8_t)SlotStats::Phase::Idle;
      return;
    }
    const ActiveRequest& a = *sl.job;
    g.phase = (uint8_t)(a.decoding ? SlotStats::Phase::Decode : SlotStats::Phase::Prefill);
    g.prompt_done = std::min<uint32_t>((uint32_t)sl.history.size(), (uint32_t)a.r.prompt.size());
    g.generated = (uint32_t)a.res.tokens.size();
  }
  Slot& slot(uint32_t k) {
    if (k >= slots.size()) throw Error("slot " + std::to_string(k) + " of " + std::to_string(slots.size()));
    return slots[k];
  }

  // --- the request state machine ----------------------------------------------------------
  void end_prefill(Slot& sl) {
    ActiveRequest& a = *sl.job;
    if (sl.history.size() == a.r.prompt.size()) take_checkpoint(sl, /*prompt_end=*/true);
    a.res.prompt_evaluated = (uint32_t)sl.history.size();
    a.res.prefill_s = seconds_since(a.t_prefill);
    prefill_ns += (uint64_t)(a.res.prefill_s * 1e9);
    a.t_decode = std::chrono::steady_clock::now();
  }
  void finish(Slot& sl, Finish f) {
    ActiveRequest& a = *sl.job;
    a.res.finish = f;
    a.res.decode_s = seconds_since(a.t_decode);
    if (!a.r.prompt_text.empty()) {
      const std::lock_guard<std::mutex> lock(prompt_mu);
      sl.prompt_cache.remember(*tokenizer, a.r.prompt_text, a.r.prompt, a.res.tokens);
      sl.prompt_scope = a.r.scope;
    }
    decode_ns += (uint64_t)(a.res.decode_s * 1e9);
    publish_slot(sl);
    GenerateResult res = std::move(a.res);
    auto done = std::move(a.ev.on_done);
    sl.job.reset();
    --busy;
    publish_slot(sl);
    if (done) done(std::move(res));  // the slot is free by now
  }
  void fail(Slot& sl, const std::string& msg) {
    auto failed = std::move(sl.job->ev.on_failed);
    sl.job.reset();
    --busy;
    publish_slot(sl);
    if (failed) failed(msg);
  }
  // The prompt is in (its last row of logits at hand): sample, stop or go on decoding.
  void sample_next(Slot& sl) {
    ActiveRequest& a = *sl.job;
    const ModelConfig& c = model->config;
    if (a.res.tokens.size() >= a.r.max_tokens) return finish(sl, Finish::Length);
    const TokenId next = a.sampler.sample(std::span<const float>(sl.last_logits.data(), c.vocab_size));
    if (const Finish f = emit(sl, next); f != Finish::None) finish(sl, f);
  }
  // `next` is the request's next token: its callback and the stop rules. None: it is pending
  // (the next step evaluates it); otherwise why the request ends (the caller finishes it).
  Finish emit(Slot& sl, TokenId next) {
    ActiveRequest& a = *sl.job;
    const ModelConfig& c = model->config;
    GenerateResult& res = a.res;
    // --draft-audit: `next` is the anchor after the newest committed position (even a last token).
    if (opt.draft_audit && drafter && speculation && sl.draft.committed == sl.history.size()) audit_block(sl, next);
    res.tokens.push_back(next);
    ++generated_tokens;
    const bool keep_going = !a.ev.on_token || a.ev.on_token(next);
    const bool is_stop = std::find(a.r.stop_tokens.begin(), a.r.stop_tokens.end(), next) != a.r.stop_tokens.end();
    if ((!a.r.ignore_eos && next == c.eos_token_id) || is_stop) return Finish::Stop;
    if (!keep_going) return Finish::Cancelled;
    if (res.tokens.size() >= a.r.max_tokens) return Finish::Length;
    if (sl.history.size() >= plan.ctx) return Finish::Context;
    a.pending = next;
    a.decoding = true;
    return Finish::None;
  }

  // --dspark: the slot's rings no longer match its state (see Slot::draft).
  void draft_jump(Slot& sl) {
    sl.draft.committed = (uint32_t)sl.history.size();
    sl.draft_from = (uint32_t)sl.history.size();
  }
  void draft_commit(Slot& sl, const float* hidden, uint32_t n) {
    if (!drafter) return;
    if (!speculation || !hidden) return draft_jump(sl);  // off: no rings kept (set_speculation)
    if (sl.draft.committed != sl.history.size() - n) return draft_jump(sl);  // defensive: never commit out of place
    if (!opt.draft_audit) return drafter->commit(sl.draft, hidden, n);
    // --draft-audit: one position at a time, each block proposed from the rings as they are
    // after its position; the anchor of the newest position is decided later (emit()).
    const size_t cw = drafter->capture_width();
    for (uint32_t i = 0; i < n; ++i) {
      drafter->commit(sl.draft, hidden + i * cw, 1);
      const uint32_t next = sl.draft.committed;  // the anchor's position
      if (next < sl.history.size()) audit_block(sl, sl.history[next]);
      else if (sl.job && !sl.job->decoding && next < sl.job->r.prompt.size()) audit_block(sl, sl.job->r.prompt[next]);
    }
  }
  // --draft-audit: the block after the last committed position with this anchor, reported and
  // never verified. Only for rings that hold every position (no restore jumped them).
  void audit_block(Slot& sl, TokenId anchor) {
    const EvalObserver* obs = sl.job ? sl.job->r.observer : nullptr;
    if (sl.draft_from != 0 || !obs || !obs->on_draft) return;
    const auto t0 = std::chrono::steady_clock::now();
    const DraftBlock b = drafter->propose(sl.draft, anchor);
    ++spec_blocks;
    spec_propose_ns += (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    obs->on_draft(b, 0, 0);
  }

  // One speculative cycle of the only running request (spec 6.4-6.5): the drafter proposes a
  // block after the slot's last position with its pending token as the anchor, the leading
  // drafts the confidence gate keeps are verified in one target pass, the exact acceptance
  // rule picks the accepted drafts and one more token, the state is cut back to what was
  // accepted and every emitted token goes through the same rules as a plainly sampled one.
  // false: no cycle this step (plain decode instead).
  bool speculate(Slot& sl) {
    ActiveRequest& a = *sl.job;
    const ModelConfig& c = model->config;
    const uint32_t V = c.vocab_size, W = c.sliding_window, pos = (uint32_t)sl.history.size();
    if (!drafter || !speculation || opt.draft_audit || !a.decoding || opt.tensors) return false;
    if (sl.draft.committed != pos) draft_jump(sl);
    if (sl.draft_from != 0 && pos - sl.draft_from < W) return false;  // its rings are not refilled yet
    if (sl.pause_left) {
      --sl.pause_left;
      return false;
    }
    // Drafts d_1..d_K are verified at positions pos+1..pos+K beside the anchor at pos; every
    // emitted token counts towards max_tokens.
    const uint64_t left = a.r.max_tokens - a.res.tokens.size();
    const uint64_t k_max = std::min<uint64_t>({opt.draft_max, drafter->config().block_size, plan.ctx - pos - 1,
                                               plan.chunk - 1, W - 1, left ? left - 1 : 0,
                                               plan.dspark_verify_max});
    if (pos + 1 >= plan.ctx || k_max < 2) return false;
    const auto t0 = std::chrono::steady_clock::now();
    DraftBlock b = drafter->propose(sl.draft, a.pending);
    if (opt.draft_hook) {
      opt.draft_hook(pos, a.pending, b.drafts);
      if (b.drafts.size() != drafter->config().block_size) throw Error("dspark: the draft hook changed the block size");
      for (TokenId& d : b.drafts) d = std::min<TokenId>(d, V - 1);
    }
    ++spec_blocks;
    const auto t1 = std::chrono::steady_clock::now();
    spec_propose_ns += (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
    uint32_t K = 0;
    while (K < k_max && 1.0 / (1.0 + std::exp(-(double)b.confidence[K])) >= opt.dspark_conf) ++K;
    const EvalObserver* obs = a.r.observer;
    if (K < 2) {  // one draft does not pay a verify pass: decode plainly
      if (obs && obs->on_draft) obs->on_draft(b, 0, 0);
      return false;
    }

    std::vector<TokenId> toks = {a.pending};
    toks.insert(toks.end(), b.drafts.begin(), b.drafts.begin() + K);
    const size_t cw = drafter->capture_width();
    verify_logits.resize(toks.size() * V);
    verify_hidden.resize(toks.size() * cw);
    VerifyRecord rec;
    std::vector<TokenTrace> trace;
    try {
      engine->eval_verify(sl.state, toks, verify_logits.data(), verify_hidden.data(), rec,
                          obs && obs->want_trace ? &trace : nullptr);
    } catch (const std::exception& e) {
      publish_engram();
      const std::string msg = e.what();
      fail(sl, msg);
      throw;
    }
    publish_engram();
    ++step_sizes[1];
    spec_verify_ns += (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t1).count();

    std::vector<std::vector<TokenProb>> p(toks.size());
    for (size_t i = 0; i < toks.size(); ++i)
      p[i] = sampling_distribution(std::span<const float>(verify_logits.data() + i * V, V), a.r.sampling);
    const Verdict v = verify_point_mass(p, std::span<const TokenId>(b.drafts.data(), K), a.sampler.rng());

    // The emitted tokens: the accepted drafts, then the correction or bonus token. Before token
    // k is emitted the sequence holds the verify pass's first k tokens, as in plain decoding.
    std::vector<TokenId> out(b.drafts.begin(), b.drafts.begin() + v.accepted);
    out.push_back(v.next);
    Finish f = Finish::None;
    uint32_t kept = 0;
    for (size_t k = 0; k < out.size(); ++k) {
      if (a.res.tokens.size() >= a.r.max_tokens) {
        f = Finish::Length;
        break;
      }
      sl.history.push_back(toks[k]);
      ++kept;
      ++a.res.decode_steps;
      sl.last_logits.assign(verify_logits.begin() + (ptrdiff_t)(k * V), verify_logits.begin() + (ptrdiff_t)((k + 1) * V));
      f = emit(sl, out[k]);
      if (f != Finish::None) break;
    }
    engine->keep_verified(sl.state, rec, kept);
    draft_commit(sl, verify_hidden.data(), kept);
    if (obs && obs->on_draft) obs->on_draft(b, K, v.accepted);
    if (obs && obs->on_eval) {  // the kept rows only: what plain decoding would have shown
      if (obs->want_trace) trace.resize(kept);
      obs->on_eval(pos, std::span<const TokenId>(toks.data(), kept), verify_logits.data(),
                   obs->want_trace ? &trace : nullptr);
    }
    ++a.res.spec_cycles;
    a.res.drafts_proposed += K;
    a.res.drafts_accepted += v.accepted;
    ++spec_cycles;
    spec_drafts += K;
    spec_accepted += v.accepted;
    spec_tokens += v.accepted + 1;
    if (opt.dspark_guard) {
      sl.recent.emplace_back(K, v.accepted);
      if (sl.recent.size() > 10) sl.recent.pop_front();
      uint32_t drafted = 0, accepted = 0;
      for (auto [d, acc] : sl.recent) drafted += d, accepted += acc;
      if (sl.recent.size() == 10 && accepted * 10 < drafted * 6) {
        sl.pause_left = 64;
        sl.recent.clear();
        ++spec_pauses;
      }
    }
    const uint32_t every = opt.checkpoint_interval;
    if (every && sl.state.position() / every > pos / every) take_checkpoint(sl, false);
    if (f != Finish::None) finish(sl, f);
    else publish_slot(sl);
    return true;
  }
};

namespace {
// An error about the DSpark support file, already naming it: not prefixed with the model's path.
struct DsparkFileError : Error {
  using Error::Error;
};

}  // namespace

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

storage::StoreOptions session_store_options(const SessionOptions& o) {
  storage::StoreOptions so;
  so.policy = o.policy;
  so.queue_depth = o.io_depth;
  so.direct_io = o.direct_io;
  return so;
}

GpuOptions gpu_options(const SessionOptions& o) {
  GpuOptions go;
  go.device = o.gpu_device;
  go.threads = o.threads;
  go.weight_budget = o.gpu_mem;
  go.expert_slots = o.gpu_experts;
  go.cpu_experts = o.cpu_experts;
  go.cpu_experts_auto = o.cpu_experts_auto;
  go.linears = o.gpu_linears;
  go.gemm = o.gpu_gemm;
  go.int_dot = o.gpu_int_dot;
  go.indexer = o.gpu_indexer;
  go.kv_bytes = o.gpu_kv;
  go.kv_auto = o.gpu_kv_auto;
  go.experts_in_place = o.gpu_experts_in_place;
  go.scratch_on_device = o.gpu_scratch_on_device;
  go.force_staging = o.gpu_force_staging;
  go.no_timeline = o.gpu_no_timeline;
  return go;
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
  // The device before the plan: planning measures this process's overhead, the driver included.
  // Its errors are about the device, not the model file.
  {
    SessionDevice d = make_session_device(opt, cfg);
    s.backend = std::move(d.backend);
    s.gpu_slots = d.slots;
    s.gpu_slots_auto = d.slots_auto;
  }
  try {
    StorePlanOptions spo;
    spo.plan.ctx = opt.ctx ? opt.ctx : default_context(cfg.max_position_embeddings);
    spo.plan.chunk = opt.chunk;
    spo.plan.threads = opt.threads;
    spo.plan.budget = opt.budget;
    spo.plan.allow_swap = opt.allow_swap;
    spo.plan.checkpoint_budget = opt.checkpoint_budget;
    spo.plan.prefix_cache_budget = opt.cache_ram;
    spo.plan.state_disk = !opt.kv_disk_dir.empty();
    spo.plan.caller_lines = opt.plan_lines;
    if (opt.parallel == 0) throw Error("--parallel must be at least 1");
    spo.plan.sequences = opt.parallel;
    spo.plan.max_cache_experts = opt.max_cache_experts;
    spo.store = session_store_options(opt);
    spo.stream_experts = opt.stream_experts;
    if (opt.draft_audit && opt.dspark_path.empty()) throw Error("draft_audit needs a drafter (--dspark FILE)");
    // The support file is checked against this model before anything is planned or read; its
    // errors name the support file (plan_dspark), not the model.
    if (!opt.dspark_path.empty()) {
      try {
        spo.plan.dspark_experts = opt.dspark_experts;
        plan_dspark(opt.dspark_path, cfg, opt.draft_max, spo.plan, spo.store);
      } catch (const Error& e) {
        throw DsparkFileError(e.what());
      }
    }
    if (s.backend)
      plan_session_device(*s.backend, s.gpu_slots, s.gpu_slots_auto, header.file, cfg, opt.stream_experts, spo.plan);
    if (opt.remote)
      spo.plan.fabric_bytes = [r = opt.remote, cfg](uint32_t chunk) {
        const uint64_t triples = (uint64_t)chunk * cfg.num_experts_per_tok;
        return r->exchange_bytes(chunk, triples) + split_moe_bytes(cfg, triples);
      };
    s.plan = plan_for_file(header.file, spo);
    require_admitted(s.plan);
  } catch (const DsparkFileError& e) {
    throw Error(e.what());
  } catch (const Error& e) {  // every error about the file names it once, as run's do
    throw Error(with_path(opt.model_path, e.what()));
  }
  LoadOptions lo;
  lo.backend = s.backend.get();
  lo.resident_experts = !opt.stream_experts;
  if (opt.progress) lo.progress = [&](uint64_t done, uint64_t total) { opt.progress("loading weights", done, total); };
  s.model = load_model(opt.model_path, lo);
  EngineOptions eo;
  eo.backend = s.backend.get();
  eo.threads = s.plan.threads;
  eo.ctx = s.plan.ctx;
  eo.chunk = s.plan.chunk;
  eo.prefetch = opt.prefetch;
  eo.observer = opt.tensors;
  if (opt.route_bias != 0.0f && !opt.stream_experts)
    throw Error("route bias needs streamed experts (with resident experts every expert is cached)");
  eo.route_bias = opt.route_bias;
  if (opt.remote && opt.route_bias != 0.0f) throw Error("--route-bias does not work across ranks (--fabric)");
  eo.remote = opt.remote;
  eo.engram_cache_rows = s.plan.engram_cache_rows;
  if (!opt.dspark_path.empty()) {
    LoadOptions dl;
    dl.resident_experts = !s.plan.dspark_streamed;
    dl.backend = s.backend.get();  // its dense weights on the device too, as the model's
    if (opt.progress) dl.progress = [&](uint64_t done, uint64_t total) { opt.progress("loading drafter", done, total); };
    s.dspark = load_dspark(opt.dspark_path, *s.model, dl);
    if (s.plan.dspark_streamed) {
      storage::StoreOptions so;
      so.queue_depth = opt.io_depth;
      so.direct_io = opt.direct_io;
      s.dspark_store = open_dspark_expert_store(*s.dspark, so);
      s.dspark_streamed = std::make_unique<StreamedExperts>(*s.dspark_store);
    }
    eo.capture_layers = s.dspark->config.target_layers;
  }
  if (opt.stream_experts) {
    s.store = open_expert_store(*s.model, store_options_for(s.plan, session_store_options(opt)));
    s.streamed = std::make_unique<StreamedExperts>(*s.store);
    eo.experts = s.streamed.get();
  }
  s.engine = s.arch->make_engine(*s.model, eo);
  // The drafter runs on the engine's backend (its threads; both models' weights prepared for it).
  if (s.dspark) s.drafter = std::make_unique<Drafter>(*s.model, *s.dspark, s.engine->backend(), s.dspark_streamed.get());
  // One decode step of every slot is one pass of parallel rows, which the chunk's scratch holds.
  if (s.plan.chunk < opt.parallel)
    throw Error(with_path(opt.model_path, "--parallel " + std::to_string(opt.parallel) + " needs a chunk of at least " +
                                              std::to_string(opt.parallel) + " rows; the plan has " +
                                              std::to_string(s.plan.chunk) + (s.plan.chunk_auto ? " (the most the budget admits)" : " (--chunk)")));
  s.slots.resize(opt.parallel);
  s.gauges = std::make_unique<SlotGauge[]>(opt.parallel);
  s.step_sizes = std::make_unique<std::atomic<uint64_t>[]>(opt.parallel + 1);
  if (opt.cache_ram) {
    s.prefix = std::make_unique<PrefixCache>(opt.cache_ram);
    s.publish_prefix();
  }
  if (!opt.kv_disk_dir.empty()) {
    StateDiskOptions d;
    d.dir = opt.kv_disk_dir;
    d.budget = opt.kv_disk_budget;
    d.shape = state_shape(cfg, s.plan.ctx);
    d.queue_bytes = s.plan.state_disk_queue;
    d.identity = model_file_identity(opt.model_path, opt.route_bias);
    d.log = opt.log;
    s.disk = std::make_unique<StateDisk>(std::move(d));
  }
  for (Slot& sl : s.slots) {
    sl.state = s.engine->new_sequence();
    if (s.drafter) sl.draft = s.drafter->new_state();
    sl.checkpoints = CheckpointSet(opt.checkpoint_budget);  // the plan charges it per sequence
  }
}

Session::~Session() {
  if (impl_ && impl_->streamed) impl_->streamed->release();
  if (impl_ && impl_->dspark_streamed) impl_->dspark_streamed->release();
}

const text::Tokenizer& Session::tokenizer() const { return *impl_->tokenizer; }
const ModelConfig& Session::config() const { return impl_->model->config; }
const Architecture& Session::architecture() const { return *impl_->arch; }
const Plan& Session::plan() const { return impl_->plan; }
const Model& Session::model() const { return *impl_->model; }
const Backend& Session::backend() const { return impl_->engine->backend(); }
const ExpertSource& Session::experts() const {
  return impl_->streamed ? static_cast<const ExpertSource&>(*impl_->streamed) : resident_expert_source(*impl_->model);
}
const SessionOptions& Session::options() const { return impl_->opt; }
uint32_t Session::ctx() const { return impl_->plan.ctx; }

std::string Session::model_id() const {
  std::string name = std::filesystem::path(impl_->opt.model_path).filename().string();
  if (name.size() > 5 && name.substr(name.size() - 5) == ".gguf") name.resize(name.size() - 5);
  return name;
}

void Session::reset() {
  for (Slot& sl : impl_->slots)
    if (!sl.job) impl_->forget(sl);
}

uint32_t Session::parallel() const { return impl_->opt.parallel; }

uint32_t Session::slot_position(uint32_t k) const { return const_cast<Impl&>(*impl_).slot(k).state.position(); }

void Session::reset_slot(uint32_t k) {
  Slot& sl = impl_->slot(k);
  if (sl.job) throw Error("slot " + std::to_string(k) + " is running a request");
  impl_->forget(sl);
}

void Session::eval_slots(std::span<const std::span<const TokenId>> tokens, float* logits) {
  Impl& s = *impl_;
  if (tokens.size() != s.opt.parallel)
    throw Error(std::to_string(tokens.size()) + " token lists for " + std::to_string(s.opt.parallel) + " slots");
  std::vector<Engine::BatchItem> items;
  for (uint32_t k = 0; k < tokens.size(); ++k) {
    if (tokens[k].empty()) continue;
    if (s.slots[k].job) throw Error("slot " + std::to_string(k) + " is running a request");
    items.push_back({&s.slots[k].state, tokens[k]});
  }
  if (items.empty()) return;
  s.engine->eval_batch(items, logits);
  // The slots moved past what is remembered of them: drop those records (the states are the
  // batch's), so a later prompt cannot be matched against them.
  for (uint32_t k = 0; k < tokens.size(); ++k)
    if (!tokens[k].empty()) {
      s.forget_record(s.slots[k]);
      s.publish_slot(s.slots[k]);
    }
}

void Session::set_route_bias(float d) {
  if (d != 0.0f && !impl_->opt.stream_experts)
    throw Error("route bias needs streamed experts (with resident experts every expert is cached)");
  impl_->engine->set_route_bias(d);
  impl_->opt.route_bias = d;
}

std::vector<TokenId> Session::tokenize_prompt(const text::PromptText& prompt, bool add_bos, uint64_t scope) const {
  const std::lock_guard<std::mutex> lock(impl_->prompt_mu);
  const text::Tokenizer& tok = *impl_->tokenizer;
  // Only the scope's own conversations: another's would show in how this text is tokenized.
  const Slot* best = nullptr;
  size_t best_reuse = 0;
  for (const Slot& sl : impl_->slots) {
    if (sl.prompt_scope != scope) continue;
    const size_t reuse = sl.prompt_cache.reused_for(tok, prompt);
    if (!best || reuse > best_reuse) best = &sl, best_reuse = reuse;
  }
  return best ? best->prompt_cache.tokens_for(tok, prompt, add_bos, best_reuse)
              : PromptCache().tokens_for(tok, prompt, add_bos, 0);
}

int Session::pick_slot(std::span<const TokenId> prompt, uint64_t scope) const {
  int best = -1;
  size_t best_common = 0;
  for (uint32_t k = 0; k < impl_->slots.size(); ++k) {
    const Slot& sl = impl_->slots[k];
    if (sl.job) continue;
    const size_t common = sl.scope == scope ? Impl::common_prefix(sl.history, prompt) : 0;
    if (best < 0 || common > best_common) best = (int)k, best_common = common;
  }
  return best;
}

bool Session::slot_busy(uint32_t k) const { return const_cast<Impl&>(*impl_).slot(k).job.has_value(); }
uint32_t Session::busy_slots() const { return impl_->busy; }

void Session::start(uint32_t k, GenerateRequest r, SlotEvents ev) {
  Impl& s = *impl_;
  const ModelConfig& c = s.model->config;
  const uint32_t ctx = s.plan.ctx;
  Slot& sl = s.slot(k);
  if (sl.job) throw Error("slot " + std::to_string(k) + " is running a request");
  if (r.prompt.empty()) throw Error("the prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] >= c.vocab_size)
      throw Error("prompt token " + std::to_string(i) + " is " + std::to_string(r.prompt[i]) +
                  ", not below the vocabulary size " + std::to_string(c.vocab_size));
  if (r.prompt.size() > ctx)
    throw Error("the prompt has " + std::to_string(r.prompt.size()) + " tokens but the context is " +
                std::to_string(ctx));
  validate(r.sampling);
  for (const uint32_t b : r.checkpoint_at)
    if (b == 0 || b >= r.prompt.size())
      throw Error("checkpoint position " + std::to_string(b) + " is not inside the prompt of " +
                  std::to_string(r.prompt.size()) + " tokens");
  std::sort(r.checkpoint_at.begin(), r.checkpoint_at.end());
  r.checkpoint_at.erase(std::unique(r.checkpoint_at.begin(), r.checkpoint_at.end()), r.checkpoint_at.end());
  r.checkpoint_at = bound_boundaries(r.checkpoint_at);

  if (sl.scope != r.scope) {  // another key's sequence: nothing of it is reused
    s.forget(sl);
    sl.scope = r.scope;
  }
  s.start_for(sl, r.prompt);
  sl.job.emplace(std::move(r), std::move(ev), s.started++);
  ++s.busy;
  ActiveRequest& a = *sl.job;
  a.res.prompt_tokens = (uint32_t)a.r.prompt.size();
  a.res.reused_tokens = (uint32_t)sl.history.size();
  ++s.requests;
  s.prompt_tokens += a.r.prompt.size();
  a.t_prefill = a.t_decode = std::chrono::steady_clock::now();
  SlotGauge& g = s.gauges[k];
  g.request = s.started;
  g.prompt_tokens = a.res.prompt_tokens;
  g.reused = a.res.reused_tokens;
  g.max_tokens = a.r.max_tokens;
  g.generated = 0;
  s.publish_slot(sl);
  const bool cancelled = a.ev.on_prefill && !a.ev.on_prefill((uint32_t)sl.history.size(), a.res.prompt_tokens);
  if (cancelled) {
    s.end_prefill(sl);
    return s.finish(sl, Finish::Cancelled);
  }
  if (sl.history.size() == a.r.prompt.size()) {
    s.end_prefill(sl);
    s.sample_next(sl);
  }
}

void Session::cancel(uint32_t k) {
  Slot& sl = impl_->slot(k);
  if (!sl.job) return;
  if (!sl.job->decoding) impl_->end_prefill(sl);
  impl_->finish(sl, Finish::Cancelled);
}

// One pass: decode rows first (one per decoding slot), then prompt pieces, oldest request
// first, within the prefill allowance and the chunk's rows. A piece stops before its prompt's
// last token (the prompt-end checkpoint is taken there), as generate() always did.
void Session::step(uint32_t prefill_tokens) {
  Impl& s = *impl_;
  const uint32_t V = s.model->config.vocab_size;
  // Speculative decoding while one request runs and decodes (a batch already shares its reads).
  if (s.drafter && s.busy == 1)
    for (Slot& sl : s.slots)
      if (sl.job && sl.job->decoding && s.speculate(sl)) return;
  struct Part {
    uint32_t slot;
    size_t n;
    bool decode, last_piece;
    std::vector<TokenTrace> trace;
  };
  std::vector<Part> parts;
  uint32_t rows = s.plan.chunk;
  for (uint32_t k = 0; k < s.slots.size(); ++k)
    if (s.slots[k].job && s.slots[k].job->decoding) {
      parts.push_back({k, 1, true, false, {}});
      --rows;  // chunk >= parallel (checked at load)
    }
  std::vector<uint32_t> waiting;
  for (uint32_t k = 0; k < s.slots.size(); ++k)
    if (s.slots[k].job && !s.slots[k].job->decoding) waiting.push_back(k);
  std::sort(waiting.begin(), waiting.end(),
            [&](uint32_t a, uint32_t b) { return s.slots[a].job->order < s.slots[b].job->order; });
  uint32_t allowance = parts.empty() || prefill_tokens == 0 ? rows : std::min(rows, prefill_tokens);
  for (const uint32_t k : waiting) {
    if (allowance == 0) break;
    const Slot& sl = s.slots[k];
    const size_t have = sl.history.size(), total = sl.job->r.prompt.size(), before_last = total - 1;
    size_t n = std::min<size_t>(allowance, total - have);
    if (have < before_last && have + n > before_last) n = before_last - have;
    const std::vector<uint32_t>& at = sl.job->r.checkpoint_at;
    const auto next_at = std::upper_bound(at.begin(), at.end(), (uint32_t)have);
    if (next_at != at.end() && have + n > *next_at) n = *next_at - have;
    parts.push_back({k, n, false, have + n == total, {}});
    allowance -= (uint32_t)n;
  }
  // The engine shows its intermediates to a tensor observer for single items only.
  if (s.opt.tensors && parts.size() > 1) parts.resize(1);
  if (parts.empty()) return;

  using Logits = Engine::BatchItem::Logits;
  std::vector<Engine::BatchItem> items;
  size_t out_rows = 0;
  for (Part& pt : parts) {
    Slot& sl = s.slots[pt.slot];
    const ActiveRequest& a = *sl.job;
    Engine::BatchItem it;
    it.state = &sl.state;
    it.tokens = pt.decode ? std::span<const TokenId>(&a.pending, 1)
                          : std::span<const TokenId>(a.r.prompt.data() + sl.history.size(), pt.n);
    const bool observed = a.r.observer && a.r.observer->on_eval;
    // An observer sees every row, and with a tensor observer the head runs for every chunk.
    it.logits = observed || s.opt.tensors ? Logits::All : pt.decode || pt.last_piece ? Logits::Last : Logits::None;
    if (a.r.observer && a.r.observer->want_trace) it.trace = &pt.trace;
    out_rows += it.logits == Logits::All ? pt.n : it.logits == Logits::Last ? 1 : 0;
    items.push_back(it);
  }
  s.step_logits.resize(out_rows * V);
  // With a drafter every evaluated row's capture feeds its slot's rings.
  const size_t cw = s.drafter ? s.drafter->capture_width() : 0;
  if (s.drafter && s.speculation) {
    size_t rows_in = 0;
    for (const Engine::BatchItem& it : items) rows_in += it.tokens.size();
    s.step_hidden.resize(rows_in * cw);
    size_t off = 0;
    for (Engine::BatchItem& it : items) {
      it.hidden = s.step_hidden.data() + off * cw;
      off += it.tokens.size();
    }
  }
  try {
    s.engine->eval_batch(items, out_rows ? s.step_logits.data() : nullptr);
  } catch (const std::exception& e) {
    s.publish_engram();  // the rows a failed eval read are in the cache and the counts
    const std::string msg = e.what();
    for (const Part& pt : parts) s.fail(s.slots[pt.slot], msg);
    throw;
  }
  s.publish_engram();
  ++s.step_sizes[parts.size()];

  const float* row = s.step_logits.data();
  const uint32_t every = s.opt.checkpoint_interval;
  for (size_t i = 0; i < parts.size(); ++i) {
    Part& pt = parts[i];
    Slot& sl = s.slots[pt.slot];
    ActiveRequest& a = *sl.job;
    const uint32_t pos = (uint32_t)sl.history.size();
    const std::span<const TokenId> toks = items[i].tokens;
    sl.history.insert(sl.history.end(), toks.begin(), toks.end());
    if (s.drafter) s.draft_commit(sl, items[i].hidden, (uint32_t)toks.size());
    const size_t n_out = items[i].logits == Logits::All ? pt.n : items[i].logits == Logits::Last ? 1 : 0;
    if (n_out) sl.last_logits.assign(row + (n_out - 1) * V, row + n_out * V);
    else sl.last_logits.clear();
    if (a.r.observer && a.r.observer->on_eval)
      a.r.observer->on_eval(pos, toks, row, a.r.observer->want_trace ? &pt.trace : nullptr);
    row += n_out * V;
    // Passing a multiple of the interval takes a checkpoint, except on a prompt's last piece
    // (the prompt-end checkpoints follow).
    const bool interval = pt.decode || !pt.last_piece;
    if (interval && every && sl.state.position() / every > pos / every) s.take_checkpoint(sl, false);
    if (!pt.decode && std::binary_search(a.r.checkpoint_at.begin(), a.r.checkpoint_at.end(), (uint32_t)sl.history.size())) {
      s.take_checkpoint(sl, false);
      s.cache_prefix(sl, false);
    }
    if (pt.decode) {
      ++a.res.decode_steps;
      s.sample_next(sl);
      if (sl.job) s.publish_slot(sl);
      continue;
    }
    s.publish_slot(sl);
    const size_t total = a.r.prompt.size();
    if (sl.history.size() == total - 1) s.take_checkpoint(sl, /*prompt_end=*/true);
    const bool cancelled = a.ev.on_prefill && !a.ev.on_prefill((uint32_t)sl.history.size(), (uint32_t)total);
    if (cancelled || sl.history.size() == total) s.end_prefill(sl);
    if (cancelled) s.finish(sl, Finish::Cancelled);
    else if (sl.history.size() == total) s.sample_next(sl);
    if (sl.job) s.publish_slot(sl);
  }
}

GenerateResult Session::generate(const GenerateRequest& r, const std::function<bool(uint32_t, uint32_t)>& on_prefill,
                                 const std::function<bool(TokenId)>& on_token) {
  if (impl_->busy) throw Error("generate() while " + std::to_string(impl_->busy.load()) + " slots run requests");
  GenerateResult out;
  bool done = false;
  SlotEvents ev;
  ev.on_prefill = on_prefill;
  ev.on_token = on_token;
  ev.on_done = [&](GenerateResult res) {
    out = std::move(res);
    done = true;
  };
  start(0, r, std::move(ev));
  // Alone, a step prefills up to the chunk; step() rethrows an evaluation's error, the request
  // already ended.
  while (!done) step(0);
  return out;
}

void Session::set_speculation(bool on) {
  if (!impl_->drafter) throw Error("speculation needs a drafter (--dspark FILE)");
  if (impl_->busy) throw Error("set_speculation() while requests run");
  impl_->speculation = on;
}

void Session::set_draft_hook(std::function<void(uint32_t, TokenId, std::vector<TokenId>&)> hook) {
  if (!impl_->drafter) throw Error("a draft hook needs a drafter (--dspark FILE)");
  if (impl_->busy) throw Error("set_draft_hook() while requests run");
  impl_->opt.draft_hook = std::move(hook);
}

void Session::flush_state_disk() {
  if (impl_->disk) impl_->disk->flush();
}

SessionStats Session::stats() const {
  const Impl& s = *impl_;
  SessionStats st;
  st.streaming = s.store != nullptr;
  if (s.store) st.store = s.store->stats();
  if (s.backend) {
    st.gpu = true;
    st.gpu_stats = gpu_stats(*s.backend);
  }
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
  st.checkpoint_budget = s.opt.checkpoint_budget * s.slots.size();
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
  {
    const std::lock_guard<std::mutex> lock(s.prefix_mu);
    const PrefixCacheStats& p = s.prefix_stats;
    st.prefix_entries = p.entries, st.prefix_bytes = p.bytes, st.prefix_budget = p.budget;
    st.prefix_lookups = p.lookups, st.prefix_hits = p.hits, st.prefix_hit_tokens = p.hit_tokens;
    st.prefix_inserted = p.inserted, st.prefix_evicted = p.evicted;
  }
  if (s.disk) {
    const StateDiskStats d = s.disk->stats();
    st.state_disk = true;
    st.disk_entries = d.entries, st.disk_bytes = d.bytes, st.disk_budget = d.budget;
    st.disk_lookups = d.lookups, st.disk_hits = d.hits, st.disk_hit_tokens = d.hit_tokens;
    st.disk_queued = d.queued, st.disk_written = d.written, st.disk_written_bytes = d.written_bytes;
    st.disk_skipped = d.skipped, st.disk_evicted = d.evicted, st.disk_rejected = d.rejected;
    st.disk_ignored = d.ignored, st.disk_write_errors = d.write_errors;
  }
  st.dspark = s.drafter != nullptr;
  if (s.dspark_store) st.dspark_store = s.dspark_store->stats();
  st.spec_blocks = s.spec_blocks, st.spec_cycles = s.spec_cycles, st.spec_drafts = s.spec_drafts;
  st.spec_accepted = s.spec_accepted, st.spec_tokens = s.spec_tokens, st.spec_pauses = s.spec_pauses;
  st.spec_propose_s = (double)s.spec_propose_ns.load() / 1e9;
  st.spec_verify_s = (double)s.spec_verify_ns.load() / 1e9;
  st.slots = (uint32_t)s.slots.size();
  st.busy_slots = s.busy;
  for (size_t k = 0; k < s.slots.size(); ++k) {
    const SlotGauge& g = s.gauges[k];
    SlotStats x;
    x.phase = (SlotStats::Phase)g.phase.load();
    x.position = g.position, x.request = g.request, x.prompt_tokens = g.prompt_tokens;
    x.prompt_done = g.prompt_done, x.reused_tokens = g.reused, x.generated = g.generated, x.max_tokens = g.max_tokens;
    st.slot.push_back(x);
  }
  for (size_t k = 0; k <= s.slots.size(); ++k) st.steps_by_sequences.push_back(s.step_sizes[k]);
  return st;
}

}  // namespace sluice
