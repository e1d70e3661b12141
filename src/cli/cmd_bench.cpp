#include "cli/cmd_bench.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "backend/read_bandwidth.h"
#include "kernels/cpu.h"
#include "model/deepseek41/primitives.h"
#include "runtime/roofline.h"
#include "runtime/session.h"
#include "storage/raw_read_bandwidth.h"
#include "cli/bench_stats.h"

namespace sluice::cli {

CLI::App* setup_bench(CLI::App& app, BenchOptions& o) {
  CLI::App* sub = app.add_subcommand("bench", "prefill/decode tok/s (or --ops: linear GFLOPS) beside the roofline measured in the same run");
  sub->footer(
      "Model runs: each of -r runs resets the sequence, prefills -p pseudo-random tokens and decodes -n\n"
      "greedy tokens; figures are the median with min and max. The roofline is measured in the same\n"
      "run: memory read GB/s (a --read-mib buffer, all threads) and, when experts stream, the raw\n"
      "O_DIRECT read GB/s of the file's expert region.\n"
      "--ops: the CPU backend's linear at the shapes of the model's first layer (the published model\n"
      "when no -m is given) in their own types or in each of --type, for each token count in -n.");
  sub->add_option("-m,--model", o.model, "deepseek41 GGUF file (required unless --ops)");
  sub->add_option("-p,--n-prompt", o.n_prompt, "prompt tokens (default 512)");
  sub->add_option("-n,--n-gen", o.n_gen, "generated tokens (default 128); with --ops: token counts, e.g. 1,8,64,512");
  sub->add_option("-r,--repetitions", o.repetitions, "runs per figure (default 3)");
  sub->add_flag("--json", o.json, "one JSON object per line");
  sub->add_flag("--ops", o.ops, "benchmark the linear op instead of a model");
  sub->add_option("--type", o.types, "with --ops: weight types, comma-separated (default: each shape's own)");
  sub->add_option("--read-mib", o.read_mib, "memory read-bandwidth buffer in MiB (default 1024)");
  sub->add_option("--disk-seconds", o.disk_seconds, "raw disk read run in seconds (default 3)");
  sub->add_option("--op-seconds", o.op_seconds, "with --ops: run each figure at least this long (default 0.3)");
  add_engine_options(sub, o.engine);
  return sub;
}

ReadBandwidth bench_read_bandwidth(const BenchOptions& o, int threads) {
  if (o.read_mib < 64 || o.read_mib > 65536) throw UsageError("--read-mib must be in 64..65536");
  ThreadPool pool(threads);
  return measure_read_bandwidth(pool, o.read_mib << 20, 5);
}

namespace {

// The file range the routed experts occupy (for the raw read baseline).
std::pair<uint64_t, uint64_t> expert_region(const gguf::File& f) {
  uint64_t b = std::numeric_limits<uint64_t>::max(), e = 0;
  for (const gguf::TensorInfo& t : f.tensors())
    if (t.name.find("_exps.") != std::string::npos) {
      b = std::min(b, t.file_offset);
      e = std::max(e, t.file_offset + t.nbytes);
    }
  return {b, e};
}

}  // namespace

int resolved_threads(int t) { return t > 0 ? t : std::max(1, (int)std::thread::hardware_concurrency()); }

int run_bench(const BenchOptions& o) {
  if (o.repetitions == 0 || o.repetitions > 100) throw UsageError("-r must be in 1..100");
  if (o.ops) return run_bench_ops(o);
  if (o.model.empty()) throw UsageError("give a model: -m FILE (or --ops)");
  if (!o.types.empty()) throw UsageError("--type needs --ops");
  uint32_t n_gen = 128;
  if (!o.n_gen.empty()) try {
    size_t used = 0;
    const unsigned long v = std::stoul(o.n_gen, &used);
    if (used != o.n_gen.size() || v > 1u << 20) throw std::invalid_argument("n");
    n_gen = (uint32_t)v;
  } catch (const std::exception&) {
    throw UsageError("-n must be one token count for a model run (got '" + o.n_gen + "')");
  }
  if (o.n_prompt == 0) throw UsageError("-p must be at least 1");
  if (!(o.disk_seconds > 0 && o.disk_seconds <= 600)) throw UsageError("--disk-seconds must be in (0, 600]");
  const int threads = resolved_threads(o.engine.threads);

  const ModelHeader header = open_model_header(o.model);
  const ModelConfig& c = header.config;
  const uint64_t ctx = (uint64_t)o.n_prompt + n_gen + 1;
  if (ctx > c.max_position_embeddings) throw UsageError("-p + -n exceed the model's max_position_embeddings");
  const DecodeBytes db = decode_bytes_per_token(header.file, c);

  // The memory baseline first, before the model takes its budget; the buffer is freed again.
  const ReadBandwidth rb = bench_read_bandwidth(o, threads);

  SessionOptions so = session_options(o.engine, o.model, (uint32_t)ctx);
  so.checkpoint_budget = 0;  // every run starts from position 0: nothing to roll back to
  Session session(std::move(so), header);
  maybe_print_plan(o.engine, session);
  const bool streaming = session.stats().streaming;

  storage::RawReadResult disk;
  std::string disk_note;
  if (streaming) {
    const auto [b, e] = expert_region(header.file);
    try {
      disk = storage::raw_direct_reads(o.model, b, e, std::max<uint32_t>(o.engine.io_depth, 1), o.disk_seconds, 7);
    } catch (const Error& err) {
      disk_note = err.what();
    }
  }

  std::vector<double> pre, dec, disk_bytes_tok, stall_frac;
  for (uint32_t r = 0; r < o.repetitions; ++r) {
    session.reset();
    GenerateRequest req;
    uint64_t x = 1000 + r;
    req.prompt.resize(o.n_prompt);
    for (auto& t : req.prompt) t = (TokenId)((x = splitmix64(x)) % c.vocab_size);
    req.max_tokens = n_gen;
    req.ignore_eos = true;
    storage::LayerStats at_first{};
    bool first = true;
    const GenerateResult res = session.generate(
        req, [](uint32_t, uint32_t) { return true; },
        [&](TokenId) {
          if (first) at_first = session.stats().store.total(), first = false;
          return true;
        });
    const storage::LayerStats end = session.stats().store.total();
    pre.push_back(res.prompt_evaluated / res.prefill_s);
    if (res.decode_steps > 0) {
      dec.push_back(res.decode_steps / res.decode_s);
      const double bytes = (double)(end.bytes_demand + end.bytes_prefetch - at_first.bytes_demand - at_first.bytes_prefetch);
      disk_bytes_tok.push_back(bytes / res.decode_steps);
      stall_frac.push_back((double)(end.stall_ns - at_first.stall_ns) / 1e9 / res.decode_s);
    }
  }
  const Figure fp = figure(pre), fd = figure(dec), fdisk = figure(disk_bytes_tok), fstall = figure(stall_frac);
  // Time per decode token cannot beat reading its weights from memory, nor (streaming) reading
  // its missed experts from the disk; with the two overlapped, the slower one is the limit.
  const double mem_s = (double)db.total() / (rb.median_gbps * 1e9);
  const double disk_s = streaming && disk.gbps > 0 ? fdisk.median / (disk.gbps * 1e9) : 0.0;
  const double roof = 1.0 / std::max(mem_s, disk_s);
  const uint32_t chunk = session.plan().chunk;
  if (o.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["threads"] = threads;
    j["isa"] = std::string(isa_name(active_isa()));
    j["n_prompt"] = o.n_prompt;
    j["n_gen"] = n_gen;
    j["chunk"] = chunk;
    j["repetitions"] = o.repetitions;
    j["prefill_tok_s"] = fp.median;
    j["prefill_tok_s_min"] = fp.min;
    j["prefill_tok_s_max"] = fp.max;
    j["decode_tok_s"] = fd.median;
    j["decode_tok_s_min"] = fd.min;
    j["decode_tok_s_max"] = fd.max;
    j["roofline_decode_tok_s"] = roof;
    j["decode_ratio"] = fd.median / roof;
    j["read_gbps"] = rb.median_gbps;
    j["weight_bytes_per_token"] = db.total();
    j["expert_bytes_per_token"] = db.experts;
    j["engram_bytes_per_token"] = db.engram;
    j["streaming"] = streaming;
    if (streaming) {
      j["disk_gbps"] = disk.gbps;
      j["disk_bytes_per_token"] = fdisk.median;
      j["stall_fraction"] = fstall.median;
      if (!disk_note.empty()) j["disk_note"] = disk_note;
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model %s: %u layers, hidden %u; isa %s, threads %d, chunk %u, %u runs\n", o.model.c_str(),
              c.num_hidden_layers, c.hidden_size, std::string(isa_name(active_isa())).c_str(), threads, chunk,
              o.repetitions);
  std::printf("memory read   %.2f GB/s (min %.2f, max %.2f; %llu MiB buffer)\n", rb.median_gbps, rb.min_gbps,
              rb.max_gbps, (unsigned long long)o.read_mib);
  std::printf("decode reads  %.1f MB per token (dense %.1f, experts %.1f, Engram %.3f)\n", db.total() / 1e6,
              db.resident / 1e6, db.experts / 1e6, db.engram / 1e6);
  if (streaming) {
    if (disk_note.empty())
      std::printf("disk read     %.3f GB/s raw O_DIRECT 1 MiB random at depth %u; decode read %.1f MB/token from disk "
                  "(min %.1f, max %.1f), stalled %.0f%% of decode time\n",
                  disk.gbps, o.engine.io_depth, fdisk.median / 1e6, fdisk.min / 1e6, fdisk.max / 1e6, 100 * fstall.median);
    else
      std::printf("disk read     not measured: %s\n", disk_note.c_str());
  }
  std::printf("prefill %5u tokens: %8.2f tok/s (min %.2f, max %.2f)\n", o.n_prompt, fp.median, fp.min, fp.max);
  if (!dec.empty())
    std::printf("decode  %5u tokens: %8.2f tok/s (min %.2f, max %.2f); roofline %.2f tok/s (%s-bound), ratio %.2f\n",
                n_gen, fd.median, fd.min, fd.max, roof, disk_s > mem_s ? "disk" : "memory", fd.median / roof);
  return 0;
}

}  // namespace sluice::cli
