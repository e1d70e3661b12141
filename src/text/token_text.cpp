#include "text/token_text.h"

#include <algorithm>
#include <string_view>

#include "text/deepseek41/dsml.h"

namespace sluice::text {

namespace {

// Everything OutputParser recognises; a control token whose text occurs in one of these is a
// piece of markup (a vocabulary may hold "<think>" whole or only "｜DSML｜").
constexpr std::string_view kMarkup[] = {
    kThinkOpen, kThinkClose, kToolCallsOpen, kToolCallsClose, "<｜DSML｜invoke name=\"", "</｜DSML｜invoke>",
    "<｜DSML｜parameter name=\"", "</｜DSML｜parameter>",
};

bool is_markup(std::string_view piece) {
  if (piece.empty()) return false;
  for (std::string_view m : kMarkup)
    if (m.find(piece) != std::string_view::npos) return true;
  return false;
}

}  // namespace

bool shows_in_output(const Tokenizer& tok, TokenId id, OutputMode mode) {
  const TokenType t = tok.type(id);
  if (t == TokenType::Normal || t == TokenType::Byte || t == TokenType::UserDefined) return true;
  return mode == OutputMode::Chat && t == TokenType::Control && is_markup(tok.token_to_piece(id, true));
}

bool OutputDecoder::shows(TokenId id) const {
  return std::find(end_.begin(), end_.end(), id) == end_.end() && shows_in_output(*tok_, id, mode_);
}

std::string OutputDecoder::push(TokenId id) {
  if (!shows(id)) return {};
  return dec_.push(id);
}

std::vector<TokenId> encode_chat_text(const Tokenizer& tok, const PromptText& rendered) {
  return tok.encode(rendered, /*add_bos=*/false);
}

std::vector<TokenId> encode_prompt_text(const Tokenizer& tok, std::string_view text, SpecialTokens special) {
  return tok.encode(text, tok.add_bos_default(), special == SpecialTokens::Parse);
}

size_t count_text_tokens(const Tokenizer& tok, std::string_view text) {
  return tok.encode(text, /*add_bos=*/false, /*parse_special=*/false).size();
}

}  // namespace sluice::text
