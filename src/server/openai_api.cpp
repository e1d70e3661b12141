#include "server/openai_api.h"

#include <algorithm>
#include <ctime>
#include <vector>

#include "server/api_error.h"
#include "server/request_body.h"
#include "server/chat_encode.h"
#include "server/job_follow.h"
#include "server/request_build.h"
#include "server/response_id.h"
#include "server/sse.h"
#include "server/stop_strings.h"
#include "server/worker_access.h"
#include "text/deepseek41/chat.h"
#include "text/token_text.h"

namespace sluice::server {

using nlohmann::json;

json openai_error_body(int status, const std::string& type, const std::string& message) {
  return {{"error", {{"message", message}, {"type", type}, {"code", status}}}};
}

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json usage_json(const GenerateResult& r) {
  const uint64_t gen = r.tokens.size();
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", gen},
          {"total_tokens", r.prompt_tokens + gen},
          {"prompt_tokens_details", {{"cached_tokens", r.reused_tokens}}}};
}

// llama.cpp's timings object (not part of OpenAI's API, loved by its users).
json timings_json(const GenerateResult& r) {
  const uint64_t evaluated = r.prompt_tokens - std::min(r.prompt_tokens, r.reused_tokens);
  const uint64_t gen = r.tokens.size();
  return {{"cache_n", r.reused_tokens},
          {"prompt_n", evaluated},
          {"prompt_ms", r.prefill_s * 1e3},
          {"prompt_per_second", r.prefill_s > 0 ? evaluated / r.prefill_s : 0.0},
          {"predicted_n", gen},
          {"predicted_ms", r.decode_s * 1e3},
          {"predicted_per_second", r.decode_s > 0 ? gen / r.decode_s : 0.0}};
}

json tool_call_json(const text::ToolCall& c, size_t index, ServerContext& ctx) {
  return {{"index", index},
          {"id", c.id.empty() ? new_id(ctx, "call_") : c.id},
          {"type", "function"},
          {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

// Writes an error into a stream that has already started (status line already sent), then
// [DONE]: clients that read to [DONE] stop there rather than on the closed connection.
void stream_error(Connection& conn, const DriveOutcome& o) {
  const char* type = o.status == 400 ? "invalid_request_error" : o.status == 503 ? "unavailable_error" : "server_error";
  conn.write(sse_data(openai_error_body(o.status, type, o.error)) + sse_done());
}

// Common shape of both endpoints' streams.
struct Streamer {
  ServerContext& ctx;
  Connection& conn;
  bool anthropic = false;
  DriveHooks hooks() {
    DriveHooks h;
    h.keepalive = [this] { return conn.write(sse_comment("keep-alive")); };
    h.prefill = [this](uint32_t done, uint32_t total) {
      return conn.write(sse_comment("prefill " + std::to_string(done) + "/" + std::to_string(total)));
    };
    return h;
  }
};

}  // namespace

int handle_chat_completions(ServerContext& ctx, const HttpRequest& req, Connection& conn) {
  const json body = parse_charged_body(ctx, req, conn, kTextWorkPerByte);
  ChatRequest cr = openai_chat_request(body, ctx.opts.max_json_depth);
  apply_server_defaults(ctx, cr);
  log_omitted(req.path, cr.omitted);
  const Session& s = ready_session(ctx);
  const bool stream = cr.stream;
  const std::vector<std::string>& stops = cr.stops;
  std::string prompt_text;
  std::vector<TokenId> prompt = encode_chat(s, cr.messages, cr.options, &prompt_text, conn.scope);
  RequestInfo info{req.path, req.body.size(), cr.tools, {}};
  GenerateRequest gr = make_request(ctx, std::move(prompt), cr.max_tokens, cr.sampling, chat_stop_tokens(s.tokenizer()),
                                    &info.max_tokens);
  gr.scope = conn.scope;
  const std::vector<std::string> headers = max_tokens_headers(info.max_tokens);
  gr.prompt_text = std::move(prompt_text);
  gr.checkpoint_at = turn_checkpoints(s.tokenizer(), gr.prompt);
  gr.ignore_eos = cr.ignore_eos;
  if (gr.ignore_eos) gr.stop_tokens.clear();
  const TextMode mode = cr.options.thinking ? TextMode::Thinking : TextMode::Chat;
  auto job = submit(ctx, std::move(gr));

  const std::string id = new_id(ctx, "chatcmpl-");
  const int64_t created = (int64_t)std::time(nullptr);
  auto chunk = [&](json delta, json finish) {
    return json{{"id", id},
                {"object", "chat.completion.chunk"},
                {"created", created},
                {"model", ctx.model_id},
                {"choices", json::array({{{"index", 0}, {"delta", std::move(delta)}, {"logprobs", nullptr},
                                          {"finish_reason", std::move(finish)}}})}};
  };

  if (stream) {
    send_stream_head(conn, 200, "text/event-stream", headers);
    // First bytes at once, before the queue wait and the prefill: clients with a first-byte
    // timeout see a live connection.
    conn.write(sse_comment("sluice " + id) + sse_data(chunk({{"role", "assistant"}, {"content", ""}}, nullptr)));
    size_t n_calls = 0;
    Streamer st{ctx, conn};
    DriveHooks h = st.hooks();
    h.info = info;
    h.delta = [&](const text::OutputParser::Delta& d) {
      std::string out;
      if (!d.reasoning.empty()) out += sse_data(chunk({{"reasoning_content", d.reasoning}, {"reasoning", d.reasoning}}, nullptr));
      if (!d.content.empty()) out += sse_data(chunk({{"content", d.content}}, nullptr));
      if (!d.calls.empty()) {
        json calls = json::array();
        for (const auto& c : d.calls) calls.push_back(tool_call_json(c, n_calls++, ctx));
        out += sse_data(chunk({{"tool_calls", calls}}, nullptr));
      }
      return conn.write(out);
    };
    h.stops = stops;
    const DriveOutcome o = drive(ctx, *job, conn, mode, h);
    if (o.client_gone) return 499;
    if (!o.ok) {
      stream_error(conn, o);
      return o.status;
    }
    json last = chunk(json::object(), o.had_calls ? "tool_calls" : finish_reason(o));
    last["timings"] = timings_json(o.result);
    std::string out = sse_data(last);
    if (cr.include_usage) {
      json u = chunk(json::object(), nullptr);
      u["choices"] = json::array();
      u["usage"] = usage_json(o.result);
      out += sse_data(u);
    }
    out += sse_done();
    conn.write(out);
    return 200;
  }

  std::string reasoning, content;
  std::vector<text::ToolCall> calls;
  DriveHooks h;
  h.info = info;
  h.delta = [&](const text::OutputParser::Delta& d) {
    reasoning += d.reasoning;
    content += d.content;
    calls.insert(calls.end(), d.calls.begin(), d.calls.end());
    return true;
  };
  h.stops = stops;
  const DriveOutcome o = drive(ctx, *job, conn, mode, h);
  if (o.client_gone) {
    conn.keep_alive = false;
    return 499;
  }
  if (!o.ok) throw ApiError(o.status, o.status == 400 ? "invalid_request_error" : "server_error", o.error);
  json msg = {{"role", "assistant"}, {"content", calls.empty() || !content.empty() ? json(content) : json(nullptr)}};
  if (!reasoning.empty()) {
    msg["reasoning_content"] = reasoning;
    msg["reasoning"] = reasoning;
  }
  if (!calls.empty()) {
    json tc = json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
      json c = tool_call_json(calls[i], i, ctx);
      c.erase("index");
      tc.push_back(std::move(c));
    }
    msg["tool_calls"] = std::move(tc);
  }
  const json resp = {{"id", id},
                     {"object", "chat.completion"},
                     {"created", created},
                     {"model", ctx.model_id},
                     {"choices", json::array({{{"index", 0}, {"message", std::move(msg)}, {"logprobs", nullptr},
                                               {"finish_reason", calls.empty() ? finish_reason(o) : "tool_calls"}}})},
                     {"usage", usage_json(o.result)},
                     {"timings", timings_json(o.result)}};
  send_response(conn, 200, "application/json", dump(resp), headers);
  return 200;
}

int handle_completions(ServerContext& ctx, const HttpRequest& req, Connection& conn) {
  const json body = parse_charged_body(ctx, req, conn, kTextWorkPerByte);
  const Session& s = ready_session(ctx);
  const auto it = body.find("prompt");
  if (it == body.end()) throw bad_request("'prompt' is required");
  json prompt = *it;
  // A batch of one is accepted; larger batches are not (one sequence).
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) prompt = prompt[0];
  std::vector<TokenId> ids;
  if (prompt.is_string()) {
    // A completions prompt is the client's text: control-token spellings in it are text unless
    // the server says otherwise (--special-in-content, llama.cpp's server behaviour).
    ids = text::encode_prompt_text(s.tokenizer(), prompt.get<std::string>(),
                                   ctx.opts.special_in_content ? text::SpecialTokens::Parse : text::SpecialTokens::AsText);
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) {
    for (const json& t : prompt) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= s.tokenizer().n_vocab())
        throw bad_request("'prompt': token ids must be integers in [0, " + std::to_string(s.tokenizer().n_vocab()) + ")");
      ids.push_back(t.get<TokenId>());
    }
  } else {
    throw bad_request("'prompt' must be a string, an array of token ids, or an array with one of those");
  }
  if (get_bool(body, "echo").value_or(false)) throw bad_request("'echo' is not supported");
  if (auto n = get_int(body, "n"); n && *n != 1) throw bad_request("only n = 1 is supported");
  const bool stream = get_bool(body, "stream").value_or(false);
  std::vector<std::string> stops = parse_stop_strings(body, "stop");
  for (const std::string& st : ctx.opts.stops)
    if (std::find(stops.begin(), stops.end(), st) == stops.end()) stops.push_back(st);
  const std::optional<int64_t> max_tokens = openai_max_tokens(body);
  RequestInfo info{req.path, req.body.size(), 0, {}};
  GenerateRequest gr = make_request(ctx, std::move(ids), max_tokens, sampling_fields(body, max_tokens), {}, &info.max_tokens);
  gr.scope = conn.scope;
  const std::vector<std::string> headers = max_tokens_headers(info.max_tokens);
  gr.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  auto job = submit(ctx, std::move(gr));

  const std::string id = new_id(ctx, "cmpl-");
  const int64_t created = (int64_t)std::time(nullptr);
  auto chunk = [&](const std::string& text, json finish) {
    return json{{"id", id},
                {"object", "text_completion"},
                {"created", created},
                {"model", ctx.model_id},
                {"choices", json::array({{{"text", text}, {"index", 0}, {"logprobs", nullptr},
                                          {"finish_reason", std::move(finish)}}})}};
  };
  if (stream) {
    send_stream_head(conn, 200, "text/event-stream", headers);
    conn.write(sse_comment("sluice " + id));
    Streamer st{ctx, conn};
    DriveHooks h = st.hooks();
    h.info = info;
    h.delta = [&](const text::OutputParser::Delta& d) { return conn.write(sse_data(chunk(d.content, nullptr))); };
    h.stops = stops;
    const DriveOutcome o = drive(ctx, *job, conn, TextMode::Raw, h);
    if (o.client_gone) return 499;
    if (!o.ok) {
      stream_error(conn, o);
      return o.status;
    }
    json last = chunk("", finish_reason(o));
    last["timings"] = timings_json(o.result);
    std::string out = sse_data(last);
    const auto so = body.find("stream_options");
    if (so != body.end() && so->is_object() && so->value("include_usage", false) == true) {
      json u = chunk("", nullptr);
      u["choices"] = json::array();
      u["usage"] = usage_json(o.result);
      out += sse_data(u);
    }
    conn.write(out + sse_done());
    return 200;
  }
  std::string text;
  DriveHooks h;
  h.info = info;
  h.delta = [&](const text::OutputParser::Delta& d) {
    text += d.content;
    return true;
  };
  h.stops = stops;
  const DriveOutcome o = drive(ctx, *job, conn, TextMode::Raw, h);
  if (o.client_gone) {
    conn.keep_alive = false;
    return 499;
  }
  if (!o.ok) throw ApiError(o.status, o.status == 400 ? "invalid_request_error" : "server_error", o.error);
  json resp = chunk(text, finish_reason(o));
  resp["usage"] = usage_json(o.result);
  resp["timings"] = timings_json(o.result);
  send_response(conn, 200, "application/json", dump(resp), headers);
  return 200;
}

int handle_models(ServerContext& ctx, const HttpRequest&, Connection& conn) {
  json meta = json::object();
  json model = {{"id", ctx.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "sluice"}};
  if (const Session* s = ctx.worker.session()) {
    meta = {{"n_ctx", s->ctx()}, {"n_vocab", s->tokenizer().n_vocab()}};
    // The context under the names clients look for it: OpenRouter / LiteLLM and vLLM.
    model["context_length"] = s->ctx();
    model["max_model_len"] = s->ctx();
  }
  model["meta"] = meta;
  const json resp = {{"object", "list"}, {"data", json::array({model})}};
  send_response(conn, 200, "application/json", dump(resp));
  return 200;
}

}  // namespace sluice::server
