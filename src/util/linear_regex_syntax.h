// The syntax tree of a LinearRegex pattern (util/linear_regex.h) and its parser; internal to
// linear_regex*.cpp.
#pragma once
#include <bitset>
#include <cstdint>
#include <string_view>
#include <vector>

namespace sluice::regex_syntax {

enum class Kind : uint8_t { Empty, Set, Begin, End, WordBoundary, NotWordBoundary, Concat, Alt, Repeat };
constexpr uint32_t kUnbounded = UINT32_MAX;

struct Node {
  Kind kind = Kind::Empty;
  std::bitset<256> set;     // Set: the bytes it matches
  std::vector<Node> parts;  // Concat, Alt: in order; Repeat: the one repeated
  uint32_t min = 0, max = 0;  // Repeat: counts (max kUnbounded for * and +)
};

// Throws Error ("at byte N: what") for anything outside the subset.
Node parse(std::string_view pattern);

}  // namespace sluice::regex_syntax
