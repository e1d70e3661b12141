// POST /v1/chat/completions body -> ChatRequest (see chat_request.h).
#include <set>

#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/media_placeholder.h"
#include "server/request_json.h"
#include "server/stop_strings.h"

namespace sluice::server {

using nlohmann::json;

namespace {

// A message's content: a string, null, or an array of {"type":"text","text":...} parts (image,
// audio and file parts become placeholders, server/media_placeholder.h).
std::string content_text(const json& c, const std::string& where, std::vector<std::string>& omitted) {
  if (c.is_null()) return "";
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    std::string s;
    for (const json& part : c) {
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
        throw bad_request(where + ": each content part must be an object with a 'type'");
      const std::string type = part["type"];
      if (is_openai_media(type)) {
        s += openai_media_text(part, omitted);
        continue;
      }
      if (type != "text")
        throw bad_request(where + ": content parts of type '" + type + "' are not supported (text, image_url, input_audio, file)");
      if (!part.contains("text") || !part["text"].is_string()) throw bad_request(where + ": a text part needs 'text'");
      s += part["text"].get<std::string>();
    }
    return s;
  }
  throw bad_request(where + ": 'content' must be a string or an array of parts");
}

std::vector<text::ChatMessage> convert_messages(const json& body, size_t max_depth, std::vector<std::string>& omitted) {
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
    cm.content = content_text(m.value("content", json()), where, omitted);
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
        if (tc.contains("id") && tc["id"].is_string()) call.id = tc["id"];
        if (!f.contains("name") || !f["name"].is_string()) throw bad_request(where + ": a tool call needs a function name");
        call.name = f["name"];
        const json args = f.value("arguments", json("{}"));
        if (args.is_string()) {
          // JSON inside a string: the body's depth check did not see it, the prompt writer will walk it.
          call.arguments = args.get<std::string>();
          check_json_depth(call.arguments, max_depth, where + ": tool call arguments");
        } else {
          call.arguments = args.dump();
        }
        cm.tool_calls.push_back(std::move(call));
      }
    }
    if (m.contains("tool_call_id") && m["tool_call_id"].is_string()) cm.tool_call_id = m["tool_call_id"];
    out.push_back(std::move(cm));
  }
  return out;
}

// OpenAI function tools: {"type": "function", "function": {"name", "description", "parameters"}}.
// Returns the function names.
std::set<std::string> convert_tools(const json& body, text::ChatOptions& o) {
  std::set<std::string> names;
  const auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return names;
  if (!it->is_array()) throw bad_request("'tools' must be an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) throw bad_request(where + " must be an object");
    if (t.contains("type") && t["type"] != "function")
      throw bad_request(where + ": only tools of type 'function' are supported");
    if (!t.contains("function") || !t["function"].is_object())
      throw bad_request(where + " needs a 'function' object");
    const json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get_ref<const std::string&>().empty())
      throw bad_request(where + ".function needs a 'name' (a non-empty string)");
    if (f.contains("description") && !f["description"].is_string() && !f["description"].is_null())
      throw bad_request(where + ".function.description must be a string");
    if (f.contains("parameters") && !f["parameters"].is_object() && !f["parameters"].is_null())
      throw bad_request(where + ".function.parameters must be a JSON object (a JSON Schema)");
    names.insert(f["name"].get<std::string>());
    o.tools.push_back(t.dump());
  }
  return names;
}

// "none" leaves the tools out; "auto", "required" and a named function keep them (the choice is
// not enforced by a grammar). A function that is not among the tools is refused.
void apply_tool_choice(const json& body, const std::set<std::string>& names, text::ChatOptions& o) {
  const auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return;
  if (it->is_string()) {
    const std::string c = *it;
    if (c == "none") o.tools.clear();
    else if (c != "auto" && c != "required")
      throw bad_request("unknown tool_choice '" + c + "' (none, auto, required, or {\"type\":\"function\",...})");
    return;
  }
  if (!it->is_object() || it->value("type", json()) != "function" || !it->contains("function") ||
      !(*it)["function"].is_object() || !(*it)["function"].contains("name") || !(*it)["function"]["name"].is_string())
    throw bad_request("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
  const std::string name = (*it)["function"]["name"];
  if (!names.count(name)) throw bad_request("tool_choice names the function '" + name + "', which is not in 'tools'");
}

void convert_response_format(const json& body, text::ChatOptions& o) {
  const auto it = body.find("response_format");
  if (it == body.end() || it->is_null()) return;
  if (!it->is_object()) throw bad_request("'response_format' must be an object");
  const json& rf = *it;
  const json type = rf.value("type", json("text"));
  if (type == "text") return;
  if (type == "json_object") {
    o.response_format = json{{"type", "object"}}.dump();
    return;
  }
  if (type != "json_schema")
    throw bad_request("unknown response_format type " + type.dump() + " (text, json_object, json_schema)");
  if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
    throw bad_request("'response_format.json_schema' must be an object with a 'schema'");
  const json schema = rf["json_schema"].value("schema", json::object());
  if (!schema.is_object() && !schema.is_boolean())
    throw bad_request("'response_format.json_schema.schema' must be a JSON Schema (an object)");
  o.response_format = schema.dump();
}

// Thinking is off unless the request asks for it: generic OpenAI clients send no reasoning
// setting and read the answer from `content` (with thinking on by default they got only
// reasoning_content and an empty content).
text::ChatOptions convert_options(const json& body) {
  text::ChatOptions o;
  o.thinking = false;
  o.reasoning_effort = 0;
  if (auto effort = get_string(body, "reasoning_effort")) {
    const auto b = text::parse_reasoning_effort(*effort);
    if (!b) throw bad_request("unknown reasoning_effort '" + *effort + "' (max, xhigh, high, medium, low, minimal, none)");
    o.reasoning_effort = *b;
    o.thinking = *b > 0;
  }
  // OpenRouter's (and the Responses API's) form: "reasoning": {"effort": ...}.
  if (const auto it = body.find("reasoning"); it != body.end() && it->is_object()) {
    if (auto effort = get_string(*it, "effort")) {
      const auto b = text::parse_reasoning_effort(*effort);
      if (!b) throw bad_request("unknown reasoning.effort '" + *effort + "' (max, xhigh, high, medium, low, minimal, none)");
      o.reasoning_effort = *b;
      o.thinking = *b > 0;
    }
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
  apply_tool_choice(body, convert_tools(body, o), o);
  convert_response_format(body, o);
  return o;
}

}  // namespace

ChatRequest openai_chat_request(const json& body, size_t max_json_depth) {
  ChatRequest r;
  r.messages = convert_messages(body, max_json_depth, r.omitted);
  r.options = convert_options(body);
  r.tools = r.options.tools.size();
  if (auto n = get_int(body, "n"); n && *n != 1) throw bad_request("only n = 1 is supported");
  r.max_tokens = openai_max_tokens(body);
  r.sampling = sampling_fields(body, r.max_tokens);
  r.stream = get_bool(body, "stream").value_or(false);
  const auto so = body.find("stream_options");
  r.include_usage = so != body.end() && so->is_object() && so->value("include_usage", false) == true;
  r.stops = parse_stop_strings(body, "stop");
  r.ignore_eos = get_bool(body, "ignore_eos").value_or(false);
  return r;
}

}  // namespace sluice::server
