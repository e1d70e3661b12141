// Token-level continuity between requests of one conversation. Chat front ends re-render the
// whole conversation as text each turn; tokenizing that text again need not give the tokens
// the model generated (BPE has many spellings of one string), and then the Session could not
// see that the new prompt extends its sequence. PromptCache remembers the last prompt's text
// and tokens plus the generated tokens and their text; a new prompt text that starts with that
// text becomes those exact tokens + the encoding of the rest, so the Session reuses its state.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::text { class Tokenizer; }

namespace sluice {

class PromptCache {
 public:
  // Tokens for a rendered prompt (special tokens parsed; BOS added when add_bos and the
  // vocabulary has one, unless the remembered tokens already start the prompt).
  std::vector<uint32_t> tokens_for(const text::Tokenizer& tok, std::string_view text, bool add_bos) const;
  // After a generation: what was asked and what came out (generated tokens decoded with their
  // special tokens, as the chat renderer writes them back).
  void remember(const text::Tokenizer& tok, std::string_view prompt_text, std::span<const uint32_t> prompt_tokens,
                std::span<const uint32_t> generated);
  void clear();
  uint64_t bytes() const { return text_.capacity() + tokens_.capacity() * sizeof(uint32_t); }

 private:
  std::string text_;
  std::vector<uint32_t> tokens_;
};

}  // namespace sluice
