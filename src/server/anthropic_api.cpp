#include "server/anthropic_api.h"

#include <vector>

#include "server/api_error.h"
#include "server/generation.h"
#include "server/stop_strings.h"
#include "server/sse.h"
#include "text/chat.h"

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

// Text of a string or of an array of blocks where only text blocks are allowed.
std::string text_of(const json& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) throw bad_request(where + " must be a string or an array of content blocks");
  std::string s;
  for (const json& b : c) {
    if (!b.is_object() || b.value("type", "") != "text" || !b.contains("text") || !b["text"].is_string())
      throw bad_request(where + ": only text blocks are supported here");
    if (!s.empty()) s += "\n\n";
    s += b["text"].get<std::string>();
  }
  return s;
}

struct Converted {
  std::vector<text::ChatMessage> messages;
  text::ChatOptions options;
};

Converted convert(const json& body) {
  Converted out;
  if (body.contains("system") && !body["system"].is_null()) {
    text::ChatMessage sys;
    sys.role = "system";
    sys.content = text_of(body["system"], "'system'");
    out.messages.push_back(std::move(sys));
  }
  const auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) throw bad_request("'messages' must be a non-empty array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw bad_request(where + " must be an object with a 'role'");
    const std::string role = m["role"];
    if (role != "user" && role != "assistant") throw bad_request(where + ": role must be 'user' or 'assistant'");
    if (!m.contains("content")) throw bad_request(where + ": 'content' is required");
    const json& c = m["content"];
    if (c.is_string()) {
      out.messages.push_back(text::ChatMessage{role, c.get<std::string>(), "", {}, ""});
      continue;
    }
    if (!c.is_array()) throw bad_request(where + ": 'content' must be a string or an array of blocks");
    // A user turn may mix tool results and text: results become tool messages (in order),
    // text becomes a user message after them — the renderer joins them into one user turn.
    text::ChatMessage msg{role, "", "", {}, ""};
    std::vector<text::ChatMessage> results;
    for (size_t k = 0; k < c.size(); ++k) {
      const json& b = c[k];
      const std::string bw = where + ".content[" + std::to_string(k) + "]";
      if (!b.is_object() || !b.contains("type") || !b["type"].is_string()) throw bad_request(bw + " needs a 'type'");
      const std::string type = b["type"];
      if (type == "text") {
        if (!b.contains("text") || !b["text"].is_string()) throw bad_request(bw + ": 'text' must be a string");
        if (!msg.content.empty()) msg.content += "\n\n";
        msg.content += b["text"].get<std::string>();
      } else if (type == "thinking" && role == "assistant") {
        msg.reasoning += b.value("thinking", "");
      } else if (type == "redacted_thinking" && role == "assistant") {
        // Nothing to replay.
      } else if (type == "tool_use" && role == "assistant") {
        if (!b.contains("name") || !b["name"].is_string()) throw bad_request(bw + ": tool_use needs a 'name'");
        const json input = b.value("input", json::object());
        msg.tool_calls.push_back(text::ToolCall{b.value("id", ""), b["name"], input.dump()});
      } else if (type == "tool_result" && role == "user") {
        text::ChatMessage r{"tool", "", "", {}, b.value("tool_use_id", "")};
        if (b.contains("content") && !b["content"].is_null()) r.content = text_of(b["content"], bw + ".content");
        if (b.value("is_error", false)) r.content = "Error: " + r.content;
        results.push_back(std::move(r));
      } else {
        throw bad_request(bw + ": content blocks of type '" + type + "' are not supported in " + role + " turns");
      }
    }
    for (auto& r : results) out.messages.push_back(std::move(r));
    if (role == "assistant" || !msg.content.empty() || results.empty()) out.messages.push_back(std::move(msg));
  }
  // Anthropic's default is no extended thinking.
  out.options.thinking = false;
  out.options.reasoning_effort = 0;
  if (body.contains("thinking") && body["thinking"].is_object() && body["thinking"].value("type", "") == "enabled") {
    out.options.thinking = true;
    out.options.reasoning_effort = text::kEffortHigh;
  }
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) throw bad_request("'tools' must be an array");
    for (const json& t : body["tools"]) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) throw bad_request("each tool needs a 'name'");
      // Server tools (web search, ...) carry a 'type' and no schema; there is nothing to run them.
      json fn = {{"name", t["name"]}};
      if (t.contains("description")) fn["description"] = t["description"];
      fn["parameters"] = t.value("input_schema", json{{"type", "object"}});
      out.options.tools.push_back(json{{"type", "function"}, {"function", fn}}.dump());
    }
  }
  if (body.contains("tool_choice") && body["tool_choice"].is_object() && body["tool_choice"].value("type", "") == "none")
    out.options.tools.clear();
  return out;
}

json stop_sequence(const DriveOutcome& o) { return o.stop_string.empty() ? json(nullptr) : json(o.stop_string); }

std::string stop_reason(const DriveOutcome& o) {
  if (o.had_calls) return "tool_use";
  if (!o.stop_string.empty()) return "stop_sequence";
  return finish_reason(o) == "length" ? "max_tokens" : "end_turn";
}

json usage_json(const GenerateResult& r, bool final) {
  json u = {{"input_tokens", r.prompt_tokens},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", r.reused_tokens},
            {"output_tokens", final ? r.tokens.size() : 0}};
  return u;
}

json tool_input(const std::string& arguments) {
  try {
    json j = json::parse(arguments);
    if (j.is_object()) return j;
  } catch (const json::exception&) {
  }
  return json{{"arguments", arguments}};
}

}  // namespace

int handle_count_tokens(ServerContext& ctx, const HttpRequest& req, Connection& conn) {
  const json body = parse_body(req.body);
  const Session& s = ready_session(ctx);
  const Converted c = convert(body);
  const size_t n = encode_chat(s, c.messages, c.options).size();
  send_response(conn, 200, "application/json", dump(json{{"input_tokens", n}}));
  return 200;
}

int handle_messages(ServerContext& ctx, const HttpRequest& req, Connection& conn) {
  const json body = parse_body(req.body);
  const Session& s = ready_session(ctx);
  const Converted c = convert(body);
  const auto max_tokens = get_int(body, "max_tokens");
  if (!max_tokens) throw bad_request("'max_tokens' is required");
  SamplingFields sf;
  sf.temperature = get_number(body, "temperature");
  sf.top_p = get_number(body, "top_p");
  const bool stream = get_bool(body, "stream").value_or(false);
  const std::vector<std::string> stops = parse_stop_strings(body, "stop_sequences");
  std::string prompt_text;
  std::vector<uint32_t> prompt = encode_chat(s, c.messages, c.options, &prompt_text);
  const uint32_t n_prompt = (uint32_t)prompt.size();
  GenerateRequest gr = make_request(ctx, std::move(prompt), max_tokens, sf, chat_stop_tokens(s.tokenizer()));
  gr.prompt_text = std::move(prompt_text);
  const TextMode mode = c.options.thinking ? TextMode::Thinking : TextMode::Chat;
  auto job = submit(ctx, std::move(gr));
  const std::string id = new_id(ctx, "msg_");

  if (stream) {
    send_stream_head(conn, 200, "text/event-stream");
    json start = {{"type", "message_start"},
                  {"message", {{"id", id},
                               {"type", "message"},
                               {"role", "assistant"},
                               {"content", json::array()},
                               {"model", ctx.model_id},
                               {"stop_reason", nullptr},
                               {"stop_sequence", nullptr},
                               {"usage", {{"input_tokens", n_prompt}, {"output_tokens", 0}}}}}};
    const std::string ping = sse_event("ping", {{"type", "ping"}});
    conn.write(sse_event("message_start", start) + ping);
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
    h.keepalive = [&] { return conn.write(ping); };
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
    std::string out;
    close_block(out);
    out += sse_event("message_delta", {{"type", "message_delta"},
                                       {"delta", {{"stop_reason", stop_reason(o)}, {"stop_sequence", stop_sequence(o)}}},
                                       {"usage", {{"output_tokens", o.result.tokens.size()}}}});
    out += sse_event("message_stop", {{"type", "message_stop"}});
    conn.write(out);
    return 200;
  }

  json content = json::array();
  DriveHooks h;
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
  send_response(conn, 200, "application/json", dump(resp));
  return 200;
}

}  // namespace sluice::server
