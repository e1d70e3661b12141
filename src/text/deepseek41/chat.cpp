#include "text/deepseek41/chat.h"

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "text/json_text.h"
#include "util/error.h"

namespace sluice::text {

const char* const kMaxEffortPrefix =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

namespace {

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";

struct Part {
  bool tool_result = false;
  std::string id;    // tool result: the call it answers
  PromptText text;
};

// A conversation turn after tool results have been folded into user turns.
struct Turn {
  bool user = false;
  std::vector<Part> parts;                  // user: text and tool results
  std::map<std::string, size_t> call_order; // user: ids of the latest assistant's calls
  const ChatMessage* assistant = nullptr;
};

enum class Role { System, User, Assistant, Tool };

Role role_of(const std::string& r) {
  if (r == "system" || r == "developer") return Role::System;
  if (r == "user") return Role::User;
  if (r == "assistant") return Role::Assistant;
  if (r == "tool" || r == "function") return Role::Tool;
  throw Error("chat message has unknown role \"" + r + "\"");
}

nlohmann::ordered_json parse_json(const std::string& text, const char* what) {
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string(what) + " is not valid JSON: " + e.what());
  }
}

// DeepSeek's encoder puts a turn's tool results in the order of the calls they answer (a
// result with an unknown id sorts as if it answered the first call; ties keep their order);
// text parts stay where they are.
void order_results(Turn& turn) {
  std::vector<Part> tools;
  for (const Part& p : turn.parts)
    if (p.tool_result) tools.push_back(p);
  if (tools.size() < 2 || turn.call_order.empty()) return;
  auto rank = [&](const Part& p) {
    auto it = turn.call_order.find(p.id);
    return it == turn.call_order.end() ? size_t{0} : it->second;
  };
  std::stable_sort(tools.begin(), tools.end(),
                   [&](const Part& a, const Part& b) { return rank(a) < rank(b); });
  size_t next = 0;
  for (Part& p : turn.parts)
    if (p.tool_result) p = tools[next++];
}

}  // namespace

std::string render_tools(const std::vector<std::string>& tools) {
  PromptText p;
  append_tools(p, tools);
  return p.text;
}

void append_tools(PromptText& out, const std::vector<std::string>& tools) {
  // The schemas are the client's text (their descriptions may quote anything): data.
  std::string schemas;
  for (const std::string& t : tools) {
    nlohmann::ordered_json j = parse_json(t, "tool schema");
    if (j.is_object() && j.contains("function") && j["function"].is_object()) j = j["function"];
    if (!j.is_object()) throw Error("tool schema is not a JSON object");
    if (!schemas.empty()) schemas += '\n';
    schemas += py_json(j);
  }
  out.markup(
      "## Tools\n\n"
      "You have access to a set of tools to help answer the user's question. You can invoke tools "
      "by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n"
      "<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
      "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
      "...\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
      "...\n"
      "</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>\n\n"
      "String parameters should be specified as is and set `string=\"true\"`. For all other types "
      "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
      "`string=\"false\"`.\n\n"
      "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
      "inside <think>...</think> BEFORE any tool calls or final response.\n\n"
      "Otherwise, output directly after </think> with tool calls or final response.\n\n"
      "### Available Tool Schemas\n\n");
  out.add_data(schemas);
  out.markup("\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
             "tool calls.\n");
}

std::optional<int> parse_reasoning_effort(std::string_view name) {
  if (name == "max") return kEffortMax;
  // Like ds4: "xhigh" is ordinary thinking; only an explicit "max" asks for the max prompt.
  if (name == "xhigh" || name == "high" || name == "medium") return kEffortHigh;
  if (name == "low" || name == "minimal") return kEffortLow;
  if (name == "none") return 0;
  return std::nullopt;
}

std::string render_chat(const std::vector<ChatMessage>& messages, const ChatOptions& o) {
  return render_chat_prompt(messages, o).text;
}

namespace {

// System text: the system messages before the first turn (messages[0, *leading)), in order,
// joined by blank lines; then tools and the response format, as DeepSeek's encoder appends them
// to the system message. A system message after the conversation has started stays where it is
// (fold_turns).
PromptText system_text(const std::vector<ChatMessage>& messages, const ChatOptions& o, size_t* leading) {
  PromptText system;
  auto add_system = [&](const PromptText& s) {
    if (!system.text.empty()) system.markup("\n\n");
    system.append(s);
  };
  size_t n = 0;
  while (n < messages.size() && role_of(messages[n].role) == Role::System) {
    PromptText d;
    d.add_data(messages[n++].content);
    add_system(d);
  }
  *leading = n;
  if (!o.tools.empty()) {
    PromptText t;
    append_tools(t, o.tools);
    add_system(t);
  }
  if (!o.response_format.empty()) {
    PromptText f;
    f.markup("## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n");
    f.add_data(py_json(parse_json(o.response_format, "response format")));
    add_system(f);
  }
  return system;
}

// Tool results and user text folded into user turns, from messages[leading] on.
std::vector<Turn> fold_turns(const std::vector<ChatMessage>& messages, size_t leading) {
  std::vector<Turn> turns;
  std::map<std::string, size_t> call_order;
  for (size_t i = leading; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const Role r = role_of(m.role);
    // A later system message is a text part of the user turn it falls in (or opens): hoisting
    // it to the front would change the start of the prompt, and with it every cached token, each
    // time a client adds one (Claude Code does on every request); the turns before it keep
    // their tokens, and the instruction sits where the client put it.
    if (r == Role::Assistant) {
      Turn t;
      t.assistant = &m;
      turns.push_back(std::move(t));
      if (!m.tool_calls.empty()) {
        call_order.clear();
        for (size_t k = 0; k < m.tool_calls.size(); ++k)
          if (!m.tool_calls[k].id.empty()) call_order.emplace(m.tool_calls[k].id, k);
      }
      continue;
    }
    if (turns.empty() || !turns.back().user) {
      Turn t;
      t.user = true;
      t.call_order = call_order;
      turns.push_back(std::move(t));
    }
    Part p;
    p.tool_result = r == Role::Tool;
    p.id = m.tool_call_id;
    if (p.tool_result) p.text.markup("<tool_result>");
    p.text.add_data(m.content);
    if (p.tool_result) p.text.markup("</tool_result>");
    turns.back().parts.push_back(std::move(p));
  }
  for (Turn& t : turns)
    if (t.user) order_results(t);
  return turns;
}

}  // namespace

// Every string a message, a tool schema or a response format brings is data (PromptText); only
// the template's own text is markup.
PromptText render_chat_prompt(const std::vector<ChatMessage>& messages, const ChatOptions& o) {
  if (o.reasoning_effort < 0 || o.reasoning_effort > 100)
    throw Error("reasoning effort " + std::to_string(o.reasoning_effort) + " is outside 0..100");
  size_t leading = 0;
  const PromptText system = system_text(messages, o, &leading);
  bool tool_context = !o.tools.empty();
  for (const ChatMessage& m : messages) {
    const Role r = role_of(m.role);
    if (r == Role::Tool || (r == Role::Assistant && !m.tool_calls.empty())) tool_context = true;
  }
  const std::vector<Turn> turns = fold_turns(messages, leading);

  const bool thinking = o.thinking && o.reasoning_effort > 0;
  const bool drop = o.drop_thinking && !tool_context;
  ptrdiff_t last_user = -1;
  for (size_t t = 0; t < turns.size(); ++t)
    if (turns[t].user) last_user = (ptrdiff_t)t;

  PromptText out;
  if (o.add_bos) out.markup(kBos);
  if (thinking && o.reasoning_effort >= kEffortMax) out.markup(kMaxEffortPrefix);
  out.append(system);
  for (size_t t = 0; t < turns.size(); ++t) {
    const Turn& turn = turns[t];
    const bool last = t + 1 == turns.size();
    if (turn.user) {
      out.markup(kUser);
      for (size_t k = 0; k < turn.parts.size(); ++k) {
        if (k) out.markup("\n\n");
        out.append(turn.parts[k].text);
      }
      // The assistant prefix opens the next turn (or the generation prompt).
      if (last || !turns[t + 1].user) {
        out.markup(kAssistant);
        out.markup(thinking && (!drop || (ptrdiff_t)t >= last_user) ? kThinkOpen : kThinkClose);
      }
      continue;
    }
    const ChatMessage& m = *turn.assistant;
    if (thinking && (!drop || (ptrdiff_t)t > last_user)) {
      if (o.own_assistant_turns) out.markup(m.reasoning);
      else out.add_data(m.reasoning);
      out.markup(kThinkClose);
    }
    if (o.own_assistant_turns) out.markup(m.content);
    else out.add_data(m.content);
    append_tool_calls(out, m.tool_calls);
    if (!(last && o.continue_final)) out.markup(kEos);
  }
  if (o.content_is_markup) out.data.clear();
  return out;
}

}  // namespace sluice::text
