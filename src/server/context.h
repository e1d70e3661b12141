// What every endpoint needs: the options, the worker that owns the model, the counters.
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "server/metrics.h"
#include "server/request_memory.h"
#include "server/worker.h"

namespace sluice::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;
  size_t queue_depth = 4;             // requests that may wait behind the running ones
  uint32_t prefill_step = 64;         // prompt tokens a step evaluates while others decode (0: the chunk)
  // Called on the worker thread after a step failed and its requests got their error events
  // (serve --fabric ends the job there when the fabric broke). Empty: the server goes on.
  std::function<void(const std::string& error)> on_step_error;
  // More Prometheus lines for /metrics (serve --fabric: each rank's traffic), called on the
  // HTTP thread. Empty: none.
  std::function<std::string()> extra_metrics;
  size_t max_body_bytes = 8u << 20;
  size_t max_connections = 64;
  int request_timeout_ms = 30000;     // a request's head and body must arrive within this (408)
  int header_timeout_ms = 10000;      // its head within this (408)
  int idle_timeout_ms = 30000;        // keep-alive connections wait this long for the next request
  uint32_t max_tokens_limit = 4096;   // largest max_tokens a request may ask for (and the default)
  // Keys a request must carry one of (empty: no authentication). With several, each key is a
  // scope of its own: the prefix caches and state files of one key serve no other
  // (GenerateRequest::scope), and /metrics and /slots answer only the first key.
  std::vector<std::string> api_keys;
  // cached_tokens (and what is derived from it) is reported rounded down to a multiple of this,
  // so a count does not tell a client single tokens of a prompt it shares a cache with.
  uint32_t cached_tokens_granularity = 16;
  std::string alias;                  // model id reported by the API ("": the file name)
  int ping_interval_ms = 5000;        // SSE keep-alive while a request waits or prefills
  int retry_after_s = 2;              // Retry-After of a 503 for a full queue
  float temp = 1.0f;                  // defaults for requests that do not say
  float top_p = 0.95f;
  uint32_t top_k = 0;
  float min_p = 0.0f;
  size_t max_json_depth = 128;        // deepest nesting a request body (or JSON in its strings) may have
  int max_token_requests = 2;         // /tokenize, /detokenize, count_tokens running at once
  // Working memory of the requests in flight (server/request_memory.h), charged in the plan.
  uint64_t request_memory = 256ull << 20;
  std::vector<std::string> stops;     // --stop: stop strings added to every request's
  bool thinking_off = false;          // --thinking off: no request thinks
  // --special-in-content: control-token spellings in request text (messages, tool results,
  // completion prompts) are the tokens, not text. Off: only the chat template makes them.
  bool special_in_content = false;
  bool webui = true;                  // a browser's GET / gets the chat page (--no-webui: the JSON)
};

struct ServerContext {
  const ServerOptions& opts;
  Worker& worker;
  HttpCounters& counters;
  RequestMemory& memory;
  std::string model_id;               // alias, or the model file name without .gguf
  std::atomic<uint64_t> next_id{1};
  // Running /tokenize, /detokenize, count_tokens (TokenRequestSlot) and the wait for a place.
  std::mutex token_mu{};
  std::condition_variable token_cv{};
  int token_requests = 0;
};

// What a request is told of its reused prompt tokens (ServerOptions::cached_tokens_granularity).
inline uint32_t reported_cached(const ServerContext& ctx, uint32_t reused) {
  const uint32_t g = ctx.opts.cached_tokens_granularity ? ctx.opts.cached_tokens_granularity : 1;
  return reused / g * g;
}

}  // namespace sluice::server
