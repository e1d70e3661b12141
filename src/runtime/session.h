// One loaded model ready to generate: admission, the resident weights, the expert store (or
// resident experts), the tokenizer, one Engine and one sequence. The CLI (run, chat) and the
// server share it, so every front end gets the same budget, the same numbers and the same stats.
//
// One thread drives it (the CLI's, or the server's worker). The sequence is kept
// between calls: a prompt that starts with everything evaluated so far (the previous prompt plus
// what was generated and fed back) only evaluates its new tokens. For a prompt that shares only
// a prefix with it, the session keeps checkpoints of the sequence (every checkpoint_interval
// tokens and at the end of each prompt, within checkpoint_budget bytes) and rolls back to the
// newest one at or before the first differing token, which gives exactly the state a fresh
// prefill of those tokens would (Engine::rollback).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/vulkan_backend.h"
#include "format/gguf.h"
#include "model/deepseek41/config.h"
#include "runtime/admission.h"
#include "runtime/sampler.h"
#include "storage/eviction_policy.h"
#include "storage/expert_store.h"
#include "storage/store_stats.h"
#include "text/prompt_text.h"
#include "util/token_id.h"

namespace sluice {
namespace text { class Tokenizer; }
class Backend;
class ExpertSource;
class Model;
class RemoteExperts;
class TensorObserver;
struct Architecture;

// The context a session gets for ctx 0 (what chat, serve and plan use without -c).
inline uint32_t default_context(uint64_t max_position_embeddings) {
  return max_position_embeddings < 4096 ? (uint32_t)max_position_embeddings : 4096u;
}

struct SessionOptions {
  std::string model_path;
  // Expert parallelism (runtime/expert_parallel.h): the routed experts it does not call local are
  // computed by other ranks (EngineOptions::remote). Null: all here. Must outlive the Session.
  const RemoteExperts* remote = nullptr;
  uint32_t ctx = 0;              // 0: min(max_position_embeddings, 4096)
  uint32_t chunk = 0;            // 0: the largest the plan admits (up to PlanOptions::max_chunk)
  int threads = 0;               // 0: all cores
  BudgetSpec budget;             // --mem-budget (auto by default)
  bool allow_swap = false;
  // false: every routed expert is read into memory at load (only sensible for small models;
  // admission then counts them as resident). true: the bounded SSD expert store.
  bool stream_experts = true;
  storage::EvictionKind policy = storage::EvictionKind::LruPerLayer;
  uint32_t io_depth = 16;
  bool prefetch = true;          // next-layer router hints
  bool direct_io = true;
  // Cache-aware routing, lossy, off at 0 (EngineOptions::route_bias); needs stream_experts.
  float route_bias = 0.0f;
  uint64_t max_cache_experts = 0;  // --cache-experts: the expert cache's slots at most (0: the budget's)
  // --backend cpu|vulkan, --device N: where the forward pass runs (backend/vulkan_backend.h; the
  // plan's "GPU weight copies" line holds what the device takes of the host, docs/backends.md).
  std::string backend = "cpu";
  uint32_t gpu_device = 0;
  uint64_t gpu_mem = 0;  // --gpu-mem: the device's weight budget (GpuOptions::weight_budget; 0: auto)
  uint64_t gpu_experts = 0;  // --gpu-experts: routed-expert slots on the device (GpuOptions::expert_slots)
  bool gpu_experts_in_place = false;  // --gpu-experts in-place (GpuOptions::experts_in_place)
  // --gpu-experts auto (the default): with neither of the two above, the device's kind chooses
  // (auto_gpu_experts). false: --gpu-experts 0, the routed experts on the CPU.
  bool gpu_experts_auto = true;
  // --cpu-experts F|auto: the CPU's share of the slot misses (GpuOptions::cpu_experts, _auto).
  double cpu_experts = 0;
  bool cpu_experts_auto = false;
  GpuLinears gpu_linears = GpuLinears::Auto;  // --gpu-linears (GpuOptions::linears)
  bool gpu_gemm = true;                       // --gpu-gemm (GpuOptions::gemm)
  GpuIntDot gpu_int_dot = GpuIntDot::Auto;    // --gpu-int-dot (GpuOptions::int_dot)
  GpuIndexer gpu_indexer = GpuIndexer::Auto;  // --gpu-indexer (GpuOptions::indexer)
  uint64_t gpu_kv = 0;       // --gpu-kv: bytes of kept attention rows (GpuOptions::kv_bytes)
  bool gpu_kv_auto = true;   // --gpu-kv auto
  bool gpu_scratch_on_device = false;         // tests: GpuOptions::scratch_on_device
  bool gpu_force_staging = false;             // tests: GpuOptions::force_staging (unmapped slots)
  bool gpu_no_timeline = false;               // tests: GpuOptions::no_timeline
  // Prefix checkpoints: one each time the sequence passes a multiple of checkpoint_interval
  // tokens (at the end of the prefill chunk or decode step that passes it; 0: none) and two at
  // the end of each prompt's prefill: before its last token and after it (with that prompt's
  // last row of logits). At most checkpoint_budget bytes (accounted in the plan; 0: none). Over
  // the budget the session drops, among all but the newest prompt's two and the one being
  // added, the checkpoint whose removal leaves the smallest gap between its neighbours (the
  // oldest on ties), so the positions left stay spread and the work a rollback redoes is small.
  uint32_t checkpoint_interval = 1024;
  uint64_t checkpoint_budget = kDefaultCheckpointBudget;
  // Shown every named intermediate of every eval (model/deepseek41/forward.h; `run --dump-tensors`). With
  // one set, the output head runs for every prompt chunk, not only the last, so "out_norm" and
  // "logits" cover every evaluated position like the rest. Must outlive the Session.
  TensorObserver* tensors = nullptr;
  // --parallel N: sequences held at once for batched decode (Engine::eval_batch), each with its
  // own state, all planned (PlanOptions::sequences) and allocated up front. Slot 0 is the kept
  // sequence generate() uses; the server's worker runs requests on all of them (start, step).
  uint32_t parallel = 1;
  // --cache-ram: bytes for the prefix cache shared by all slots (runtime/prefix_cache.h; 0: none,
  // accounted in the plan). A snapshot of the state is kept at each prompt's end (with its last
  // row of logits) and at each of its checkpoint_at positions; a request on any slot starts from
  // the longest cached prefix of its prompt when that beats the slot's own sequence and checkpoints.
  uint64_t cache_ram = 0;
  // --kv-disk-dir / --kv-disk-budget: the same states written to files in this directory
  // (runtime/state_disk.h), at most kv_disk_budget bytes of them, found again after a restart;
  // the plan accounts the snapshots queued for writing and the one being read. Empty: none.
  std::string kv_disk_dir;
  uint64_t kv_disk_budget = 0;
  // Memory the caller holds beside the engine, planned with it (serve: its request memory).
  std::vector<PlanLine> plan_lines;
  // --dspark FILE: the DSpark drafter's support file (spec 6, docs/dspark.md): exact speculative
  // decoding while one request runs (runtime/speculative.h); empty: none. Drafts are verified
  // draft_max at most per cycle (2 .. the block size), kept while sigmoid(confidence) >=
  // dspark_conf; with dspark_guard, drafting pauses for 64 tokens when fewer than 60% of the
  // drafts of the last 10 cycles were accepted. Output is exact either way; these change speed.
  std::string dspark_path;
  // --dspark-experts: the drafter's routed experts loaded or streamed from the support file
  // through a small store of their own (auto: the plan decides, PlanOptions::dspark_experts).
  DsparkExperts dspark_experts = DsparkExperts::Auto;
  uint32_t draft_max = 5;
  float dspark_conf = 0.7f;
  bool dspark_guard = true;
  // Test hook: sees each proposed block's drafts (the anchor's position and token, the drafts) and may
  // replace them (forced drafts: the acceptance rule keeps the output exact for any drafts).
  std::function<void(uint32_t anchor_pos, TokenId anchor, std::vector<TokenId>& drafts)> draft_hook;
  // --draft-audit (a test mode for comparing drafters from outside): no speculation; after every
  // committed position c the drafter proposes the block whose anchor is the sequence's own token
  // at c + 1 (a prompt token, or the one decoding chose) and reports it to the request's
  // EvalObserver::on_draft. Decoding is plain decoding, so the blocks are those an independent
  // drafter fed the same target states proposes at each position.
  bool draft_audit = false;
  // Where the session's log lines go (one line, no newline; a damaged state file, for one).
  // Empty: stderr.
  std::function<void(const std::string&)> log;
  // Load progress: stage name and done/total bytes (total 0: unknown). May be empty.
  std::function<void(const std::string& stage, uint64_t done, uint64_t total)> progress;
};

struct TokenTrace;
struct DraftBlock;

// Sees every eval() of a generate(): the position of its first token, the tokens, their logits
// (tokens.size() x vocab) and, when want_trace, their routing traces. With speculation only the
// kept rows of a verify pass are shown, so a request sees the same rows as plain decoding.
// on_draft (--dspark): each block the drafter proposed for the request, with how many of its
// drafts the confidence gate sent to the verify pass and how many were accepted (0 and 0: not
// verified: a gate that kept fewer than two, or --draft-audit).
struct EvalObserver {
  bool want_trace = false;
  std::function<void(uint32_t first_pos, std::span<const TokenId> tokens, const float* logits,
                     const std::vector<TokenTrace>* trace)> on_eval;
  std::function<void(const DraftBlock& block, uint32_t verified, uint32_t accepted)> on_draft;
};

struct GenerateRequest {
  std::vector<TokenId> prompt;   // must not be empty
  uint32_t max_tokens = 256;     // generated tokens at most (0: only prefill)
  SamplerOptions sampling;
  bool ignore_eos = false;
  std::vector<TokenId> stop_tokens;  // besides eos: generation ends after one of these
  const EvalObserver* observer = nullptr;  // for dumps and traces; null: none
  // The text `prompt` encodes, when it came from tokenize_prompt(). After the request the
  // session remembers it with the generated tokens, so a later prompt text that extends it is
  // tokenized as exactly those tokens + the rest (see runtime/prompt_cache.h).
  std::string prompt_text;
  // Prompt positions (each in 1 .. prompt.size() - 1) where the prefill stops for a checkpoint
  // of the slot's sequence: where a later prompt sharing this one's start is likely to diverge
  // (the chat front ends put one after each user-turn marker, so a second conversation with the
  // same system prompt, or an edited last message, restarts there instead of from an interval
  // checkpoint far before it). Unordered and duplicates are fine; others are refused. At most
  // kMaxBoundaries are kept, kMinBoundaryGap tokens apart (runtime/request_boundaries.h).
  std::vector<uint32_t> checkpoint_at;
  // Whose states this request may reuse and leaves (serve: its API key's; 0: shared). A slot's
  // sequence and checkpoints, the prefix cache and the state directory serve a request only
  // states of its own scope, so one key can neither reuse nor detect another's prompts.
  uint64_t scope = 0;
};

// Why a generate() ended.
enum class Finish : uint8_t {
  None,       // not run (a result that was never filled in)
  Stop,       // eos or one of the request's stop tokens
  Length,     // max_tokens generated
  Context,    // the context is full
  Cancelled,  // the caller's on_prefill / on_token asked to stop
};
// "none", "stop", "length", "context", "cancelled" (logs, the CLI summary).
const char* finish_name(Finish f);

struct GenerateResult {
  std::vector<TokenId> tokens;   // generated, including a final eos/stop token
  Finish finish = Finish::None;
  uint32_t prompt_tokens = 0;
  // Prompt tokens not evaluated again: the kept sequence's when the prompt extends it, else the
  // position of the checkpoint rolled back to (0: evaluated from the start).
  uint32_t reused_tokens = 0;
  uint32_t prompt_evaluated = 0; // prompt tokens in the sequence after prefill (< prompt_tokens if cancelled)
  uint32_t decode_steps = 0;     // generated tokens fed back and evaluated
  double prefill_s = 0, decode_s = 0;
  // Speculative decoding (--dspark): verify cycles, drafts verified in them, drafts accepted.
  uint32_t spec_cycles = 0, drafts_proposed = 0, drafts_accepted = 0;
};

// What one slot is doing (for /slots and /metrics).
struct SlotStats {
  enum class Phase : uint8_t { Idle, Prefill, Decode };
  Phase phase = Phase::Idle;
  uint32_t position = 0;          // tokens in the slot's sequence
  uint64_t request = 0;           // the running (or last) request's number on this session, from 1; 0: none yet
  uint32_t prompt_tokens = 0, prompt_done = 0, reused_tokens = 0;  // the running (or last) request's
  uint32_t generated = 0, max_tokens = 0;
};
const char* phase_name(SlotStats::Phase p);  // "idle", "prefill", "decode"

struct SessionStats {
  storage::StoreStats store;     // all zero with resident experts
  bool gpu = false;              // --backend vulkan: gpu_stats() below is the device's
  GpuStats gpu_stats;
  bool streaming = false;
  uint64_t budget_bytes = 0;     // admitted budget
  uint64_t planned_bytes = 0;    // what the plan accounts for
  uint64_t rss_bytes = 0;        // this process, now (from /proc)
  uint64_t requests = 0, prompt_tokens = 0, generated_tokens = 0;
  double prefill_s = 0, decode_s = 0;
  // Prefix checkpoints (see SessionOptions): held now, their bytes and the budget (all slots'); how many
  // were taken, dropped to stay in the budget, not taken because one alone exceeds it, and
  // how many requests rolled back to one.
  uint64_t checkpoints = 0, checkpoint_bytes = 0, checkpoint_budget = 0;
  uint64_t checkpoints_taken = 0, checkpoints_dropped = 0, checkpoints_skipped = 0, checkpoint_rollbacks = 0;
  // Engram rows: looked up (one per token, table and column), distinct per read batch, found in
  // the row cache, pread calls and bytes read; the cache's rows per table (0: no Engram).
  uint64_t engram_rows = 0, engram_unique = 0, engram_hits = 0, engram_reads = 0, engram_bytes = 0;
  uint64_t engram_cache_rows = 0;
  // The shared prefix cache (SessionOptions::cache_ram): entries and bytes held, its budget,
  // lookups, hits (restores) and the prompt tokens they saved, entries added and evicted.
  uint64_t prefix_entries = 0, prefix_bytes = 0, prefix_budget = 0;
  uint64_t prefix_lookups = 0, prefix_hits = 0, prefix_hit_tokens = 0, prefix_inserted = 0, prefix_evicted = 0;
  // States on disk (SessionOptions::kv_disk_dir; runtime/state_disk.h StateDiskStats): files and
  // bytes held, the budget; lookups, hits and their tokens; snapshots queued, written (and bytes),
  // skipped, evicted; this model's files rejected as damaged, others' left alone; write errors.
  bool state_disk = false;
  uint64_t disk_entries = 0, disk_bytes = 0, disk_budget = 0;
  uint64_t disk_lookups = 0, disk_hits = 0, disk_hit_tokens = 0;
  uint64_t disk_queued = 0, disk_written = 0, disk_written_bytes = 0, disk_skipped = 0, disk_evicted = 0;
  uint64_t disk_rejected = 0, disk_ignored = 0, disk_write_errors = 0;
  uint32_t slots = 1, busy_slots = 0;  // --parallel, and how many run a request now
  std::vector<SlotStats> slot;         // per slot
  // Speculative decoding (--dspark): whether a drafter is loaded; blocks proposed, verify cycles,
  // drafts verified and accepted, tokens emitted by cycles, guard pauses; seconds proposing and verifying.
  // dspark_store: the drafter's expert store when its experts stream (all zero when resident).
  bool dspark = false;
  storage::StoreStats dspark_store;
  uint64_t spec_blocks = 0, spec_cycles = 0, spec_drafts = 0, spec_accepted = 0, spec_tokens = 0, spec_pauses = 0;
  double spec_propose_s = 0, spec_verify_s = 0;
  // steps_by_sequences[k]: step() passes that evaluated k sequences together (index 0 unused).
  std::vector<uint64_t> steps_by_sequences;
};

// A model file's header opened once, with what is derived from it: the config and the
// tokenizer (built and checked against the vocabulary size). Front ends that need them before
// choosing the session's options (run sizes its context from the prompt's tokens, chat and
// serve check -c against the model) open the header once and give it to the Session, instead of
// each opening and deriving it again. Errors name the path.
struct ModelHeader {
  std::string path;
  gguf::File file;  // metadata and tensor records only; no payload is read
  const Architecture* arch = nullptr;  // from general.architecture (model/architecture.h)
  ModelConfig config;
  std::shared_ptr<const text::Tokenizer> tokenizer;
};
ModelHeader open_model_header(const std::string& path);

// The expert store's options the session's select (--cache-policy, --io-depth, --no-direct-io);
// its cache's size comes from the plan (store_options_for).
storage::StoreOptions session_store_options(const SessionOptions& o);
// The Vulkan backend's options the session's select (--device, --gpu-mem, --gpu-experts,
// --cpu-experts, --gpu-linears, --gpu-gemm, --gpu-int-dot, --gpu-indexer); the session caps the slots at the experts there are.
GpuOptions gpu_options(const SessionOptions& o);

class Session {
 public:
  // Plans (refusing with Error and the plan's breakdown when it does not fit), then loads.
  // h must be o.model_path's header; the first form opens it.
  explicit Session(SessionOptions o);
  Session(SessionOptions o, const ModelHeader& h);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const text::Tokenizer& tokenizer() const;
  const Architecture& architecture() const;  // the file's (its chat format, its engine)
  const ModelConfig& config() const;
  const Plan& plan() const;
  // What an expert server (runtime/expert_parallel.h) computes with: the loaded model, the
  // engine's backend and the routed experts (resident, or the store).
  const Model& model() const;
  const Backend& backend() const;
  const ExpertSource& experts() const;
  const SessionOptions& options() const;
  uint32_t ctx() const;
  std::string model_id() const;  // file name without directory and .gguf

  // Tokens for a rendered prompt (special tokens parsed outside its data ranges, never inside).
  // When the text extends a slot's remembered prompt + generation, those exact tokens are
  // reused (the slot whose record the text shares most), so that slot can keep its sequence.
  // Safe from any thread.
  std::vector<TokenId> tokenize_prompt(const text::PromptText& prompt, bool add_bos, uint64_t scope = 0) const;

  // Callbacks may be empty. on_prefill(done, total) is called after each prefill chunk (and once
  // at 0 before the first); returning false cancels. on_token(id) is called for each generated
  // token as soon as it is sampled; returning false cancels (finish "cancelled"; the token is
  // kept in the result). Throws Error for a bad request (empty prompt, id out of range, prompt
  // longer than the context) before touching the sequence; an Error while evaluating (I/O)
  // leaves the sequence as it was before the failing step. Throws Error when a slot is busy.
  GenerateResult generate(const GenerateRequest& r, const std::function<bool(uint32_t, uint32_t)>& on_prefill,
                          const std::function<bool(TokenId)>& on_token);
  // Forget the kept sequences of every free slot (the next prompt is evaluated from position 0).
  void reset();
  // Cache-aware routing from the next generate() on (EngineOptions::route_bias; 0: exact). Throws
  // Error for a bad value, or a non-zero one without streamed experts. Not during generate().
  void set_route_bias(float d);
  // --dspark, between requests: speculation on or off (the drafter stays loaded and its rings
  // keep being filled), and SessionOptions::draft_hook replaced (empty: none). bench compares
  // plain and speculative decoding on one loaded model with them. Throws Error without a drafter.
  void set_speculation(bool on);
  void set_draft_hook(std::function<void(uint32_t anchor_pos, TokenId anchor, std::vector<TokenId>& drafts)> hook);
  // Safe to call from any thread, also while generate() runs.
  SessionStats stats() const;
  // Returns once every state queued for --kv-disk-dir is written (or failed); at once without one.
  // Snapshots are written in the background, so stats() and the directory lag behind generate().
  void flush_state_disk();

  // Continuous batching (the server's --parallel): requests run on slots and advance together.
  // Each slot keeps its own sequence, prompt record and checkpoints (checkpoint_budget each, as
  // the plan charges it per sequence), so a conversation that comes back to its slot reuses it as
  // generate() reuses slot 0; generate() itself is start() on slot 0 and step() until done.
  // Every callback runs on the thread calling start() or step().
  struct SlotEvents {
    std::function<bool(uint32_t done, uint32_t total)> on_prefill;  // as generate()'s
    std::function<bool(TokenId)> on_token;                          // as generate()'s
    std::function<void(GenerateResult)> on_done;                    // the request ended (its finish set)
    // An evaluation failed: the request ended, its slot's sequence as before the failing step.
    std::function<void(const std::string& error)> on_failed;
  };
  // The free slot whose sequence shares the longest prefix with `prompt` (ties: the lowest);
  // -1 when every slot is busy.
  int pick_slot(std::span<const TokenId> prompt, uint64_t scope = 0) const;
  // Starts r on a free slot. Throws Error for a bad request (as generate()) or a busy slot,
  // before anything changes. May end the request at once (a cancel at the first on_prefill, a
  // prompt whose logits the slot holds and max_tokens reached): on_done runs before it returns.
  void start(uint32_t slot, GenerateRequest r, SlotEvents ev);
  bool slot_busy(uint32_t slot) const;
  uint32_t busy_slots() const;
  // Ends the slot's request as cancelled (on_done, finish "cancelled"); nothing when it is free.
  void cancel(uint32_t slot);
  // One pass over the busy slots: each decoding slot evaluates its last sampled token and samples
  // the next, and waiting prompts are prefilled, the oldest request first, with at most
  // prefill_tokens prompt tokens while any slot decodes (what bounds the stall a prefill causes
  // the streams) and up to the chunk when none does (0: the chunk). Throws the evaluation's
  // Error after ending the pass's requests with on_failed. Does nothing when no slot is busy.
  void step(uint32_t prefill_tokens);

  // Batched decode over the session's SessionOptions::parallel slots. eval_slots appends
  // tokens[k] to slot k (an empty span leaves slot k alone) in one pass: every weight and each
  // layer's expert union is read once for all of them, and each slot's logits are bit for bit
  // what evaluating it alone gives. logits (may be null) receives one row per token, slots in
  // order. Touching a slot forgets what was kept of it (its next prompt starts from the
  // start). Throws Error, every slot unchanged, as Engine::eval_batch does, when
  // tokens.size() != parallel and when a slot given tokens is busy.
  uint32_t parallel() const;
  void eval_slots(std::span<const std::span<const TokenId>> tokens, float* logits);
  uint32_t slot_position(uint32_t k) const;
  void reset_slot(uint32_t k);  // back to position 0 (slot 0: as reset())

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
