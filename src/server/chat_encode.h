// A chat request's messages to prompt tokens, and the tokens that end a chat turn.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/session.h"
#include "text/chat.h"
#include "text/tokenizer.h"

namespace sluice::server {

// Renders a chat with text::render_chat (ApiError 400 on what it rejects) and tokenizes it
// with Session::tokenize_prompt; the rendered text goes to *text_out (for prompt_text).
std::vector<uint32_t> encode_chat(const Session& s, const std::vector<text::ChatMessage>& messages,
                                  const text::ChatOptions& options, std::string* text_out = nullptr);
// Tokens that end a chat turn besides eos: the model opening a new user turn.
std::vector<uint32_t> chat_stop_tokens(const text::Tokenizer& tok);
std::vector<uint32_t> to_ids(const std::vector<int32_t>& v);

}  // namespace sluice::server
