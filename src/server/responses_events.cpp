#include "server/responses_events.h"

#include <utility>

#include "server/sse.h"

namespace sluice::server {

using nlohmann::json;

namespace {

json text_part(bool reasoning, const std::string& text) {
  json p = {{"type", reasoning ? "reasoning_text" : "output_text"}, {"text", text}};
  if (!reasoning) p["annotations"] = json::array();
  return p;
}

json text_item(bool reasoning, const std::string& id, const char* status, json content) {
  if (reasoning)
    return {{"id", id}, {"type", "reasoning"}, {"status", status}, {"summary", json::array()},
            {"content", std::move(content)}, {"encrypted_content", nullptr}};
  return {{"id", id}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", std::move(content)}};
}

}  // namespace

ResponseBuilder::ResponseBuilder(const ResponsesRequest& rr, ResponseMeta meta, std::function<std::string(const char*)> new_id)
    : rr_(rr), meta_(std::move(meta)), new_id_(std::move(new_id)) {}

json ResponseBuilder::object(const char* status) const {
  return {{"id", meta_.id},
          {"object", "response"},
          {"created_at", meta_.created},
          {"status", status},
          {"error", nullptr},
          {"incomplete_details", nullptr},
          {"instructions", rr_.instructions},
          {"max_output_tokens", rr_.max_output_tokens ? json(*rr_.max_output_tokens) : json(nullptr)},
          {"model", meta_.model},
          {"output", output_},
          {"parallel_tool_calls", rr_.parallel_tool_calls},
          {"previous_response_id", nullptr},
          {"reasoning", rr_.reasoning},
          {"store", false},
          {"temperature", meta_.temperature},
          {"top_p", meta_.top_p},
          {"text", {{"format", rr_.text_format}}},
          {"tool_choice", rr_.tool_choice},
          {"tools", rr_.tools},
          {"truncation", "disabled"},
          {"usage", nullptr},
          {"metadata", rr_.metadata}};
}

std::string ResponseBuilder::event(json j) {
  const std::string type = j["type"];
  j["sequence_number"] = seq_++;
  return sse_event(type, j);
}

std::string ResponseBuilder::created() {
  std::string out = event({{"type", "response.created"}, {"response", object("in_progress")}});
  out += event({{"type", "response.in_progress"}, {"response", object("in_progress")}});
  return out;
}

std::string ResponseBuilder::close() {
  if (open_.empty()) return "";
  const bool reasoning = open_ == "reasoning";
  const size_t index = output_.size();
  const json part = text_part(reasoning, text_);
  json done = {{"type", reasoning ? "response.reasoning_text.done" : "response.output_text.done"},
               {"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"text", text_}};
  if (!reasoning) done["logprobs"] = json::array();
  std::string out = event(std::move(done));
  out += event({{"type", "response.content_part.done"}, {"item_id", item_id_}, {"output_index", index},
                {"content_index", 0}, {"part", part}});
  json item = text_item(reasoning, item_id_, "completed", json::array({part}));
  out += event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
  if (reasoning) reasoning_closed_ = true;
  open_.clear();
  text_.clear();
  return out;
}

std::string ResponseBuilder::append(bool reasoning, const std::string& text) {
  std::string out;
  const char* kind = reasoning ? "reasoning" : "message";
  if (open_ != kind) {
    out += close();
    open_ = kind;
    item_id_ = new_id_(reasoning ? "rs_" : "msg_");
    out += event({{"type", "response.output_item.added"}, {"output_index", output_.size()},
                  {"item", text_item(reasoning, item_id_, "in_progress", json::array())}});
    out += event({{"type", "response.content_part.added"}, {"item_id", item_id_}, {"output_index", output_.size()},
                  {"content_index", 0}, {"part", text_part(reasoning, "")}});
  }
  text_ += text;
  if (reasoning) reasoning_ += text;
  json d = {{"type", reasoning ? "response.reasoning_text.delta" : "response.output_text.delta"},
            {"item_id", item_id_}, {"output_index", output_.size()}, {"content_index", 0}, {"delta", text}};
  if (!reasoning) d["logprobs"] = json::array();
  out += event(std::move(d));
  return out;
}

// A call of a namespaced tool goes back under its own name, with its namespace.
json ResponseBuilder::call_item(const text::ToolCall& c, const std::string& item_id, const std::string& call_id,
                                const char* status) const {
  json item = {{"id", item_id}, {"type", "function_call"}, {"status", status}, {"call_id", call_id},
               {"name", c.name}, {"arguments", c.arguments}};
  const auto it = rr_.namespaced.find(c.name);
  if (it != rr_.namespaced.end()) {
    item["namespace"] = it->second.first;
    item["name"] = it->second.second;
  }
  return item;
}

std::string ResponseBuilder::call(const text::ToolCall& c) {
  std::string out = close();
  const size_t index = output_.size();
  const std::string fc_id = new_id_("fc_"), call_id = new_id_("call_");
  json added = call_item(c, fc_id, call_id, "in_progress");
  added["arguments"] = "";  // accumulators append the deltas to it
  out += event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", added}});
  out += event({{"type", "response.function_call_arguments.delta"}, {"item_id", fc_id}, {"output_index", index},
                {"delta", c.arguments}});
  out += event({{"type", "response.function_call_arguments.done"}, {"item_id", fc_id}, {"output_index", index},
                {"arguments", c.arguments}});
  json item = call_item(c, fc_id, call_id, "completed");
  out += event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  output_.push_back(std::move(item));
  return out;
}

std::string ResponseBuilder::delta(const text::OutputParser::Delta& d) {
  std::string out;
  if (!d.reasoning.empty()) out += append(true, d.reasoning);
  if (!d.content.empty()) out += append(false, d.content);
  for (const text::ToolCall& c : d.calls) out += call(c);
  return out;
}

json ResponseBuilder::final_object(bool incomplete, const json& usage) const {
  json r = object(incomplete ? "incomplete" : "completed");
  if (incomplete) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  r["usage"] = usage;
  return r;
}

std::string ResponseBuilder::finish(bool incomplete, const json& usage) {
  std::string out = close();
  out += event({{"type", incomplete ? "response.incomplete" : "response.completed"}, {"response", final_object(incomplete, usage)}});
  return out;
}

std::string ResponseBuilder::failed(const json& error) {
  std::string out = close();
  json r = object("failed");
  r["error"] = error;
  out += event({{"type", "response.failed"}, {"response", std::move(r)}});
  return out;
}

}  // namespace sluice::server
