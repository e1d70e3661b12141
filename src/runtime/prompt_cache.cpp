#include "runtime/prompt_cache.h"

#include "text/tokenizer.h"

namespace sluice {

std::vector<uint32_t> PromptCache::tokens_for(const text::Tokenizer& tok, std::string_view text, bool add_bos) const {
  std::vector<uint32_t> out;
  std::string_view rest = text;
  if (!tokens_.empty() && text.substr(0, text_.size()) == text_) {
    out = tokens_;
    rest = text.substr(text_.size());
    add_bos = false;
  }
  for (int32_t id : tok.encode(rest, add_bos, /*parse_special=*/true)) out.push_back((uint32_t)id);
  return out;
}

void PromptCache::remember(const text::Tokenizer& tok, std::string_view prompt_text,
                           std::span<const uint32_t> prompt_tokens, std::span<const uint32_t> generated) {
  text_.assign(prompt_text);
  tokens_.assign(prompt_tokens.begin(), prompt_tokens.end());
  for (uint32_t id : generated) {
    text_ += tok.token_to_piece((int32_t)id, /*render_special=*/true);
    tokens_.push_back(id);
  }
}

void PromptCache::clear() {
  text_.clear();
  tokens_.clear();
  text_.shrink_to_fit();
  tokens_.shrink_to_fit();
}

}  // namespace sluice
