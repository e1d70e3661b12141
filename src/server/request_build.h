// Turning a converted request into a GenerateRequest under the server's bounds and defaults:
// the prompt checked against the context, max_tokens clamped, sampling filled in from the
// server's options, --stop and --thinking applied.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/session.h"
#include "server/chat_request.h"
#include "server/context.h"
#include "server/max_tokens.h"
#include "server/request_json.h"
#include "util/token_id.h"

namespace sluice::server {

// The server's own settings over a chat request: --stop strings join the request's, and
// --thinking off turns thinking off. Every chat endpoint calls it after converting its body.
void apply_server_defaults(const ServerContext& ctx, ChatRequest& r);

// Logs once, on stderr, the parts a request had that the model cannot read (placeholders).
void log_omitted(const std::string& endpoint, const std::vector<std::string>& omitted);

// Checks the prompt against the context (ApiError 400 with the numbers), clamps max_tokens
// (clamp_max_tokens; *max_out gets the outcome) and fills in defaults.
GenerateRequest make_request(ServerContext& ctx, std::vector<TokenId> prompt, std::optional<int64_t> max_tokens,
                             const SamplingFields& sampling, std::vector<TokenId> stop_tokens,
                             MaxTokens* max_out = nullptr);

}  // namespace sluice::server
