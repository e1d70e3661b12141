// POST /v1/responses body -> ResponsesRequest (see responses_request.h).
#include "server/responses_request.h"

#include <set>

#include "server/api_error.h"
#include "server/media_placeholder.h"
#include "server/request_json.h"

namespace sluice::server {

using nlohmann::json;

namespace {

// Tool types that run on OpenAI's side (or the client's, under a fixed protocol sluice does
// not speak). sluice runs none of them, and the model is never told about them: dropping them
// (and logging it) lets clients that always send one — Codex sends web_search — work.
const std::set<std::string>& builtin_tools() {
  static const std::set<std::string> s = {
      "web_search",        "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
      "file_search",       "code_interpreter",   "image_generation",              "computer_use_preview",
      "computer_use",      "mcp",                "local_shell",                   "shell",
      "apply_patch",       "custom",             "tool_search"};
  return s;
}

// Output items of those tools, replayed in `input` by stateless clients.
const std::set<std::string>& builtin_items() {
  static const std::set<std::string> s = {
      "web_search_call",   "file_search_call",    "code_interpreter_call", "image_generation_call",
      "computer_call",     "computer_call_output", "local_shell_call",     "local_shell_call_output",
      "shell_call",        "shell_call_output",   "apply_patch_call",      "apply_patch_call_output",
      "mcp_call",          "mcp_list_tools",      "mcp_approval_request",  "mcp_approval_response",
      "custom_tool_call",  "custom_tool_call_output", "tool_search_call",  "tool_search_output"};
  return s;
}

std::string where_of(size_t i) { return "input[" + std::to_string(i) + "]"; }

std::string string_field(const json& j, const char* key, const std::string& where, bool required) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) throw bad_request(where + ": '" + key + "' is required (a string)");
    return "";
  }
  if (!it->is_string()) throw bad_request(where + ": '" + key + "' must be a string");
  return it->get<std::string>();
}

// Text of a message's or a tool output's content: a string, or parts. Text parts are joined by
// blank lines; image, file and audio parts become the placeholder every endpoint writes
// (media_placeholder.h), recorded in `omitted` for the request's log line.
std::string content_text(const json& c, const std::string& where, std::vector<std::string>& omitted) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) throw bad_request(where + " must be a string or an array of content parts");
  std::string s;
  auto add = [&](const std::string& t) {
    if (!s.empty()) s += "\n\n";
    s += t;
  };
  for (size_t k = 0; k < c.size(); ++k) {
    const json& p = c[k];
    const std::string pw = where + "[" + std::to_string(k) + "]";
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      throw bad_request(pw + " must be an object with a 'type'");
    const std::string type = p["type"];
    if (type == "input_text" || type == "output_text" || type == "text" || type == "summary_text" ||
        type == "reasoning_text") {
      add(string_field(p, "text", pw, true));
    } else if (type == "refusal") {
      add(string_field(p, "refusal", pw, true));
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      add(openai_media_text(p, omitted));
    } else {
      throw bad_request(pw + ": content parts of type '" + type + "' are not supported");
    }
  }
  return s;
}

struct Converter {
  size_t max_depth;
  ResponsesRequest& r;
  std::vector<text::ChatMessage>& out;
  // The assistant turn being assembled: reasoning, text and calls of one model response come
  // as separate items and render as one DeepSeek assistant turn.
  std::optional<text::ChatMessage> pending;

  void flush() {
    if (pending) out.push_back(std::move(*pending));
    pending.reset();
  }
  text::ChatMessage& assistant() {
    if (!pending) pending = text::ChatMessage{"assistant", "", "", {}, ""};
    return *pending;
  }

  void message(const json& m, const std::string& where) {
    const std::string role = string_field(m, "role", where, true);
    if (!m.contains("content") || m["content"].is_null()) throw bad_request(where + ": 'content' is required");
    const std::string text = content_text(m["content"], where + ".content", r.chat.omitted);
    if (role == "assistant") {
      // Text after calls (or after earlier text) starts a new turn.
      if (pending && (!pending->tool_calls.empty() || !pending->content.empty())) flush();
      assistant().content = text;
      return;
    }
    if (role != "user" && role != "system" && role != "developer")
      throw bad_request(where + ": unknown role '" + role + "' (user, assistant, system, developer)");
    flush();
    // developer is OpenAI's newer name for system instructions.
    out.push_back(text::ChatMessage{role == "user" ? "user" : "system", text, "", {}, ""});
  }

  void function_call(const json& m, const std::string& where) {
    text::ToolCall call;
    call.id = string_field(m, "call_id", where, true);
    const std::string name = string_field(m, "name", where, true);
    if (name.empty()) throw bad_request(where + ": 'name' must not be empty");
    const std::string ns = string_field(m, "namespace", where, false);
    call.name = ns.empty() ? name : ns + "." + name;
    const auto a = m.find("arguments");
    if (a == m.end() || a->is_null()) {
      call.arguments = "{}";
    } else if (a->is_string()) {
      call.arguments = a->get<std::string>();
      // JSON inside a string: the body's depth check did not see it, the prompt writer will walk it.
      check_json_depth(call.arguments, max_depth, where + ": 'arguments'");
    } else if (a->is_object()) {
      call.arguments = a->dump();
    } else {
      throw bad_request(where + ": 'arguments' must be a string (JSON text)");
    }
    assistant().tool_calls.push_back(std::move(call));
  }

  void function_call_output(const json& m, const std::string& where) {
    flush();
    text::ChatMessage t{"tool", "", "", {}, string_field(m, "call_id", where, true)};
    if (!m.contains("output") || m["output"].is_null()) throw bad_request(where + ": 'output' is required");
    t.content = content_text(m["output"], where + ".output", r.chat.omitted);
    out.push_back(std::move(t));
  }

  // Replayed reasoning: its text (content), else its summary. encrypted_content is opaque to
  // us (sluice never sends one), so it is not read.
  void reasoning(const json& m, const std::string& where) {
    std::string text;
    if (m.contains("content") && !m["content"].is_null())
      text = content_text(m["content"], where + ".content", r.chat.omitted);
    if (text.empty() && m.contains("summary") && !m["summary"].is_null())
      text = content_text(m["summary"], where + ".summary", r.chat.omitted);
    if (pending && (!pending->tool_calls.empty() || !pending->content.empty())) flush();
    text::ChatMessage& a = assistant();
    if (!a.reasoning.empty() && !text.empty()) a.reasoning += "\n\n";
    a.reasoning += text;
  }

  void item(const json& m, size_t i) {
    const std::string where = where_of(i);
    if (!m.is_object()) throw bad_request(where + " must be an object");
    // An item without a type but with a role is a message (the API's "easy input message").
    std::string type = "message";
    if (m.contains("type") && !m["type"].is_null()) {
      if (!m["type"].is_string()) throw bad_request(where + ": 'type' must be a string");
      type = m["type"];
    }
    if (type == "message") return message(m, where);
    if (type == "function_call") return function_call(m, where);
    if (type == "function_call_output") return function_call_output(m, where);
    if (type == "reasoning") return reasoning(m, where);
    if (type == "item_reference")
      throw bad_request(where + ": 'item_reference' needs stored responses, which sluice does not keep; send the items");
    if (builtin_items().count(type)) {
      r.dropped.push_back({where, type});
      return;
    }
    throw bad_request(where + ": items of type '" + type + "' are not supported");
  }
};

json function_tool(const json& t, const std::string& where, const std::string& name) {
  json fn = {{"name", name}};
  if (t.contains("description") && !t["description"].is_null()) {
    if (!t["description"].is_string()) throw bad_request(where + ".description must be a string");
    fn["description"] = t["description"];
  }
  const auto p = t.find("parameters");
  if (p != t.end() && !p->is_null()) {
    if (!p->is_object()) throw bad_request(where + ".parameters must be a JSON object (a JSON Schema)");
    fn["parameters"] = *p;
  } else {
    fn["parameters"] = json{{"type", "object"}, {"properties", json::object()}};
  }
  return json{{"type", "function"}, {"function", std::move(fn)}};
}

std::string tool_name(const json& t, const std::string& where) {
  if (!t.contains("name") || !t["name"].is_string() || t["name"].get_ref<const std::string&>().empty())
    throw bad_request(where + " needs a 'name' (a non-empty string)");
  return t["name"];
}

// Returns the names the model may call (flattened for namespaces).
std::set<std::string> convert_tools(const json& body, ResponsesRequest& r) {
  std::set<std::string> names;
  r.tools = json::array();
  const auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return names;
  if (!it->is_array()) throw bad_request("'tools' must be an array");
  r.tools = *it;
  auto add = [&](const std::string& name, json tool, const std::string& where) {
    if (!names.insert(name).second) throw bad_request(where + ": a second tool named '" + name + "'");
    r.chat.options.tools.push_back(tool.dump());
  };
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("type") || !t["type"].is_string())
      throw bad_request(where + " must be an object with a 'type'");
    const std::string type = t["type"];
    if (type == "function") {
      const std::string name = tool_name(t, where);
      add(name, function_tool(t, where, name), where);
    } else if (type == "namespace") {
      const std::string ns = tool_name(t, where);
      if (!t.contains("tools") || !t["tools"].is_array()) throw bad_request(where + ": a namespace needs 'tools' (an array)");
      std::string ns_desc;
      if (t.contains("description") && !t["description"].is_null()) {
        if (!t["description"].is_string()) throw bad_request(where + ".description must be a string");
        ns_desc = t["description"];
      }
      const json& sub = t["tools"];
      for (size_t k = 0; k < sub.size(); ++k) {
        const json& s = sub[k];
        const std::string sw = where + ".tools[" + std::to_string(k) + "]";
        if (!s.is_object()) throw bad_request(sw + " must be an object");
        std::string stype = "function";
        if (s.contains("type") && !s["type"].is_null()) {
          if (!s["type"].is_string()) throw bad_request(sw + ": 'type' must be a string");
          stype = s["type"];
        }
        if (builtin_tools().count(stype)) {
          r.dropped.push_back({sw, "tool " + stype});
          continue;
        }
        if (stype != "function") throw bad_request(sw + ": unknown tool type '" + stype + "' in a namespace");
        const std::string name = tool_name(s, sw);
        const std::string flat = ns + "." + name;
        json fn = function_tool(s, sw, flat);
        // The namespace's description is the only place the model learns what the group is for.
        if (!ns_desc.empty()) {
          const std::string own = fn["function"].value("description", "");
          fn["function"]["description"] = ns_desc + (own.empty() ? "" : "\n\n" + own);
        }
        add(flat, std::move(fn), sw);
        r.namespaced[flat] = {ns, name};
      }
    } else if (builtin_tools().count(type)) {
      r.dropped.push_back({where, "tool " + type});
    } else {
      throw bad_request(where + ": unknown tool type '" + type + "' (function, namespace, or a built-in tool)");
    }
  }
  return names;
}

// "none" leaves the tools out; "auto", "required", allowed_tools and a named function keep
// them all (the choice is not enforced by a grammar). A function that is not a tool is refused.
void apply_tool_choice(const json& body, const std::set<std::string>& names, ResponsesRequest& r) {
  const auto it = body.find("tool_choice");
  r.tool_choice = it == body.end() || it->is_null() ? json("auto") : *it;
  if (it == body.end() || it->is_null()) return;
  if (it->is_string()) {
    const std::string c = *it;
    if (c == "none") r.chat.options.tools.clear();
    else if (c != "auto" && c != "required")
      throw bad_request("unknown tool_choice '" + c + "' (none, auto, required, or an object)");
    return;
  }
  if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
    throw bad_request("'tool_choice' must be \"none\", \"auto\", \"required\" or an object with a 'type'");
  const std::string type = (*it)["type"];
  if (type == "allowed_tools") return;
  if (type != "function")
    throw bad_request("tool_choice of type '" + type + "' is not supported (sluice runs no built-in tools)");
  if (!it->contains("name") || !(*it)["name"].is_string())
    throw bad_request("tool_choice of type 'function' needs a 'name'");
  std::string name = (*it)["name"];
  if (it->contains("namespace") && (*it)["namespace"].is_string()) name = (*it)["namespace"].get<std::string>() + "." + name;
  if (!names.count(name)) throw bad_request("tool_choice names the function '" + name + "', which is not in 'tools'");
}

void convert_reasoning(const json& body, ResponsesRequest& r) {
  text::ChatOptions& o = r.chat.options;
  // Default: thinking on at high effort (the Responses API serves reasoning models; clients that
  // want none say effort "none").
  o.thinking = true;
  o.reasoning_effort = text::kEffortHigh;
  json effort = nullptr, summary = nullptr;
  const auto it = body.find("reasoning");
  if (it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw bad_request("'reasoning' must be an object");
    if (auto e = get_string(*it, "effort")) {
      const auto b = text::parse_reasoning_effort(*e);
      if (!b) throw bad_request("unknown reasoning.effort '" + *e + "' (none, minimal, low, medium, high, xhigh, max)");
      o.reasoning_effort = *b;
      o.thinking = *b > 0;
      effort = *e;
    }
    // No summarizer: reasoning is returned as its text (reasoning_text), never summarized.
    if (auto s = get_string(*it, "summary")) summary = *s;
    else if (auto g = get_string(*it, "generate_summary")) summary = *g;
  }
  r.reasoning = {{"effort", effort}, {"summary", summary}};
}

void convert_text_format(const json& body, ResponsesRequest& r) {
  r.text_format = json{{"type", "text"}};
  const auto it = body.find("text");
  if (it == body.end() || it->is_null()) return;
  if (!it->is_object()) throw bad_request("'text' must be an object");
  const auto f = it->find("format");
  if (f == it->end() || f->is_null()) return;
  if (!f->is_object() || !f->contains("type") || !(*f)["type"].is_string())
    throw bad_request("'text.format' must be an object with a 'type'");
  r.text_format = *f;
  const std::string type = (*f)["type"];
  if (type == "text") return;
  if (type == "json_object") {
    r.chat.options.response_format = json{{"type", "object"}}.dump();
    return;
  }
  if (type != "json_schema") throw bad_request("unknown text.format type '" + type + "' (text, json_object, json_schema)");
  const auto s = f->find("schema");
  if (s == f->end() || (!s->is_object() && !s->is_boolean()))
    throw bad_request("'text.format.schema' must be a JSON Schema (an object)");
  r.chat.options.response_format = s->dump();
}

// Fields that need state sluice does not keep, or work it does not do: refused rather than
// half-honoured.
void refuse_unsupported(const json& body) {
  for (const char* key : {"previous_response_id", "conversation", "prompt"}) {
    const auto it = body.find(key);
    if (it != body.end() && !it->is_null())
      throw bad_request(std::string("'") + key +
                        "' is not supported: sluice stores no responses or prompts; send the whole conversation "
                        "in 'input' (as clients with store: false do)");
  }
  if (get_bool(body, "background").value_or(false)) throw bad_request("'background': true is not supported");
  if (auto t = get_string(body, "truncation"); t && *t != "disabled")
    throw bad_request("truncation '" + *t + "' is not supported (only 'disabled': a prompt longer than the context is refused)");
  if (auto n = get_int(body, "top_logprobs"); n && *n != 0) throw bad_request("'top_logprobs' is not supported");
}

}  // namespace

ResponsesRequest responses_request(const json& body, size_t max_json_depth) {
  ResponsesRequest r;
  refuse_unsupported(body);
  std::vector<text::ChatMessage>& msgs = r.chat.messages;
  r.instructions = nullptr;
  if (auto ins = get_string(body, "instructions")) {
    r.instructions = *ins;
    msgs.push_back(text::ChatMessage{"system", *ins, "", {}, ""});
  }
  const auto in = body.find("input");
  if (in == body.end() || in->is_null()) throw bad_request("'input' is required (a string or an array of items)");
  if (in->is_string()) {
    msgs.push_back(text::ChatMessage{"user", in->get<std::string>(), "", {}, ""});
  } else if (in->is_array()) {
    if (in->empty()) throw bad_request("'input' must not be empty");
    Converter c{max_json_depth, r, msgs, std::nullopt};
    for (size_t i = 0; i < in->size(); ++i) c.item((*in)[i], i);
    c.flush();
  } else {
    throw bad_request("'input' must be a string or an array of items");
  }
  apply_tool_choice(body, convert_tools(body, r), r);
  convert_reasoning(body, r);
  convert_text_format(body, r);
  r.parallel_tool_calls = get_bool(body, "parallel_tool_calls").value_or(true);
  r.metadata = body.contains("metadata") && body["metadata"].is_object() ? body["metadata"] : json::object();
  r.max_output_tokens = get_int(body, "max_output_tokens");
  r.chat.max_tokens = r.max_output_tokens;
  r.chat.sampling = sampling_fields(body, r.chat.max_tokens);
  r.chat.stream = get_bool(body, "stream").value_or(false);
  // Accepted and without effect: store (nothing is stored), include (no encrypted reasoning),
  // prompt_cache_key (one kept sequence, matched by its tokens), client_metadata, user, ...
  (void)get_bool(body, "store");
  r.chat.tools = r.chat.options.tools.size();
  return r;
}

}  // namespace sluice::server
