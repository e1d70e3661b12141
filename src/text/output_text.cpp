#include "text/output_text.h"

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

bool shows_in_output(const Tokenizer& tok, int32_t id, OutputMode mode) {
  const TokenType t = tok.type(id);
  if (t == TokenType::Normal || t == TokenType::Byte || t == TokenType::UserDefined) return true;
  return mode == OutputMode::Chat && t == TokenType::Control && is_markup(tok.token_to_piece(id, true));
}

std::string OutputDecoder::push(int32_t id) {
  if (!shows_in_output(*tok_, id, mode_)) return {};
  return dec_.push(id);
}

}  // namespace sluice::text
