// OpenAI-compatible endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models.
// Each handler writes its response and returns the HTTP status (for /metrics). Request errors
// before the response starts are thrown as ApiError; once a stream has started they become an
// in-stream {"error":{...}} event.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "server/context.h"
#include "server/http.h"

namespace sluice::server {

int handle_chat_completions(ServerContext& ctx, const HttpRequest& req, Connection& conn);
int handle_completions(ServerContext& ctx, const HttpRequest& req, Connection& conn);
int handle_models(ServerContext& ctx, const HttpRequest& req, Connection& conn);

// {"error":{"message","type","code"}}
nlohmann::json openai_error_body(int status, const std::string& type, const std::string& message);

}  // namespace sluice::server
