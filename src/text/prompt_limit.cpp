#include "text/prompt_limit.h"

#include <algorithm>
#include <limits>

namespace sluice::text {

uint64_t prompt_bytes_per_token(const Tokenizer& tok) {
  uint64_t longest = 1;
  for (TokenId id = 0; id < (TokenId)tok.n_vocab(); ++id)
    longest = std::max<uint64_t>(longest, tok.token_to_piece(id, /*render_special=*/true).size());
  return std::min(longest, kMaxPromptBytesPerToken);
}

uint64_t prompt_byte_limit(const Tokenizer& tok, uint64_t tokens) {
  const uint64_t per = prompt_bytes_per_token(tok);
  if (tokens > std::numeric_limits<uint64_t>::max() / per) return std::numeric_limits<uint64_t>::max();
  return tokens * per;
}

}  // namespace sluice::text
