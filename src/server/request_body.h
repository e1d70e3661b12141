// A request's body parsed as JSON, with what the handler will build from it charged to the
// server's request memory first (server/request_memory.h): the parsed tree's bound, read from
// the text (text/json_cost.h), plus the handler's own working memory per body byte. Refused
// with 503 + Retry-After when that is not free now, 413 when it is more than the whole pool.
#pragma once
#include <cstdint>

#include <nlohmann/json.hpp>

#include "server/context.h"
#include "server/http.h"

namespace sluice::server {

// Per body byte, what a handler holds besides the body and its parsed tree. Text endpoints (chat,
// completions, tokenize, count_tokens) copy the text into the request, render the prompt and
// tokenize it: the tokenizer's pieces and ids at most a few bytes per input byte, the rest one
// copy each (measured in docs/server.md, "Request memory"). /detokenize holds its ids (at most
// 4 bytes per 2 bytes of "1,") and writes its answer in pieces of a fixed size.
constexpr uint64_t kTextWorkPerByte = 24;
constexpr uint64_t kIdsWorkPerByte = 2;
constexpr uint64_t kAnswerBufferBytes = 512 * 1024;

// Charges json_tree_bound(body) + work_per_byte x body + fixed_bytes to conn.memory, then parses.
nlohmann::json parse_charged_body(ServerContext& ctx, const HttpRequest& req, Connection& conn, uint64_t work_per_byte,
                                  uint64_t fixed_bytes = 0);

}  // namespace sluice::server
