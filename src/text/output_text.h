// The one rule for special tokens in generated text shown to a user — `sluice run`, `sluice chat`
// and both server APIs use this decoder: control, unknown and unused tokens are hidden (a model
// that emits <｜place▁holder▁no▁218｜> shows nothing); user-defined tokens are text and show.
// With Chat, the control tokens that spell the chat markup an OutputParser reads (<think>,
// </think>, the DSML tool-call tags) are kept for it: the parser consumes them. Token tools
// (/tokenize pieces, /detokenize, `sluice tokenize`) render every token as it is.
#pragma once
#include <cstdint>
#include <string>

#include "text/tokenizer.h"

namespace sluice::text {

enum class OutputMode {
  Plain,  // raw completions, `sluice run`: every control token hidden
  Chat,   // the text goes through OutputParser: chat markup kept for it
};

// Whether token `id` contributes text to output of this mode. Throws Error on a bad id.
bool shows_in_output(const Tokenizer& tok, int32_t id, OutputMode mode);

// StreamDecoder (UTF-8-safe pieces) over the tokens shows_in_output keeps.
class OutputDecoder {
 public:
  OutputDecoder(const Tokenizer& tok, OutputMode mode) : tok_(&tok), mode_(mode), dec_(tok, true) {}
  std::string push(int32_t id);
  std::string finish() { return dec_.finish(); }

 private:
  const Tokenizer* tok_;
  OutputMode mode_;
  StreamDecoder dec_;
};

}  // namespace sluice::text
