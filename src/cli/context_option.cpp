#include "cli/context_option.h"

#include <charconv>
#include <limits>

#include "cli/commands.h"

namespace sluice::cli {

std::string ctx_text_problem(std::string& text, uint64_t min_ctx, const std::string& min_why) {
  const std::string got = "got '" + text + "'";
  if (text.empty()) return "needs a number of positions (" + got + ")";
  if (text[0] == '-') return "must not be negative (" + got + "; 0 means the default)";
  // 32k, 128K, 1M: binary multiples, as contexts are quoted (32k = 32,768 positions).
  uint64_t mult = 1;
  size_t digits = text.size();
  const char last = text.back();
  if (last == 'k' || last == 'K') mult = 1024, --digits;
  else if (last == 'm' || last == 'M') mult = 1024 * 1024, --digits;
  if (digits == 0) return "needs a number before its suffix (" + got + ")";
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + digits, v);
  if (ec == std::errc() && end == text.data() + digits && v > std::numeric_limits<uint32_t>::max() / mult)
    return "is out of range (" + got + "; at most the model's max_position_embeddings)";
  if (ec == std::errc::result_out_of_range) return "is out of range (" + got + "; at most the model's max_position_embeddings)";
  if (ec != std::errc() || end != text.data() + digits)
    return "is not a whole number (" + got + "; a number of positions, or with k / M: 32k = 32768)";
  v *= mult;
  if (v != 0 && v < min_ctx) return "must be at least " + std::to_string(min_ctx) + ", " + min_why + " (" + got + ")";
  text = std::to_string(v);  // what the option's integer is parsed from
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
