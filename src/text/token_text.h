// Text to token ids and token ids to text, for everything a user sends and sees: `sluice run`,
// `sluice chat` and every server API go through here, so a prompt is tokenized and a reply is
// shown by one rule. (The token tools — /tokenize, /detokenize, `sluice tokenize` — show the
// tokenizer as it is, with its own flags, and call it directly.)
//
// The output rule: control, unknown and unused tokens are hidden (a model that emits
// <｜place▁holder▁no▁218｜> shows nothing); user-defined tokens are text and show. With Chat,
// the control tokens that spell the chat markup an OutputParser reads (<think>, </think>, the
// DSML tool-call tags) are kept for it: the parser consumes them. The tokens that end
// generation (eos, a turn's stop tokens) never show, whatever their type.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"
#include "util/token_id.h"

namespace sluice::text {

enum class OutputMode {
  Plain,  // raw completions, `sluice run`: every control token hidden
  Chat,   // the text goes through OutputParser: chat markup kept for it
};

// Whether token `id` contributes text to output of this mode. Throws Error on a bad id.
bool shows_in_output(const Tokenizer& tok, TokenId id, OutputMode mode);

// Generated ids to UTF-8-safe text pieces (StreamDecoder) over the tokens that show: those
// shows_in_output keeps, less `end_tokens` (what ends generation: eos, stop tokens).
class OutputDecoder {
 public:
  OutputDecoder(const Tokenizer& tok, OutputMode mode, std::vector<TokenId> end_tokens = {})
      : tok_(&tok), mode_(mode), end_(std::move(end_tokens)), dec_(tok, true) {}
  bool shows(TokenId id) const;
  std::string push(TokenId id);  // "" for a token that does not show; throws Error on a bad id
  std::string finish() { return dec_.finish(); }

 private:
  const Tokenizer* tok_;
  OutputMode mode_;
  std::vector<TokenId> end_;
  StreamDecoder dec_;
};

// A rendered chat (text/chat.h) to prompt ids: the BOS is part of the rendering, the markup in
// it is control tokens and its data is text.
std::vector<TokenId> encode_chat_text(const Tokenizer& tok, const PromptText& rendered);

// Whether control-token spellings in a plain prompt are the tokens or ordinary text.
enum class SpecialTokens { Parse, AsText };

// A plain prompt to ids, with the vocabulary's BOS when it asks for one.
std::vector<TokenId> encode_prompt_text(const Tokenizer& tok, std::string_view text, SpecialTokens special);

// How many tokens the model's own tokenizer makes of `text`, with no BOS and control-token
// spellings taken as text (a share of generated text, such as its reasoning).
size_t count_text_tokens(const Tokenizer& tok, std::string_view text);

}  // namespace sluice::text
