// `sluice bench`: throughput against the physical limit measured in the same run, llama-bench
// style. Model runs: prefill and decode tok/s of a model file (median, min, max of -r runs) beside
// the decode roofline (weight bytes a token reads / the memory read bandwidth; with streamed
// experts also the expert bytes it reads / the disk's raw O_DIRECT bandwidth). --ops: GFLOPS of
// the CPU backend's linear op at the model's real shapes, per type and token count, beside the
// memory read bandwidth. --json: one JSON object per line instead of the table.
#pragma once
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "backend/read_bandwidth.h"
#include "cli/cmd_run.h"
#include "cli/fabric_job.h"
#include "cli/commands.h"

namespace sluice::cli {

struct BenchOptions {
  std::string model;
  uint32_t n_prompt = 512;
  std::string n_gen;             // model runs: one count (empty: 128); --ops: token counts (empty: 1,8,64,512)
  uint32_t repetitions = 3;
  bool json = false;
  bool ops = false;
  std::string types;             // --ops: comma-separated type names; empty: each shape's own type
  uint64_t read_mib = 1024;      // the read-bandwidth buffer
  double disk_seconds = 3.0;     // the raw disk read run (streamed experts only)
  double op_seconds = 0.3;       // --ops: each figure runs at least this long (and -r times)
  uint32_t parallel = 1;         // --parallel N: also N streams decoding together vs in turn
  EngineCliOptions engine;
  FabricCliOptions fabric;       // --fabric mpi: the runs across ranks beside one process's
};
CLI::App* setup_bench(CLI::App& app, BenchOptions& o);
int run_bench(const BenchOptions& o);

// bench_ops.cpp
int run_bench_ops(const BenchOptions& o);
// The same-run memory baseline of both modes (--read-mib checked here).
ReadBandwidth bench_read_bandwidth(const BenchOptions& o, int threads);

}  // namespace sluice::cli
