// `sluice run`: the CPU forward pass on a prompt of token ids, then greedy or sampled generation.
// Declared here rather than in commands.h (owned by the CLI); main.cpp registers it like the other
// subcommands: setup_run on the app, then run_run when the subcommand was parsed.
#pragma once
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace sluice::cli {

struct RunOptions {
  std::string model;
  std::string tokens;          // comma-separated prompt ids, parsed by run_run
  int64_t n_predict = 0;       // tokens to generate
  float temp = 0.0f;           // 0: greedy
  float top_p = 1.0f;
  uint64_t seed = 0;
  uint32_t chunk = 64;
  int threads = 0;             // 0: all cores
  uint64_t ctx = 0;            // 0: prompt + n
  bool ignore_eos = false;
  std::string dump_logits;     // file of f32 rows, plus <file>.json
  std::string trace_dir;       // <dir>/trace.jsonl
};
CLI::App* setup_run(CLI::App& app, RunOptions& o);
// 0 on success, also when SIGTERM/SIGINT stopped generation early (the summary is printed).
int run_run(const RunOptions& o);

}  // namespace sluice::cli
