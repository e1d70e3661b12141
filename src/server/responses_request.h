// POST /v1/responses (OpenAI Responses API) body -> ChatRequest, plus what the response needs to
// say back: the namespaced tools' real names, the echoed settings, and what was left out.
// Validated like the other APIs (ApiError 400 naming the field), no tokenizer needed, so the
// fuzz target (fuzz/fuzz_requests.cpp) runs it too. See docs/server.md for the field table.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/chat_request.h"

namespace sluice::server {

struct ResponsesRequest {
  ChatRequest chat;
  // Tools of a `namespace` tool are rendered as functions named "NAMESPACE.NAME" (a dot is not
  // allowed in OpenAI function names, so no top-level function can collide); this maps such a
  // name back to {namespace, name} for the function_call items of the response.
  std::map<std::string, std::pair<std::string, std::string>> namespaced;
  // Set only when the request gave max_output_tokens: hitting it makes the response incomplete.
  std::optional<int64_t> max_output_tokens;
  // Things the model cannot use, left out of the prompt: built-in tools (what = "tool
  // web_search"), their call items in the input ("web_search_call"), non-text content
  // ("input_image", replaced by a placeholder). `what` comes from a fixed list, so the endpoint
  // can log each kind once. where: "tools[3]", "input[2].content[1]".
  struct Dropped {
    std::string where, what;
  };
  std::vector<Dropped> dropped;
  // Echoed in the response object, as the API does.
  nlohmann::json instructions;      // string or null
  nlohmann::json tools;             // the tools as given (array, possibly empty)
  nlohmann::json tool_choice;       // as given, "auto" when absent
  nlohmann::json reasoning;         // {"effort", "summary"}
  nlohmann::json text_format;       // text.format as given, {"type":"text"} when absent
  nlohmann::json metadata;          // object
  bool parallel_tool_calls = true;
};

// max_json_depth bounds JSON held in strings (function_call arguments).
ResponsesRequest responses_request(const nlohmann::json& body, size_t max_json_depth);

}  // namespace sluice::server
