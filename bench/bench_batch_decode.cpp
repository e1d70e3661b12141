// Batched decode through the SSD expert store (issue 13 item 1): N streams decoding together
// (Engine::eval_batch, one pass per step, each layer's routed-expert union leased once) against
// the same N streams decoded one at a time, in turn (what a server without batching does), both
// through a fresh store with a cache of ~25% of the experts, O_DIRECT, on bench_decode_streamed's
// model. Printed per N: aggregate generated tok/s, expert bytes read per generated token, the
// store's hit rate, the ratio batched / in turn, and the disk's raw random-read speed measured in
// the same run as the limit (the time the step's expert reads take at raw speed).
// Runs `--runs` times and prints the median with min and max.
//
// With `--text FILE...` (a trained model's held-out files, issue 52) stream k reads file k: its
// prompt is the file's first --prompt tokens and each step feeds the file's next token
// (teacher-forced), so the experts are those a real model routes real text to. The bytes the
// streams share are then the in-turn bytes per token less the batched ones, as a share.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/bench_stats.h"
#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "model/streamed_experts.h"
#include "runtime/sampler.h"
#include "storage/expert_store.h"
#include "storage/raw_read_bandwidth.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/read_file.h"

using namespace sluice;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Result {
  double tok_s = 0, mb_per_token = 0, hit_rate = 0, read_s = 0;
};

// The median, min and max of the runs (cli/bench_stats.h, as sluice bench reports them).
struct Stat {
  double med = 0, lo = 0, hi = 0;
};
Stat stat(std::vector<double> v) {
  const cli::Figure f = cli::figure(std::move(v));
  return Stat{f.median, f.min, f.max};
}

std::vector<TokenId> prompt(uint32_t k, uint32_t len, uint32_t vocab) {
  std::vector<TokenId> p;
  for (uint32_t i = 0; i < len; ++i) p.push_back((i * 7919u + 1009u * k + 13u) % vocab);
  return p;
}

// Each stream's tokens: synthetic ids (then greedy decode picks what follows), or a text file's
// (prompt and every token fed after it).
struct Streams {
  std::vector<std::vector<TokenId>> text;  // empty: synthetic prompts, greedy decode
  std::vector<TokenId> prompt(uint32_t k, uint32_t len, uint32_t vocab) const {
    if (text.empty()) return ::prompt(k, len, vocab);
    const std::vector<TokenId>& t = text[k % text.size()];
    return std::vector<TokenId>(t.begin(), t.begin() + len);
  }
  // The token fed at step g: the file's, or the model's greedy choice.
  TokenId next(uint32_t k, uint32_t len, uint32_t g, TokenId greedy) const {
    return text.empty() ? greedy : text[k % text.size()][len + g];
  }
};

Streams read_streams(const std::vector<std::string>& files, const Model& m, uint32_t need) {
  Streams s;
  const text::Tokenizer tok = text::Tokenizer::from_gguf(m.file);
  for (const std::string& f : files) {
    s.text.push_back(tok.encode(read_regular_file_bounded(f, 64ull << 20, "a --text file"), true, false));
    if (s.text.back().size() < need)
      throw Error(f + " has " + std::to_string(s.text.back().size()) + " tokens; --prompt + --gen need " +
                  std::to_string(need));
  }
  return s;
}

// N streams: prompts prefilled one by one (not timed), then `gen` tokens each, batched or in turn.
Result run(const Model& m, const storage::StoreOptions& so, int threads, uint32_t N, uint32_t prompt_len,
           uint32_t gen, bool batched, const Streams& streams) {
  const ModelConfig& c = m.config;
  const uint32_t V = c.vocab_size;
  // Hints in flight cover the batch's union: top_k x 2 per stream, as bench_decode_streamed gives one.
  storage::StoreOptions o = so;
  o.prefetch_budget_bytes = so.prefetch_budget_bytes * N;
  auto store = open_expert_store(m, o);
  StreamedExperts src(*store);
  EngineOptions eo;
  eo.threads = threads;
  eo.ctx = prompt_len + gen + 1;
  eo.chunk = std::max<uint32_t>(N, 1);
  eo.experts = &src;
  Engine eng(m, eo);
  std::vector<SequenceState> st;
  std::vector<TokenId> next(N);
  std::vector<float> logits((size_t)N * V);
  for (uint32_t k = 0; k < N; ++k) {
    st.push_back(eng.new_sequence());
    const std::vector<TokenId> p = streams.prompt(k, prompt_len, V);
    eng.eval(st[k], std::span<const TokenId>(p.data(), p.size() - 1), nullptr);
    eng.eval(st[k], std::span<const TokenId>(&p.back(), 1), logits.data());
    next[k] = streams.next(k, prompt_len, 0, argmax_lowest(std::span<const float>(logits.data(), V)));
  }
  store->reset_stats();
  const double t0 = now_s();
  for (uint32_t g = 0; g < gen; ++g) {
    if (batched) {
      std::vector<Engine::BatchItem> items;
      for (uint32_t k = 0; k < N; ++k) items.push_back({&st[k], std::span<const TokenId>(&next[k], 1)});
      eng.eval_batch(items, logits.data());
      for (uint32_t k = 0; k < N; ++k)
        next[k] = streams.next(k, prompt_len, g + 1, argmax_lowest(std::span<const float>(logits.data() + (size_t)k * V, V)));
    } else {
      for (uint32_t k = 0; k < N; ++k) {
        eng.eval(st[k], std::span<const TokenId>(&next[k], 1), logits.data());
        next[k] = streams.next(k, prompt_len, g + 1, argmax_lowest(std::span<const float>(logits.data(), V)));
      }
    }
  }
  const double dt = now_s() - t0;
  src.release();
  const storage::LayerStats d = store->stats().total();
  const double toks = (double)N * gen;
  Result r;
  r.tok_s = toks / dt;
  r.mb_per_token = (double)(d.bytes_demand + d.bytes_prefetch) / 1e6 / toks;
  r.hit_rate = d.requests ? (double)d.hits / d.requests : 0.0;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string file = "/var/tmp/sluice-bench-decode.gguf";
  uint32_t prompt_len = 16, gen = 16, qd = 16, runs = 3;
  double cache_fraction = 0.25, raw_seconds = 3;
  int threads = 0;
  std::vector<uint32_t> ns{1, 2, 4};
  std::vector<std::string> texts;
  CLI::App app{"batched decode of N streams vs the same streams in turn, through a 25% expert cache"};
  app.add_option("--file", file, "model (make it with bench_decode_streamed, which generates it when missing)");
  app.add_option("--prompt", prompt_len);
  app.add_option("--gen", gen, "tokens generated per stream");
  app.add_option("--qd", qd);
  app.add_option("--cache-fraction", cache_fraction);
  app.add_option("--raw-seconds", raw_seconds);
  app.add_option("--runs", runs)->check(CLI::Range(1u, 99u));
  app.add_option("-n,--streams", ns, "stream counts to measure");
  app.add_option("-t,--threads", threads);
  app.add_option("--text", texts, "text files: stream k reads file k, teacher-forced (a trained model's held-out text)");
  CLI11_PARSE(app, argc, argv);
  try {
    struct stat sb {};
    if (::stat(file.c_str(), &sb) != 0) {
      std::fprintf(stderr, "error: %s is missing: run build/bench_decode_streamed once to generate it\n", file.c_str());
      return 1;
    }
    LoadOptions lo;
    lo.resident_experts = false;
    std::unique_ptr<Model> m = load_model(file, lo);
    const ModelConfig& c = m->config;
    const Streams streams = read_streams(texts, *m, prompt_len + gen + 1);
    if (threads <= 0) threads = (int)std::max(1u, std::thread::hardware_concurrency());
    const uint64_t total_experts = (uint64_t)c.num_hidden_layers * c.n_routed_experts;
    storage::StoreOptions so;
    so.policy = storage::EvictionKind::LruGlobal;
    so.cache_bytes = UINT64_MAX;
    so.max_slots = (uint32_t)std::max<uint64_t>(c.num_experts_per_tok, (uint64_t)(cache_fraction * total_experts));
    so.queue_depth = qd;
    const storage::ExpertGeometry g = storage::expert_geometry(m->file, c.num_hidden_layers, c.n_routed_experts);
    so.prefetch_budget_bytes = storage::bytes_needed(g, so).slot_bytes * c.num_experts_per_tok * 2;  // per stream
    const uint64_t region_begin = g.layers[0][0].file_offset;
    const uint64_t region_end = g.layers.back()[2].file_offset + g.layers.back()[2].nbytes;
    std::printf("model %s: %llu experts of %.2f MB, cache %u slots (%.0f%%), %d threads, prompt %u, %u tokens per stream, "
                "%u runs\n",
                file.c_str(), (unsigned long long)total_experts, (double)g.load_bytes(0, 0) / 1e6, so.max_slots,
                100.0 * so.max_slots / total_experts, threads, prompt_len, gen, runs);
    std::printf("%7s %-8s %22s %24s %10s %26s %12s\n", "streams", "mode", "aggregate tok/s", "MB read / token", "hit rate",
                "tok/s at raw disk speed", "vs in turn");
    double one_stream = 0;
    for (uint32_t N : ns) {
      std::vector<double> tb, tt, mbb, mbt, hb, limit, raw_gbps;
      for (uint32_t r = 0; r < runs; ++r) {
        const storage::RawReadResult raw =
            storage::raw_direct_reads(file, region_begin, region_end, qd, raw_seconds, 7 + r);
        const Result in_turn = run(*m, so, threads, N, prompt_len, gen, false, streams);
        const Result batch = run(*m, so, threads, N, prompt_len, gen, true, streams);
        tt.push_back(in_turn.tok_s);
        tb.push_back(batch.tok_s);
        mbt.push_back(in_turn.mb_per_token);
        mbb.push_back(batch.mb_per_token);
        hb.push_back(batch.hit_rate);
        raw_gbps.push_back(raw.gbps);
        // The disk alone, at its raw random-read speed, for the bytes the batch read per token.
        limit.push_back(batch.mb_per_token > 0 ? raw.gbps * 1e3 / batch.mb_per_token : 0.0);
      }
      const Stat sb1 = stat(tb), st1 = stat(tt), mb1 = stat(mbb), mt1 = stat(mbt), h1 = stat(hb), l1 = stat(limit);
      if (N == 1) one_stream = st1.med;
      std::vector<double> ratio;
      for (size_t i = 0; i < tb.size(); ++i) ratio.push_back(tb[i] / tt[i]);
      const Stat rt = stat(ratio);
      std::printf("%7u %-8s %8.2f (%5.2f-%5.2f) %10.1f (%5.1f-%5.1f) %9.1f%% %12.2f (%5.2f-%5.2f) %5.2fx (%4.2f-%4.2f)\n", N,
                  "batched", sb1.med, sb1.lo, sb1.hi, mb1.med, mb1.lo, mb1.hi, 100 * h1.med, l1.med, l1.lo, l1.hi, rt.med,
                  rt.lo, rt.hi);
      std::printf("%7u %-8s %8.2f (%5.2f-%5.2f) %10.1f (%5.1f-%5.1f)\n", N, "in turn", st1.med, st1.lo, st1.hi, mt1.med,
                  mt1.lo, mt1.hi);
      if (N > 1 && mt1.med > 0)
        std::printf("        expert bytes the %u streams shared: %.1f%% (1 - batched / in turn, per token)\n", N,
                    100.0 * (1.0 - mb1.med / mt1.med));
      if (one_stream > 0 && N > 1)
        std::printf("        %u streams batched / one stream: %.2fx (target for 4: >= 2.5x)\n", N, sb1.med / one_stream);
      const Stat rg = stat(raw_gbps);
      std::printf("        raw 1 MiB O_DIRECT random reads: %.3f GB/s (%.3f-%.3f)\n", rg.med, rg.lo, rg.hi);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
