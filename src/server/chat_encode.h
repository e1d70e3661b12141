// A chat request's messages to prompt tokens, and the tokens that end a chat turn.
#pragma once
#include <span>
#include <string>
#include <vector>

#include "runtime/session.h"
#include "text/deepseek41/chat.h"
#include "text/tokenizer.h"
#include "util/token_id.h"

namespace sluice::server {

// Renders a chat with text::render_chat (ApiError 400 on what it rejects) and tokenizes it
// with Session::tokenize_prompt; the rendered text goes to *text_out (for prompt_text).
std::vector<TokenId> encode_chat(const Session& s, const std::vector<text::ChatMessage>& messages,
                                 const text::ChatOptions& options, std::string* text_out = nullptr, uint64_t scope = 0);
// Tokens that end a chat turn besides eos: the model opening a new user turn.
std::vector<TokenId> chat_stop_tokens(const text::Tokenizer& tok);
// Where a chat prompt gets prefix checkpoints (GenerateRequest::checkpoint_at): after each
// user-turn marker but the prompt's last token, which is where another conversation with the same
// system prompt and tools, or the same conversation with an edited message, diverges.
std::vector<uint32_t> turn_checkpoints(const text::Tokenizer& tok, std::span<const TokenId> prompt);

}  // namespace sluice::server
