// What a chat request asks for, read from the body of either API before it meets the model:
// the conversation and its rendering options (text::render_chat turns them into the prompt),
// sampling, limits, stop strings. Everything here is validated (ApiError 400 naming the field)
// and needs no tokenizer, so the fuzz target (fuzz/fuzz_requests.cpp) runs it without a model.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/deepseek41/chat.h"

namespace sluice::server {

struct SamplingFields {
  std::optional<double> temperature, top_p, min_p;
  std::optional<int64_t> top_k;
  std::optional<uint64_t> seed;  // absent (or -1, llama.cpp's "random"): a random seed
};

// temperature, top_p, top_k, min_p, seed from the body, with max_tokens checked by the same
// function the CLI uses (sluice::check_sampling); ApiError 400 with its message.
SamplingFields sampling_fields(const nlohmann::json& body, std::optional<int64_t> max_tokens);

// OpenAI's max_completion_tokens, max_tokens or llama.cpp's n_predict (first present).
std::optional<int64_t> openai_max_tokens(const nlohmann::json& body);

struct ChatRequest {
  std::vector<text::ChatMessage> messages;
  text::ChatOptions options;
  SamplingFields sampling;
  std::optional<int64_t> max_tokens;
  std::vector<std::string> stops;
  bool stream = false;
  bool ignore_eos = false;      // llama.cpp extension (OpenAI only)
  bool include_usage = false;   // stream_options.include_usage (OpenAI only)
  std::vector<std::string> omitted;  // image / audio / document parts replaced by a placeholder
  size_t tools = 0;             // tool schemas in the request (for the request log)
};

// POST /v1/chat/completions. max_json_depth bounds JSON held in strings (tool-call arguments).
ChatRequest openai_chat_request(const nlohmann::json& body, size_t max_json_depth);

// POST /v1/messages; count_only (/v1/messages/count_tokens) does not require max_tokens.
ChatRequest anthropic_request(const nlohmann::json& body, bool count_only);

}  // namespace sluice::server
