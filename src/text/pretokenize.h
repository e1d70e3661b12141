// The "deepseek-v3" / "joyai-llm" pre-tokenizer (spec section 5): three ordered regex passes,
// each splitting the pieces the previous pass left, implemented as a hand-written scanner.
//   1. \p{N}{1,3}
//   2. [一-龥぀-ゟ゠-ヿ]+                      (U+4E00-9FA5, U+3040-309F, U+30A0-30FF)
//   3. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
//      | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
//      |  ?[\p{P}\p{S}]+[\r\n]*
//      | \s*[\r\n]+
//      | \s+(?!\S)
//      | \s+
// Every pass keeps both the matches and the text between them as pieces ("Isolated"
// behaviour); a regex never matches across the boundary of a piece it was given, and
// lookahead sees the end of the piece as the end of input.
#pragma once
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::text {

// Appends the pieces of `text` as [begin, end) byte offsets, in order; they tile the text.
// Bytes that are not well-formed UTF-8 are kept, each as a one-byte unit of no category.
void pretokenize(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& pieces);

}  // namespace sluice::text
