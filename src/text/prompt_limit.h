// How many bytes of prompt text are worth reading for a context of N token positions, so a
// prompt that cannot fit is refused before it is read (or tokenized, which costs ~14 bytes of
// memory per byte of text).
//
// The bound: every token stands for at most `longest` bytes (the longest piece of the
// vocabulary, control tokens rendered), so text longer than N x longest cannot encode to N tokens
// or fewer; that part is exact. It is further capped at kMaxPromptBytesPerToken = 32 bytes per
// token, which real text is far below (DeepSeek's tokenizer averages about 4 bytes per token on
// English, under 3 on code and Chinese), so that a long-context model (1M positions) does not
// accept a 100+ MB prompt file only to refuse it after tokenizing.
#pragma once
#include <cstdint>
#include <string>

#include "text/tokenizer.h"

namespace sluice::text {

constexpr uint64_t kMaxPromptBytesPerToken = 32;

// Bytes per token used for `tok`: min(longest piece, kMaxPromptBytesPerToken), at least 1.
uint64_t prompt_bytes_per_token(const Tokenizer& tok);

// tokens x prompt_bytes_per_token(tok), saturating.
uint64_t prompt_byte_limit(const Tokenizer& tok, uint64_t tokens);

}  // namespace sluice::text
