#include "server/request_build.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "runtime/sampler.h"
#include "server/api_error.h"
#include "server/worker_access.h"
#include "util/error.h"

namespace sluice::server {

void apply_server_defaults(const ServerContext& ctx, ChatRequest& r) {
  for (const std::string& s : ctx.opts.stops)
    if (std::find(r.stops.begin(), r.stops.end(), s) == r.stops.end()) r.stops.push_back(s);
  r.options.content_is_markup = ctx.opts.special_in_content;
  if (ctx.opts.thinking_off) {
    r.options.thinking = false;
    r.options.reasoning_effort = 0;
  }
}

void log_omitted(const std::string& endpoint, const std::vector<std::string>& omitted) {
  if (omitted.empty()) return;
  std::string list;
  for (const std::string& o : omitted) list += (list.empty() ? "" : "; ") + o;
  std::fprintf(stderr, "sluice serve: %s: %zu part(s) replaced by a text placeholder (the model reads text only): %s\n",
               endpoint.c_str(), omitted.size(), list.c_str());
}

GenerateRequest make_request(ServerContext& ctx, std::vector<TokenId> prompt, std::optional<int64_t> max_tokens,
                             const SamplingFields& sampling, std::vector<TokenId> stop_tokens, MaxTokens* max_out) {
  const Session& s = ready_session(ctx);
  const uint32_t n_ctx = s.ctx();
  if (prompt.empty()) throw bad_request("the prompt is empty");
  if (prompt.size() >= n_ctx)
    throw bad_request("the prompt has " + std::to_string(prompt.size()) + " tokens but the context holds " +
                      std::to_string(n_ctx) + " (start the server with a larger -c, or shorten the prompt)");
  GenerateRequest r;
  const MaxTokens m = clamp_max_tokens(max_tokens, ctx.opts.max_tokens_limit, n_ctx - (uint32_t)prompt.size());
  r.max_tokens = m.effective;
  if (max_out) *max_out = m;
  r.prompt = std::move(prompt);
  r.stop_tokens = std::move(stop_tokens);
  r.sampling.temp = (float)sampling.temperature.value_or(ctx.opts.temp);
  r.sampling.top_p = (float)sampling.top_p.value_or(ctx.opts.top_p);
  r.sampling.top_k = (uint32_t)sampling.top_k.value_or(ctx.opts.top_k);
  r.sampling.min_p = (float)sampling.min_p.value_or(ctx.opts.min_p);
  if (sampling.seed) {
    r.sampling.seed = *sampling.seed;
  } else {
    static thread_local std::mt19937_64 seeder{std::random_device{}()};
    r.sampling.seed = seeder();
  }
  try {
    validate(r.sampling);
  } catch (const Error& e) {
    throw bad_request(e.what());
  }
  return r;
}

}  // namespace sluice::server
