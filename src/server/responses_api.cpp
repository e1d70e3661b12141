#include "server/responses_api.h"

#include <cstdio>
#include <ctime>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/request_body.h"
#include "server/chat_encode.h"
#include "server/job_follow.h"
#include "server/openai_api.h"
#include "server/request_build.h"
#include "server/response_id.h"
#include "server/responses_events.h"
#include "server/responses_request.h"
#include "server/sse.h"
#include "server/worker_access.h"
#include "text/token_text.h"

namespace sluice::server {

using nlohmann::json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Each kind of dropped thing is logged once per process: an agent sends the same built-in tool
// with every request. The kinds come from fixed lists (responses_request.cpp), so this is bounded.
void log_dropped(const std::vector<ResponsesRequest::Dropped>& dropped) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard lk(mu);
  for (const auto& d : dropped)
    if (seen.insert(d.what).second)
      std::fprintf(stderr,
                   "sluice serve: /v1/responses: left out %s (%s): sluice runs no built-in tools and the model "
                   "reads text only (logged once per kind)\n",
                   d.what.c_str(), d.where.c_str());
}

json usage_json(const GenerateResult& r, uint64_t reasoning_tokens) {
  const uint64_t out = r.tokens.size();
  return {{"input_tokens", r.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", r.reused_tokens}}},
          {"output_tokens", out},
          {"output_tokens_details", {{"reasoning_tokens", std::min(reasoning_tokens, out)}}},
          {"total_tokens", r.prompt_tokens + out}};
}

// The worker reports tokens, the parser text: the reasoning's share is counted by tokenizing it
// again (plus the </think> that closed it), which matches the generated count for text the
// model's own tokenizer produced.
uint64_t count_reasoning_tokens(const Session& s, const std::string& reasoning, bool closed) {
  if (reasoning.empty()) return 0;
  return text::count_text_tokens(s.tokenizer(), reasoning) + (closed ? 1 : 0);
}

// Incomplete only for limits the client (or nobody) chose: its own max_output_tokens, or the
// context filling up. A response ended by the server's --max-tokens-limit is complete: that is
// the operator's cap on every answer (docs/server.md).
bool incomplete(const DriveOutcome& o, const ResponsesRequest& rr) {
  if (o.result.finish == Finish::Context) return true;
  return o.result.finish == Finish::Length && rr.max_output_tokens && (int64_t)o.result.tokens.size() >= *rr.max_output_tokens;
}

json error_json(const DriveOutcome& o) {
  const char* code = o.status == 503 ? "server_is_overloaded" : o.status == 400 ? "invalid_request_error" : "server_error";
  return {{"code", code}, {"message", o.error}};
}

std::string context_message(size_t n, uint32_t n_ctx) {
  return "the prompt has " + std::to_string(n) + " tokens but the context holds " + std::to_string(n_ctx) +
         " (start the server with a larger -c, or shorten the input)";
}

}  // namespace

int handle_responses(ServerContext& ctx, const HttpRequest& req, Connection& conn) {
  const json body = parse_charged_body(ctx, req, conn, kTextWorkPerByte);
  ResponsesRequest rr = responses_request(body, ctx.opts.max_json_depth);
  log_dropped(rr.dropped);
  apply_server_defaults(ctx, rr.chat);
  log_omitted(req.path, rr.chat.omitted);
  const ChatRequest& cr = rr.chat;
  const Session& s = ready_session(ctx);
  std::string prompt_text;
  std::vector<TokenId> prompt = encode_chat(s, cr.messages, cr.options, &prompt_text, conn.scope);
  const size_t n_prompt = prompt.size();
  ResponseMeta meta{new_id(ctx, "resp_"), ctx.model_id, (int64_t)std::time(nullptr),
                    cr.sampling.temperature.value_or(ctx.opts.temp), cr.sampling.top_p.value_or(ctx.opts.top_p)};
  ResponseBuilder b(rr, meta, [&ctx](const char* prefix) { return new_id(ctx, prefix); });
  const TextMode mode = cr.options.thinking ? TextMode::Thinking : TextMode::Chat;

  // A prompt the context cannot hold: the API's own code, which agents act on (Codex compacts
  // its history on context_length_exceeded instead of retrying).
  const bool too_long = n_prompt >= s.ctx();
  if (too_long && !cr.stream) {
    const json err = {{"error", {{"message", context_message(n_prompt, s.ctx())}, {"type", "invalid_request_error"},
                                 {"param", "input"}, {"code", "context_length_exceeded"}}}};
    send_response(conn, 400, "application/json", dump(err));
    return 400;
  }
  RequestInfo info{req.path, req.body.size(), cr.tools, {}};
  std::shared_ptr<Job> job;
  if (!too_long) {
    GenerateRequest gr = make_request(ctx, std::move(prompt), cr.max_tokens, cr.sampling, chat_stop_tokens(s.tokenizer()),
                                      &info.max_tokens);
    gr.scope = conn.scope;
    gr.prompt_text = std::move(prompt_text);
    gr.checkpoint_at = turn_checkpoints(s.tokenizer(), gr.prompt);
    job = submit(ctx, std::move(gr));
  }

  if (cr.stream) {
    send_stream_head(conn, 200, "text/event-stream", max_tokens_headers(info.max_tokens));
    // First bytes at once, before the queue wait and the prefill.
    conn.write(sse_comment("sluice " + meta.id) + b.created());
    if (too_long) {
      conn.write(b.failed({{"code", "context_length_exceeded"}, {"message", context_message(n_prompt, s.ctx())}}));
      return 400;
    }
    DriveHooks h;
    h.keepalive = [&] { return conn.write(sse_comment("keep-alive")); };
    h.prefill = [&](uint32_t done, uint32_t total) {
      return conn.write(sse_comment("prefill " + std::to_string(done) + "/" + std::to_string(total)));
    };
    h.delta = [&](const text::OutputParser::Delta& d) { return conn.write(b.delta(d)); };
    h.info = info;
    h.stops = cr.stops;
    const DriveOutcome o = drive(ctx, *job, conn, mode, h);
    if (o.client_gone) return 499;
    if (!o.ok) {
      conn.write(b.failed(error_json(o)));
      return o.status;
    }
    conn.write(b.finish(incomplete(o, rr), usage_json(o.result, count_reasoning_tokens(s, b.reasoning(), b.reasoning_closed()))));
    return 200;
  }

  // The same builder; the events are not sent.
  DriveHooks h;
  h.info = info;
  h.stops = cr.stops;
  h.delta = [&](const text::OutputParser::Delta& d) {
    b.delta(d);
    return true;
  };
  const DriveOutcome o = drive(ctx, *job, conn, mode, h);
  if (o.client_gone) {
    conn.keep_alive = false;
    return 499;
  }
  if (!o.ok) throw ApiError(o.status, o.status == 400 ? "invalid_request_error" : "server_error", o.error);
  const bool inc = incomplete(o, rr);
  const json usage = usage_json(o.result, count_reasoning_tokens(s, b.reasoning(), b.reasoning_closed()));
  b.finish(inc, usage);  // closes the last item
  send_response(conn, 200, "application/json", dump(b.final_object(inc, usage)), max_tokens_headers(info.max_tokens));
  return 200;
}

}  // namespace sluice::server
