#include "server/chat_encode.h"

#include "model/architecture.h"
#include "server/api_error.h"
#include "util/error.h"

namespace sluice::server {

std::vector<TokenId> encode_chat(const Session& s, const std::vector<text::ChatMessage>& messages,
                                 const text::ChatOptions& options, std::string* text_out, uint64_t scope) {
  text::PromptText prompt;
  try {
    prompt = s.architecture().render_chat(messages, options);
  } catch (const Error& e) {
    throw bad_request(e.what());
  }
  // The BOS is part of the rendered text. The session reuses the model's own tokens for a
  // conversation that extends the previous request (tokenize_prompt), so it keeps its state.
  std::vector<TokenId> ids = s.tokenize_prompt(prompt, /*add_bos=*/false, scope);
  if (text_out) *text_out = std::move(prompt.text);
  return ids;
}

std::vector<TokenId> chat_stop_tokens(const text::Tokenizer& tok) {
  std::vector<TokenId> stops;
  if (auto id = tok.find("<｜User｜>")) stops.push_back(*id);
  return stops;
}

std::vector<uint32_t> turn_checkpoints(const text::Tokenizer& tok, std::span<const TokenId> prompt) {
  std::vector<uint32_t> at;
  const auto user = tok.find("<｜User｜>");
  if (!user) return at;
  for (size_t i = 0; i + 2 < prompt.size(); ++i)
    if (prompt[i] == *user) at.push_back((uint32_t)(i + 1));
  return at;
}

}  // namespace sluice::server
