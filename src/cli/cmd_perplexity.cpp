// `sluice perplexity`: llama-perplexity's method on the engine's logits (docs/perplexity.md).
// Each window is a prompt prefilled from a fresh sequence with an observer that sees every
// position's logits (the path `run --dump-logits` takes); nothing is generated.
#include "cli/cmd_perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/context_option.h"
#include "cli/stop_signals.h"
#include "model/deepseek41/config.h"
#include "runtime/session.h"
#include "text/token_text.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/read_file.h"

namespace sluice::cli {

std::vector<PerplexityWindow> perplexity_windows(uint64_t n_tokens, uint32_t n_ctx, uint32_t stride) {
  std::vector<PerplexityWindow> w;
  if (n_ctx < kMinPerplexityCtx || stride > n_ctx / 2)
    throw Error("internal: perplexity window or stride out of range");
  const uint64_t step = stride ? stride : n_ctx;
  for (uint64_t start = 0; n_tokens >= n_ctx && start <= n_tokens - n_ctx; start += step)
    w.push_back({start, stride && start ? n_ctx - 1 - stride : n_ctx / 2});
  return w;
}

double token_nll(const float* logits, uint32_t vocab, TokenId target) {
  double mx = -std::numeric_limits<double>::infinity();
  for (uint32_t v = 0; v < vocab; ++v) mx = std::max(mx, (double)logits[v]);
  double sum = 0;
  for (uint32_t v = 0; v < vocab; ++v) sum += std::exp((double)logits[v] - mx);
  return -((double)logits[target] - mx - std::log(sum));
}

PerplexityEstimate perplexity_estimate(const std::vector<double>& nll) {
  PerplexityEstimate e;
  e.n = nll.size();
  if (e.n == 0) return e;
  double sum = 0;
  for (const double x : nll) sum += x;
  e.nll_mean = sum / (double)e.n;
  double sq = 0;
  for (const double x : nll) sq += (x - e.nll_mean) * (x - e.nll_mean);
  e.ppl = std::exp(e.nll_mean);
  e.std_error = e.n < 2 ? std::numeric_limits<double>::quiet_NaN()
                        : e.ppl * std::sqrt(sq / (double)e.n / (double)(e.n - 1));
  return e;
}

CLI::App* setup_perplexity(CLI::App& app, PerplexityOptions& o) {
  CLI::App* sub =
      app.add_subcommand("perplexity", "Perplexity of the model on a text file (llama-perplexity's method)");
  sub->footer(
      "Method (llama.cpp's llama-perplexity; docs/perplexity.md): the whole file is tokenized as run -f\n"
      "tokenizes a prompt (BOS first when the vocabulary asks for one) and cut into windows of n_ctx\n"
      "(-c) tokens. Each window is evaluated from a fresh sequence (nothing is carried between\n"
      "windows) with its first token replaced by BOS, and the predictions at window positions i in\n"
      "[n_ctx/2, n_ctx - 1) are scored: NLL = -log softmax(logits at i)[token at i + 1], in double.\n"
      "Without --stride the windows are disjoint (starts 0, n_ctx, 2 n_ctx, ...; the tokens after the\n"
      "last whole window are not used), n_ctx - 1 - n_ctx/2 tokens scored each.\n"
      "--stride S (1 .. n_ctx/2): windows start every S tokens while a whole window fits; the first\n"
      "scores its second half as above, every later one only its last S predictions (positions\n"
      "n_ctx - 1 - S .. n_ctx - 2), so each token after position n_ctx/2 is scored exactly once, with\n"
      "at least n_ctx - 1 - S tokens of its window before it. Scored: n_ctx - 1 - n_ctx/2 + (W - 1) S\n"
      "for W = floor((tokens - n_ctx) / S) + 1 windows. --chunks N: only the first N windows.\n"
      "Output: the running estimate after each window ([1]P1,[2]P2,...), then\n"
      "'Final estimate: PPL = exp(m) +/- E', m the mean NLL of the N scored tokens and\n"
      "E = PPL * sqrt(var / (N - 1)), var = sum((nll - m)^2) / N (llama.cpp's standard error; n/a for\n"
      "N < 2). --json prints one JSON object instead: ppl, stderr, nll_mean, tokens_scored, chunks,\n"
      "n_ctx, stride (0: disjoint windows), tok_per_s, file_tokens, complete. The summary line on stderr\n"
      "has the evaluation's tok/s and peak RSS against the budget. The figures are the same for any\n"
      "-t and --chunk. SIGTERM / SIGINT: the estimate over the windows evaluated so far, exit 0.\n"
      "The text file must be a regular file of at most 64 MiB with at least n_ctx tokens.");
  sub->add_option("-m,--model", o.model, "deepseek41 GGUF file")->required();
  sub->add_option("-f,--file", o.text_file, "the text file to evaluate (UTF-8)")->required();
  sub->add_option("-c,--ctx-size", o.ctx,
                  "tokens per window, e.g. 512, 4k (" + std::to_string(kMinPerplexityCtx) +
                      " up to the model's max_position_embeddings; 0 or not given: min(512, the model's maximum))")
      ->transform(CLI::Validator(
          [](std::string& text) {
            return ctx_text_problem(text, kMinPerplexityCtx, "so a window's second half has a prediction to score");
          },
          "N", "window size"));
  sub->add_option("--stride", o.stride,
                  "windows start every S tokens (1 .. n_ctx/2), each scoring its last S predictions")
      ->each([&o](const std::string&) { o.stride_given = true; });
  sub->add_option("--chunks", o.chunks, "evaluate only the first N windows; 0 = all (default 0)");
  sub->add_flag("--json", o.json, "print one JSON object instead of the text report");
  add_engine_options(sub, o.engine);
  return sub;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The window n_ctx: -c, else min(512, the model's maximum). UsageError above the model's maximum.
uint32_t window_size(const PerplexityOptions& o, const ModelConfig& cfg) {
  check_ctx(o.ctx, cfg.max_position_embeddings);
  if (o.ctx != 0) return (uint32_t)o.ctx;  // at least kMinPerplexityCtx (the parse-time check)
  const uint64_t n = std::min<uint64_t>(kDefaultPerplexityCtx, cfg.max_position_embeddings);
  if (n < kMinPerplexityCtx)
    throw Error("the model's max_position_embeddings " + std::to_string(cfg.max_position_embeddings) +
                " is below the smallest perplexity window of " + std::to_string(kMinPerplexityCtx) + " tokens");
  return (uint32_t)n;
}

// The file's tokens, as run -f tokenizes a prompt: control-token spellings are text, BOS first
// when the vocabulary asks for one.
std::vector<TokenId> read_tokens(const std::string& path, const text::Tokenizer& tok) {
  const std::string text = read_regular_file_bounded(path, kMaxPerplexityTextBytes,
                                                     "perplexity reads at most 64 MiB of text; split larger files");
  return text::encode_prompt_text(tok, text, text::SpecialTokens::AsText);
}

// Evaluates window w from a fresh sequence and appends its scored NLLs, in position order, to
// nll. False, nothing appended, when a stop signal cancelled it.
bool evaluate_window(Session& s, const std::vector<TokenId>& tokens, const PerplexityWindow& w, uint32_t n_ctx,
                     std::optional<TokenId> bos, std::vector<double>& nll) {
  GenerateRequest req;
  req.prompt.assign(tokens.begin() + (ptrdiff_t)w.start, tokens.begin() + (ptrdiff_t)(w.start + n_ctx));
  if (bos) req.prompt[0] = *bos;
  req.max_tokens = 0;
  const uint32_t vocab = s.config().vocab_size;
  std::vector<double> got(n_ctx - 1 - w.first, std::numeric_limits<double>::quiet_NaN());
  size_t seen = 0;
  EvalObserver obs;
  obs.on_eval = [&](uint32_t pos0, std::span<const TokenId> toks, const float* logits, const std::vector<TokenTrace>*) {
    for (size_t j = 0; j < toks.size(); ++j) {
      const size_t pos = pos0 + j;
      if (pos < w.first || pos + 1 >= n_ctx) continue;
      got[pos - w.first] = token_nll(logits + j * vocab, vocab, req.prompt[pos + 1]);
      ++seen;
    }
  };
  req.observer = &obs;
  s.reset();  // a fresh sequence: nothing of the previous window is reused
  const auto on_prefill = [](uint32_t, uint32_t) { return StopSignals::raised() == 0; };
  const GenerateResult res = s.generate(req, on_prefill, nullptr);
  if (res.finish == Finish::Cancelled) return false;
  if (res.reused_tokens != 0 || seen != got.size())
    throw Error("internal: window at token " + std::to_string(w.start) + " scored " + std::to_string(seen) + " of " +
                std::to_string(got.size()) + " positions");
  for (size_t i = 0; i < got.size(); ++i)
    if (!std::isfinite(got[i]))
      throw Error("the logits at position " + std::to_string(w.first + i) + " of the window at token " +
                  std::to_string(w.start) + " are not finite");
  nll.insert(nll.end(), got.begin(), got.end());
  return true;
}

struct Evaluation {
  std::vector<double> nll;
  size_t windows = 0;  // evaluated
  double seconds = 0;
  int stop_signal = 0;
};

// Every window in order; the running estimate after each on stdout (text mode).
Evaluation evaluate(Session& s, const std::vector<TokenId>& tokens, const std::vector<PerplexityWindow>& windows,
                    uint32_t n_ctx, bool print) {
  const text::Tokenizer& tok = s.tokenizer();
  const std::optional<TokenId> bos = tok.add_bos_default() ? tok.bos() : std::nullopt;
  Evaluation ev;
  double sum = 0;
  const auto t0 = Clock::now();
  for (const PerplexityWindow& w : windows) {
    const size_t before = ev.nll.size();
    if (!evaluate_window(s, tokens, w, n_ctx, bos, ev.nll)) {
      ev.stop_signal = StopSignals::raised();
      break;
    }
    ++ev.windows;
    for (size_t i = before; i < ev.nll.size(); ++i) sum += ev.nll[i];
    if (print) {
      std::printf("[%zu]%.4f,", ev.windows, std::exp(sum / (double)ev.nll.size()));
      std::fflush(stdout);
    }
  }
  ev.seconds = seconds_since(t0);
  if (print && ev.windows) std::printf("\n");
  return ev;
}

void print_result(const PerplexityOptions& o, const PerplexityEstimate& e, const Evaluation& ev, uint32_t n_ctx,
                  size_t file_tokens, double tok_per_s) {
  if (o.json) {
    nlohmann::json j;
    j["ppl"] = e.ppl;
    j["stderr"] = std::isnan(e.std_error) ? nlohmann::json(nullptr) : nlohmann::json(e.std_error);
    j["nll_mean"] = e.nll_mean;
    j["tokens_scored"] = e.n;
    j["chunks"] = ev.windows;
    j["n_ctx"] = n_ctx;
    j["stride"] = o.stride;
    j["tok_per_s"] = tok_per_s;
    j["file_tokens"] = file_tokens;
    j["complete"] = ev.stop_signal == 0;
    std::printf("%s\n", j.dump().c_str());
  } else if (std::isnan(e.std_error)) {
    std::printf("Final estimate: PPL = %.4f +/- n/a (one scored token)\n", e.ppl);
  } else {
    std::printf("Final estimate: PPL = %.4f +/- %.5f\n", e.ppl, e.std_error);
  }
  std::fflush(stdout);
}

}  // namespace

int run_perplexity(const PerplexityOptions& o) {
  const StopSignals stop_signals;  // first: a signal during the load still ends cleanly
  if (o.stride_given && o.stride == 0)
    throw UsageError("--stride must be at least 1 (without it the windows are disjoint)");
  if (!o.engine.dspark.empty() && !o.engine.no_dspark)
    throw UsageError("--dspark drafts generated tokens; perplexity generates none");
  session_options(o.engine, o.model, 0);  // usage checks that do not need the model come before it is opened

  const auto t_load = Clock::now();
  const ModelHeader header = open_model_header(o.model);
  const uint32_t n_ctx = window_size(o, header.config);
  if (o.stride > n_ctx / 2)
    throw UsageError("--stride " + std::to_string(o.stride) + " is larger than half the window (-c " +
                     std::to_string(n_ctx) + ": at most " + std::to_string(n_ctx / 2) + ")");
  const std::vector<TokenId> tokens = read_tokens(o.text_file, *header.tokenizer);
  std::vector<PerplexityWindow> windows = perplexity_windows(tokens.size(), n_ctx, o.stride);
  if (o.chunks != 0 && windows.size() > o.chunks) windows.resize(o.chunks);
  if (windows.empty())
    throw Error(o.text_file + ": " + std::to_string(tokens.size()) + " tokens, fewer than one window of " +
                std::to_string(n_ctx) +
                (o.ctx ? " (-c " + std::to_string(n_ctx) + ")" : std::string(" (the default window; see -c)")));

  Session session(session_options(o.engine, o.model, n_ctx), header);
  maybe_print_plan(o.engine, session);
  const double load_s = seconds_since(t_load);
  if (!o.json) {
    const uint64_t half = n_ctx - 1 - n_ctx / 2;  // what the first window scores
    const uint64_t scored = half + (windows.size() - 1) * (o.stride ? o.stride : half);
    const std::string how = o.stride ? "stride " + std::to_string(o.stride) : std::string("disjoint");
    std::printf("perplexity: %zu tokens, %zu windows of %u (%s), %llu tokens to score\n", tokens.size(),
                windows.size(), n_ctx, how.c_str(), (unsigned long long)scored);
    std::fflush(stdout);
  }
  const Evaluation ev = evaluate(session, tokens, windows, n_ctx, !o.json);
  if (ev.windows == 0)
    throw Error(std::string("stopped by ") + signal_name(ev.stop_signal) + " before the first window was evaluated");
  const uint64_t evaluated = (uint64_t)ev.windows * n_ctx;
  const double tok_per_s = ev.seconds > 0 ? (double)evaluated / ev.seconds : 0.0;
  print_result(o, perplexity_estimate(ev.nll), ev, n_ctx, tokens.size(), tok_per_s);
  const std::string stop = ev.stop_signal ? std::string(" | stopped by ") + signal_name(ev.stop_signal) + " after " +
                                                std::to_string(ev.windows) + " of " + std::to_string(windows.size()) +
                                                " windows"
                                          : "";
  std::fprintf(stderr,
               "sluice perplexity: %zu windows of %u tokens, %zu tokens scored | evaluated %llu tokens in %.3f s "
               "(%.2f tok/s)%s | load %.3f s, %d threads, chunk %u | %s\n",
               ev.windows, n_ctx, ev.nll.size(), (unsigned long long)evaluated, ev.seconds, tok_per_s, stop.c_str(),
               load_s, session.plan().threads, session.plan().chunk, session_summary(session, evaluated).c_str());
  return 0;
}

}  // namespace sluice::cli
