// The Responses API's output, built from the parser's deltas without sockets or a model: the
// response object and its output items (reasoning, message, function_call), and the typed
// event sequence a stream sends. Every event is named (`event:` = its `type`) and numbered
// (`sequence_number` from 0). Items open when their first text arrives and close when another
// kind of output starts or the response ends. Used by responses_api.cpp for both plain and
// streamed answers; tested alone in tests/responses_request_test.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/responses_request.h"
#include "text/deepseek41/dsml.h"

namespace sluice::server {

struct ResponseMeta {
  std::string id;        // resp_...
  std::string model;
  int64_t created = 0;
  double temperature = 1, top_p = 1;  // effective values, echoed
};

class ResponseBuilder {
 public:
  // new_id("rs_") etc. gives fresh item ids.
  ResponseBuilder(const ResponsesRequest& rr, ResponseMeta meta, std::function<std::string(const char*)> new_id);

  // The response object with the items closed so far.
  nlohmann::json object(const char* status) const;

  std::string created();                                   // response.created, response.in_progress
  std::string delta(const text::OutputParser::Delta& d);   // the events for one delta
  // Closes the open item, then response.completed or response.incomplete with final_object.
  std::string finish(bool incomplete, const nlohmann::json& usage);
  // The finished response: status, incomplete_details, usage (after finish: every item).
  nlohmann::json final_object(bool incomplete, const nlohmann::json& usage) const;
  // Closes the open item, then response.failed with `error` ({code, message}).
  std::string failed(const nlohmann::json& error);

  const std::string& reasoning() const { return reasoning_; }  // all reasoning text
  bool reasoning_closed() const { return reasoning_closed_; }   // content or calls followed it

 private:
  std::string event(nlohmann::json j);
  std::string close();
  std::string append(bool reasoning, const std::string& text);
  std::string call(const text::ToolCall& c);
  nlohmann::json call_item(const text::ToolCall& c, const std::string& item_id, const std::string& call_id,
                           const char* status) const;

  const ResponsesRequest& rr_;
  ResponseMeta meta_;
  std::function<std::string(const char*)> new_id_;
  nlohmann::json output_ = nlohmann::json::array();
  uint64_t seq_ = 0;
  std::string open_;            // "", "reasoning", "message"
  std::string item_id_, text_;
  std::string reasoning_;
  bool reasoning_closed_ = false;
};

}  // namespace sluice::server
