// `sluice run`: prefill a prompt of token ids, then generate token by token (greedy or sampled),
// optionally dumping every evaluated position's logits and routing trace.
#include "cli/cmd_run.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "backend/vulkan_backend.h"
#include "cli/budget_check.h"
#include "cli/cache_policy_option.h"
#include "cli/commands.h"
#include "cli/context_option.h"
#include "cli/stop_signals.h"
#include "cli/tensor_dump.h"
#include "fabric/placement.h"
#include "model/architecture.h"
#include "model/deepseek41/config.h"
#include "model/deepseek41/dspark_forward.h"
#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "runtime/meminfo.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "text/deepseek41/chat.h"
#include "text/prompt_limit.h"
#include "text/token_text.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/output_dir.h"
#include "util/output_file.h"
#include "util/read_file.h"

namespace sluice::cli {
namespace {

static_assert(std::endian::native == std::endian::little, "--dump-logits writes host floats as little-endian");

// "1,2,3" (spaces around items allowed). Ids are checked against the vocabulary later.
std::vector<uint64_t> parse_token_list(const std::string& s) {
  std::vector<uint64_t> ids;
  size_t i = 0;
  while (true) {
    const size_t comma = s.find(',', i);
    std::string item = s.substr(i, comma == std::string::npos ? std::string::npos : comma - i);
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size())
      throw UsageError("--tokens: '" + item + "' (item " + std::to_string(ids.size() + 1) +
                       ") is not a token id; expected comma-separated non-negative integers like 1,2,3");
    ids.push_back(v);
    if (comma == std::string::npos) break;
    i = comma + 1;
  }
  return ids;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// OUT: rows of vocab f32 values, no header; OUT.json describes them when the run ends.
// Both are AtomicOutputFiles (util/output_file.h): created beside OUT, renamed into place when
// the run ends well, so a failed or killed run leaves OUT and OUT.json as they were.
class LogitsDump {
 public:
  LogitsDump(const std::string& path, uint32_t vocab, uint32_t prompt, Existing existing)
      : rows_(path, existing), meta_(path + ".json", existing), vocab_(vocab), prompt_(prompt) {}

  void rows(std::span<const TokenId> tokens, const float* logits) {
    rows_.write(logits, tokens.size() * (size_t)vocab_ * sizeof(float));
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  }
  void finish() {
    nlohmann::json j;
    j["rows"] = tokens_.size();
    j["vocab"] = vocab_;
    j["prompt_tokens"] = std::min<size_t>(prompt_, tokens_.size());
    j["tokens"] = tokens_;
    meta_.write(j.dump() + "\n");
    rows_.commit();
    meta_.commit();
  }

 private:
  AtomicOutputFile rows_, meta_;
  uint32_t vocab_, prompt_;
  std::vector<TokenId> tokens_;
};

// --dump-draft-logits OUT: per drafter block, its block_size rows of vocab f32 logits (row j:
// the logits of draft j, Markov bias included), no header; OUT.json describes the blocks when
// the run ends. Atomic like LogitsDump.
class DraftLogitsDump {
 public:
  DraftLogitsDump(const std::string& path, uint32_t vocab, Existing existing)
      : rows_(path, existing), meta_(path + ".json", existing), vocab_(vocab) {}

  void block(const DraftBlock& b, uint32_t verified, uint32_t accepted) {
    const size_t rows = b.drafts.size();
    if (b.logits.size() != rows * vocab_) throw Error("internal: a draft block's logits are not its rows x vocab");
    if (block_ == 0) block_ = (uint32_t)rows;
    rows_.write(b.logits.data(), b.logits.size() * sizeof(float));
    index_.push_back({{"c", b.c}, {"anchor", b.anchor}, {"drafts", b.drafts}, {"row", rows_written_},
                      {"verified", verified}, {"accepted", accepted}});
    rows_written_ += rows;
  }
  void finish() {
    nlohmann::json j;
    j["vocab"] = vocab_;
    j["block"] = block_;
    j["rows"] = rows_written_;
    j["blocks"] = index_;
    meta_.write(j.dump() + "\n");
    rows_.commit();
    meta_.commit();
  }

 private:
  AtomicOutputFile rows_, meta_;
  uint32_t vocab_, block_ = 0;
  uint64_t rows_written_ = 0;
  nlohmann::json index_ = nlohmann::json::array();
};

// --trace DIR (util/output_dir.h): DIR/trace.jsonl (and with --dspark DIR/drafts.jsonl) are
// AtomicOutputFiles, renamed into place when the run ends well; a failed run removes its
// temporary files and the directory too if this run created it.
class TraceFile {
 public:
  TraceFile(const std::string& dir, Existing existing, bool drafts)
      : dir_(dir, existing, "--trace directory", drafts ? "trace.jsonl and drafts.jsonl" : "trace.jsonl"),
        file_(dir_.file("trace.jsonl"), existing) {
    if (drafts) drafts_.emplace(dir_.file("drafts.jsonl"), existing);
  }
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;

  void positions(uint32_t first_pos, std::span<const TokenId> tokens, const std::vector<TokenTrace>& tr) {
    if (tr.size() != tokens.size())
      throw Error("internal: " + std::to_string(tr.size()) + " traces for " + std::to_string(tokens.size()) + " tokens");
    std::string lines;
    for (size_t i = 0; i < tr.size(); ++i) {
      nlohmann::json j;
      j["pos"] = first_pos + i;
      j["token"] = tokens[i];
      j["engram_rows"] = tr[i].engram_rows;
      j["experts"] = tr[i].experts;
      j["expert_weights"] = tr[i].expert_weights;
      j["selected_rows"] = tr[i].selected_rows;
      lines += j.dump() + "\n";
    }
    file_.write(lines);
  }
  // One drafter block: its committed position, anchor, drafts, raw confidence logits, each
  // stage's routed experts per row, and what the verify pass made of it.
  void block(const DraftBlock& b, uint32_t verified, uint32_t accepted) {
    nlohmann::json j;
    j["c"] = b.c;
    j["anchor"] = b.anchor;
    j["drafts"] = b.drafts;
    j["confidence"] = b.confidence;
    j["experts"] = b.experts;
    j["verified"] = verified;
    j["accepted"] = accepted;
    drafts_->write(j.dump() + "\n");
  }
  void finish() {
    file_.commit();
    if (drafts_) drafts_->commit();
    dir_.keep();
  }

 private:
  OutputDir dir_;  // first: destroyed after the files, so an unused DIR it created is empty again
  AtomicOutputFile file_;
  std::optional<AtomicOutputFile> drafts_;
};

// Generated ids go to stdout as they come (one line, space-separated), so a reader sees progress
// and an interrupted run still ends its line.
class IdPrinter {
 public:
  ~IdPrinter() {
    if (count_ > 0) end();  // a failed run ends the partial line; one that printed nothing stays silent
  }
  void id(TokenId t) {
    std::printf(count_++ ? " %u" : "%u", t);
    std::fflush(stdout);
  }
  void end() {
    if (ended_) return;
    ended_ = true;
    std::printf("\n");
    std::fflush(stdout);
  }

 private:
  size_t count_ = 0;
  bool ended_ = false;
};

std::string rate(double count, double secs) {
  if (count <= 0 || secs <= 0) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f tok/s", count / secs);
  return buf;
}

}  // namespace

void parse_gpu_memory_options(const std::string& gpu_mem, const std::string& gpu_experts, SessionOptions& so) {
  if (gpu_mem != "auto") {
    try {
      so.gpu_mem = parse_bytes(gpu_mem, "--gpu-mem");
    } catch (const Error& err) {
      throw UsageError(err.what());
    }
    if (so.gpu_mem == 0) throw UsageError("--gpu-mem must be at least 1 byte (or auto)");
  }
  so.gpu_experts_auto = gpu_experts.empty() || gpu_experts == "auto";
  if (gpu_experts == "in-place") {
    so.gpu_experts_in_place = true;
  } else if (!so.gpu_experts_auto) {
    const char* end = gpu_experts.data() + gpu_experts.size();
    const auto [at, ec] = std::from_chars(gpu_experts.data(), end, so.gpu_experts);
    if (ec != std::errc() || at != end)
      throw UsageError("--gpu-experts must be a slot count, in-place or auto (got '" + gpu_experts + "')");
  }
}

void parse_gpu_kv(const std::string& gpu_kv, SessionOptions& so) {
  so.gpu_kv_auto = gpu_kv == "auto";
  so.gpu_kv = 0;
  if (so.gpu_kv_auto || gpu_kv == "off") return;
  try {
    so.gpu_kv = parse_bytes(gpu_kv, "--gpu-kv");
  } catch (const Error& err) {
    throw UsageError(std::string(err.what()) + " (or auto, or off)");
  }
}

void add_engine_options(CLI::App* sub, EngineCliOptions& o) {
  sub->add_option("--chunk", o.chunk, "prompt tokens processed together; default: the largest the budget admits, up to 256")
      ->each([&o](const std::string&) { o.chunk_given = true; });
  sub->add_option("-t,--threads", o.threads, "worker threads; 0 = all cores (default 0)");
  sub->add_option("--mem-budget", o.mem_budget, "memory budget: BYTES (e.g. 100GiB) or auto (default auto)");
  sub->add_flag("--allow-swap", o.allow_swap, "start even when swap is active");
  sub->add_flag(kBudgetOverrideFlag, o.mem_budget_override,
                "accept a --mem-budget above this machine's MemTotal + SwapTotal (refused otherwise)");
  add_cache_policy_option(sub, o.cache_policy);
  sub->add_option("--io-depth", o.io_depth, "expert reads in flight (default 16)");
  sub->add_flag("--no-prefetch", o.no_prefetch, "do not read predicted experts ahead (from disk, or into device slots)");
  sub->add_flag("--no-direct-io", o.no_direct_io, "buffered expert reads (drops the pages after reading)");
  sub->add_flag("--resident-experts", o.resident_experts,
                "read every routed expert into memory at load instead of streaming them (small models)");
  sub->add_option("--cache-experts", o.cache_experts,
                  "hold at most N routed experts in the expert cache (default 0: as many as the budget leaves room for)");
  sub->add_option("--backend", o.backend,
                  "where the forward pass runs: cpu (default) or vulkan (linear layers on the GPU, with "
                  "--gpu-experts the routed experts too, the rest on the CPU; `sluice devices` lists the devices)")
      ->check(CLI::IsMember({"cpu", "vulkan"}));
  sub->add_option("--device", o.device, "with --backend vulkan: the device index from `sluice devices` (default 0)");
  sub->add_option("--gpu-mem", o.gpu_mem,
                  "with --backend vulkan: bytes of device memory the engine uses at most: on a card with memory of "
                  "its own the deferred batch's rows first (16 MiB; a budget without room for them is refused), then "
                  "the weights (the rest run on the CPU), then routed-expert slots; the plan's device lines show it; auto: "
                  "half of what the device-local heap has free on an integrated GPU, 80% on a discrete card (free: "
                  "by VK_EXT_memory_budget where the driver has it, else the heap's size); more than that is refused "
                  "(default auto)");
  sub->add_option("--gpu-experts", o.gpu_experts,
                  "with --backend vulkan: routed-expert slots on the device (each one expert's gate, up and down, "
                  "out of --gpu-mem after the dense weights); the routed FFN then runs on the device, an expert "
                  "read from the host store only when it has no slot; in-place: on a device that shares the host's "
                  "memory (an integrated GPU), no slots and no copies, the device reads each expert where the host "
                  "store holds it; 0: routed experts on the CPU; auto: slots on a discrete card, in place on an "
                  "integrated GPU that imports host memory, else 0 (default auto)");
  sub->add_option("--cpu-experts", o.cpu_experts,
                  "with --gpu-experts: the share (0 to 1) of each layer's slot misses the CPU computes from host "
                  "memory while the device runs the rest, instead of uploading them; auto: the share that a cost "
                  "model of measured upload, device and CPU times says finishes first (same results either way; "
                  "default 0)");
  sub->add_option("--gpu-linears", o.gpu_linears,
                  "with --backend vulkan: how the quantized linears spread their work: plain (an invocation per "
                  "output), subgroup (a subgroup per output, and per tile of 4 tokens) or auto (subgroup on a GPU "
                  "that can, plain on a CPU device; `sluice devices` says which); the same results (default auto)")
      ->check(CLI::IsMember({"auto", "plain", "subgroup"}));
  sub->add_option("--gpu-gemm", o.gpu_gemm,
                  "with --backend vulkan: calls of 16 tokens or more (prefill) run the quantized linears as a GEMM "
                  "(64 rows and 16 tokens per workgroup, blocks staged in workgroup memory) where the device's "
                  "workgroup memory holds the tile; off: the --gpu-linears build; the same results (default on)")
      ->check(CLI::IsMember({"on", "off"}));
  sub->add_option("--gpu-int-dot", o.gpu_int_dot,
                  "with --backend vulkan: the quantized linears dot four codes at a time with the device's "
                  "integer dot product: on, off, or auto (where the driver says it is accelerated; `sluice devices` "
                  "says); the same results (default auto)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  sub->add_option("--gpu-indexer", o.gpu_indexer,
                  "with --backend vulkan: where the indexer scores the keys: device (index_scores.comp; the top-k "
                  "stays the CPU's), cpu, or auto: the device on a GPU when a call scores enough (long contexts, "
                  "prefill chunks) to pay for the round trip it adds; the same results (default auto)")
      ->check(CLI::IsMember({"auto", "device", "cpu"}));
  sub->add_option("--gpu-kv", o.gpu_kv,
                  "with --backend vulkan: bytes of device memory (out of --gpu-mem, as sequence state) for the "
                  "attention rows the device keeps between steps (window rows, and compressed rows as they are "
                  "cached), so a step copies only the rows it has not read before; the host keeps a copy of each "
                  "row's bytes (as "
                  "many bytes of host memory) and a row is read from the device only while they are unchanged; the "
                  "same results; off: every step stages the rows it reads; auto: 64 MiB (an eighth of --gpu-mem where "
                  "that is less) on a card with memory of its own, off on an integrated GPU or a CPU device (default auto)");
  sub->add_option("--route-bias", o.route_bias,
                  "LOSSY, off by default: add D to the routing score of experts already in the cache, so near-ties "
                  "cost no read (mixing weights stay exact; `sluice bench --route-bias D` measures what it buys and "
                  "costs)");
  sub->add_option("--checkpoint-every", o.checkpoint_every,
                  "prefix checkpoints of the kept sequence every N tokens, for prompts that share only a prefix "
                  "with it; 0 = only at the end of each prompt (default 1024)");
  sub->add_option("--checkpoint-budget", o.checkpoint_budget,
                  "memory for prefix checkpoints: BYTES (e.g. 64MiB); 0 = none (default " +
                      format_bytes(kDefaultCheckpointBudget) + ")");
  sub->add_option("--dspark,--model-draft", o.dspark,
                  "DSpark support GGUF (the model's own drafter, `make-model --dspark-out`): exact speculative "
                  "decoding while one request runs; output is token for token (greedy) or in distribution (sampling) "
                  "what plain decoding gives");
  sub->add_flag("--no-dspark", o.no_dspark, "do not draft even when --dspark is given");
  sub->add_option("--dspark-experts", o.dspark_experts,
                  "the drafter's routed experts: resident (loaded), stream (read from the support file through a "
                  "small cache of their own, in the same budget) or auto: resident when the plan has room (default)")
      ->check(CLI::IsMember({"auto", "resident", "stream"}));
  sub->add_option("--draft-max", o.draft_max, "drafts verified per cycle at most, 2 .. the drafter's block of 5 (default 5)");
  sub->add_option("--dspark-conf", o.dspark_conf,
                  "keep drafts while sigmoid(confidence) >= T, in [0, 1]; 0 = every draft (default 0.7)");
  sub->add_flag("--no-dspark-guard", o.no_dspark_guard,
                "draft on even when fewer than 60% of the last 10 cycles' drafts were accepted (default: pause 64 tokens)");
  sub->add_flag("--print-plan", o.print_plan, "print the memory plan's breakdown on stderr (default: when it is a terminal)");
  sub->add_option("--watchdog", o.watchdog,
                  "SOFT:HARD byte sizes: run under a memory watchdog (SIGTERM at SOFT, kill at HARD)");
}

SessionOptions session_options(const EngineCliOptions& e, const std::string& model, uint32_t ctx) {
  if (e.chunk_given && e.chunk == 0) throw UsageError("--chunk must be at least 1");
  if (e.threads < 0) throw UsageError("-t must be >= 0 (got " + std::to_string(e.threads) + "; 0 = all cores)");
  if (e.io_depth == 0 || e.io_depth > 1024) throw UsageError("--io-depth must be in 1..1024");
  SessionOptions so;
  so.model_path = model;
  so.ctx = ctx;
  so.chunk = e.chunk_given ? e.chunk : 0;
  so.threads = e.threads;
  try {
    so.budget = parse_budget(e.mem_budget);
  } catch (const Error& err) {
    throw UsageError(err.what());
  }
  check_budget_on_host(so.budget, /*refuse_beyond_machine=*/true, e.mem_budget_override);
  so.checkpoint_interval = e.checkpoint_every;
  try {
    if (!e.checkpoint_budget.empty()) so.checkpoint_budget = parse_bytes(e.checkpoint_budget, "--checkpoint-budget");
  } catch (const Error& err) {
    throw UsageError(err.what());
  }
  so.allow_swap = e.allow_swap;
  so.stream_experts = !e.resident_experts;
  so.policy = cache_policy_kind(e.cache_policy);
  so.io_depth = e.io_depth;
  so.prefetch = !e.no_prefetch;
  so.direct_io = !e.no_direct_io;
  if (!(e.route_bias >= 0.0f && e.route_bias <= 1e6f)) throw UsageError("--route-bias must be in [0, 1e6]");
  if (e.route_bias != 0.0f && e.resident_experts)
    throw UsageError("--route-bias needs streamed experts (with --resident-experts every expert is cached)");
  so.route_bias = e.route_bias;
  so.max_cache_experts = e.cache_experts;
  so.backend = e.backend;
  so.gpu_device = e.device;
  parse_gpu_memory_options(e.gpu_mem, e.gpu_experts, so);
  const bool gpu_experts = so.gpu_experts != 0 || so.gpu_experts_in_place;
  if ((e.gpu_mem != "auto" || e.device != 0 || gpu_experts || e.gpu_linears != "auto" || e.gpu_gemm != "on" ||
       e.gpu_int_dot != "auto" || e.gpu_indexer != "auto" || e.gpu_kv != "auto") &&
      e.backend != "vulkan")
    throw UsageError("--device, --gpu-mem, --gpu-experts, --gpu-linears, --gpu-gemm, --gpu-int-dot, --gpu-indexer and "
                     "--gpu-kv need --backend vulkan");
  parse_gpu_kv(e.gpu_kv, so);
  so.gpu_gemm = e.gpu_gemm == "on";
  so.gpu_int_dot = e.gpu_int_dot == "on" ? GpuIntDot::On : e.gpu_int_dot == "off" ? GpuIntDot::Off : GpuIntDot::Auto;
  so.gpu_indexer = e.gpu_indexer == "device" ? GpuIndexer::Device : e.gpu_indexer == "cpu" ? GpuIndexer::Cpu : GpuIndexer::Auto;
  so.gpu_linears = e.gpu_linears == "plain"      ? GpuLinears::Plain
                   : e.gpu_linears == "subgroup" ? GpuLinears::Subgroup
                                                 : GpuLinears::Auto;
  if (!e.cpu_experts.empty()) {
    if (so.gpu_experts_in_place)
      throw UsageError("--cpu-experts shares out slot misses, and --gpu-experts in-place copies no expert");
    if (so.gpu_experts == 0)
      throw UsageError("--cpu-experts needs --gpu-experts N (without slots every routed expert runs on the CPU)");
    if (e.cpu_experts == "auto") {
      so.cpu_experts_auto = true;
    } else {
      char* end = nullptr;
      so.cpu_experts = std::strtod(e.cpu_experts.c_str(), &end);
      if (end == e.cpu_experts.c_str() || *end != '\0' || !(so.cpu_experts >= 0.0 && so.cpu_experts <= 1.0))
        throw UsageError("--cpu-experts must be a share from 0 to 1, or auto (got '" + e.cpu_experts + "')");
    }
  }
  if (!e.no_dspark) so.dspark_path = e.dspark;
  if (!(e.dspark_conf >= 0.0f && e.dspark_conf <= 1.0f)) throw UsageError("--dspark-conf must be in [0, 1]");
  if (e.draft_max < 2 || e.draft_max > 16) throw UsageError("--draft-max must be in 2..16 (the drafter's block bounds it further)");
  so.draft_max = e.draft_max;
  so.dspark_experts = parse_dspark_experts(e.dspark_experts);
  so.dspark_conf = e.dspark_conf;
  so.dspark_guard = !e.no_dspark_guard;
  if (isatty(2)) {
    so.progress = [last = std::chrono::steady_clock::time_point{}](const std::string& stage, uint64_t done,
                                                                     uint64_t total) mutable {
      const auto now = std::chrono::steady_clock::now();
      if (done != total && now - last < std::chrono::milliseconds(100)) return;
      last = now;
      std::fprintf(stderr, "\r%s: %s / %s%s", stage.c_str(), format_bytes(done).c_str(), format_bytes(total).c_str(),
                   done == total ? "\n" : "");
    };
  }
  return so;
}

SamplerOptions sampler_options(float temp, float top_p, uint64_t seed, int64_t top_k, float min_p) {
  SamplingRequest r;
  r.temperature = temp;
  r.top_p = top_p;
  r.top_k = top_k;
  r.min_p = min_p;
  try {
    check_sampling(r);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  return SamplerOptions{temp, top_p, seed, (uint32_t)top_k, min_p};
}

void add_topk_minp_options(CLI::App* sub, int64_t& top_k, float& min_p) {
  sub->add_option("--top-k", top_k, "keep at most the K most likely tokens; 0 = off (default 0)");
  sub->add_option("--min-p", min_p, "drop tokens less likely than P times the most likely one, in [0, 1] (default 0)");
}

void maybe_print_plan(const EngineCliOptions& e, const Session& s) {
  if (e.print_plan || isatty(2)) std::fputs(format_plan(s.plan()).c_str(), stderr);
}

std::string session_summary(const Session& s, uint64_t tokens_evaluated) {
  const SessionStats st = s.stats();
  const ProcMemory pm = read_self_status();
  char buf[512];
  std::string out;
  if (!st.streaming) {
    std::snprintf(buf, sizeof buf, "experts resident | peak RSS %s of budget %s", format_bytes(pm.hwm).c_str(),
                  format_bytes(st.budget_bytes).c_str());
    out = buf;
  } else {
    const storage::LayerStats t = st.store.total();
    const double hit = t.requests ? 100.0 * (double)t.hits / (double)t.requests : 0.0;
    const uint64_t bytes = t.bytes_demand + t.bytes_prefetch;
    std::snprintf(buf, sizeof buf,
                  "expert cache %u slots, hit rate %.1f%% (%llu/%llu), read %s (%s/token, prefetch %s), stall %.3f s | "
                  "peak RSS %s of budget %s",
                  st.store.slots, hit, (unsigned long long)t.hits, (unsigned long long)t.requests,
                  format_bytes(bytes).c_str(), format_bytes(tokens_evaluated ? bytes / tokens_evaluated : 0).c_str(),
                  format_bytes(t.bytes_prefetch).c_str(), (double)t.stall_ns / 1e9, format_bytes(pm.hwm).c_str(),
                  format_bytes(st.budget_bytes).c_str());
    out = buf;
  }
  if (st.engram_unique) {
    std::snprintf(buf, sizeof buf, " | Engram rows %.1f%% from cache (%llu of %llu distinct), read %s",
                  100.0 * (double)st.engram_hits / (double)st.engram_unique, (unsigned long long)st.engram_hits,
                  (unsigned long long)st.engram_unique, format_bytes(st.engram_bytes).c_str());
    out += buf;
  }
  if (st.gpu) {
    const GpuStats& g = st.gpu_stats;
    const std::string imported =
        g.weights_imported ? ", " + std::to_string(g.weights_imported) + " of them used in place (" +
                                 format_bytes(g.bytes_imported) + " imported, no copy)"
                           : std::string();
    std::snprintf(buf, sizeof buf,
                  " | %s: %llu weights on the device (%s of %s%s), %llu on the CPU; linear %llu on the device, %llu on "
                  "the CPU (%llu inputs quantized on the device; quantized linears %s); %llu submissions (host-device "
                  "round trips)",
                  std::string(s.backend().name()).c_str(), (unsigned long long)g.weights_on_device,
                  format_bytes(g.bytes_on_device + g.bytes_imported).c_str(), format_bytes(g.device_budget).c_str(),
                  imported.c_str(), (unsigned long long)g.weights_on_host, (unsigned long long)g.linear_on_device,
                  (unsigned long long)g.linear_on_host, (unsigned long long)g.inputs_quantized_on_device,
                  gpu_linears_text(g).c_str(),
                  (unsigned long long)g.submissions);
    out += buf;
    if (g.index_on_device) out += "; indexer scored on the device " + std::to_string(g.index_on_device) + " times";
    if (g.attention_on_host) out += "; attention on the CPU " + std::to_string(g.attention_on_host) + " times";
    if (g.scratch_on_device)
      out += "; the batch's rows in device memory (" + format_bytes(g.scratch_bytes) + "), " +
             format_bytes(g.bytes_read_back) + " of them read back";
    if (g.kv_bytes) {
      const uint64_t rows = g.kv_hits + g.kv_misses + g.kv_staged;
      std::snprintf(buf, sizeof buf,
                    "; attention rows kept on the device: %llu slots (%s), %.1f%% read from a slot (%llu/%llu), %s "
                    "copied in, %llu staged with their batch",
                    (unsigned long long)g.kv_slots, format_bytes(g.kv_bytes).c_str(),
                    rows ? 100.0 * (double)g.kv_hits / (double)rows : 0.0, (unsigned long long)g.kv_hits,
                    (unsigned long long)rows, format_bytes(g.kv_upload_bytes).c_str(), (unsigned long long)g.kv_staged);
      out += buf;
    }
    // The expert tiers: device slots, then the host store (the expert cache figures above).
    const uint64_t looks = g.expert_hits + g.expert_misses + g.expert_on_cpu;
    if (g.expert_slots) {
      std::snprintf(buf, sizeof buf,
                    "; routed experts on the device: %llu slots of %s, hit rate %.1f%% (%llu/%llu), %s copied in",
                    (unsigned long long)g.expert_slots, format_bytes(g.expert_slot_bytes).c_str(),
                    looks ? 100.0 * (double)g.expert_hits / (double)looks : 0.0, (unsigned long long)g.expert_hits,
                    (unsigned long long)looks, format_bytes(g.expert_upload_bytes).c_str());
      out += buf;
      if (g.expert_uploads_ahead)
        out += " (" + std::to_string(g.expert_uploads_ahead) + " experts while the device ran the group before)";
      if (g.expert_uploads_hinted)
        out += " (" + std::to_string(g.expert_uploads_hinted) + " experts by hint-started copies " +
               (g.transfer_queue ? "on a transfer queue" : "on the compute queue") + ", " +
               std::to_string(g.expert_hints_used) + " of them used; " + std::to_string(g.expert_hints_dropped) +
               " hints dropped)";
      if (g.expert_on_cpu) {
        std::snprintf(buf, sizeof buf,
                      "; %llu misses computed on the CPU from host memory (--cpu-experts; per expert: upload %.2f ms, "
                      "device %.2f ms, CPU %.2f ms)",
                      (unsigned long long)g.expert_on_cpu, 1e3 * g.split_upload_s, 1e3 * g.split_device_s,
                      1e3 * g.split_cpu_s);
        out += buf;
      }
      if (g.expert_calls_on_host) out += "; " + std::to_string(g.expert_calls_on_host) + " routed calls on the CPU (experts larger than a slot)";
    } else if (g.experts_in_place) {
      std::snprintf(buf, sizeof buf,
                    "; routed experts on the device in place: %llu runs from the host store's memory (%llu chunks, %s "
                    "mapped, no copies)",
                    (unsigned long long)g.expert_in_place, (unsigned long long)g.expert_chunks_mapped,
                    format_bytes(g.expert_bytes_mapped).c_str());
      out += buf;
      if (g.expert_in_place_refused)
        out += ", " + std::to_string(g.expert_in_place_refused) + " on the CPU (memory the device could not map)";
      if (g.expert_calls_on_host) out += "; " + std::to_string(g.expert_calls_on_host) + " routed calls on the CPU (no shader for a type, or imports released)";
    } else {
      out += g.expert_slots_refused ? "; routed experts on the CPU (--gpu-experts: the device budget left no room for a slot)"
                                    : "; routed experts on the CPU";
    }
    if (!g.experts_auto.empty()) out += " (--gpu-experts " + g.experts_auto + ")";
  }
  if (st.dspark) {
    std::snprintf(buf, sizeof buf,
                  " | DSpark: %llu blocks, %llu verify cycles, %llu/%llu drafts accepted (%.1f%%), %.2f tokens per cycle, "
                  "%llu guard pauses; propose %.3f s, verify %.3f s",
                  (unsigned long long)st.spec_blocks, (unsigned long long)st.spec_cycles,
                  (unsigned long long)st.spec_accepted, (unsigned long long)st.spec_drafts,
                  st.spec_drafts ? 100.0 * (double)st.spec_accepted / (double)st.spec_drafts : 0.0,
                  st.spec_cycles ? (double)st.spec_tokens / (double)st.spec_cycles : 0.0,
                  (unsigned long long)st.spec_pauses, st.spec_propose_s, st.spec_verify_s);
    out += buf;
    if (st.dspark_store.slots) {
      const storage::LayerStats t = st.dspark_store.total();
      std::snprintf(buf, sizeof buf, "; drafter experts streamed: %u slots, hit rate %.1f%% (%llu/%llu), read %s, stall %.3f s",
                    st.dspark_store.slots, t.requests ? 100.0 * (double)t.hits / (double)t.requests : 0.0,
                    (unsigned long long)t.hits, (unsigned long long)t.requests,
                    format_bytes(t.bytes_demand + t.bytes_prefetch).c_str(), (double)t.stall_ns / 1e9);
      out += buf;
    }
  }
  if (s.options().route_bias != 0.0f)
    out += " | route bias " + std::to_string(s.options().route_bias) + " (lossy: routing favours cached experts)";
  return out;
}

// The device's slot tier per layer (--gpu-experts), above the host store's table.
std::string device_tier_table(const GpuStats& g) {
  std::string out = "device slots: " + std::to_string(g.expert_slots) + " of " + format_bytes(g.expert_slot_bytes) +
                    " (--gpu-experts)\n  layer slot hits   uploads    on CPU   MiB up  upload ms\n";
  for (size_t L = 0; L < g.expert_layers.size(); ++L) {
    const GpuLayerStats& l = g.expert_layers[L];
    if (l.hits + l.misses + l.on_cpu == 0) continue;
    char line[160];
    std::snprintf(line, sizeof line, "  %5zu %9llu %9llu %9llu %8.1f %10.1f\n", L, (unsigned long long)l.hits,
                  (unsigned long long)l.misses, (unsigned long long)l.on_cpu, (double)l.upload_bytes / (1 << 20),
                  (double)l.upload_ns / 1e6);
    out += line;
  }
  return out;
}

// The device's in-place runs per layer (--gpu-experts in-place), above the host store's table.
std::string in_place_table(const GpuStats& g) {
  std::string out = "device in place: " + std::to_string(g.expert_chunks_mapped) + " chunks of the host store's memory, " +
                    format_bytes(g.expert_bytes_mapped) + " mapped (--gpu-experts in-place)\n  layer  in place    on CPU\n";
  for (size_t L = 0; L < g.expert_layers.size(); ++L) {
    const GpuLayerStats& l = g.expert_layers[L];
    if (l.in_place + l.on_cpu == 0) continue;
    char line[96];
    std::snprintf(line, sizeof line, "  %5zu %9llu %9llu\n", L, (unsigned long long)l.in_place, (unsigned long long)l.on_cpu);
    out += line;
  }
  return out;
}

std::string expert_stats_table(const SessionStats& st) {
  const std::string tier = !st.gpu                           ? std::string()
                           : st.gpu_stats.expert_slots       ? device_tier_table(st.gpu_stats)
                           : st.gpu_stats.experts_in_place   ? in_place_table(st.gpu_stats)
                                                             : std::string();
  if (!st.streaming) return tier + "expert store: not used (--resident-experts)\n";
  std::string out = tier + st.store.summary();
  out += "  layer  requests      hits    misses   joined  prefetch     wasted   MiB read   stall ms  p99 us\n";
  for (size_t L = 0; L < st.store.layers.size(); ++L) {
    const storage::LayerStats& l = st.store.layers[L];
    char line[256];
    std::snprintf(line, sizeof line, "  %5zu %9llu %9llu %9llu %8llu %9llu %10llu %10.1f %10.1f %7.0f\n", L,
                  (unsigned long long)l.requests, (unsigned long long)l.hits, (unsigned long long)l.misses,
                  (unsigned long long)l.joined, (unsigned long long)l.prefetch_issued,
                  (unsigned long long)l.prefetch_wasted, (double)(l.bytes_demand + l.bytes_prefetch) / (1 << 20),
                  (double)l.stall_ns / 1e6, l.latency.quantile_us(0.99));
    out += line;
  }
  return out;
}

CLI::App* setup_run(CLI::App& app, RunOptions& o) {
  CLI::App* sub = app.add_subcommand("run", "Run the CPU forward pass on a prompt and generate");
  sub->footer(
      "Prompt: -p TEXT (or -f FILE) is tokenized with the model's tokenizer (BOS added) and the\n"
      "generated text is streamed to stdout; --chat wraps it as one user turn of DeepSeek's chat\n"
      "format. --tokens IDS gives token ids instead, and the generated ids are printed on one line,\n"
      "space-separated (an end-of-sequence token that stops generation is printed).\n"
      "A summary goes to stderr: prompt and generation tok/s, expert cache hit rate, bytes read,\n"
      "peak RSS against the admitted budget.\n"
      "Memory: the whole budget is planned before loading (see `sluice plan`); routed experts are\n"
      "streamed from the file through a cache sized to what is left. --watchdog SOFT:HARD restarts\n"
      "the command under `sluice watchdog`.\n"
      "Sampling: greedy by default (temperature 0, ties go to the lowest id). With --temp T > 0:\n"
      "softmax(logits / T), then top-p (tokens sorted by probability, ties by id; the smallest prefix\n"
      "whose mass reaches P is kept), drawn with a seeded mt19937_64. DeepSeek recommends --temp 1.0\n"
      "--top-p 0.95 for V4.1. Generation stops after -n tokens or at the model's eos_token_id.\n"
      "SIGTERM / SIGINT: the current token is finished, the summary printed, exit status 0.\n"
      "--dump-logits OUT: f32 little-endian logits, one row of vocab_size floats per evaluated\n"
      "position (prompt positions first, then each generated token that was fed back), no header.\n"
      "OUT.json: {\"rows\", \"vocab\", \"prompt_tokens\", \"tokens\"}; row i holds the logits after tokens[i].\n"
      "--trace DIR: DIR/trace.jsonl, one JSON object per evaluated position: {\"pos\", \"token\",\n"
      "\"engram_rows\": [Engram layer][column] table rows, \"experts\": [layer][k] routed expert ids\n"
      "(descending score), \"expert_weights\": [layer][k], \"selected_rows\": [layer][...] compressed rows\n"
      "chosen by the indexer (ascending; empty for layers that are not index sources)}.\n"
      "With --dspark, DIR/drafts.jsonl: one JSON object per drafter block: {\"c\" (the last committed\n"
      "position), \"anchor\" (the token at c + 1), \"drafts\" (for c + 2 ..), \"confidence\" (raw logits),\n"
      "\"experts\": [stage][row][k] routed expert ids, \"verified\", \"accepted\"}. Speculation keeps\n"
      "--dump-logits and trace.jsonl exactly as plain decoding writes them (only kept rows).\n"
      "--dump-draft-logits OUT (with --dspark): block x vocab f32 rows per drafter block, Markov bias\n"
      "included; OUT.json: {\"vocab\", \"block\", \"rows\", \"blocks\": [{\"c\", \"anchor\", \"drafts\",\n"
      "\"row\", \"verified\", \"accepted\"}]}. --draft-audit (with --dspark, a test mode): decode plainly\n"
      "and propose a block after every committed position, prompt included, with the sequence's own\n"
      "next token as the anchor, so an independent drafter can be compared block by block.\n"
      "--dump-tensors DIR: the forward pass's named intermediates (embd, l<L>.attn_in, l<L>.out,\n"
      "out_norm, logits, ...), one file DIR/<name>.f32 each: f32 little-endian rows of the tensor's\n"
      "width, one per evaluated position in order (prompt, then each token fed back); DIR/index.json\n"
      "lists name, file, width, first, count, dtype and the run. --dump-filter REGEX keeps the names\n"
      "a regex matches anywhere in (an ECMAScript subset searched in linear time, docs/numerics.md;\n"
      "anchor with ^...$).\n"
      "Output files appear only when the run ends well (written beside, then renamed); an existing\n"
      "OUT, OUT.json or non-empty DIR is refused unless --force; links and devices never are\n"
      "replaced (docs/files.md).\n"
      "Context (-c/--ctx-size): 0 or not given means prompt + n; at least 2 and at most the model's\n"
      "max_position_embeddings; state for it is allocated up front.");
  sub->add_option("-m,--model", o.model, "deepseek41 GGUF file")->required();
  auto* tokens = sub->add_option("--tokens", o.tokens, "prompt token ids, comma-separated, e.g. 0,15,27");
  auto* prompt = sub->add_option("-p,--prompt", o.prompt, "prompt text");
  auto* file = sub->add_option("-f,--file", o.prompt_file, "read the prompt text from this file");
  tokens->excludes(prompt)->excludes(file);
  prompt->excludes(file);
  sub->add_flag("--chat", o.chat, "render the -p/-f text as a user turn of the chat format");
  sub->add_option("--think", o.think, "with --chat: thinking on or off (default off)")
      ->check(CLI::IsMember({"on", "off"}));
  sub->add_option("-n,--n-predict", o.n_predict, "tokens to generate")->required();
  sub->add_option("--temp", o.temp, "temperature; 0 = greedy (default 0)");
  sub->add_option("--top-p", o.top_p, "nucleus mass in [0, 1] (default 1.0)");
  add_topk_minp_options(sub, o.top_k, o.min_p);
  sub->add_option("--seed", o.seed, "sampler seed (default 0)");
  add_ctx_option(sub, o.ctx, "prompt + n");
  sub->add_flag("--ignore-eos", o.ignore_eos, "keep generating after eos_token_id");
  sub->add_option("--dump-logits", o.dump_logits, "write every evaluated position's logits to this file");
  sub->add_option("--trace", o.trace_dir, "write per-position routing to DIR/trace.jsonl");
  sub->add_option("--routing-profile", o.routing_profile,
                  "write how often each routed expert was chosen over the run, per layer, to this file (for "
                  "--fabric mpi --placement local-first:FILE)");
  sub->add_option("--dump-tensors", o.dump_tensors,
                  "write the forward pass's named intermediates to DIR (one f32 file each + index.json)");
  sub->add_option("--dump-filter", o.dump_filter,
                  "with --dump-tensors: only names this regex matches (an ECMAScript subset, searched, not anchored)");
  sub->add_option("--dump-draft-logits", o.dump_draft_logits,
                  "with --dspark: write each drafter block's logit rows to this file (+ FILE.json)");
  sub->add_flag("--draft-audit", o.draft_audit,
                "with --dspark, a test mode: decode plainly and draft at every committed position (see --trace)");
  sub->add_flag("--force", o.force,
                "replace existing regular files at --dump-logits / DIR/trace.jsonl / the --dump-tensors files "
                "(never links or devices)");
  sub->add_flag("--expert-stats", o.expert_stats, "after the summary, print the expert store's statistics per layer");
  add_engine_options(sub, o.engine);
  add_fabric_options(sub, o.fabric);
  return sub;
}

namespace {

// Two outputs on one path would write over each other (a dump over another's data or index,
// or into a directory another one makes): refused before anything is opened.
void check_distinct_outputs(const RunOptions& o) {
  std::vector<std::pair<std::string, std::filesystem::path>> outs;
  auto add = [&](const char* flag, const std::string& path, bool with_index) {
    if (path.empty()) return;
    const std::filesystem::path p = std::filesystem::absolute(path).lexically_normal();
    outs.emplace_back(flag, p);
    if (with_index) outs.emplace_back(std::string(flag) + "'s index", p.string() + ".json");
  };
  add("--dump-logits", o.dump_logits, true);
  add("--dump-draft-logits", o.dump_draft_logits, true);
  add("--trace", o.trace_dir, false);
  add("--routing-profile", o.routing_profile, false);
  add("--dump-tensors", o.dump_tensors, false);
  for (size_t i = 0; i < outs.size(); ++i)
    for (size_t j = i + 1; j < outs.size(); ++j)
      if (outs[i].second == outs[j].second)
        throw UsageError(outs[i].first + " and " + outs[j].first + " are the same path (" + outs[i].second.string() + ")");
}

}  // namespace

int run_body(const RunOptions& o, const ModelHeader& header, const std::vector<uint64_t>& ids, uint64_t ctx,
             std::chrono::steady_clock::time_point t_load, FabricJob* job);

int run_run(const RunOptions& o) {
  using Clock = std::chrono::steady_clock;
  const StopSignals stop_signals;  // first: a signal during the (long) load still ends cleanly

  if (o.n_predict < 0) throw UsageError("-n must be >= 0 (got " + std::to_string(o.n_predict) + ")");
  if (o.tokens.empty() && o.prompt.empty() && o.prompt_file.empty())
    throw UsageError("give a prompt: -p TEXT, -f FILE or --tokens IDS");
  if (o.chat && !o.tokens.empty()) throw UsageError("--chat needs a text prompt (-p or -f), not --tokens");
  if (!o.dump_filter.empty() && o.dump_tensors.empty()) throw UsageError("--dump-filter needs --dump-tensors DIR");
  const bool drafter = !o.engine.dspark.empty() && !o.engine.no_dspark;
  if (!drafter && !o.dump_draft_logits.empty()) throw UsageError("--dump-draft-logits needs --dspark FILE");
  if (!drafter && o.draft_audit) throw UsageError("--draft-audit needs --dspark FILE");
  check_distinct_outputs(o);
  const bool text_mode = o.tokens.empty();
  sampler_options(o.temp, o.top_p, o.seed, o.top_k, o.min_p);  // bad values are usage errors before the load
  // Usage checks that do not need the model come before it is opened.
  session_options(o.engine, o.model, 0);

  const auto t_load = Clock::now();
  // Opened once: the prompt's tokens size the context, then the Session plans from the same header.
  const ModelHeader header = open_model_header(o.model);
  const ModelConfig& cfg = header.config;
  const text::Tokenizer* tok = header.tokenizer.get();
  std::vector<uint64_t> ids;
  if (text_mode) {
    std::string text = o.prompt;
    if (!o.prompt_file.empty()) {
      // Read no more than a prompt that fits the context could be (text/prompt_limit.h).
      const uint64_t window = o.ctx != 0 ? o.ctx : cfg.max_position_embeddings;
      const uint64_t positions = window > (uint64_t)o.n_predict ? window - (uint64_t)o.n_predict : 1;
      const uint64_t per = text::prompt_bytes_per_token(*tok);
      text = read_file_bounded(o.prompt_file, positions * per,
                               "what a prompt of " + std::to_string(positions) + " tokens can hold: " +
                                   (o.ctx != 0 ? "-c " : "max_position_embeddings ") + std::to_string(window) +
                                   " minus -n " + std::to_string(o.n_predict) + ", at most " + std::to_string(per) +
                                   " bytes per token; see docs/files.md");
    }
    std::vector<TokenId> enc;
    if (o.chat) {
      text::ChatOptions co;
      co.thinking = o.think == "on";
      co.reasoning_effort = co.thinking ? text::kEffortHigh : 0;
      enc = text::encode_chat_text(*tok, header.arch->render_chat({text::ChatMessage{"user", text, "", {}, ""}}, co));
    } else {
      enc = text::encode_prompt_text(*tok, text, text::SpecialTokens::AsText);
    }
    ids.assign(enc.begin(), enc.end());
    if (ids.empty()) throw UsageError("the prompt is empty");
  } else {
    ids = parse_token_list(o.tokens);
  }
  const uint64_t n_predict = (uint64_t)o.n_predict;
  const uint64_t prompt_n = ids.size();
  if (o.ctx != 0 && prompt_n + n_predict > o.ctx)
    throw UsageError("prompt (" + std::to_string(prompt_n) + " tokens) + -n " + std::to_string(n_predict) +
                     " exceeds the context " + kCtxFlag + " " + std::to_string(o.ctx));
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= cfg.vocab_size)
      throw UsageError("--tokens: id " + std::to_string(ids[i]) + " (item " + std::to_string(i + 1) +
                       ") is not below the model's vocabulary size " + std::to_string(cfg.vocab_size));
  const uint64_t max_pos = cfg.max_position_embeddings;
  check_ctx(o.ctx, max_pos);
  if (prompt_n + n_predict > max_pos)
    throw UsageError("prompt (" + std::to_string(prompt_n) + " tokens) + -n " + std::to_string(n_predict) +
                     " exceeds the model's max_position_embeddings " + std::to_string(max_pos));
  const uint64_t ctx = o.ctx != 0 ? o.ctx : std::max<uint64_t>(1, prompt_n + n_predict);

  // Every rank of a --fabric job runs this command; the others serve experts and write nothing.
  std::unique_ptr<FabricJob> job = FabricJob::open(o.fabric, header);
  if (job && !job->coordinator()) return job->serve(session_options(o.engine, o.model, (uint32_t)ctx), header);
  try {
    return run_body(o, header, ids, ctx, t_load, job.get());
  } catch (const std::exception& e) {
    if (job) job->fail(e.what());  // every rank ends with it, this error named once
    throw;
  }
}

int run_body(const RunOptions& o, const ModelHeader& header, const std::vector<uint64_t>& ids, uint64_t ctx,
             std::chrono::steady_clock::time_point t_load, FabricJob* job) {
  const ModelConfig& cfg = header.config;
  const text::Tokenizer* tok = header.tokenizer.get();
  const bool drafter = !o.engine.dspark.empty() && !o.engine.no_dspark;
  const bool text_mode = o.tokens.empty();
  const SamplerOptions so = sampler_options(o.temp, o.top_p, o.seed, o.top_k, o.min_p);
  const uint64_t n_predict = (uint64_t)o.n_predict;
  const uint64_t prompt_n = ids.size();

  // Output files before the (long) load, so a path they may not use is refused at once.
  const Existing existing = o.force ? Existing::Replace : Existing::Refuse;
  std::unique_ptr<LogitsDump> dump;
  if (!o.dump_logits.empty()) dump = std::make_unique<LogitsDump>(o.dump_logits, cfg.vocab_size, (uint32_t)prompt_n, existing);
  std::unique_ptr<TraceFile> trace;
  if (!o.trace_dir.empty()) trace = std::make_unique<TraceFile>(o.trace_dir, existing, drafter);
  std::unique_ptr<DraftLogitsDump> draft_dump;
  if (!o.dump_draft_logits.empty())
    draft_dump = std::make_unique<DraftLogitsDump>(o.dump_draft_logits, cfg.vocab_size, existing);
  std::unique_ptr<AtomicOutputFile> profile_file;
  fabric::RoutingProfile profile{cfg.num_hidden_layers, cfg.n_routed_experts, {}};
  if (!o.routing_profile.empty()) {
    profile_file = std::make_unique<AtomicOutputFile>(o.routing_profile, existing);
    profile.count.assign((size_t)cfg.num_hidden_layers * cfg.n_routed_experts, 0);
  }
  std::unique_ptr<TensorDump> tensors;
  if (!o.dump_tensors.empty()) tensors = std::make_unique<TensorDump>(o.dump_tensors, o.dump_filter, existing);

  SessionOptions sopt = session_options(o.engine, o.model, (uint32_t)ctx);
  sopt.tensors = tensors.get();
  sopt.draft_audit = o.draft_audit;
  if (job) sopt.remote = job->remote();
  Session session(std::move(sopt), header);
  if (job) job->start(session);
  maybe_print_plan(o.engine, session);
  const double load_s = seconds_since(t_load);
  EvalObserver obs;
  obs.want_trace = trace || profile_file;
  obs.on_eval = [&](uint32_t pos, std::span<const TokenId> toks, const float* logits, const std::vector<TokenTrace>* tr) {
    if (dump) dump->rows(toks, logits);
    if (trace) trace->positions(pos, toks, *tr);
    if (profile_file)
      for (const TokenTrace& t : *tr)
        for (uint32_t L = 0; L < t.experts.size(); ++L)
          for (uint32_t e : t.experts[L]) profile.count[(size_t)L * cfg.n_routed_experts + e] += 1;
  };
  if (drafter && (trace || draft_dump))
    obs.on_draft = [&](const DraftBlock& b, uint32_t verified, uint32_t accepted) {
      if (trace) trace->block(b, verified, accepted);
      if (draft_dump) draft_dump->block(b, verified, accepted);
    };

  GenerateRequest req;
  req.prompt.assign(ids.begin(), ids.end());
  req.max_tokens = (uint32_t)n_predict;
  req.sampling = so;
  req.ignore_eos = o.ignore_eos;
  req.observer = (dump || trace || draft_dump || profile_file) ? &obs : nullptr;

  IdPrinter out_ids;
  std::unique_ptr<text::OutputDecoder> decoder;
  if (text_mode)
    decoder = std::make_unique<text::OutputDecoder>(*tok, text::OutputMode::Plain,
                                                    o.ignore_eos ? std::vector<TokenId>{} : std::vector<TokenId>{cfg.eos_token_id});
  const bool show_prefill = isatty(2) && prompt_n > 2ull * session.plan().chunk;
  std::string stop_note;
  const auto on_prefill = [&](uint32_t done, uint32_t total) {
    if (show_prefill) std::fprintf(stderr, "\rprefill %u / %u tokens%s", done, total, done == total ? "\n" : "");
    if (const int sig = StopSignals::raised()) {
      stop_note = std::string(signal_name(sig)) + " during prefill";
      return false;
    }
    return true;
  };
  const auto on_token = [&](TokenId id) {
    if (decoder) {
      const std::string piece = decoder->push(id);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    } else {
      out_ids.id(id);
    }
    if (const int sig = StopSignals::raised()) {
      stop_note = signal_name(sig);
      return false;
    }
    return true;
  };
  const GenerateResult res = session.generate(req, on_prefill, on_token);
  if (job) job->end();
  if (decoder) {
    const std::string rest = decoder->finish();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::printf("\n");
    std::fflush(stdout);
  } else {
    out_ids.end();
  }
  if (dump) dump->finish();
  if (trace) trace->finish();
  if (draft_dump) draft_dump->finish();
  if (profile_file) {
    profile_file->write(fabric::format_routing_profile(profile));
    profile_file->commit();
  }
  if (tensors) {
    // What was evaluated: the prompt (all of it unless a signal stopped the prefill), then each
    // generated token that was fed back.
    std::vector<uint32_t> evaluated(ids.begin(), ids.begin() + res.prompt_evaluated);
    evaluated.insert(evaluated.end(), res.tokens.begin(), res.tokens.begin() + res.decode_steps);
    nlohmann::json info;
    info["model"] = o.model;
    info["architecture"] = header.arch->name;
    info["config"] = {{"hidden_size", cfg.hidden_size},
                      {"hc_mult", cfg.hc_mult},
                      {"num_hidden_layers", cfg.num_hidden_layers},
                      {"vocab_size", cfg.vocab_size},
                      {"engram_layer_ids", cfg.engram_layer_ids}};
    info["prompt_tokens"] = res.prompt_evaluated;
    info["positions"] = evaluated.size();
    info["tokens"] = evaluated;
    info["generated"] = res.tokens;
    info["chunk"] = session.plan().chunk;
    const size_t n = tensors->finish(std::move(info));
    std::fprintf(stderr, "sluice run: dumped %zu tensors (%s) to %s\n", n, format_bytes(tensors->bytes_written()).c_str(),
                 o.dump_tensors.c_str());
    if (n == 0)
      std::fprintf(stderr, "sluice run: --dump-filter '%s' matched no tensor; %s/index.json lists the names under "
                   "\"not_dumped\"\n", o.dump_filter.c_str(), o.dump_tensors.c_str());
  }

  const std::string stop = !stop_note.empty() ? stop_note : res.finish == Finish::Stop ? "eos" : finish_name(res.finish);
  const uint64_t prefilled = res.prompt_evaluated;
  const uint64_t decode_evals = res.decode_steps;
  const std::string store_line = session_summary(session, prompt_n + decode_evals);
  std::fprintf(stderr,
               "sluice run: prompt %llu tokens in %.3f s (%s) | generated %zu tokens, %llu decode steps "
               "in %.3f s (%s) | stop: %s | load %.3f s, %d threads, ctx %llu, chunk %u | %s\n",
               (unsigned long long)prefilled, res.prefill_s, rate((double)prefilled, res.prefill_s).c_str(),
               res.tokens.size(), (unsigned long long)decode_evals, res.decode_s,
               rate((double)decode_evals, res.decode_s).c_str(), stop.c_str(), load_s, session.plan().threads,
               (unsigned long long)ctx, session.plan().chunk, store_line.c_str());
  if (job) std::fprintf(stderr, "sluice run: %s\n", job->summary().c_str());
  if (o.expert_stats) {
    std::fputs(expert_stats_table(session.stats()).c_str(), stderr);
    // The other ranks' stores, as their answers reported them (their own tables are on their
    // last lines).
    if (job) {
      const std::vector<PeerTraffic> t = job->traffic();
      for (size_t r = 1; r < t.size(); ++r)
        std::fprintf(stderr, "rank %zu expert store: %s, %llu expert terms computed, %llu exchanges, %llu bytes sent, %llu bytes received\n", r,
                     FabricJob::store_text(t[r]).c_str(), (unsigned long long)t[r].triples,
                     (unsigned long long)t[r].exchanges, (unsigned long long)t[r].work_bytes,
                     (unsigned long long)t[r].result_bytes);
    }
  }
  return 0;
}

}  // namespace sluice::cli
