// `sluice perplexity`: the perplexity of the model on a text file, computed the way llama.cpp's
// llama-perplexity does (docs/perplexity.md). The file is tokenized whole, cut into windows of
// n_ctx tokens, each evaluated from a fresh sequence with its first token replaced by BOS, and
// the second half of each window's predictions is scored. Registered like the other
// subcommands (see commands.h): setup_perplexity on the app, then run_perplexity.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/cmd_run.h"
#include "util/token_id.h"

namespace sluice::cli {

// The smallest window: its second half holds at least one scored prediction, and --stride has
// a choice (1 or 2).
inline constexpr uint32_t kMinPerplexityCtx = 4;
// The window when -c is not given (llama-perplexity's), or the model's maximum when smaller.
inline constexpr uint32_t kDefaultPerplexityCtx = 512;
// Tokenizing costs about 14 bytes of memory per byte of text: 64 MiB, as `tokenize` reads.
inline constexpr uint64_t kMaxPerplexityTextBytes = 64ull << 20;

struct PerplexityOptions {
  std::string model;
  std::string text_file;  // -f
  uint64_t ctx = 0;       // -c: the window n_ctx; 0: min(512, max_position_embeddings)
  uint32_t stride = 0;    // --stride S; 0: disjoint windows
  bool stride_given = false;  // --stride 0 is refused, not taken as "disjoint"
  uint64_t chunks = 0;    // --chunks N: the first N windows only (llama-perplexity's flag); 0: all
  bool json = false;
  EngineCliOptions engine;
};
CLI::App* setup_perplexity(CLI::App& app, PerplexityOptions& o);
int run_perplexity(const PerplexityOptions& o);

// One evaluation window: tokens [start, start + n_ctx) of the file, its first token replaced by
// BOS; the predictions at window positions [first, n_ctx - 1) are scored (position i predicts
// the token at i + 1).
struct PerplexityWindow {
  uint64_t start = 0;
  uint32_t first = 0;
};
// The windows over n_tokens tokens. stride 0: starts 0, n_ctx, 2 n_ctx, ... (the tokens after the
// last whole window are not used), each scoring from n_ctx / 2. stride S (1 .. n_ctx / 2): starts
// 0, S, 2S, ... while a whole window fits; the first scores from n_ctx / 2, every later one its
// last S predictions (from n_ctx - 1 - S), so the scored tokens follow each other without a gap
// or an overlap. Empty when n_tokens < n_ctx. Requires n_ctx >= kMinPerplexityCtx.
std::vector<PerplexityWindow> perplexity_windows(uint64_t n_tokens, uint32_t n_ctx, uint32_t stride);

// -log softmax(logits)[target], in double: the maximum, then the sum of exp(x - max) in index order.
double token_nll(const float* logits, uint32_t vocab, TokenId target);

// From the scored tokens' NLLs (summed in their order): mean m, PPL = exp(m), and llama.cpp's
// standard error PPL * sqrt(var / (N - 1)) with var = sum((x - m)^2) / N (NaN for N < 2).
struct PerplexityEstimate {
  double ppl = 0, std_error = 0, nll_mean = 0;
  uint64_t n = 0;
};
PerplexityEstimate perplexity_estimate(const std::vector<double>& nll);

}  // namespace sluice::cli
