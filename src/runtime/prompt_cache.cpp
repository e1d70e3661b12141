#include "runtime/prompt_cache.h"

#include <algorithm>

#include "text/tokenizer.h"

namespace sluice {

size_t PromptCache::reused_for(const text::Tokenizer& tok, const text::PromptText& p) const {
  if (tokens_.empty()) return 0;
  const std::string_view text = p.text;
  if (text.substr(0, text_.size()) == text_) return keep_meaning(tok, p, tokens_.size());
  const size_t common = (size_t)(std::mismatch(text.begin(), text.begin() + std::min(text.size(), text_.size()),
                                               text_.begin()).first - text.begin());
  // ends_ is non-decreasing: the tokens that end at or before the divergence.
  const size_t k = (size_t)(std::upper_bound(ends_.begin(), ends_.end(), common) - ends_.begin());
  return keep_meaning(tok, p, k > 0 ? k - 1 : 0);
}

size_t PromptCache::keep_meaning(const text::Tokenizer& tok, const text::PromptText& p, size_t k) const {
  // Tokens past ends_ have no known place in the text, so nothing vouches for their meaning.
  k = std::min(k, ends_.size());
  size_t next_data = 0;  // the first data range that ends after the byte looked at
  for (size_t i = 0; i < k; ++i) {
    const size_t b = i == 0 ? 0 : ends_[i - 1], e = ends_[i];
    if (b == e) continue;  // an added BOS, not in the text
    if (tok.is_added(tokens_[i])) {
      if (text::overlaps_data(p.data, b, e)) return i;
      continue;
    }
    for (size_t at = b; at < e; ++at) {
      while (next_data < p.data.size() && p.data[next_data].end <= at) ++next_data;
      size_t limit = p.text.size();
      if (next_data < p.data.size()) {
        if (p.data[next_data].begin <= at) continue;  // data: never an added token
        limit = p.data[next_data].begin;
      }
      // Markup inside an ordinary token where the encoder would read an added token.
      if (tok.added_token_at(p.text, at, limit) > 0) return i;
    }
  }
  return k;
}

std::vector<TokenId> PromptCache::tokens_for(const text::Tokenizer& tok, const text::PromptText& p, bool add_bos) const {
  return tokens_for(tok, p, add_bos, reused_for(tok, p));
}

std::vector<TokenId> PromptCache::tokens_for(const text::Tokenizer& tok, const text::PromptText& p, bool add_bos,
                                             size_t k) const {
  std::vector<TokenId> out(tokens_.begin(), tokens_.begin() + (std::ptrdiff_t)k);
  const size_t from = k == 0 ? 0 : ends_[k - 1];
  if (k) add_bos = false;
  const std::vector<text::TextRange> data = text::data_from(p.data, from);
  const std::vector<TokenId> more =
      tok.encode(std::string_view(p.text).substr(from), add_bos, /*parse_special=*/true, data);
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
