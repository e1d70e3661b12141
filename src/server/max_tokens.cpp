#include "server/max_tokens.h"

#include <algorithm>

namespace sluice::server {

MaxTokens clamp_max_tokens(std::optional<int64_t> requested, uint32_t limit, uint32_t room) {
  MaxTokens m;
  m.requested = requested;
  uint64_t want = requested ? (uint64_t)std::max<int64_t>(*requested, 0) : limit;
  if (want > limit) {
    want = limit;
    m.capped_by = "--max-tokens-limit";
  }
  if (want > room) {
    want = room;
    m.capped_by = "context";
  }
  m.effective = (uint32_t)want;
  return m;
}

std::vector<std::string> max_tokens_headers(const MaxTokens& m) {
  std::vector<std::string> h = {"X-Max-Tokens: " + std::to_string(m.effective)};
  if (m.capped_by) h.push_back(std::string("X-Max-Tokens-Capped-By: ") + m.capped_by);
  return h;
}

}  // namespace sluice::server
