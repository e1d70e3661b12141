// Anthropic Messages API: POST /v1/messages (plain and streaming, with its named-event
// sequence) and POST /v1/messages/count_tokens. Handlers write the response and return the
// HTTP status; request errors are thrown as ApiError (the router writes Anthropic's error body).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "server/context.h"
#include "server/http.h"

namespace sluice::server {

int handle_messages(ServerContext& ctx, const HttpRequest& req, Connection& conn);
int handle_count_tokens(ServerContext& ctx, const HttpRequest& req, Connection& conn);

// {"type":"error","error":{"type","message"}}; HTTP status to Anthropic error type.
nlohmann::json anthropic_error_body(int status, const std::string& message);

}  // namespace sluice::server
