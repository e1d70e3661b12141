#include "server/server.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <exception>

#include <nlohmann/json.hpp>

#include "runtime/meminfo.h"
#include "server/anthropic_api.h"
#include "server/api_error.h"
#include "server/auth.h"
#include "server/openai_api.h"
#include "server/responses_api.h"
#include "server/token_endpoints.h"
#include "server/webui.h"
#include "server/worker_access.h"
#include "util/error.h"

namespace sluice::server {

using nlohmann::json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

bool is_anthropic(const std::string& path) { return path.rfind("/v1/messages", 0) == 0; }

// Known paths keep the metric label set bounded; everything else is "other".
std::string endpoint_label(const std::string& path) {
  static const char* const known[] = {"/", "/health", "/v1/health", "/metrics", "/tokenize", "/detokenize", "/v1/models",
                                      "/models", "/v1/chat/completions", "/chat/completions", "/v1/completions",
                                      "/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"};
  for (const char* k : known)
    if (path == k) return k;
  return "other";
}

void require_method(const HttpRequest& req, const char* method) {
  if (req.method != method)
    throw ApiError(405, "invalid_request_error", req.path + " accepts " + method + ", not " + req.method);
}

int handle_health(ServerContext& ctx, Connection& conn) {
  switch (ctx.worker.state()) {
    case Worker::State::Ready: send_response(conn, 200, "application/json", R"({"status":"ok"})"); return 200;
    case Worker::State::Loading:
      send_response(conn, 503, "application/json",
                    dump(json{{"error", {{"code", 503}, {"message", "Loading model"}, {"type", "unavailable_error"}}}}),
                    {"Retry-After: 5"});
      return 503;
    default:
      send_response(conn, 500, "application/json",
                    dump(json{{"error", {{"code", 500}, {"message", "the model failed to load: " + ctx.worker.load_error()},
                                         {"type", "server_error"}}}}));
      return 500;
  }
}

// Clients probe the base URL before their first request (Claude Code sends HEAD /). It names
// the server and its endpoints, needs no key and says nothing about the model.
// A browser (Accept: text/html) gets the chat page instead (server/webui.h), unless --no-webui.
int handle_root(const HttpRequest& req, Connection& conn, const ServerOptions& opts) {
  if (req.method != "GET" && req.method != "HEAD")
    throw ApiError(405, "invalid_request_error", "/ accepts GET or HEAD, not " + req.method);
  const std::string body = req.method == "HEAD" ? "" : dump(json{{"name", "sluice"}, {"version", SLUICE_VERSION},
      {"endpoints", {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
                     "/v1/models", "/health", "/metrics", "/slots", "/tokenize", "/detokenize"}},
      {"chat_page", opts.webui}, {"api_key_required", !opts.api_keys.empty()}});
  send_response(conn, 200, "application/json", body);
  return 200;
}

int handle_metrics(ServerContext& ctx, Connection& conn) {
  MetricsInput in;
  in.http = &ctx.counters;
  in.worker = &ctx.worker.counters();
  in.loaded = ctx.worker.state() == Worker::State::Ready;
  in.running = ctx.worker.running();
  in.slots = ctx.worker.stats().slots;
  in.waiting = ctx.worker.waiting();
  in.queue_depth = ctx.opts.queue_depth;
  in.session = ctx.worker.stats();
  in.request_memory_bytes = ctx.memory.capacity();
  in.request_memory_used = ctx.memory.in_use();
  in.request_memory_peak = ctx.memory.peak();
  in.request_memory_refused = ctx.memory.refused();
  try {
    in.rss_bytes = read_self_status().rss;
  } catch (const Error&) {
    in.rss_bytes = 0;
  }
  std::string text = render_metrics(in);
  if (ctx.opts.extra_metrics) text += ctx.opts.extra_metrics();
  send_response(conn, 200, "text/plain; version=0.0.4; charset=utf-8", text);
  return 200;
}

// GET /slots: what each slot is doing, in llama.cpp's shape (id, id_task, n_ctx, is_processing,
// next_token) plus sluice's own fields (state, the prompt's progress, the kept tokens).
int handle_slots(ServerContext& ctx, Connection& conn) {
  const Session& s = ready_session(ctx);
  const SessionStats st = s.stats();
  json out = json::array();
  for (size_t k = 0; k < st.slot.size(); ++k) {
    const SlotStats& x = st.slot[k];
    const bool busy = x.phase != SlotStats::Phase::Idle;
    out.push_back(json{{"id", k}, {"id_task", x.request}, {"n_ctx", s.ctx()}, {"is_processing", busy},
                       {"state", phase_name(x.phase)}, {"n_past", x.position}, {"n_prompt_tokens", x.prompt_tokens},
                       {"n_prompt_tokens_processed", x.prompt_done}, {"n_prompt_tokens_cache", x.reused_tokens},
                       {"next_token", {{"has_next_token", x.phase == SlotStats::Phase::Decode},
                                       {"n_decoded", x.generated},
                                       {"n_remain", busy && x.max_tokens > x.generated ? x.max_tokens - x.generated : 0}}}});
  }
  send_response(conn, 200, "application/json", dump(out));
  return 200;
}

}  // namespace

std::vector<PlanLine> plan_lines(const ServerOptions& o, uint32_t parallel) {
  // Beside the pool: each connection's head buffer (grown by doubling to at most twice the 64 KiB
  // head limit), its read and write buffers and the touched part of its thread's stack; each
  // request on a slot or in the queue, its generated tokens and their text.
  constexpr uint64_t kPerConnection = 256 << 10, kPerGeneratedToken = 64;
  const uint64_t requests = (uint64_t)parallel + o.queue_depth;
  return {{"request memory", o.request_memory,
           "--request-memory: bodies being read, their parsed JSON, prompts being rendered and tokenized, answers "
           "being written (a request that does not fit waits for a 503's retry)"},
          {"connections", o.max_connections * kPerConnection + requests * o.max_tokens_limit * kPerGeneratedToken,
           std::to_string(o.max_connections) + " connections x 256 KiB (head, reads, writes, stack) + " +
               std::to_string(requests) + " requests x " + std::to_string(o.max_tokens_limit) +
               " generated tokens x 64 B (ids, text)"}};
}

Server::Server(ServerOptions opts, Worker::Factory factory, std::string model_id)
    : opts_(std::move(opts)),
      memory_(opts_.request_memory),
      factory_(std::move(factory)),
      model_id_(std::move(model_id)) {
  HttpLimits limits;
  limits.memory = &memory_;
  limits.max_body_bytes = opts_.max_body_bytes;
  limits.max_connections = opts_.max_connections;
  // One address may hold a quarter of the slots with requests still arriving (slow senders).
  limits.max_reading_per_client = std::max<size_t>(1, opts_.max_connections / 4);
  limits.reserved_connections = std::min<size_t>(4, opts_.max_connections / 4);
  limits.reserved_paths = {"/health", "/v1/health", "/metrics"};
  limits.request_timeout_ms = opts_.request_timeout_ms;
  limits.header_timeout_ms = opts_.header_timeout_ms;
  limits.idle_timeout_ms = opts_.idle_timeout_ms;
  http_ = std::make_unique<HttpServer>(
      limits, [this](const HttpRequest& r, Connection& c) { handle(r, c); },
      [this](int status, Refusal why) {
        counters_.count("transport", status);
        counters_.reject(refusal_label(why));
      });
}

Server::~Server() {
  if (worker_) worker_->stop();
}

uint16_t Server::listen() {
  const uint16_t port = http_->listen(opts_.host, opts_.port);
  worker_ = std::make_unique<Worker>(
      std::move(factory_), opts_.queue_depth, opts_.prefill_step,
      [this](Worker::State s) {
        if (s == Worker::State::Failed) http_->stop();
      },
      opts_.on_step_error);
  ctx_.reset(new ServerContext{opts_, *worker_, counters_, memory_, model_id_});
  return port;
}

void Server::serve() {
  http_->serve();
  const bool failed = worker_->state() == Worker::State::Failed;
  const std::string error = worker_->load_error();
  worker_->stop();
  if (failed) throw Error(error);
}

namespace {
constexpr auto kShutdownGrace = std::chrono::seconds(2);
constexpr size_t kTrimAfterBytes = 1u << 20;
}

void Server::stop() {
  if (worker_) worker_->shutdown();
  {
    std::unique_lock lk(active_mu_);
    active_cv_.wait_for(lk, kShutdownGrace, [&] { return active_ == 0; });
  }
  http_->stop();
}

void Server::handle(const HttpRequest& req, Connection& conn) {
  {
    std::lock_guard lk(active_mu_);
    ++active_;
  }
  struct Leave {
    Server& s;
    ~Leave() {
      {
        std::lock_guard lk(s.active_mu_);
        --s.active_;
      }
      s.active_cv_.notify_all();
    }
  } leave{*this};
  int status = 500;
  try {
    status = route(req, conn);
  } catch (const ApiError& e) {
    status = e.status;
    if (e.refusal) counters_.reject(e.refusal);
    else if (status == 400) counters_.reject("bad_request");
    else if (status == 401) counters_.reject("unauthorized");
    else if (status == 503) counters_.reject(worker_->state() == Worker::State::Ready ? "queue_full" : "not_ready");
    if (conn.responded) {
      conn.keep_alive = false;
    } else {
      std::vector<std::string> headers;
      if (e.retry_after > 0) headers.push_back("Retry-After: " + std::to_string(e.retry_after));
      if (status == 401) headers.push_back("WWW-Authenticate: Bearer");
      const json body = is_anthropic(req.path) ? anthropic_error_body(status, e.what())
                                               : openai_error_body(status, e.type, e.what());
      send_response(conn, status, "application/json", dump(body), headers);
    }
  } catch (const std::exception& e) {
    status = 500;
    if (conn.responded) {
      conn.keep_alive = false;
    } else {
      const json body = is_anthropic(req.path) ? anthropic_error_body(500, e.what())
                                               : openai_error_body(500, "server_error", e.what());
      send_response(conn, 500, "application/json", dump(body));
    }
  }
  counters_.count(endpoint_label(req.path), status);
  // A large request leaves large free blocks behind (parsed body, token vectors): give them back
  // to the system rather than keep them in glibc's arenas (RSS would stay at the peak).
  if (req.body.size() >= kTrimAfterBytes) malloc_trim(0);
}

int Server::route(const HttpRequest& req, Connection& conn) {
  ServerContext& ctx = *ctx_;
  const std::string& p = req.path;
  if (p == "/health" || p == "/v1/health") {
    require_method(req, "GET");
    return handle_health(ctx, conn);
  }
  if (p == "/") {
    if (opts_.webui && (req.method == "GET" || req.method == "HEAD") && accepts_html(req)) return handle_chat_page(req, conn);
    return handle_root(req, conn, opts_);
  }
  if (!opts_.api_keys.empty()) {
    const int k = matched_key(req, opts_.api_keys);
    if (k < 0) throw ApiError(401, "authentication_error", "invalid or missing API key");
    const bool several = opts_.api_keys.size() > 1;
    conn.scope = several ? key_scope(opts_.api_keys[(size_t)k]) : 0;
    // Counts of every key's traffic and what each slot holds: the operator's (the first key) alone.
    if (several && k != 0 && (p == "/metrics" || p == "/slots"))
      throw ApiError(403, "permission_error", p + " answers only the first key of --api-key-file (the operator's)");
  }
  if (p == "/metrics") {
    require_method(req, "GET");
    return handle_metrics(ctx, conn);
  }
  if (p == "/slots") {
    require_method(req, "GET");
    return handle_slots(ctx, conn);
  }
  if (p == "/v1/models" || p == "/models") {
    require_method(req, "GET");
    return handle_models(ctx, req, conn);
  }
  if (p == "/v1/chat/completions" || p == "/chat/completions") {
    require_method(req, "POST");
    return handle_chat_completions(ctx, req, conn);
  }
  if (p == "/v1/completions" || p == "/completions") {
    require_method(req, "POST");
    return handle_completions(ctx, req, conn);
  }
  if (p == "/v1/responses" || p == "/responses") {
    require_method(req, "POST");
    return handle_responses(ctx, req, conn);
  }
  if (p == "/v1/messages") {
    require_method(req, "POST");
    return handle_messages(ctx, req, conn);
  }
  if (p == "/v1/messages/count_tokens") {
    require_method(req, "POST");
    return handle_count_tokens(ctx, req, conn);
  }
  if (p == "/tokenize") {
    require_method(req, "POST");
    return handle_tokenize(ctx, req, conn);
  }
  if (p == "/detokenize") {
    require_method(req, "POST");
    return handle_detokenize(ctx, req, conn);
  }
  throw ApiError(404, "not_found_error", "no endpoint " + req.method + " " + p);
}

}  // namespace sluice::server
