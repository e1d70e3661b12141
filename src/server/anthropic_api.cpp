#include "server/anthropic_api.h"

#include <algorithm>
#include <vector>

#include "server/api_error.h"
#include "server/request_body.h"
#include "server/chat_encode.h"
#include "server/job_follow.h"
#include "server/request_build.h"
#include "server/response_id.h"
#include "server/sse.h"
#include "server/stop_strings.h"
#include "server/token_endpoints.h"
#include "server/sse.h"
#include "server/worker_access.h"
#include "text/deepseek41/chat.h"
#include "text/json_text.h"

namespace sluice::server {

using nlohmann::json;

json anthropic_error_body(int status, const std::string& message) {
  const char* type = status == 400   ? "invalid_request_error"
                     : status == 401 ? "authentication_error"
                     : status == 404 ? "not_found_error"
                     : status == 413 ? "request_too_large"
                     : status == 503 ? "overloaded_error"
                                     : "api_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json stop_sequence(const DriveOutcome& o) { return o.stop_string.empty() ? json(nullptr) : json(o.stop_string); }

std::string stop_reason(const DriveOutcome& o) {
  if (o.had_calls) return "tool_use";
  if (!o.stop_string.empty()) return "stop_sequence";
  return finish_reason(o) == "length" ? "max_tokens" : "end_turn";
}

// Anthropic's input_tokens counts the prompt tokens not read from the cache: the prompt is
// input + cache_creation + cache_read (Claude Code sums them for its context meter).
json usage_json(const GenerateResult& r, bool final) {
  json u = {{"input_tokens", r.prompt_tokens - std::min(r.prompt_tokens, r.reused_tokens)},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", r.reused_tokens},
            {"output_tokens", final ? r.tokens.size() : 0}};
  return u;
}

// The model's arguments as an object. They are generated text: nesting deeper than the writer's
// bound stays a string, since dumping the value would recurse once per level.
json tool_input(const std::string& arguments) {
  if (text::json_nesting_depth(arguments, text::kMaxJsonWriteDepth) > text::kMaxJsonWriteDepth)
    return json{{"arguments", arguments}};
  try {
    json j = json::parse(arguments);
    if (j.is_object()) return j;
  } catch (const json::exception&) {
  }
  return json{{"arguments", arguments}};
}

}  // namespace

int handle_count_tokens(ServerContext& ctx, const HttpRequest& req, Connection& conn) {
  const TokenRequestSlot slot(ctx);  // tokenizes in this thread, outside the worker's queue
  const json body = parse_charged_body(ctx, req, conn, kTextWorkPerByte);
  ChatRequest c = anthropic_request(body, /*count_only=*/true);
  apply_server_defaults(ctx, c);  // the rendering depends on thinking
  const Session& s = ready_session(ctx);
  const size_t n = encode_chat(s, c.messages, c.options, nullptr, conn.scope).size();
  send_response(conn, 200, "application/json", dump(json{{"input_tokens", n}}));
  return 200;
}

int handle_messages(ServerContext& ctx, const HttpRequest& req, Connection& conn) {
  const json body = parse_charged_body(ctx, req, conn, kTextWorkPerByte);
  ChatRequest c = anthropic_request(body, /*count_only=*/false);
  apply_server_defaults(ctx, c);
  log_omitted(req.path, c.omitted);
  const Session& s = ready_session(ctx);
  const bool stream = c.stream;
  const std::vector<std::string>& stops = c.stops;
  std::string prompt_text;
  std::vector<TokenId> prompt = encode_chat(s, c.messages, c.options, &prompt_text, conn.scope);
  const uint32_t n_prompt = (uint32_t)prompt.size();
  RequestInfo info{req.path, req.body.size(), c.tools, {}};
  GenerateRequest gr = make_request(ctx, std::move(prompt), c.max_tokens, c.sampling, chat_stop_tokens(s.tokenizer()),
                                    &info.max_tokens);
  gr.scope = conn.scope;
  gr.prompt_text = std::move(prompt_text);
  gr.checkpoint_at = turn_checkpoints(s.tokenizer(), gr.prompt);
  const TextMode mode = c.options.thinking ? TextMode::Thinking : TextMode::Chat;
  auto job = submit(ctx, std::move(gr));
  const std::string id = new_id(ctx, "msg_");
  const std::vector<std::string> headers = max_tokens_headers(info.max_tokens);

  if (stream) {
    send_stream_head(conn, 200, "text/event-stream", headers);
    // message_start goes out when the worker reports the reused prompt tokens (its usage has
    // cache_read_input_tokens, which Claude Code shows); until then SSE comments keep the
    // connection alive (the SDK skips them, while a ping before message_start is not expected).
    bool started = false;
    auto start_event = [&](uint32_t reused) {
      started = true;
      const json start = {{"type", "message_start"},
                  {"message", {{"id", id},
                               {"type", "message"},
                               {"role", "assistant"},
                               {"content", json::array()},
                               {"model", ctx.model_id},
                               {"stop_reason", nullptr},
                               {"stop_sequence", nullptr},
                               {"usage", {{"input_tokens", n_prompt - std::min(n_prompt, reused)},
                                          {"cache_creation_input_tokens", 0},
                                          {"cache_read_input_tokens", reused},
                                          {"output_tokens", 0}}}}}};
      return sse_event("message_start", start);
    };
    const std::string ping = sse_event("ping", {{"type", "ping"}});
    int index = -1;
    std::string open;  // type of the open block: "", "thinking", "text"
    auto close_block = [&](std::string& out) {
      if (open.empty()) return;
      out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}});
      open.clear();
    };
    auto ensure_block = [&](std::string& out, const std::string& type) {
      if (open == type) return;
      close_block(out);
      ++index;
      open = type;
      const json block = type == "thinking" ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                            : json{{"type", "text"}, {"text", ""}};
      out += sse_event("content_block_start", {{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
    };
    DriveHooks h;
    h.info = info;
    h.started = [&](uint32_t reused) { return conn.write(start_event(reused) + ping); };
    h.keepalive = [&] { return conn.write(started ? ping : sse_comment("keep-alive")); };
    h.prefill = [&](uint32_t, uint32_t) { return conn.write(ping); };
    h.delta = [&](const text::OutputParser::Delta& d) {
      std::string out;
      if (!d.reasoning.empty()) {
        ensure_block(out, "thinking");
        out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index},
                                                 {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning}}}});
      }
      if (!d.content.empty()) {
        ensure_block(out, "text");
        out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index},
                                                 {"delta", {{"type", "text_delta"}, {"text", d.content}}}});
      }
      for (const auto& call : d.calls) {
        close_block(out);
        ++index;
        const json block = {{"type", "tool_use"}, {"id", new_id(ctx, "toolu_")}, {"name", call.name}, {"input", json::object()}};
        out += sse_event("content_block_start", {{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
        out += sse_event("content_block_delta",
                         {{"type", "content_block_delta"}, {"index", index},
                          {"delta", {{"type", "input_json_delta"}, {"partial_json", dump(tool_input(call.arguments))}}}});
        out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}});
      }
      return conn.write(out);
    };
    h.stops = stops;
    const DriveOutcome o = drive(ctx, *job, conn, mode, h);
    if (o.client_gone) return 499;
    if (!o.ok) {
      conn.write(sse_event("error", anthropic_error_body(o.status, o.error)));
      return o.status;
    }
    std::string out = started ? "" : start_event(o.result.reused_tokens);
    close_block(out);
    out += sse_event("message_delta", {{"type", "message_delta"},
                                       {"delta", {{"stop_reason", stop_reason(o)}, {"stop_sequence", stop_sequence(o)}}},
                                       {"usage", usage_json(o.result, true)}});
    out += sse_event("message_stop", {{"type", "message_stop"}});
    conn.write(out);
    return 200;
  }

  json content = json::array();
  DriveHooks h;
  h.info = info;
  h.delta = [&](const text::OutputParser::Delta& d) {
    auto append = [&](const char* type, const std::string& text) {
      if (content.empty() || content.back()["type"] != type) {
        json block = {{"type", type}, {type, ""}};
        if (std::string(type) == "thinking") block["signature"] = "";
        content.push_back(std::move(block));
      }
      content.back()[type] = content.back()[type].get<std::string>() + text;
    };
    if (!d.reasoning.empty()) append("thinking", d.reasoning);
    if (!d.content.empty()) append("text", d.content);
    for (const auto& call : d.calls)
      content.push_back({{"type", "tool_use"}, {"id", new_id(ctx, "toolu_")}, {"name", call.name}, {"input", tool_input(call.arguments)}});
    return true;
  };
  h.stops = stops;
  const DriveOutcome o = drive(ctx, *job, conn, mode, h);
  if (o.client_gone) {
    conn.keep_alive = false;
    return 499;
  }
  if (!o.ok) throw ApiError(o.status, o.status == 400 ? "invalid_request_error" : "api_error", o.error);
  const json resp = {{"id", id},
                     {"type", "message"},
                     {"role", "assistant"},
                     {"content", content},
                     {"model", ctx.model_id},
                     {"stop_reason", stop_reason(o)},
                     {"stop_sequence", stop_sequence(o)},
                     {"usage", usage_json(o.result, true)}};
  send_response(conn, 200, "application/json", dump(resp), headers);
  return 200;
}

}  // namespace sluice::server
