#include "cli/context_option.h"

#include <charconv>
#include <limits>

#include "cli/commands.h"

namespace sluice::cli {

std::string ctx_text_problem(const std::string& text) {
  const std::string got = "got '" + text + "'";
  if (text.empty()) return "needs a number of positions (" + got + ")";
  if (text[0] == '-') return "must not be negative (" + got + "; 0 means the default)";
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range ||
      (ec == std::errc() && end == text.data() + text.size() && v > std::numeric_limits<uint32_t>::max()))
    return "is out of range (" + got + "; at most the model's max_position_embeddings)";
  if (ec != std::errc() || end != text.data() + text.size()) return "is not a whole number (" + got + ")";
  if (v != 0 && v < kMinCtx)
    return "must be at least " + std::to_string(kMinCtx) + ", one prompt token and one generated token (" + got + ")";
  return "";
}

void check_ctx(uint64_t ctx, uint64_t max_position_embeddings) {
  if (ctx == 0) return;
  if (ctx < kMinCtx)
    throw UsageError(std::string(kCtxFlag) + " " + std::to_string(ctx) + " must be at least " + std::to_string(kMinCtx) +
                     ", one prompt token and one generated token");
  if (ctx > max_position_embeddings)
    throw UsageError(std::string(kCtxFlag) + " " + std::to_string(ctx) + " exceeds the model's max_position_embeddings " +
                     std::to_string(max_position_embeddings));
}

}  // namespace sluice::cli
