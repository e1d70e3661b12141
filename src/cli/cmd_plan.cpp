// `sluice plan -m FILE -c N --mem-budget B [--chunk N] [--threads N] [--cache-policy P]
//  [--allow-swap] [--backend vulkan [--device N] [--gpu-mem B] [--gpu-experts N] [--gpu-kv B]] [--json]`
#include "cli/cmd_plan.h"

#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/budget_check.h"
#include "cli/cache_policy_option.h"
#include "cli/cmd_run.h"
#include "cli/commands.h"
#include "cli/context_option.h"
#include "format/gguf.h"
#include "model/deepseek41/schema.h"
#include "runtime/admission.h"
#include "runtime/device_plan.h"
#include "runtime/dspark_plan.h"
#include "runtime/session.h"
#include "runtime/store_plan.h"
#include "text/tokenizer.h"
#include "util/error.h"

namespace sluice::cli {

CLI::App* setup_plan(CLI::App& app, PlanCommandOptions& o) {
  CLI::App* sub = app.add_subcommand(
      "plan", "Memory admission: the budget breakdown and expert-cache size for a model, without loading it");
  sub->footer(
      "Sizes accept K/M/G/T and KiB/MiB/GiB/TiB (binary) or KB/MB/GB/TB (decimal).\n"
      "--mem-budget auto = min(0.85 x MemAvailable, MemAvailable - 10% of MemTotal, 0.85 x cgroup headroom).\n"
      "Exit status: 0 when admitted; 1 when refused (the breakdown on stdout, one error line on stderr).");
  sub->add_option("-m,--model", o.model, "GGUF model file (only its header is read)")->required();
  add_ctx_option(sub, o.ctx, "min(model maximum, 4096), as run and serve", /*ctx_alias=*/true);
  sub->add_option("--mem-budget", o.mem_budget, "memory budget: BYTES (e.g. 116GiB) or auto")->capture_default_str();
  sub->add_option("--chunk", o.chunk, "prefill chunk in tokens (default: the largest that fits)");
  sub->add_option("-t,--threads", o.threads, "compute threads (default: all cores)");
  add_cache_policy_option(sub, o.cache_policy);
  sub->add_flag("--allow-swap", o.allow_swap, "admit even when swap is active");
  sub->add_option("--checkpoint-budget", o.checkpoint_budget,
                  "memory for prefix checkpoints, as run/chat/serve take it (default " +
                      format_bytes(kDefaultCheckpointBudget) + ")");
  sub->add_option("--cache-experts", o.cache_experts, "hold at most N routed experts in the cache, as run/chat/serve take it");
  sub->add_option("--parallel", o.parallel, "sequences held at once, each with its own state (batched decode; default 1)")
      ->check(CLI::Range(1u, 256u));
  sub->add_option("--cache-ram", o.cache_ram, "memory for the shared prefix cache, as serve takes it (default: none)");
  sub->add_flag("--kv-disk", o.kv_disk,
                "count the memory serve's --kv-disk-dir holds (snapshots waiting to be written, one being read)");
  sub->add_option("--dspark,--model-draft", o.dspark,
                  "DSpark support GGUF: checked against the model; the plan adds the drafter's line and the verify depth "
                  "the expert cache allows, as run/chat/serve plan it");
  sub->add_option("--draft-max", o.draft_max, "as run/chat/serve take it (default 5)");
  sub->add_option("--dspark-experts", o.dspark_experts, "auto (default), resident or stream, as run/chat/serve take it")
      ->check(CLI::IsMember({"auto", "resident", "stream"}));
  sub->add_option("--backend", o.backend,
                  "cpu (default) or vulkan: the device's lines too (its share of this host's budget and its own "
                  "plan: budget, scratch, sequence state, staging, dense weights, expert slots), as run plans them")
      ->check(CLI::IsMember({"cpu", "vulkan"}));
  sub->add_option("--device", o.device, "with --backend vulkan: the device index from `sluice devices` (default 0)");
  sub->add_option("--gpu-mem", o.gpu_mem, "with --backend vulkan: as run takes it (default auto)");
  sub->add_option("--gpu-experts", o.gpu_experts, "with --backend vulkan: N, in-place or auto, as run takes it (default auto)");
  sub->add_option("--gpu-kv", o.gpu_kv, "with --backend vulkan: BYTES, auto or off, as run takes it (default auto)");
  sub->add_flag("--json", o.json, "print one JSON object instead of the table");
  return sub;
}

int run_plan(const PlanCommandOptions& o) {
  PlanOptions po;
  try {
    po.budget = parse_budget(o.mem_budget);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  if (o.threads < 0) throw UsageError("--threads must not be negative");
  check_budget_on_host(po.budget, /*refuse_beyond_machine=*/false, false);
  po.chunk = o.chunk;
  po.threads = o.threads;
  po.allow_swap = o.allow_swap;
  po.max_cache_experts = o.cache_experts;
  po.sequences = o.parallel;
  po.state_disk = o.kv_disk;
  try {
    if (!o.checkpoint_budget.empty()) po.checkpoint_budget = parse_bytes(o.checkpoint_budget, "--checkpoint-budget");
    if (!o.cache_ram.empty()) po.prefix_cache_budget = parse_bytes(o.cache_ram, "--cache-ram");
  } catch (const Error& e) {
    throw UsageError(e.what());
  }

  // The same planning run/serve/chat do: the expert cache is the store's own figure.
  StorePlanOptions spo;
  spo.plan = po;
  spo.store.policy = cache_policy_kind(o.cache_policy);
  const gguf::File f = open_gguf(o.model);
  const ModelConfig cfg = read_model_config(o.model, f);
  check_ctx(o.ctx, cfg.max_position_embeddings);
  spo.plan.ctx = o.ctx ? o.ctx : default_context(cfg.max_position_embeddings);
  if (!o.dspark.empty()) {
    spo.plan.dspark_experts = parse_dspark_experts(o.dspark_experts);
    plan_dspark(o.dspark, cfg, o.draft_max, spo.plan, spo.store);
  }
  // The device as run would open it (before the plan measures this process, driver included).
  if (o.backend != "vulkan" && (o.device != 0 || o.gpu_mem != "auto" || !o.gpu_experts.empty() || o.gpu_kv != "auto"))
    throw UsageError("--device, --gpu-mem, --gpu-experts and --gpu-kv need --backend vulkan");
  SessionDevice dev;
  if (o.backend == "vulkan") {
    SessionOptions so;
    so.model_path = o.model;
    so.backend = o.backend;
    so.gpu_device = o.device;
    so.threads = o.threads;
    parse_gpu_memory_options(o.gpu_mem, o.gpu_experts, so);
    parse_gpu_kv(o.gpu_kv, so);
    if (!o.dspark.empty()) so.dspark_path = o.dspark;
    dev = make_session_device(so, cfg);
    plan_session_device(*dev.backend, dev.slots, dev.slots_auto, f, cfg, so.stream_experts, spo.plan);
  }
  // run/chat/serve plan with the tokenizer parsed (open_model_header), and the plan's runtime
  // overhead is this process's resident set: parse it here too, so plan measures what run does.
  std::string tokenizer_problem;
  std::unique_ptr<text::Tokenizer> tokenizer;
  try {
    tokenizer = std::make_unique<text::Tokenizer>(text::Tokenizer::from_gguf(f));
  } catch (const Error& e) {
    tokenizer_problem = e.what();
  }
  Plan p;
  try {
    p = plan_for_file(f, spo);
  } catch (const Error& e) {
    throw Error(with_path(o.model, e.what()));
  }
  // What run would refuse the file for (the same list as inspect's), as a warning: the plan
  // itself needs only the header.
  if (const std::vector<std::string> problems = load_problems(f); !problems.empty())
    p.warnings.push_back("the file has " + std::to_string(problems.size()) +
                         " problem(s) run would refuse it for, first: " + problems.front() + " (see sluice inspect)");
  // A batched step of N sequences is one pass of N rows (as Session refuses it).
  if (p.chunk < o.parallel)
    p.warnings.push_back("--parallel " + std::to_string(o.parallel) + " needs a chunk of at least " +
                         std::to_string(o.parallel) + " rows; the plan has " + std::to_string(p.chunk) +
                         ": a session with these options is refused");
  if (!tokenizer_problem.empty())
    p.warnings.push_back("the tokenizer could not be read (" + tokenizer_problem +
                         "): the measured runtime overhead lacks it");
  if (o.json) std::printf("%s\n", plan_to_json(p).dump(2).c_str());
  else std::fputs(format_plan(p).c_str(), stdout);
  std::fflush(stdout);
  require_admitted(p);
  return 0;
}

}  // namespace sluice::cli
