// `sluice run`: prefill a prompt of token ids, then generate token by token (greedy or sampled),
// optionally dumping every evaluated position's logits and routing trace.
#include "cli/cmd_run.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "model/config.h"
#include "model/forward.h"
#include "model/model.h"
#include "runtime/sampler.h"
#include "util/error.h"

namespace sluice::cli {
namespace {

static_assert(std::endian::native == std::endian::little, "--dump-logits writes host floats as little-endian");
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

// The signal that asked us to stop (0: none). Set by the handler, read between tokens.
std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig, std::memory_order_relaxed); }

// SIGTERM/SIGINT set the flag for the duration of a run. SA_RESETHAND: a second signal takes the
// default action, so a stuck run can still be killed by repeating it.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    sigaction(SIGTERM, &sa, &old_term_);
    sigaction(SIGINT, &sa, &old_int_);
  }
  ~StopSignals() {
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGINT, &old_int_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  static int raised() { return g_stop_signal.load(std::memory_order_relaxed); }

 private:
  struct sigaction old_term_ {}, old_int_ {};
};

const char* signal_name(int sig) { return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "signal"; }

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
// A failed run leaves neither file behind.
class LogitsDump {
 public:
  LogitsDump(std::string path, uint32_t vocab, uint32_t prompt) : path_(std::move(path)), vocab_(vocab), prompt_(prompt) {
    f_ = std::fopen(path_.c_str(), "wb");
    if (!f_) throw Error("cannot create " + path_ + ": " + std::strerror(errno));
  }
  ~LogitsDump() {
    if (!f_) return;
    std::fclose(f_);
    std::error_code ec;
    std::filesystem::remove(path_, ec);
    std::filesystem::remove(path_ + ".json", ec);
  }
  LogitsDump(const LogitsDump&) = delete;
  LogitsDump& operator=(const LogitsDump&) = delete;

  void rows(std::span<const uint32_t> tokens, const float* logits) {
    const size_t n = tokens.size() * (size_t)vocab_;
    if (std::fwrite(logits, sizeof(float), n, f_) != n) throw Error("cannot write " + path_ + ": " + std::strerror(errno));
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  }
  void finish() {
    std::FILE* f = f_;
    f_ = nullptr;
    try {
      if (std::fclose(f) != 0) throw Error("cannot write " + path_ + ": " + std::strerror(errno));
      write_meta();
    } catch (...) {
      std::error_code ec;
      std::filesystem::remove(path_, ec);
      std::filesystem::remove(path_ + ".json", ec);
      throw;
    }
  }

 private:
  void write_meta() const {
    nlohmann::json j;
    j["rows"] = tokens_.size();
    j["vocab"] = vocab_;
    j["prompt_tokens"] = std::min<size_t>(prompt_, tokens_.size());
    j["tokens"] = tokens_;
    const std::string meta = path_ + ".json";
    std::FILE* m = std::fopen(meta.c_str(), "wb");
    const std::string text = j.dump() + "\n";
    const bool ok = m && std::fwrite(text.data(), 1, text.size(), m) == text.size();
    if (m && std::fclose(m) != 0 && ok) throw Error("cannot write " + meta + ": " + std::strerror(errno));
    if (!ok) throw Error("cannot write " + meta + ": " + std::strerror(errno));
  }

  std::string path_;
  uint32_t vocab_, prompt_;
  std::FILE* f_ = nullptr;
  std::vector<uint32_t> tokens_;
};

// DIR/trace.jsonl: one JSON object per evaluated position, written as positions are evaluated
// (a failed run keeps what it traced, which is what one wants when debugging it).
class TraceFile {
 public:
  explicit TraceFile(const std::string& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error("cannot create trace directory " + dir + ": " + ec.message());
    path_ = (std::filesystem::path(dir) / "trace.jsonl").string();
    f_ = std::fopen(path_.c_str(), "wb");
    if (!f_) throw Error("cannot create " + path_ + ": " + std::strerror(errno));
  }
  ~TraceFile() {
    if (f_) std::fclose(f_);
  }
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;

  void positions(uint32_t first_pos, std::span<const uint32_t> tokens, const std::vector<TokenTrace>& tr) {
    if (tr.size() != tokens.size())
      throw Error("internal: " + std::to_string(tr.size()) + " traces for " + std::to_string(tokens.size()) + " tokens");
    for (size_t i = 0; i < tr.size(); ++i) {
      nlohmann::json j;
      j["pos"] = first_pos + i;
      j["token"] = tokens[i];
      j["engram_rows"] = tr[i].engram_rows;
      j["experts"] = tr[i].experts;
      j["expert_weights"] = tr[i].expert_weights;
      j["selected_rows"] = tr[i].selected_rows;
      const std::string line = j.dump() + "\n";
      if (std::fwrite(line.data(), 1, line.size(), f_) != line.size())
        throw Error("cannot write " + path_ + ": " + std::strerror(errno));
    }
    if (std::fflush(f_) != 0) throw Error("cannot write " + path_ + ": " + std::strerror(errno));
  }
  void finish() {
    std::FILE* f = f_;
    f_ = nullptr;
    if (std::fclose(f) != 0) throw Error("cannot write " + path_ + ": " + std::strerror(errno));
  }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

// Generated ids go to stdout as they come (one line, space-separated), so a reader sees progress
// and an interrupted run still ends its line.
class IdPrinter {
 public:
  ~IdPrinter() {
    if (count_ > 0) end();  // a failed run ends the partial line; one that printed nothing stays silent
  }
  void id(uint32_t t) {
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

CLI::App* setup_run(CLI::App& app, RunOptions& o) {
  CLI::App* sub = app.add_subcommand("run", "Run the CPU forward pass on token ids and generate");
  sub->footer(
      "Output: the generated ids on stdout, one line, space-separated (an end-of-sequence token that\n"
      "stops generation is printed); a summary with prompt and generation tok/s on stderr.\n"
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
      "Context (-c): defaults to prompt + n, bounded by max_position_embeddings; state for it is\n"
      "allocated up front.");
  sub->add_option("-m,--model", o.model, "deepseek41 GGUF file")->required();
  sub->add_option("--tokens", o.tokens, "prompt token ids, comma-separated, e.g. 0,15,27")->required();
  sub->add_option("-n,--n-predict", o.n_predict, "tokens to generate")->required();
  sub->add_option("--temp", o.temp, "temperature; 0 = greedy (default 0)");
  sub->add_option("--top-p", o.top_p, "nucleus mass in (0, 1] (default 1.0)");
  sub->add_option("--seed", o.seed, "sampler seed (default 0)");
  sub->add_option("--chunk", o.chunk, "prompt tokens processed together (default 64)");
  sub->add_option("-t,--threads", o.threads, "worker threads; 0 = all cores (default 0)");
  sub->add_option("-c,--ctx-size", o.ctx, "context positions; 0 = prompt + n (default 0)");
  sub->add_flag("--ignore-eos", o.ignore_eos, "keep generating after eos_token_id");
  sub->add_option("--dump-logits", o.dump_logits, "write every evaluated position's logits to this file");
  sub->add_option("--trace", o.trace_dir, "write per-position routing to DIR/trace.jsonl");
  return sub;
}

int run_run(const RunOptions& o) {
  using Clock = std::chrono::steady_clock;
  const StopSignals stop_signals;  // first: a signal during the (long) load still ends cleanly

  if (o.n_predict < 0) throw UsageError("-n must be >= 0 (got " + std::to_string(o.n_predict) + ")");
  if (o.chunk == 0) throw UsageError("--chunk must be at least 1");
  if (o.threads < 0) throw UsageError("-t must be >= 0 (got " + std::to_string(o.threads) + "; 0 = all cores)");
  const std::vector<uint64_t> ids = parse_token_list(o.tokens);
  SamplerOptions so{o.temp, o.top_p, o.seed};
  try {
    validate(so);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  const uint64_t n_predict = (uint64_t)o.n_predict;
  const uint64_t prompt_n = ids.size();
  if (o.ctx != 0 && prompt_n + n_predict > o.ctx)
    throw UsageError("prompt (" + std::to_string(prompt_n) + " tokens) + -n " + std::to_string(n_predict) +
                     " exceeds the context -c " + std::to_string(o.ctx));

  // The header alone settles the checks that depend on the model, before the weights are read.
  const auto t_load = Clock::now();
  ModelConfig cfg;
  {
    const gguf::File header = open_gguf(o.model);
    try {
      cfg = config_from_gguf(header);
    } catch (const Error& e) {
      throw Error(o.model + ": " + e.what());
    }
  }
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= cfg.vocab_size)
      throw Error("--tokens: id " + std::to_string(ids[i]) + " (item " + std::to_string(i + 1) +
                  ") is not below the model's vocabulary size " + std::to_string(cfg.vocab_size));
  const uint64_t max_pos = cfg.max_position_embeddings;
  if (o.ctx > max_pos)
    throw Error("-c " + std::to_string(o.ctx) + " exceeds the model's max_position_embeddings " + std::to_string(max_pos));
  if (prompt_n + n_predict > max_pos)
    throw Error("prompt (" + std::to_string(prompt_n) + " tokens) + -n " + std::to_string(n_predict) +
                " exceeds the model's max_position_embeddings " + std::to_string(max_pos));
  const uint64_t ctx = o.ctx != 0 ? o.ctx : prompt_n + n_predict;
  if (ctx > UINT32_MAX) throw Error("context " + std::to_string(ctx) + " is too large");

  const std::unique_ptr<Model> model = load_model(o.model);
  const ModelConfig& c = model_config(*model);
  const uint32_t V = c.vocab_size;
  if (V != cfg.vocab_size) throw Error(o.model + ": vocabulary size changed while loading");
  EngineOptions eo;
  eo.threads = o.threads > 0 ? o.threads : std::max(1, (int)std::thread::hardware_concurrency());
  eo.ctx = (uint32_t)ctx;
  eo.chunk = o.chunk;
  const Engine engine(*model, eo);
  SequenceState state = engine.new_sequence();
  Sampler sampler(so);
  const double load_s = seconds_since(t_load);

  std::vector<uint32_t> prompt(ids.begin(), ids.end());
  std::unique_ptr<LogitsDump> dump;
  if (!o.dump_logits.empty()) dump = std::make_unique<LogitsDump>(o.dump_logits, V, (uint32_t)prompt_n);
  std::unique_ptr<TraceFile> trace;
  if (!o.trace_dir.empty()) trace = std::make_unique<TraceFile>(o.trace_dir);
  std::vector<TokenTrace> traces;
  std::vector<float> logits;
  IdPrinter out;

  // Prefill in chunk-aligned pieces: the Engine splits one eval() call at the same boundaries, so
  // this costs the same weight passes while bounding the logits buffer to one chunk and letting a
  // signal stop between chunks. Logits are only computed where needed (the last piece, or every
  // piece when dumping).
  const auto t_prefill = Clock::now();
  uint64_t prefilled = 0;
  bool have_next = false;
  std::string stop = "length";
  while (prefilled < prompt_n) {
    if (const int sig = StopSignals::raised()) {
      stop = std::string(signal_name(sig)) + " during prefill";
      break;
    }
    const uint64_t n = std::min<uint64_t>(o.chunk, prompt_n - prefilled);
    const bool last = prefilled + n == prompt_n;
    const bool want = dump || (last && n_predict > 0);
    const std::span<const uint32_t> piece(prompt.data() + prefilled, n);
    logits.resize(want ? n * V : 0);
    traces.clear();
    engine.eval(state, piece, want ? logits.data() : nullptr, trace ? &traces : nullptr);
    if (dump) dump->rows(piece, logits.data());
    if (trace) trace->positions((uint32_t)prefilled, piece, traces);
    prefilled += n;
    have_next = last && n_predict > 0;
  }
  const double prefill_s = seconds_since(t_prefill);

  // Decode: sample from the last row, feed the token back, repeat.
  const auto t_decode = Clock::now();
  std::vector<uint32_t> generated;
  uint64_t decode_evals = 0;
  if (have_next) {
    const float* row = logits.data() + logits.size() - V;
    while (true) {
      const uint32_t next = sampler.sample(std::span<const float>(row, V));
      generated.push_back(next);
      out.id(next);
      if (!o.ignore_eos && next == c.eos_token_id) { stop = "eos"; break; }
      if (generated.size() == n_predict) { stop = "length"; break; }
      if (const int sig = StopSignals::raised()) { stop = signal_name(sig); break; }
      const uint32_t pos = state.position();
      logits.resize(V);
      traces.clear();
      engine.eval(state, std::span<const uint32_t>(&next, 1), logits.data(), trace ? &traces : nullptr);
      ++decode_evals;
      if (dump) dump->rows(std::span<const uint32_t>(&next, 1), logits.data());
      if (trace) trace->positions(pos, std::span<const uint32_t>(&next, 1), traces);
      row = logits.data();
    }
  }
  const double decode_s = seconds_since(t_decode);
  out.end();
  if (dump) dump->finish();
  if (trace) trace->finish();

  std::fprintf(stderr,
               "sluice run: prompt %llu/%llu tokens in %.3f s (%s) | generated %zu tokens, %llu decode steps "
               "in %.3f s (%s) | stop: %s | load %.3f s, %d threads, ctx %llu, chunk %u\n",
               (unsigned long long)prefilled, (unsigned long long)prompt_n, prefill_s,
               rate((double)prefilled, prefill_s).c_str(), generated.size(), (unsigned long long)decode_evals,
               decode_s, rate((double)decode_evals, decode_s).c_str(), stop.c_str(), load_s, eo.threads,
               (unsigned long long)ctx, o.chunk);
  return 0;
}

}  // namespace sluice::cli
