// POST /v1/messages body -> ChatRequest (see chat_request.h).
#include <set>

#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/media_placeholder.h"
#include "server/request_json.h"
#include "server/stop_strings.h"

namespace sluice::server {

using nlohmann::json;

namespace {

// Text of a string or of an array of text blocks (and, where `omitted` is given, image and
// document blocks, which become placeholders: tool results carry screenshots).
std::string text_of(const json& c, const std::string& where, std::vector<std::string>* omitted = nullptr) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) throw bad_request(where + " must be a string or an array of content blocks");
  std::string s;
  for (const json& b : c) {
    const std::string type = b.is_object() && b.contains("type") && b["type"].is_string() ? b["type"].get<std::string>() : "";
    std::string part;
    if (omitted && is_anthropic_media(type)) {
      part = anthropic_media_text(b, *omitted);
    } else {
      if (type != "text" || !b.contains("text") || !b["text"].is_string())
        throw bad_request(where + ": only text blocks are supported here" +
                          (omitted ? " (and image / document blocks)" : ""));
      part = b["text"].get<std::string>();
    }
    if (!s.empty()) s += "\n\n";
    s += part;
  }
  return s;
}

std::string string_or_empty(const json& b, const char* key) {
  const auto it = b.find(key);
  return it != b.end() && it->is_string() ? it->get<std::string>() : std::string();
}

void convert_messages(const json& body, std::vector<text::ChatMessage>& out, std::vector<std::string>& omitted) {
  if (body.contains("system") && !body["system"].is_null()) {
    text::ChatMessage sys;
    sys.role = "system";
    sys.content = text_of(body["system"], "'system'");
    out.push_back(std::move(sys));
  }
  const auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) throw bad_request("'messages' must be a non-empty array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw bad_request(where + " must be an object with a 'role'");
    const std::string role = m["role"];
    if (!m.contains("content")) throw bad_request(where + ": 'content' is required");
    const json& c = m["content"];
    // Instructions inside the conversation (Claude Code sends one on every request); the
    // renderer keeps a system message after the first turn where it stands (docs/chat.md).
    if (role == "system" || role == "developer") {
      out.push_back(text::ChatMessage{"system", text_of(c, where + ".content"), "", {}, ""});
      continue;
    }
    if (role != "user" && role != "assistant")
      throw bad_request(where + ": role must be 'user', 'assistant', 'system' or 'developer'");
    if (c.is_string()) {
      out.push_back(text::ChatMessage{role, c.get<std::string>(), "", {}, ""});
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
        msg.reasoning += string_or_empty(b, "thinking");
      } else if (type == "redacted_thinking" && role == "assistant") {
        // Nothing to replay.
      } else if (type == "tool_use" && role == "assistant") {
        if (!b.contains("name") || !b["name"].is_string()) throw bad_request(bw + ": tool_use needs a 'name'");
        const json input = b.value("input", json::object());
        msg.tool_calls.push_back(text::ToolCall{string_or_empty(b, "id"), b["name"], input.dump()});
      } else if (is_anthropic_media(type)) {
        if (!msg.content.empty()) msg.content += "\n\n";
        msg.content += anthropic_media_text(b, omitted);
      } else if (type == "tool_result" && role == "user") {
        text::ChatMessage r{"tool", "", "", {}, string_or_empty(b, "tool_use_id")};
        if (b.contains("content") && !b["content"].is_null()) r.content = text_of(b["content"], bw + ".content", &omitted);
        if (b.value("is_error", json(false)) == true) r.content = "Error: " + r.content;
        results.push_back(std::move(r));
      } else {
        throw bad_request(bw + ": content blocks of type '" + type + "' are not supported in " + role + " turns");
      }
    }
    for (auto& r : results) out.push_back(std::move(r));
    if (role == "assistant" || !msg.content.empty() || results.empty()) out.push_back(std::move(msg));
  }
}

// Tools become OpenAI function tools for the renderer; returns their names.
std::set<std::string> convert_tools(const json& body, text::ChatOptions& o) {
  std::set<std::string> names;
  if (!body.contains("tools") || body["tools"].is_null()) return names;
  if (!body["tools"].is_array()) throw bad_request("'tools' must be an array");
  for (const json& t : body["tools"]) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) throw bad_request("each tool needs a 'name'");
    // Server tools (web search, ...) carry a 'type' and no schema; there is nothing to run them.
    json fn = {{"name", t["name"]}};
    if (t.contains("description")) fn["description"] = t["description"];
    const json schema = t.value("input_schema", json{{"type", "object"}});
    if (!schema.is_object()) throw bad_request("tool '" + t["name"].get<std::string>() + "': 'input_schema' must be an object");
    fn["parameters"] = schema;
    names.insert(t["name"].get<std::string>());
    o.tools.push_back(json{{"type", "function"}, {"function", fn}}.dump());
  }
  return names;
}

// {"type": "auto" | "any" | "none" | "tool" (with "name")}; "none" leaves the tools out.
void apply_tool_choice(const json& body, const std::set<std::string>& names, text::ChatOptions& o) {
  const auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return;
  const json type = it->is_object() ? it->value("type", json()) : json();
  if (type == "none") {
    o.tools.clear();
  } else if (type == "tool") {
    if (!it->contains("name") || !(*it)["name"].is_string()) throw bad_request("tool_choice of type 'tool' needs a 'name'");
    const std::string name = (*it)["name"];
    if (!names.count(name)) throw bad_request("tool_choice names the tool '" + name + "', which is not in 'tools'");
  } else if (type != "auto" && type != "any") {
    throw bad_request("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
  }
}

// Anthropic's default is no extended thinking. "enabled" (with a budget) and "adaptive" turn it
// on; output_config.effort (low / medium / high / max) sets the effort, as the API's effort
// parameter does; the budget has no equivalent in the chat format and is not enforced.
void apply_thinking(const json& body, text::ChatOptions& o) {
  o.thinking = false;
  o.reasoning_effort = 0;
  const auto it = body.find("thinking");
  if (it != body.end() && !it->is_null()) {
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
      throw bad_request("'thinking' must be {\"type\": \"enabled\" | \"adaptive\" | \"disabled\"}");
    const std::string type = (*it)["type"];
    if (type != "enabled" && type != "adaptive" && type != "disabled")
      throw bad_request("unknown thinking type '" + type + "' (enabled, adaptive, disabled)");
    o.thinking = type != "disabled";
  }
  int effort = text::kEffortHigh;
  const auto oc = body.find("output_config");
  if (oc != body.end() && !oc->is_null()) {
    if (!oc->is_object()) throw bad_request("'output_config' must be an object");
    if (auto e = get_string(*oc, "effort")) {
      const auto b = text::parse_reasoning_effort(*e);
      if (!b || *b == 0) throw bad_request("unknown output_config.effort '" + *e + "' (low, medium, high, max)");
      effort = *b;
    }
  }
  if (o.thinking) o.reasoning_effort = effort;
}

}  // namespace

ChatRequest anthropic_request(const json& body, bool count_only) {
  ChatRequest r;
  convert_messages(body, r.messages, r.omitted);
  apply_thinking(body, r.options);
  apply_tool_choice(body, convert_tools(body, r.options), r.options);
  r.tools = r.options.tools.size();
  r.max_tokens = get_int(body, "max_tokens");
  if (!r.max_tokens && !count_only) throw bad_request("'max_tokens' is required");
  r.sampling = sampling_fields(body, r.max_tokens);
  r.stream = get_bool(body, "stream").value_or(false);
  r.stops = parse_stop_strings(body, "stop_sequences");
  return r;
}

}  // namespace sluice::server
