// How many tokens a request may generate. Agents ask for far more than a local server allows
// (Claude Code 32000-128000, opencode 32000), so a larger value is capped, not refused: by
// --max-tokens-limit, then by the context left after the prompt. The value itself was checked
// (an integer >= 1) with the sampling fields; every endpoint's max_tokens goes through here.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sluice::server {

struct MaxTokens {
  std::optional<int64_t> requested;  // as the request said (absent: the limit is the default)
  uint32_t effective = 0;
  const char* capped_by = nullptr;   // "--max-tokens-limit", "context", or null when not capped
};
MaxTokens clamp_max_tokens(std::optional<int64_t> requested, uint32_t limit, uint32_t room);

// Response headers that report the effective value: X-Max-Tokens (and X-Max-Tokens-Capped-By
// with the reason when it is less than the request asked for).
std::vector<std::string> max_tokens_headers(const MaxTokens& m);

}  // namespace sluice::server
