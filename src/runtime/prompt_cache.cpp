#include "runtime/prompt_cache.h"

#include <algorithm>

#include "text/tokenizer.h"

namespace sluice {

size_t PromptCache::reused_for(std::string_view text) const {
  if (tokens_.empty()) return 0;
  if (text.substr(0, text_.size()) == text_) return tokens_.size();
  const size_t common = (size_t)(std::mismatch(text.begin(), text.begin() + std::min(text.size(), text_.size()),
                                               text_.begin()).first - text.begin());
  // ends_ is non-decreasing: the tokens that end at or before the divergence.
  const size_t k = (size_t)(std::upper_bound(ends_.begin(), ends_.end(), common) - ends_.begin());
  return k > 0 ? k - 1 : 0;
}

std::vector<TokenId> PromptCache::tokens_for(const text::Tokenizer& tok, std::string_view text, bool add_bos) const {
  const size_t k = reused_for(text);
  std::vector<TokenId> out(tokens_.begin(), tokens_.begin() + (std::ptrdiff_t)k);
  const std::string_view rest = k == 0 ? text : text.substr(k == tokens_.size() ? text_.size() : ends_[k - 1]);
  if (k) add_bos = false;
  const std::vector<TokenId> more = tok.encode(rest, add_bos, /*parse_special=*/true);
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

void PromptCache::remember(const text::Tokenizer& tok, std::string_view prompt_text,
                           std::span<const TokenId> prompt_tokens, std::span<const TokenId> generated) {
  text_.assign(prompt_text);
  tokens_.assign(prompt_tokens.begin(), prompt_tokens.end());
  ends_.clear();
  // Where each prompt token ends in the text, while the pieces spell it.
  size_t at = 0;
  bool spelled = true;
  for (size_t i = 0; i < tokens_.size() && spelled; ++i) {
    const std::string_view piece = tok.token_to_piece(tokens_[i], /*render_special=*/true);
    if (std::string_view(text_).substr(at, piece.size()) == piece) at += piece.size();
    else spelled = i == 0 && tokens_[i] == tok.bos();  // an added BOS: not in the text
    if (spelled) ends_.push_back(at);
  }
  spelled = spelled && at == text_.size();
  for (TokenId id : generated) {
    text_ += tok.token_to_piece(id, /*render_special=*/true);
    tokens_.push_back(id);
    if (spelled) ends_.push_back(text_.size());
  }
}

void PromptCache::clear() {
  text_.clear();
  tokens_.clear();
  ends_.clear();
  text_.shrink_to_fit();
  tokens_.shrink_to_fit();
  ends_.shrink_to_fit();
}

}  // namespace sluice
