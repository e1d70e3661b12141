// llama.cpp's POST /tokenize and POST /detokenize, and the limit they share with
// /v1/messages/count_tokens: these run in the connection's thread, outside the worker's queue,
// so at most ServerOptions::max_token_requests of them run at once (more get 503 + Retry-After),
// and their output is written as it is made rather than built as a JSON tree (an 8 MiB body
// can hold millions of tokens).
#pragma once
#include <chrono>

#include "server/context.h"
#include "server/http.h"

namespace sluice::server {

// How long a request waits for a place before its 503.
inline constexpr std::chrono::milliseconds kTokenSlotWait{250};

// Holds one of the max_token_requests places for its lifetime; ApiError 503 when none is free
// within kTokenSlotWait.
class TokenRequestSlot {
 public:
  explicit TokenRequestSlot(ServerContext& ctx);
  ~TokenRequestSlot();
  TokenRequestSlot(const TokenRequestSlot&) = delete;
  TokenRequestSlot& operator=(const TokenRequestSlot&) = delete;

 private:
  ServerContext& ctx_;
};

int handle_tokenize(ServerContext& ctx, const HttpRequest& req, Connection& conn);
int handle_detokenize(ServerContext& ctx, const HttpRequest& req, Connection& conn);

}  // namespace sluice::server
