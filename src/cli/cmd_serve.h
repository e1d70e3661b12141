// `sluice serve`: the OpenAI- and Anthropic-compatible HTTP server (src/server). Registered in
// main.cpp like the other subcommands: setup_serve on the app, then run_serve when parsed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/cmd_run.h"
#include "cli/fabric_job.h"

namespace sluice::cli {

struct ServeOptions {
  std::string model;
  uint32_t ctx = 0;                  // 0: the Session's default
  std::string host = "127.0.0.1";
  uint16_t port = 8080;              // 0: any free port (printed)
  size_t queue = 4;
  uint32_t parallel = 1;             // --parallel / -np: requests decoded together
  uint32_t prefill_step = 64;        // prompt tokens a step evaluates while others decode
  std::string cache_ram;             // --cache-ram BYTES: the shared prefix cache (empty or 0: none)
  std::string kv_disk_dir;           // --kv-disk-dir DIR: states on disk (empty: none)
  std::string kv_disk_budget;        // --kv-disk-budget BYTES: their files at most
  std::string max_body = "8MiB";
  std::string request_memory = "256MiB";
  uint32_t max_tokens_limit = 4096;
  std::string api_key;
  bool api_key_given = false;        // --api-key was on the command line (even empty: refused)
  std::string api_key_file;          // one key per line (keeps them out of `ps`)
  uint32_t cached_tokens_granularity = 16;
  size_t max_connections = 64;
  double request_timeout_s = 30;
  double header_timeout_s = 10;
  double idle_timeout_s = 30;
  std::string alias;
  double ping_interval_s = 5.0;
  float temp = 1.0f;
  float top_p = 0.95f;
  int64_t top_k = 0;
  float min_p = 0.0f;
  size_t max_json_depth = 128;
  std::vector<std::string> stops;   // --stop, added to every request's stop strings
  std::string thinking = "request"; // --thinking request|off
  bool special_in_content = false;  // --special-in-content: control tokens may come from request text
  bool no_webui = false;            // --no-webui: / answers JSON to browsers too
  bool open_browser = false;        // --open: the chat page in the desktop's browser once listening
  EngineCliOptions engine;
  FabricCliOptions fabric;           // --fabric mpi: rank 0 serves, the other ranks compute experts           // -t, --mem-budget, --allow-swap, store options, --watchdog
};
CLI::App* setup_serve(CLI::App& app, ServeOptions& o);
// Serves until SIGINT/SIGTERM (exit 0) or until the model fails to load (throws Error).
int run_serve(const ServeOptions& o);

}  // namespace sluice::cli
