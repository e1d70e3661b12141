// `sluice plan`: the memory admission breakdown for a model file, context and budget, computed
// from the GGUF header alone (no payload is read). Declared here rather than in commands.h
// (owned by the CLI); main.cpp registers it like the other subcommands.
#pragma once
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/cache_policy_option.h"

namespace sluice::cli {

struct PlanCommandOptions {
  std::string model;
  uint32_t ctx = 0;  // 0: min(max_position_embeddings, 4096), the default of chat and serve
  std::string mem_budget = "auto";
  uint32_t chunk = 0;  // 0: the largest that fits
  int threads = 0;     // 0: all cores
  std::string cache_policy = kDefaultCachePolicy;  // a storage::eviction_names() entry (cli/cache_policy_option.h)
  bool allow_swap = false;
  std::string checkpoint_budget;  // empty: kDefaultCheckpointBudget, as run, chat and serve
  uint64_t cache_experts = 0;     // --cache-experts, as run, chat and serve (0: no cap)
  uint32_t parallel = 1;          // --parallel N: sequences held at once (sluice bench --parallel)
  std::string cache_ram;          // --cache-ram, as serve takes it (empty: none)
  bool kv_disk = false;           // --kv-disk: the state directory's buffers, as serve's --kv-disk-dir holds them
  std::string dspark;             // --dspark FILE: the drafter's line and verify depth, as run/chat/serve plan it
  uint32_t draft_max = 5;
  std::string dspark_experts = "auto";
  bool json = false;
  // --backend vulkan: the device's lines too, as run/chat/serve plan them (the device is opened;
  // nothing is loaded).
  std::string backend = "cpu";
  uint32_t device = 0;
  std::string gpu_mem = "auto";
  std::string gpu_kv = "auto";
  std::string gpu_experts;
};
CLI::App* setup_plan(CLI::App& app, PlanCommandOptions& o);
// 0 when admitted; prints the breakdown to stdout and throws Error (exit 1) when refused.
int run_plan(const PlanCommandOptions& o);

}  // namespace sluice::cli
