#include "text/deepseek41/dsml.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "text/json_text.h"

namespace sluice::text {
namespace {

constexpr std::string_view kInvokeOpen = "<｜DSML｜invoke name=\"";
constexpr std::string_view kInvokeClose = "</｜DSML｜invoke>";
constexpr std::string_view kParamOpen = "<｜DSML｜parameter name=\"";
constexpr std::string_view kParamClose = "</｜DSML｜parameter>";

struct Cursor {
  std::string_view s;
  size_t i = 0;
  bool eat(std::string_view lit) {
    if (s.substr(i, lit.size()) != lit) return false;
    i += lit.size();
    return true;
  }
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  }
  // Text up to `stop` (not included), moving past `stop`; false when `stop` never comes.
  bool until(std::string_view stop, std::string& out) {
    const size_t p = s.find(stop, i);
    if (p == std::string_view::npos) return false;
    out.assign(s.substr(i, p - i));
    i = p + stop.size();
    return true;
  }
};

// Longest k < marker.size() such that `s` ends with the first k bytes of `marker`.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t k = std::min(s.size(), marker.size() - 1); k > 0; --k)
    if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
  return 0;
}

void append(OutputParser::Delta& into, OutputParser::Delta&& d) {
  into.reasoning += d.reasoning;
  into.content += d.content;
  for (auto& c : d.calls) into.calls.push_back(std::move(c));
  if (!d.error.empty()) into.error = d.error;
}

}  // namespace

std::string render_tool_calls(const std::vector<ToolCall>& calls) {
  PromptText p;
  append_tool_calls(p, calls);
  return p.text;
}

void append_tool_calls(PromptText& out, const std::vector<ToolCall>& calls) {
  if (calls.empty()) return;
  out.markup("\n\n");
  out.markup(kToolCallsOpen);
  out.markup("\n");
  for (size_t c = 0; c < calls.size(); ++c) {
    if (c) out.markup("\n");
    out.markup(kInvokeOpen);
    out.add_data(calls[c].name);
    out.markup("\">\n");
    std::vector<JsonMember> members;
    if (!split_json_object(calls[c].arguments, members)) {
      JsonMember m;
      m.key = "arguments";
      m.is_string = true;
      m.str = calls[c].arguments;
      members.push_back(std::move(m));
    }
    for (size_t k = 0; k < members.size(); ++k) {
      if (k) out.markup("\n");
      out.markup(kParamOpen);
      out.add_data(members[k].key);
      out.markup(members[k].is_string ? "\" string=\"true\">" : "\" string=\"false\">");
      out.add_data(members[k].is_string ? members[k].str : members[k].raw);
      out.markup(kParamClose);
    }
    out.markup("\n");
    out.markup(kInvokeClose);
  }
  out.markup("\n");
  out.markup(kToolCallsClose);
}

bool parse_tool_calls_block(std::string_view block, std::vector<ToolCall>& calls, std::string& error) {
  Cursor c{block};
  std::vector<ToolCall> found;
  if (!c.eat(kToolCallsOpen)) {
    error = "block does not start with <｜DSML｜tool_calls>";
    return false;
  }
  for (;;) {
    c.ws();
    if (c.eat(kToolCallsClose)) break;
    if (!c.eat(kInvokeOpen)) {
      error = "expected <｜DSML｜invoke name=\"...\"> or </｜DSML｜tool_calls> at byte " + std::to_string(c.i);
      return false;
    }
    ToolCall call;
    if (!c.until("\">", call.name) || call.name.empty() || call.name.find('"') != std::string::npos ||
        call.name.find('<') != std::string::npos) {
      error = "malformed invoke name at byte " + std::to_string(c.i);
      return false;
    }
    std::vector<std::string> keys;
    std::string args = "{";
    for (;;) {
      c.ws();
      if (c.eat(kInvokeClose)) break;
      if (!c.eat(kParamOpen)) {
        error = "expected <｜DSML｜parameter ...> or </｜DSML｜invoke> in call \"" + call.name + "\"";
        return false;
      }
      std::string key, flag, value;
      if (!c.until("\"", key) || key.empty() || key.find('<') != std::string::npos) {
        error = "malformed parameter name in call \"" + call.name + "\"";
        return false;
      }
      if (!c.eat(" string=\"") || !c.until("\">", flag) || (flag != "true" && flag != "false")) {
        error = "parameter \"" + key + "\" lacks string=\"true|false\"";
        return false;
      }
      if (!c.until(kParamClose, value)) {
        error = "parameter \"" + key + "\" is not closed";
        return false;
      }
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) {
        error = "parameter \"" + key + "\" given twice in call \"" + call.name + "\"";
        return false;
      }
      if (flag == "false" && !nlohmann::json::accept(value)) {
        error = "parameter \"" + key + "\" has string=\"false\" but its value is not JSON";
        return false;
      }
      keys.push_back(key);
      if (args.size() > 1) args += ", ";
      args += py_json_string(key);
      args += ": ";
      args += flag == "true" ? py_json_string(value) : value;
    }
    args += '}';
    call.arguments = std::move(args);
    found.push_back(std::move(call));
  }
  if (c.i != block.size()) {
    error = "text after </｜DSML｜tool_calls>";
    return false;
  }
  if (found.empty()) {
    error = "tool_calls block without any invoke";
    return false;
  }
  for (auto& f : found) calls.push_back(std::move(f));
  return true;
}

void OutputParser::run(bool final, Delta& d) {
  for (;;) {
    if (state_ == State::Reasoning) {
      const size_t p = buf_.find(kThinkClose);
      if (p != std::string::npos) {
        d.reasoning.append(buf_, 0, p);
        buf_.erase(0, p + kThinkClose.size());
        state_ = State::Content;
        continue;
      }
      const size_t keep = final ? 0 : partial_suffix(buf_, kThinkClose);
      d.reasoning.append(buf_, 0, buf_.size() - keep);
      buf_.erase(0, buf_.size() - keep);
      return;
    }
    if (state_ == State::Content) {
      const size_t p = buf_.find(kToolCallsOpen);
      if (p != std::string::npos) {
        size_t cut = p;
        if (cut >= 2 && buf_.compare(cut - 2, 2, "\n\n") == 0) cut -= 2;
        d.content.append(buf_, 0, cut);
        block_lead_.assign(buf_, cut, p - cut);
        buf_.erase(0, p);
        state_ = State::Block;
        continue;
      }
      size_t end = buf_.size() - (final ? 0 : partial_suffix(buf_, kToolCallsOpen));
      // Two newlines right before a block belong to the block, not the content.
      for (int k = 0; !final && k < 2 && end > 0 && buf_[end - 1] == '\n'; ++k) --end;
      d.content.append(buf_, 0, end);
      buf_.erase(0, end);
      return;
    }
    // Block
    const size_t p = buf_.find(kToolCallsClose);
    if (p == std::string::npos) {
      if (final) {
        d.content += block_lead_ + buf_;
        d.error = "unterminated <｜DSML｜tool_calls> block";
        buf_.clear();
        block_lead_.clear();
      }
      return;
    }
    const size_t end = p + kToolCallsClose.size();
    std::string error;
    if (!parse_tool_calls_block(std::string_view(buf_).substr(0, end), d.calls, error)) {
      d.content += block_lead_;
      d.content.append(buf_, 0, end);
      d.error = error;
    }
    buf_.erase(0, end);
    block_lead_.clear();
    state_ = State::Content;
  }
}

OutputParser::Delta OutputParser::push(std::string_view text) {
  buf_ += text;
  Delta d;
  run(false, d);
  return d;
}

OutputParser::Delta OutputParser::finish() {
  Delta d;
  run(true, d);
  return d;
}

ParsedOutput parse_output(std::string_view text, bool thinking) {
  OutputParser p(thinking);
  OutputParser::Delta d = p.push(text);
  append(d, p.finish());
  return {std::move(d.reasoning), std::move(d.content), std::move(d.calls), std::move(d.error)};
}

}  // namespace sluice::text
