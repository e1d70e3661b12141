// POST /v1/responses: the OpenAI Responses API over the chat pipeline. The request becomes a
// chat (responses_request.h); the answer (responses_events.h) is a response object with output
// items (reasoning, message, function_call), or with "stream": true the API's typed event
// sequence. docs/server.md lists the fields.
#pragma once
#include "server/context.h"
#include "server/http.h"

namespace sluice::server {

int handle_responses(ServerContext& ctx, const HttpRequest& req, Connection& conn);

}  // namespace sluice::server
