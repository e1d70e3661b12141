// `sluice run`: the CPU forward pass on a prompt of token ids, then greedy or sampled generation.
// Declared here rather than in commands.h (owned by the CLI); main.cpp registers it like the other
// subcommands: setup_run on the app, then run_run when the subcommand was parsed.
#pragma once
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/cache_policy_option.h"
#include "cli/fabric_job.h"
#include "runtime/session.h"

namespace sluice::cli {

// Options every command that runs the model shares (run, chat, serve).
struct EngineCliOptions {
  uint32_t chunk = 0;          // 0: the plan's choice
  bool chunk_given = false;
  int threads = 0;             // 0: all cores
  std::string mem_budget = "auto";
  bool allow_swap = false;
  bool mem_budget_override = false;  // accept a --mem-budget above MemTotal + SwapTotal
  std::string cache_policy = kDefaultCachePolicy;  // a storage::eviction_names() entry (cli/cache_policy_option.h)
  uint32_t io_depth = 16;
  bool no_prefetch = false;
  bool no_direct_io = false;
  bool resident_experts = false;
  float route_bias = 0.0f;     // --route-bias: cache-aware routing, lossy (0: exact)
  uint64_t cache_experts = 0;  // --cache-experts: at most this many experts cached (0: what the budget leaves)
  std::string backend = "cpu";  // --backend cpu|vulkan
  uint32_t device = 0;          // --device N (vulkan)
  std::string gpu_mem = "auto"; // --gpu-mem BYTES|auto: the weights the device holds at most
  std::string gpu_experts;      // --gpu-experts N|in-place: routed-expert slots on the device, or none and in place
  std::string cpu_experts;      // --cpu-experts F|auto: the CPU's share of the slot misses
  std::string gpu_linears = "auto";  // --gpu-linears auto|plain|subgroup (GpuOptions::linears)
  std::string gpu_gemm = "on";       // --gpu-gemm on|off (GpuOptions::gemm)
  std::string gpu_int_dot = "auto";  // --gpu-int-dot auto|on|off (GpuOptions::int_dot)
  std::string gpu_indexer = "auto";  // --gpu-indexer auto|device|cpu (GpuOptions::indexer)
  std::string gpu_kv = "auto";       // --gpu-kv BYTES|auto|off (GpuOptions::kv_bytes)
  uint32_t checkpoint_every = 1024;   // prefix checkpoints every N tokens (0: only at prompt ends)
  std::string checkpoint_budget;      // their byte budget (0: none; empty: kDefaultCheckpointBudget)
  std::string watchdog;        // SOFT:HARD; handled in main() (re-executes under the watchdog)
  bool print_plan = false;     // the admission breakdown on stderr (always when stderr is a terminal)
  std::string dspark;          // --dspark FILE: the drafter's support file (exact speculative decoding)
  bool no_dspark = false;      // --no-dspark: ignore --dspark
  uint32_t draft_max = 5;      // --draft-max
  std::string dspark_experts = "auto";  // --dspark-experts auto|resident|stream
  float dspark_conf = 0.7f;    // --dspark-conf
  bool no_dspark_guard = false;
};
void add_engine_options(CLI::App* sub, EngineCliOptions& o);
// --gpu-mem BYTES|auto and --gpu-experts N|in-place|auto into so; UsageError for bad values.
void parse_gpu_memory_options(const std::string& gpu_mem, const std::string& gpu_experts, SessionOptions& so);
// --gpu-kv BYTES|auto|off into so; UsageError for a bad value.
void parse_gpu_kv(const std::string& gpu_kv, SessionOptions& so);
// Throws UsageError for bad values. ctx 0: the session's default.
SessionOptions session_options(const EngineCliOptions& e, const std::string& model, uint32_t ctx);
// --temp/--top-p/--top-k/--min-p checked by sluice::check_sampling, the check the server's APIs
// use too (UsageError with its message).
SamplerOptions sampler_options(float temp, float top_p, uint64_t seed, int64_t top_k = 0, float min_p = 0.0f);
// Adds --top-k and --min-p (run, chat, serve).
void add_topk_minp_options(CLI::App* sub, int64_t& top_k, float& min_p);
// The plan's breakdown on stderr when asked (--print-plan) or when stderr is a terminal.
void maybe_print_plan(const EngineCliOptions& e, const Session& s);
// "expert cache ... hit rate ... read ... | peak RSS ... of budget ..." for summaries.
std::string session_summary(const Session& s, uint64_t tokens_evaluated);
// The store's summary and one line of counters per layer (for --expert-stats and chat).
std::string expert_stats_table(const SessionStats& st);

struct RunOptions {
  std::string model;
  std::string tokens;          // comma-separated prompt ids, parsed by run_run
  std::string prompt;          // -p text
  std::string prompt_file;     // -f file
  bool chat = false;           // render the text as a user turn
  std::string think = "off";
  int64_t n_predict = 0;       // tokens to generate
  float temp = 0.0f;           // 0: greedy
  float top_p = 1.0f;
  uint64_t seed = 0;
  int64_t top_k = 0;           // 0: off
  float min_p = 0.0f;          // 0: off
  uint64_t ctx = 0;            // 0: prompt + n
  bool ignore_eos = false;
  std::string dump_logits;     // file of f32 rows, plus <file>.json
  std::string trace_dir;       // <dir>/trace.jsonl
  std::string routing_profile;  // how often each routed expert was chosen (--placement local-first:FILE)
  std::string dump_tensors;    // <dir>/index.json + one f32 file per named intermediate
  std::string dump_filter;     // regex (util/linear_regex.h) searched for in tensor names; empty: all
  std::string dump_draft_logits;  // --dspark: the drafter's logit rows per block, plus <file>.json
  bool draft_audit = false;    // --dspark test mode: a block at every committed position, plain decoding
  bool force = false;          // --dump-logits / --trace / --dump-tensors may replace existing regular files
  bool expert_stats = false;   // per-layer store statistics after the summary
  EngineCliOptions engine;
  FabricCliOptions fabric;     // --fabric mpi: routed experts spread over the ranks of an mpirun job
};
CLI::App* setup_run(CLI::App& app, RunOptions& o);
// 0 on success, also when SIGTERM/SIGINT stopped generation early (the summary is printed).
int run_run(const RunOptions& o);

}  // namespace sluice::cli
