// Token-level continuity between requests of one conversation. Chat front ends re-render the
// whole conversation as text each turn; tokenizing that text again need not give the tokens
// the model generated (BPE has many spellings of one string), and then the Session could not
// see that the new prompt shares its sequence. PromptCache remembers the last prompt's text
// and tokens plus the generated tokens and their text, with the text offset where each token
// ends. A new prompt text becomes the longest run of remembered tokens whose text is a prefix
// of it + the encoding of the rest:
//   - the new text starts with the whole remembered text: all remembered tokens;
//   - it diverges inside: the remembered tokens that end before the divergence, less the last
//     one (so the text around the divergence is encoded afresh and a word cut by it is spelled
//     as the tokenizer spells it), then the rest.
// The Session then finds the common token prefix with its sequence (runtime/session.h).
//
// The new text's data ranges (text/prompt_text.h) bound the reuse: a remembered added token
// (a control token) may not fall in the new text's data, and a remembered ordinary token may
// not cover markup where the encoder would read an added token. Otherwise a request whose
// content spells another conversation's markers could inherit that conversation's control
// tokens (injection through the cache), or one with real markers could inherit text tokens.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/prompt_text.h"
#include "util/token_id.h"

namespace sluice::text { class Tokenizer; }

namespace sluice {

class PromptCache {
 public:
  // Tokens for a rendered prompt (special tokens parsed; BOS added when add_bos and the
  // vocabulary has one, unless remembered tokens start the prompt).
  std::vector<TokenId> tokens_for(const text::Tokenizer& tok, const text::PromptText& p, bool add_bos) const;
  // The same, keeping `reused` leading tokens, which reused_for(tok, p) gave.
  std::vector<TokenId> tokens_for(const text::Tokenizer& tok, const text::PromptText& p, bool add_bos,
                                  size_t reused) const;
  // After a generation: what was asked and what came out (generated tokens decoded with their
  // special tokens, as the chat renderer writes them back).
  void remember(const text::Tokenizer& tok, std::string_view prompt_text, std::span<const TokenId> prompt_tokens,
                std::span<const TokenId> generated);
  void clear();
  // How many leading remembered tokens tokens_for(text) keeps (for tests and the docs' claims).
  size_t reused_for(const text::Tokenizer& tok, const text::PromptText& p) const;
  uint64_t bytes() const {
    return text_.capacity() + tokens_.capacity() * sizeof(TokenId) + ends_.capacity() * sizeof(size_t);
  }

 private:
  std::string text_;
  std::vector<TokenId> tokens_;
  // ends_[i]: the offset in text_ where token i's text ends. Only for the leading tokens whose
  // pieces spell text_ (a BOS the text does not carry takes no bytes); shorter than tokens_
  // when the prompt tokens do not spell the prompt text from some token on (then a divergence
  // can reuse only those; a text that extends text_ still reuses every token, as the caller
  // vouches that the prompt tokens encode the prompt text).
  std::vector<size_t> ends_;

  // How many of the first k remembered tokens keep their meaning in p (see above).
  size_t keep_meaning(const text::Tokenizer& tok, const text::PromptText& p, size_t k) const;
};

}  // namespace sluice
