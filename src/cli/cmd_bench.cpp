#include "cli/cmd_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <cstdio>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "backend/read_bandwidth.h"
#include "backend/vulkan_backend.h"
#include "kernels/cpu.h"
#include "model/deepseek41/primitives.h"
#include "runtime/roofline.h"
#include "runtime/sampler.h"
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
      "--route-bias D (lossy): the same runs with exact routing first, then biased, with each one's decode\n"
      "hit rate, and the cost: KL(exact || biased) of next-token distributions and top-1 agreement on a\n"
      "fixed set of prompts evaluated token by token.\n"
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
  sub->add_option("--parallel", o.parallel,
                  "also decode N streams together (batched: one pass per step, each layer's experts read once) and the "
                  "same N streams in turn, after the single-stream runs; the plan holds N sequences (default 1: off)")
      ->check(CLI::Range(1u, 256u));
  sub->add_option("--op-seconds", o.op_seconds, "with --ops: run each figure at least this long (default 0.3)");
  add_engine_options(sub, o.engine);
  add_fabric_options(sub, o.fabric);
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

namespace {

constexpr uint64_t kGpuCopyBenchBytes = 64ull << 20;  // bench --backend vulkan: bytes per copy pass


struct Timings {
  std::vector<double> pre, dec, disk_bytes_tok, stall_frac, hit_rate;
  std::vector<double> ms_tok, stall_ms_tok;  // decode: wall time and store stall per token
  std::vector<double> engram_hit;             // decode: share of distinct Engram rows found cached
  std::vector<std::vector<TokenId>> tokens;   // each run's generated tokens
  uint64_t spec_cycles = 0, spec_drafts = 0, spec_accepted = 0, spec_tokens = 0;  // --dspark, over the runs
};

// -r runs: reset, prefill -p pseudo-random tokens (the same ones for every mode), decode -n greedy
// tokens. The decode figures count from the first generated token on.
// `mark` (may be empty) is called when each run starts (decode false) and at its first generated
// token (decode true).
Timings time_runs(Session& session, const BenchOptions& o, uint32_t n_gen,
                  const std::function<void(uint32_t run)>& before_run = {},
                  const std::function<void(bool decode)>& mark = {}) {
  const ModelConfig& c = session.config();
  Timings t;
  const SessionStats at_start = session.stats();
  for (uint32_t r = 0; r < o.repetitions; ++r) {
    if (before_run) before_run(r);
    session.reset();
    if (mark) mark(false);
    GenerateRequest req;
    uint64_t x = 1000 + r;
    req.prompt.resize(o.n_prompt);
    for (auto& tok : req.prompt) tok = (TokenId)((x = splitmix64(x)) % c.vocab_size);
    req.max_tokens = n_gen;
    req.ignore_eos = true;
    storage::LayerStats at_first{};
    SessionStats ss_first{};
    bool first = true;
    const GenerateResult res = session.generate(
        req, [](uint32_t, uint32_t) { return true; },
        [&](TokenId) {
          if (first) {
            ss_first = session.stats(), at_first = ss_first.store.total(), first = false;
            if (mark) mark(true);
          }
          return true;
        });
    const SessionStats ss_end = session.stats();
    const storage::LayerStats end = ss_end.store.total();
    if (ss_end.engram_unique > ss_first.engram_unique)
      t.engram_hit.push_back((double)(ss_end.engram_hits - ss_first.engram_hits) /
                             (double)(ss_end.engram_unique - ss_first.engram_unique));
    t.tokens.push_back(res.tokens);
    t.pre.push_back(res.prompt_evaluated / res.prefill_s);
    if (res.decode_steps > 0) {
      t.dec.push_back(res.decode_steps / res.decode_s);
      const double bytes = (double)(end.bytes_demand + end.bytes_prefetch - at_first.bytes_demand - at_first.bytes_prefetch);
      t.disk_bytes_tok.push_back(bytes / res.decode_steps);
      const double stall_s = (double)(end.stall_ns - at_first.stall_ns) / 1e9;
      t.stall_frac.push_back(stall_s / res.decode_s);
      t.ms_tok.push_back(1e3 * res.decode_s / res.decode_steps);
      t.stall_ms_tok.push_back(1e3 * stall_s / res.decode_steps);
      const uint64_t req_n = end.requests - at_first.requests;
      if (req_n) t.hit_rate.push_back((double)(end.hits - at_first.hits) / (double)req_n);
    }
  }
  const SessionStats at_end = session.stats();
  t.spec_cycles = at_end.spec_cycles - at_start.spec_cycles;
  t.spec_drafts = at_end.spec_drafts - at_start.spec_drafts;
  t.spec_accepted = at_end.spec_accepted - at_start.spec_accepted;
  t.spec_tokens = at_end.spec_tokens - at_start.spec_tokens;
  return t;
}

// --dspark: decode with speculation against the plain runs (the same prompts, greedy, so every
// mode generates the same tokens): the drafter's own drafts, then forced drafts of controlled
// quality -- each draft is the plain run's next token with probability `rate` (a fixed hash of
// its position), else another token -- so the acceptance that makes speculation pay is measured
// on this machine even with random weights.
struct SpecRow {
  std::string mode;
  double rate = -1;        // forced: the chance a draft is right; -1: the drafter's own
  Figure dec;
  double acceptance = 0, tokens_per_cycle = 0;
  uint64_t cycles = 0;
};

std::vector<SpecRow> time_speculation(Session& session, const BenchOptions& o, uint32_t n_gen, const Timings& plain) {
  std::vector<SpecRow> rows;
  const uint32_t V = session.config().vocab_size, P = o.n_prompt;
  auto row = [&](std::string mode, double rate, const Timings& t) {
    SpecRow r;
    r.mode = std::move(mode);
    r.rate = rate;
    r.dec = figure(t.dec);
    r.cycles = t.spec_cycles;
    r.acceptance = t.spec_drafts ? (double)t.spec_accepted / (double)t.spec_drafts : 0.0;
    r.tokens_per_cycle = t.spec_cycles ? (double)t.spec_tokens / (double)t.spec_cycles : 0.0;
    rows.push_back(r);
  };
  session.set_speculation(true);
  session.set_draft_hook({});
  row("own drafts", -1, time_runs(session, o, n_gen));
  uint32_t run = 0;
  for (const double rate : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    session.set_draft_hook([&, rate](uint32_t pos, TokenId, std::vector<TokenId>& d) {
      const std::vector<TokenId>& ref = plain.tokens.at(run);
      for (size_t j = 0; j < d.size(); ++j) {
        const size_t g = pos - P + 1 + j;  // the anchor at pos is generated token pos - P
        const TokenId right = g < ref.size() ? ref[g] : 0;
        const double u = (double)(splitmix64(((uint64_t)pos << 8) + j) >> 11) * 0x1.0p-53;
        d[j] = u < rate ? right : (right + 1) % V;
      }
    });
    row("forced", rate, time_runs(session, o, n_gen, [&](uint32_t r) { run = r; }));
  }
  session.set_draft_hook({});
  session.set_speculation(false);
  return rows;
}

// --parallel N: -r runs of N streams, each prefilled with its own -p pseudo-random tokens, then
// -n decode steps of all N together (one eval_slots pass per step) and, from the same prefills,
// the same steps taken stream by stream. Greedy, so both modes generate the same tokens (each
// slot's rows are bit-identical either way); only the time and the reads differ.
struct ParallelTimings {
  std::vector<double> batched, in_turn;          // aggregate generated tok/s
  std::vector<double> batched_mb, in_turn_mb;    // expert MB read from disk per generated token
  std::vector<double> batched_hit, in_turn_hit;  // expert-cache hit rate
};

ParallelTimings time_parallel(Session& session, const BenchOptions& o, uint32_t n_gen) {
  const ModelConfig& c = session.config();
  const uint32_t N = session.parallel(), V = c.vocab_size, chunk = session.plan().chunk;
  ParallelTimings t;
  std::vector<float> logits((size_t)std::max(N, chunk) * V);
  for (uint32_t r = 0; r < o.repetitions; ++r) {
    for (const bool batched : {true, false}) {
      std::vector<TokenId> next(N);
      for (uint32_t k = 0; k < N; ++k) {
        session.reset_slot(k);
        uint64_t x = 5000 + 131 * r + k;
        std::vector<TokenId> p(o.n_prompt);
        for (auto& tok : p) tok = (TokenId)((x = splitmix64(x)) % V);
        std::vector<std::span<const TokenId>> lists(N);
        for (size_t off = 0; off < p.size(); off += chunk) {
          const size_t len = std::min<size_t>(chunk, p.size() - off);
          lists[k] = std::span<const TokenId>(p.data() + off, len);
          session.eval_slots(lists, logits.data());
        }
        const size_t last = (p.size() - 1) % chunk;
        next[k] = argmax_lowest(std::span<const float>(logits.data() + last * V, V));
      }
      const storage::LayerStats before = session.stats().store.total();
      const auto t0 = std::chrono::steady_clock::now();
      for (uint32_t g = 0; g < n_gen; ++g) {
        std::vector<std::span<const TokenId>> lists(N);
        if (batched) {
          for (uint32_t k = 0; k < N; ++k) lists[k] = std::span<const TokenId>(&next[k], 1);
          session.eval_slots(lists, logits.data());
          for (uint32_t k = 0; k < N; ++k) next[k] = argmax_lowest(std::span<const float>(logits.data() + (size_t)k * V, V));
        } else {
          for (uint32_t k = 0; k < N; ++k) {
            lists.assign(N, {});
            lists[k] = std::span<const TokenId>(&next[k], 1);
            session.eval_slots(lists, logits.data());
            next[k] = argmax_lowest(std::span<const float>(logits.data(), V));
          }
        }
      }
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const storage::LayerStats end = session.stats().store.total();
      const double toks = (double)N * n_gen;
      const double mb = (double)(end.bytes_demand + end.bytes_prefetch - before.bytes_demand - before.bytes_prefetch) / 1e6 / toks;
      const uint64_t req = end.requests - before.requests;
      const double hit = req ? (double)(end.hits - before.hits) / (double)req : 0.0;
      (batched ? t.batched : t.in_turn).push_back(toks / dt);
      (batched ? t.batched_mb : t.in_turn_mb).push_back(mb);
      (batched ? t.batched_hit : t.in_turn_hit).push_back(hit);
    }
  }
  for (uint32_t k = 0; k < N; ++k) session.reset_slot(k);
  return t;
}

// The fixed prompt set route-bias costs are measured on: code, prose, a chat turn, numbers. Each
// is evaluated token by token (decode, where the bias acts on a warm cache), teacher-forced, so
// both routings see the same tokens and only the next-token distributions can differ.
constexpr const char* kQualityPrompts[] = {
    "def merge_sorted(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n",
    "The river had risen overnight, and by morning the old stone bridge stood alone in a field of water.",
    "User: Why does my Rust program fail to compile with a borrow checker error when I push to a vector "
    "while iterating over it?\n\nAssistant:",
    "Quarterly revenue rose 12.4% to $3.81 billion, while operating costs fell from 1,204 to 1,131 million.",
};
constexpr uint32_t kQualityTokens = 32;  // positions per prompt at most

struct RouteBiasCost {
  double kl_mean = 0, kl_max = 0, top1 = 0;
  uint64_t positions = 0;
};

// Next-token log-probabilities of each position of `prompt`, evaluated one token at a time.
std::vector<std::vector<double>> teacher_forced_logprobs(Session& session, const std::vector<TokenId>& prompt) {
  const uint32_t V = session.config().vocab_size;
  std::vector<std::vector<double>> out;
  EvalObserver obs;
  obs.on_eval = [&](uint32_t, std::span<const TokenId> toks, const float* logits, const std::vector<TokenTrace>*) {
    for (size_t i = 0; i < toks.size(); ++i) {
      const float* l = logits + i * (size_t)V;
      double mx = l[0];
      for (uint32_t v = 1; v < V; ++v) mx = std::max(mx, (double)l[v]);
      double z = 0;
      for (uint32_t v = 0; v < V; ++v) z += std::exp((double)l[v] - mx);
      const double lz = mx + std::log(z);
      std::vector<double> lp(V);
      for (uint32_t v = 0; v < V; ++v) lp[v] = (double)l[v] - lz;
      out.push_back(std::move(lp));
    }
  };
  session.reset();
  for (size_t k = 1; k <= prompt.size(); ++k) {
    GenerateRequest req;
    req.prompt.assign(prompt.begin(), prompt.begin() + (std::ptrdiff_t)k);
    req.max_tokens = 0;
    req.observer = &obs;
    session.generate(req, {}, {});
  }
  return out;
}

size_t argmax(const std::vector<double>& v) { return (size_t)(std::max_element(v.begin(), v.end()) - v.begin()); }

// KL(exact || biased) of every position's next-token distribution, and how often the top-1 token
// agrees, over the fixed prompt set. Leaves the session at route bias d.
RouteBiasCost route_bias_cost(Session& session, float d) {
  RouteBiasCost c;
  uint64_t agree = 0;
  double kl_sum = 0;
  for (const char* text : kQualityPrompts) {
    std::vector<TokenId> p = session.tokenize_prompt(text::PromptText{text, {}}, /*add_bos=*/true);
    p.resize(std::min<size_t>({p.size(), kQualityTokens, session.ctx() - 1}));
    session.set_route_bias(0.0f);
    const std::vector<std::vector<double>> ref = teacher_forced_logprobs(session, p);
    session.set_route_bias(d);
    const std::vector<std::vector<double>> got = teacher_forced_logprobs(session, p);
    for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
      double kl = 0;
      for (size_t v = 0; v < ref[i].size(); ++v) kl += std::exp(ref[i][v]) * (ref[i][v] - got[i][v]);
      kl = std::max(kl, 0.0);  // rounding can leave -1e-17 where the two agree
      kl_sum += kl;
      c.kl_max = std::max(c.kl_max, kl);
      agree += argmax(ref[i]) == argmax(got[i]);
      ++c.positions;
    }
  }
  session.reset();
  if (c.positions) {
    c.kl_mean = kl_sum / (double)c.positions;
    c.top1 = (double)agree / (double)c.positions;
  }
  return c;
}

}  // namespace

namespace {

// --fabric: the same runs in one process (every expert here) and across the job's ranks, in this
// order, with the fabric's bytes per prefill and decode token and each rank's exchange latency.
int bench_fabric(const BenchOptions& o, const ModelHeader& header, uint32_t n_gen, FabricJob& job) {
  if (o.parallel > 1 || o.engine.route_bias != 0.0f || (!o.engine.dspark.empty() && !o.engine.no_dspark))
    throw UsageError("--fabric is measured alone (not with --parallel, --route-bias or --dspark)");
  if (n_gen < 2) throw UsageError("--fabric needs -n of at least 2");
  const uint64_t ctx = (uint64_t)o.n_prompt + n_gen + 1;
  SessionOptions so = session_options(o.engine, o.model, (uint32_t)ctx);
  so.checkpoint_budget = 0;
  Timings one;
  {
    Session s(so, header);
    one = time_runs(s, o, n_gen);
  }
  so.remote = job.remote();
  Session s(std::move(so), header);
  job.start(s);
  // Bytes between the marks: prefill (run start .. first token) and decode (first token .. the
  // next run's start, or the end).
  auto sum = [&](bool out) {
    uint64_t b = 0;
    for (const PeerTraffic& t : job.traffic()) b += out ? t.work_bytes : t.result_bytes;
    return b;
  };
  uint64_t pre_out = 0, pre_in = 0, dec_out = 0, dec_in = 0, last_out = 0, last_in = 0;
  bool in_decode = false;
  const auto mark = [&](bool decode) {
    const uint64_t out = sum(true), in = sum(false);
    (in_decode ? dec_out : pre_out) += out - last_out;
    (in_decode ? dec_in : pre_in) += in - last_in;
    last_out = out, last_in = in, in_decode = decode;
  };
  const Timings t = time_runs(s, o, n_gen, {}, mark);
  mark(false);
  const std::vector<PeerTraffic> traffic = job.traffic();
  job.end();
  const double pre_tokens = (double)o.n_prompt * o.repetitions, dec_tokens = (double)(n_gen - 1) * o.repetitions;
  const Figure p1 = figure(one.pre), d1 = figure(one.dec), pn = figure(t.pre), dn = figure(t.dec);
  const bool same = one.tokens == t.tokens;
  if (o.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["fabric_ranks"] = traffic.size();
    j["placement"] = o.fabric.placement;
    j["n_prompt"] = o.n_prompt;
    j["n_gen"] = n_gen;
    j["repetitions"] = o.repetitions;
    j["single_prefill_tok_s"] = p1.median;
    j["single_decode_tok_s"] = d1.median;
    j["prefill_tok_s"] = pn.median;
    j["prefill_tok_s_min"] = pn.min;
    j["prefill_tok_s_max"] = pn.max;
    j["decode_tok_s"] = dn.median;
    j["decode_tok_s_min"] = dn.min;
    j["decode_tok_s_max"] = dn.max;
    j["fabric_bytes_out_per_prefill_token"] = pre_out / pre_tokens;
    j["fabric_bytes_in_per_prefill_token"] = pre_in / pre_tokens;
    j["fabric_bytes_out_per_decode_token"] = dec_out / dec_tokens;
    j["fabric_bytes_in_per_decode_token"] = dec_in / dec_tokens;
    j["same_tokens"] = same;
    for (size_t r = 1; r < traffic.size(); ++r) {
      j["ranks"].push_back({{"rank", r},
                            {"exchanges", traffic[r].exchanges},
                            {"terms", traffic[r].triples},
                            {"p50_us", traffic[r].p50_us},
                            {"p99_us", traffic[r].p99_us},
                            {"expert_requests", traffic[r].store_requests},
                            {"expert_hits", traffic[r].store_hits}});
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model %s: %u layers, hidden %u; %zu ranks (%s), %u runs of -p %u -n %u\n", o.model.c_str(),
              header.config.num_hidden_layers, header.config.hidden_size, traffic.size(), o.fabric.placement.c_str(),
              o.repetitions, o.n_prompt, n_gen);
  std::printf("%-12s %28s %28s\n", "", "prefill tok/s (min-max)", "decode tok/s (min-max)");
  std::printf("%-12s %12.2f (%6.2f-%6.2f) %12.2f (%6.2f-%6.2f)\n", "one process", p1.median, p1.min, p1.max, d1.median,
              d1.min, d1.max);
  std::printf("%-12s %12.2f (%6.2f-%6.2f) %12.2f (%6.2f-%6.2f)  %.2fx / %.2fx\n", "across ranks", pn.median, pn.min, pn.max,
              dn.median, dn.min, dn.max, p1.median > 0 ? pn.median / p1.median : 0, d1.median > 0 ? dn.median / d1.median : 0);
  std::printf("fabric bytes per prefill token: %.0f out, %.0f in; per decode token: %.0f out, %.0f in\n",
              pre_out / pre_tokens, pre_in / pre_tokens, dec_out / dec_tokens, dec_in / dec_tokens);
  for (size_t r = 1; r < traffic.size(); ++r)
    std::printf("rank %zu: %llu exchanges, %llu expert terms, exchange latency p50 %.0f us, p99 %.0f us, %s\n", r,
                (unsigned long long)traffic[r].exchanges, (unsigned long long)traffic[r].triples, traffic[r].p50_us,
                traffic[r].p99_us, FabricJob::store_text(traffic[r]).c_str());
  std::printf("generated tokens %s one process's\n", same ? "equal" : "DIFFER from");
  return same ? 0 : 1;
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
  if (std::unique_ptr<FabricJob> job = FabricJob::open(o.fabric, header)) {
    if (!job->coordinator()) return job->serve(session_options(o.engine, o.model, (uint32_t)ctx), header);
    try {
      return bench_fabric(o, header, n_gen, *job);
    } catch (const std::exception& e) {
      job->fail(e.what());
    }
  }

  // The memory baseline first, before the model takes its budget; the buffer is freed again.
  const ReadBandwidth rb = bench_read_bandwidth(o, threads);
  // The session's peak resident set is compared with its plan: the baseline's buffer must not count.
  const bool peak_reset = reset_peak_rss();

  if (o.parallel > 1 && n_gen == 0) throw UsageError("--parallel needs -n of at least 1");
  SessionOptions so = session_options(o.engine, o.model, (uint32_t)ctx);
  so.parallel = o.parallel;
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

  const float bias = o.engine.route_bias;
  Timings exact;
  if (bias != 0.0f) {  // the exact baseline of the same run, on the same prompts
    session.set_route_bias(0.0f);
    exact = time_runs(session, o, n_gen);
    session.set_route_bias(bias);
  }
  const bool dspark = session.stats().dspark;
  if (dspark) {
    if (o.parallel > 1 || bias != 0.0f) throw UsageError("--dspark is measured alone (not with --parallel or --route-bias)");
    if (n_gen < 8) throw UsageError("--dspark needs -n of at least 8");
    session.set_speculation(false);  // the plain runs first: the baseline and the forced drafts' tokens
  }
  const Timings t = time_runs(session, o, n_gen);
  std::vector<SpecRow> spec;
  if (dspark) spec = time_speculation(session, o, n_gen, t);
  RouteBiasCost cost;
  if (bias != 0.0f) cost = route_bias_cost(session, bias);
  ParallelTimings par;
  if (o.parallel > 1) par = time_parallel(session, o, n_gen);
  const std::vector<double>&pre = t.pre, &dec = t.dec, &disk_bytes_tok = t.disk_bytes_tok, &stall_frac = t.stall_frac;
  const Figure fp = figure(pre), fd = figure(dec), fdisk = figure(disk_bytes_tok), fstall = figure(stall_frac),
               fhit = figure(t.hit_rate);
  // Per decode token: wall = compute + stall (the time acquire() waited for reads); the disk
  // reads alone would take io at the raw rate. With I/O hidden under compute, wall is
  // max(compute, io); the overlap ratio wall / max(compute, io) says how far from that it is.
  const double ms = figure(t.ms_tok).median, stall_ms = figure(t.stall_ms_tok).median;
  const double compute_ms = ms - stall_ms;
  const double io_ms = disk.gbps > 0 ? 1e3 * fdisk.median / (disk.gbps * 1e9) : 0.0;
  const double overlap = std::max(compute_ms, io_ms) > 0 ? ms / std::max(compute_ms, io_ms) : 0.0;
  // Time per decode token cannot beat reading its weights from memory, nor (streaming) reading
  // its missed experts from the disk; with the two overlapped, the slower one is the limit.
  const double mem_s = (double)db.total() / (rb.median_gbps * 1e9);
  const double disk_s = streaming && disk.gbps > 0 ? fdisk.median / (disk.gbps * 1e9) : 0.0;
  const double roof = 1.0 / std::max(mem_s, disk_s);
  const uint32_t chunk = session.plan().chunk;
  const Plan& plan = session.plan();
  const uint64_t planned = plan.mandatory_bytes + plan.bounce_bytes + plan.cache_bytes;
  const uint64_t peak = read_self_status().hwm;
  uint64_t state_bytes = 0;
  for (const PlanLine& l : plan.mandatory)
    if (l.name == "sequence state") state_bytes = l.bytes;
  // --backend vulkan: the device's share of the runs above, and the copy rate into device memory
  // (the path of every weight and expert slot) against a host memcpy of the same bytes, measured
  // after the peak was read so its buffers are not in it.
  const SessionStats final_stats = session.stats();
  const GpuStats& gs = final_stats.gpu_stats;
  GpuCopyBandwidth gc;
  if (final_stats.gpu) gc = measure_gpu_copy(session.backend(), kGpuCopyBenchBytes, 5);
  const uint64_t gpu_looks = gs.expert_hits + gs.expert_misses + gs.expert_on_cpu;
  const double gpu_hit = gpu_looks ? (double)gs.expert_hits / (double)gpu_looks : 0.0;
  if (o.json) {
    nlohmann::json j;
    j["model"] = o.model;
    j["threads"] = threads;
    j["backend"] = o.engine.backend;
    if (final_stats.gpu) {
      j["gpu_copy_gb_s"] = gc.median_gbps;
      j["gpu_copy_gb_s_min"] = gc.min_gbps;
      j["gpu_copy_gb_s_max"] = gc.max_gbps;
      j["gpu_copy_memcpy_gb_s"] = gc.memcpy_gbps;
      j["gpu_copy_staged"] = gc.staged;
      j["gpu_linear_on_device"] = gs.linear_on_device;
      j["gpu_linear_on_host"] = gs.linear_on_host;
      j["gpu_submissions"] = gs.submissions;
      j["gpu_scratch_on_device"] = gs.scratch_on_device;  // the batch's rows in device memory, read back by copy
      j["gpu_bytes_read_back"] = gs.bytes_read_back;
      // Attention rows kept on the device between steps (--gpu-kv): read from a slot, copied in,
      // staged with their batch.
      j["gpu_kv_bytes"] = gs.kv_bytes;
      j["gpu_kv_hits"] = gs.kv_hits;
      j["gpu_kv_misses"] = gs.kv_misses;
      j["gpu_kv_upload_bytes"] = gs.kv_upload_bytes;
      j["gpu_kv_staged"] = gs.kv_staged;
      j["gpu_index_on_device"] = gs.index_on_device;  // index_select calls scored on the device (--gpu-indexer)
      j["gpu_linears"] = gs.subgroup_linears ? "subgroup" : "plain";
      j["gpu_subgroup_size"] = gs.subgroup_size;
      j["gpu_int_dot"] = gs.int_dot;  // the linears' integer dot product builds (--gpu-int-dot)
      j["gpu_gemm_dispatches"] = gs.gemm_dispatches;
      j["gpu_expert_slots"] = gs.expert_slots;
      j["gpu_expert_hit_rate"] = gpu_hit;
      j["gpu_expert_upload_bytes"] = gs.expert_upload_bytes;
      j["gpu_expert_upload_s"] = (double)gs.expert_upload_ns() / 1e9;  // the host's time copying misses in
      j["gpu_expert_on_cpu"] = gs.expert_on_cpu;
      j["gpu_expert_uploads_hinted"] = gs.expert_uploads_hinted;  // hint-started copies (unmapped slots)
      j["gpu_expert_hints_used"] = gs.expert_hints_used;
      j["gpu_expert_hints_dropped"] = gs.expert_hints_dropped;
      j["gpu_experts_in_place"] = gs.experts_in_place;
      j["gpu_experts_auto"] = gs.experts_auto;  // how --gpu-experts auto chose ("" when given)
      j["gpu_expert_in_place"] = gs.expert_in_place;
      j["gpu_expert_in_place_refused"] = gs.expert_in_place_refused;
    }
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
    j["peak_rss_bytes"] = peak;
    j["peak_rss_since_session"] = peak_reset;  // false: the peak includes the read baseline's buffer
    j["planned_bytes"] = planned;
    j["sequence_state_bytes"] = state_bytes;
    if (!t.engram_hit.empty()) j["engram_hit_rate"] = figure(t.engram_hit).median;
    if (streaming) {
      j["disk_gbps"] = disk.gbps;
      j["disk_bytes_per_token"] = fdisk.median;
      j["stall_fraction"] = fstall.median;
      j["hit_rate"] = fhit.median;
      j["decode_ms_per_token"] = ms;
      j["compute_ms_per_token"] = compute_ms;
      j["stall_ms_per_token"] = stall_ms;
      j["io_ms_per_token"] = io_ms;
      j["overlap_ratio"] = overlap;
      if (!disk_note.empty()) j["disk_note"] = disk_note;
    }
    if (bias != 0.0f) {
      j["route_bias"] = bias;
      j["exact_prefill_tok_s"] = figure(exact.pre).median;
      j["exact_decode_tok_s"] = figure(exact.dec).median;
      j["exact_hit_rate"] = figure(exact.hit_rate).median;
      j["kl_mean"] = cost.kl_mean;
      j["kl_max"] = cost.kl_max;
      j["top1_agreement"] = cost.top1;
      j["quality_positions"] = cost.positions;
    }
    if (dspark) {
      nlohmann::json a = nlohmann::json::array();
      for (const SpecRow& r : spec)
        a.push_back({{"mode", r.mode}, {"forced_rate", r.rate}, {"decode_tok_s", r.dec.median},
                     {"decode_tok_s_min", r.dec.min}, {"decode_tok_s_max", r.dec.max}, {"acceptance", r.acceptance},
                     {"tokens_per_cycle", r.tokens_per_cycle}, {"cycles", r.cycles},
                     {"over_plain", fd.median > 0 ? r.dec.median / fd.median : 0.0}});
      j["dspark"] = a;
    }
    if (o.parallel > 1) {
      j["parallel"] = o.parallel;
      j["parallel_batched_tok_s"] = figure(par.batched).median;
      j["parallel_batched_tok_s_min"] = figure(par.batched).min;
      j["parallel_batched_tok_s_max"] = figure(par.batched).max;
      j["parallel_in_turn_tok_s"] = figure(par.in_turn).median;
      j["parallel_batched_over_one_stream"] = fd.median > 0 ? figure(par.batched).median / fd.median : 0.0;
      if (streaming) {
        j["parallel_batched_disk_mb_per_token"] = figure(par.batched_mb).median;
        j["parallel_in_turn_disk_mb_per_token"] = figure(par.in_turn_mb).median;
        j["parallel_batched_hit_rate"] = figure(par.batched_hit).median;
        j["parallel_in_turn_hit_rate"] = figure(par.in_turn_hit).median;
      }
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model %s: %u layers, hidden %u; backend %s, isa %s, threads %d, chunk %u, %u runs\n", o.model.c_str(),
              c.num_hidden_layers, c.hidden_size, o.engine.backend.c_str(), std::string(isa_name(active_isa())).c_str(),
              threads, chunk, o.repetitions);
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
  std::printf("memory        peak RSS %s of the plan's %s (sequence state %s at ctx %llu)%s\n",
              format_bytes(peak).c_str(), format_bytes(planned).c_str(), format_bytes(state_bytes).c_str(),
              (unsigned long long)ctx, peak_reset ? "" : "; the peak includes the read baseline's buffer");
  if (final_stats.gpu) {
    std::printf("GPU copy      host -> device %.2f GB/s (min %.2f, max %.2f; %s MiB %s), host memcpy %.2f GB/s in the "
                "same run, ratio %.2f\n",
                gc.median_gbps, gc.min_gbps, gc.max_gbps, std::to_string(gc.bytes >> 20).c_str(),
                gc.staged ? "through the staging buffer" : "into mapped device memory", gc.memcpy_gbps,
                gc.memcpy_gbps > 0 ? gc.median_gbps / gc.memcpy_gbps : 0.0);
    char upload_s[32];  // the host's time copying slot misses in
    std::snprintf(upload_s, sizeof upload_s, "%.3f", (double)gs.expert_upload_ns() / 1e9);
    std::printf("GPU share     linear %llu on the device (quantized ones %s), %llu on the CPU; routed experts %s\n",
                (unsigned long long)gs.linear_on_device,
                gpu_linears_text(gs).c_str(),
                (unsigned long long)gs.linear_on_host,
                gs.expert_slots ? ("in " + std::to_string(gs.expert_slots) + " device slots, hit rate " +
                                   std::to_string((int)std::lround(100 * gpu_hit)) + "% (" + std::to_string(gs.expert_hits) +
                                   "/" + std::to_string(gpu_looks) + "), " + format_bytes(gs.expert_upload_bytes) +
                                   " copied in (" + upload_s + " s), " +
                                   std::to_string(gs.expert_on_cpu) +
                                   " misses computed on the CPU (all runs)")
                                      .c_str()
                : gs.experts_in_place
                    ? ("on the device in place, " + std::to_string(gs.expert_in_place) +
                       " runs from the host store's memory (" + format_bytes(gs.expert_bytes_mapped) + " mapped, no copies), " +
                       std::to_string(gs.expert_in_place_refused) + " on the CPU (all runs)")
                          .c_str()
                    : "on the CPU");
    if (gs.kv_bytes) {
      const uint64_t rows = gs.kv_hits + gs.kv_misses + gs.kv_staged;
      std::printf("GPU kept rows %llu attention-row slots (%s, --gpu-kv): %.1f%% read from a slot (%llu/%llu), %s "
                  "copied in, %llu staged with their batch (all runs)\n",
                  (unsigned long long)gs.kv_slots, format_bytes(gs.kv_bytes).c_str(),
                  rows ? 100.0 * (double)gs.kv_hits / (double)rows : 0.0, (unsigned long long)gs.kv_hits,
                  (unsigned long long)rows, format_bytes(gs.kv_upload_bytes).c_str(), (unsigned long long)gs.kv_staged);
    }
  }
  if (streaming && !t.hit_rate.empty()) {
    std::printf("decode expert-cache hit rate %.1f%% (min %.1f, max %.1f)\n", 100 * fhit.median, 100 * fhit.min,
                100 * fhit.max);
    std::printf("decode per token %.2f ms = compute %.2f + stall %.2f; its disk reads alone take %.2f ms at the raw "
                "rate; time / max(compute, disk) = %.2f (1.00: reads fully hidden)\n",
                ms, compute_ms, stall_ms, io_ms, overlap);
  }
  if (!t.engram_hit.empty()) {
    const Figure fe = figure(t.engram_hit);
    std::printf("decode Engram rows from the row cache %.1f%% (min %.1f, max %.1f; %llu rows per table)\n",
                100 * fe.median, 100 * fe.min, 100 * fe.max, (unsigned long long)session.stats().engram_cache_rows);
  }
  if (dspark) {
    std::printf("DSpark speculative decode vs the plain decode above (same prompts, greedy, same tokens):\n");
    std::printf("  %-22s %10s %12s %22s %9s\n", "drafts", "accepted", "tokens/cycle", "decode tok/s (min-max)", "vs plain");
    double prev_acc = -1, prev_ratio = 0, break_even = -1;
    for (const SpecRow& r : spec) {
      char name[64];
      if (r.rate < 0) std::snprintf(name, sizeof name, "%s", r.mode.c_str());
      else std::snprintf(name, sizeof name, "forced, %3.0f%% right", 100 * r.rate);
      const double ratio = fd.median > 0 ? r.dec.median / fd.median : 0.0;
      std::printf("  %-22s %9.1f%% %12.2f %10.2f (%.2f-%.2f) %8.2fx\n", name, 100 * r.acceptance, r.tokens_per_cycle,
                  r.dec.median, r.dec.min, r.dec.max, ratio);
      if (r.rate >= 0) {
        if (break_even < 0 && ratio >= 1.0)
          break_even = prev_acc < 0 ? r.acceptance
                                    : prev_acc + (1.0 - prev_ratio) * (r.acceptance - prev_acc) / std::max(ratio - prev_ratio, 1e-9);
        prev_acc = r.acceptance, prev_ratio = ratio;
      }
    }
    if (break_even >= 0) std::printf("  break-even: speculation pays from about %.0f%% of drafts accepted\n", 100 * break_even);
    else std::printf("  break-even: not reached (speculation did not pay even with every draft right)\n");
  }
  if (o.parallel > 1) {
    const Figure b = figure(par.batched), it = figure(par.in_turn);
    std::printf("parallel %u streams, %u tokens each: batched %.2f tok/s aggregate (min %.2f, max %.2f), in turn %.2f "
                "(min %.2f, max %.2f); batched / in turn %.2fx, batched / one stream's decode %.2fx\n",
                o.parallel, n_gen, b.median, b.min, b.max, it.median, it.min, it.max, it.median > 0 ? b.median / it.median : 0.0,
                fd.median > 0 ? b.median / fd.median : 0.0);
    if (streaming)
      std::printf("parallel expert reads: batched %.1f MB per generated token (hit rate %.1f%%), in turn %.1f MB "
                  "(hit rate %.1f%%), one stream %.1f MB\n",
                  figure(par.batched_mb).median, 100 * figure(par.batched_hit).median, figure(par.in_turn_mb).median,
                  100 * figure(par.in_turn_hit).median, fdisk.median / 1e6);
  }
  if (bias != 0.0f) {
    const Figure ep = figure(exact.pre), ed = figure(exact.dec), eh = figure(exact.hit_rate);
    std::printf("route bias %g (LOSSY) against exact routing in the same run:\n", (double)bias);
    std::printf("  exact   prefill %.2f tok/s, decode %.2f tok/s (min %.2f, max %.2f), hit rate %.1f%%\n", ep.median,
                ed.median, ed.min, ed.max, 100 * eh.median);
    std::printf("  biased  prefill %.2f tok/s, decode %.2f tok/s (min %.2f, max %.2f), hit rate %.1f%%\n", fp.median,
                fd.median, fd.min, fd.max, 100 * fhit.median);
    std::printf("  cost on %llu teacher-forced positions of %zu fixed prompts: KL(exact || biased) mean %.4g nats, "
                "max %.4g; top-1 agreement %.1f%%\n",
                (unsigned long long)cost.positions, std::size(kQualityPrompts), cost.kl_mean, cost.kl_max,
                100 * cost.top1);
  }
  return 0;
}

}  // namespace sluice::cli
