#include "server/openai_api.h"

#include <ctime>
#include <vector>

#include "server/api_error.h"
#include "server/generation.h"
#include "server/stop_strings.h"
#include "server/sse.h"
#include "text/chat.h"

namespace sluice::server {

using nlohmann::json;

json openai_error_body(int status, const std::string& type, const std::string& message) {
  return {{"error", {{"message", message}, {"type", type}, {"code", status}}}};
}

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A message's content: a string, null, or an array of {"type":"text","text":...} parts.
std::string content_text(const json& c, const std::string& where) {
  if (c.is_null()) return "";
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    std::string s;
    for (const json& part : c) {
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
        throw bad_request(where + ": each content part must be an object with a 'type'");
      const std::string type = part["type"];
      if (type != "text")
        throw bad_request(where + ": content parts of type '" + type + "' are not supported (text only)");
      if (!part.contains("text") || !part["text"].is_string()) throw bad_request(where + ": a text part needs 'text'");
      s += part["text"].get<std::string>();
    }
    return s;
  }
  throw bad_request(where + ": 'content' must be a string or an array of parts");
}

std::vector<text::ChatMessage> convert_messages(const json& body) {
  const auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) throw bad_request("'messages' must be a non-empty array");
  std::vector<text::ChatMessage> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad_request(where + " must be an object");
    text::ChatMessage cm;
    if (!m.contains("role") || !m["role"].is_string()) throw bad_request(where + ": 'role' must be a string");
    cm.role = m["role"];
    if (cm.role != "system" && cm.role != "developer" && cm.role != "user" && cm.role != "assistant" &&
        cm.role != "tool" && cm.role != "function")
      throw bad_request(where + ": unknown role '" + cm.role + "'");
    cm.content = content_text(m.value("content", json()), where);
    // Reasoning of earlier turns comes back under either name (DeepSeek's and vLLM's).
    for (const char* key : {"reasoning_content", "reasoning"})
      if (m.contains(key) && m[key].is_string() && cm.reasoning.empty()) cm.reasoning = m[key];
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (!m["tool_calls"].is_array()) throw bad_request(where + ": 'tool_calls' must be an array");
      for (const json& tc : m["tool_calls"]) {
        if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object())
          throw bad_request(where + ": each tool call needs a 'function' object");
        const json& f = tc["function"];
        text::ToolCall call;
        call.id = tc.value("id", "");
        if (!f.contains("name") || !f["name"].is_string()) throw bad_request(where + ": a tool call needs a function name");
        call.name = f["name"];
        const json args = f.value("arguments", json("{}"));
        call.arguments = args.is_string() ? args.get<std::string>() : args.dump();
        cm.tool_calls.push_back(std::move(call));
      }
    }
    if (m.contains("tool_call_id") && m["tool_call_id"].is_string()) cm.tool_call_id = m["tool_call_id"];
    out.push_back(std::move(cm));
  }
  return out;
}

text::ChatOptions convert_options(const json& body) {
  text::ChatOptions o;
  if (auto effort = get_string(body, "reasoning_effort")) {
    const auto b = text::parse_reasoning_effort(*effort);
    if (!b) throw bad_request("unknown reasoning_effort '" + *effort + "' (max, xhigh, high, medium, low, minimal, none)");
    o.reasoning_effort = *b;
    o.thinking = *b > 0;
  }
  // DeepSeek's API: "thinking": {"type": "enabled"|"disabled"}; llama.cpp's chat_template_kwargs.
  if (body.contains("thinking")) {
    const json& t = body["thinking"];
    if (t.is_boolean()) o.thinking = t.get<bool>();
    else if (t.is_object() && t.contains("type") && t["type"].is_string()) o.thinking = t["type"] != "disabled";
    else if (!t.is_null()) throw bad_request("'thinking' must be {\"type\": \"enabled\"|\"disabled\"}");
  }
  if (body.contains("chat_template_kwargs") && body["chat_template_kwargs"].is_object()) {
    const json& k = body["chat_template_kwargs"];
    for (const char* key : {"thinking", "enable_thinking"})
      if (k.contains(key) && k[key].is_boolean()) o.thinking = k[key].get<bool>();
  }
  if (o.thinking && o.reasoning_effort == 0) o.reasoning_effort = text::kEffortHigh;
  if (!o.thinking) o.reasoning_effort = 0;
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) throw bad_request("'tools' must be an array");
    for (const json& t : body["tools"]) {
      if (!t.is_object()) throw bad_request("each tool must be an object");
      o.tools.push_back(t.dump());
    }
  }
  if (body.contains("tool_choice") && body["tool_choice"].is_string() && body["tool_choice"] == "none") o.tools.clear();
  if (body.contains("response_format") && body["response_format"].is_object()) {
    const json& rf = body["response_format"];
    const std::string type = rf.value("type", "text");
    if (type == "json_schema" && rf.contains("json_schema") && rf["json_schema"].is_object())
      o.response_format = rf["json_schema"].value("schema", json::object()).dump();
    else if (type == "json_object")
      o.response_format = json{{"type", "object"}}.dump();
  }
  return o;
}

SamplingFields sampling_fields(const json& body) {
  SamplingFields s;
  s.temperature = get_number(body, "temperature");
  s.top_p = get_number(body, "top_p");
  s.seed = get_int(body, "seed");
  return s;
}

std::optional<int64_t> max_tokens_field(const json& body) {
  if (auto v = get_int(body, "max_completion_tokens")) return v;
  if (auto v = get_int(body, "max_tokens")) return v;
  return get_int(body, "n_predict");
}

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

bool stream_requested(const json& body) { return get_bool(body, "stream").value_or(false); }

bool include_usage(const json& body) {
  const auto it = body.find("stream_options");
  return it != body.end() && it->is_object() && it->value("include_usage", false) == true;
}

// Writes an error into a stream that has already started (status line already sent).
void stream_error(Connection& conn, const DriveOutcome& o) {
  conn.write(sse_data(openai_error_body(o.status, o.status == 400 ? "invalid_request_error" : "server_error", o.error)));
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
  const json body = parse_body(req.body);
  const Session& s = ready_session(ctx);
  const auto messages = convert_messages(body);
  const text::ChatOptions opts = convert_options(body);
  if (auto n = get_int(body, "n"); n && *n != 1) throw bad_request("only n = 1 is supported");
  const bool stream = stream_requested(body);
  const std::vector<std::string> stops = parse_stop_strings(body, "stop");
  std::string prompt_text;
  std::vector<uint32_t> prompt = encode_chat(s, messages, opts, &prompt_text);
  GenerateRequest gr = make_request(ctx, std::move(prompt), max_tokens_field(body), sampling_fields(body),
                                    chat_stop_tokens(s.tokenizer()));
  gr.prompt_text = std::move(prompt_text);
  gr.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  if (gr.ignore_eos) gr.stop_tokens.clear();
  const TextMode mode = opts.thinking ? TextMode::Thinking : TextMode::Chat;
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
    send_stream_head(conn, 200, "text/event-stream");
    // First bytes at once, before the queue wait and the prefill: clients with a first-byte
    // timeout see a live connection.
    conn.write(sse_comment("sluice " + id) + sse_data(chunk({{"role", "assistant"}, {"content", ""}}, nullptr)));
    size_t n_calls = 0;
    Streamer st{ctx, conn};
    DriveHooks h = st.hooks();
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
    if (include_usage(body)) {
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
  send_response(conn, 200, "application/json", dump(resp));
  return 200;
}

int handle_completions(ServerContext& ctx, const HttpRequest& req, Connection& conn) {
  const json body = parse_body(req.body);
  const Session& s = ready_session(ctx);
  const auto it = body.find("prompt");
  if (it == body.end()) throw bad_request("'prompt' is required");
  json prompt = *it;
  // A batch of one is accepted; larger batches are not (one sequence).
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) prompt = prompt[0];
  std::vector<uint32_t> ids;
  if (prompt.is_string()) {
    ids = to_ids(s.tokenizer().encode(prompt.get<std::string>(), s.tokenizer().add_bos_default()));
  } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) {
    for (const json& t : prompt) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= s.tokenizer().n_vocab())
        throw bad_request("'prompt': token ids must be integers in [0, " + std::to_string(s.tokenizer().n_vocab()) + ")");
      ids.push_back(t.get<uint32_t>());
    }
  } else {
    throw bad_request("'prompt' must be a string, an array of token ids, or an array with one of those");
  }
  if (get_bool(body, "echo").value_or(false)) throw bad_request("'echo' is not supported");
  if (auto n = get_int(body, "n"); n && *n != 1) throw bad_request("only n = 1 is supported");
  const bool stream = stream_requested(body);
  const std::vector<std::string> stops = parse_stop_strings(body, "stop");
  GenerateRequest gr = make_request(ctx, std::move(ids), max_tokens_field(body), sampling_fields(body), {});
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
    send_stream_head(conn, 200, "text/event-stream");
    conn.write(sse_comment("sluice " + id));
    Streamer st{ctx, conn};
    DriveHooks h = st.hooks();
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
    if (include_usage(body)) {
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
  send_response(conn, 200, "application/json", dump(resp));
  return 200;
}

int handle_models(ServerContext& ctx, const HttpRequest&, Connection& conn) {
  json meta = json::object();
  if (const Session* s = ctx.worker.session()) meta = {{"n_ctx", s->ctx()}, {"n_vocab", s->tokenizer().n_vocab()}};
  const json resp = {{"object", "list"},
                     {"data", json::array({{{"id", ctx.model_id},
                                            {"object", "model"},
                                            {"created", 0},
                                            {"owned_by", "sluice"},
                                            {"meta", meta}}})}};
  send_response(conn, 200, "application/json", dump(resp));
  return 200;
}

}  // namespace sluice::server
