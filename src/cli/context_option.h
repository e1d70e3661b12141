// -c/--ctx-size, the context length of run, chat, serve and plan: one spelling (plan also keeps
// its older --ctx), one meaning of 0 (the command's default, as if -c were not given), one range.
//
// At parse time the text must be a decimal number (no sign, no overflow), optionally with a
// binary k or M suffix (32k = 32,768, 128K = 131,072, 1M = 1,048,576): "-1" used to wrap to
// 18446744073709551615 and a 20-digit value was silently capped. At startup, once the
// model's header is read, check_ctx refuses what cannot run: below kMinCtx (one prompt token +
// one generated token) or above the model's max_position_embeddings. Both are usage errors
// (exit 2) naming -c/--ctx-size.
#pragma once
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace sluice::cli {

inline constexpr uint64_t kMinCtx = 2;
inline constexpr const char* kCtxFlag = "-c/--ctx-size";

// The parse-time check, as a CLI11 validator: "" when `text` is 0 or a number in
// [min_ctx, UINT32_MAX] (then rewritten to plain digits, a suffix applied), else why not;
// min_why says what the minimum is for (perplexity's is larger than run's).
std::string ctx_text_problem(std::string& text, uint64_t min_ctx = kMinCtx,
                             const std::string& min_why = "one prompt token and one generated token");

// Registers -c,--ctx-size (with --ctx too when ctx_alias) on `sub`. default_meaning says what
// 0 / no -c gives for this command ("prompt + n", "min(model maximum, 4096)").
template <class T>
CLI::Option* add_ctx_option(CLI::App* sub, T& ctx, const std::string& default_meaning, bool ctx_alias = false) {
  return sub
      ->add_option(ctx_alias ? "-c,--ctx-size,--ctx" : "-c,--ctx-size", ctx,
                   "context positions, e.g. 8192, 32k, 1M (" + std::to_string(kMinCtx) + " up to the model's max_position_embeddings; " +
                       "0 or not given: " + default_meaning + ")")
      ->transform(CLI::Validator([](std::string& text) { return ctx_text_problem(text); }, "N", "context size"));
}

// At startup: UsageError unless ctx is 0 or within [kMinCtx, max_position_embeddings].
void check_ctx(uint64_t ctx, uint64_t max_position_embeddings);

}  // namespace sluice::cli
