// The model reads text only. Image, audio, document and file parts of a request become a short
// text placeholder naming what was left out, so an agent's turn (a screenshot in a tool result,
// a PDF the user attached) goes on instead of failing; the handler logs the list once per request.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sluice::server {

// Anthropic `image` or `document` block. A document whose source is text (`text`, or `content`
// with text blocks) is kept as that text; anything else becomes a placeholder. Appends a short
// description to *omitted for what it left out.
std::string anthropic_media_text(const nlohmann::json& block, std::vector<std::string>& omitted);

// OpenAI content part of type `image_url`, `input_audio` or `file`.
std::string openai_media_text(const nlohmann::json& part, std::vector<std::string>& omitted);

// True for the Anthropic block types anthropic_media_text handles.
bool is_anthropic_media(const std::string& type);
// True for the OpenAI part types openai_media_text handles.
bool is_openai_media(const std::string& type);

}  // namespace sluice::server
