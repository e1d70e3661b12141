// JSON text the way DeepSeek's Python encoder writes it, and a member splitter that keeps the
// exact text of each value (so tool-call arguments replay byte for byte).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace sluice::text {

// Deepest nesting of arrays/objects in `text` (brackets outside string literals), scanned without
// recursion or allocation; stops counting once it passes `stop_after`. Says nothing about
// whether the text is valid JSON: it is the cheap guard run before anything that recurses.
size_t json_nesting_depth(std::string_view text, size_t stop_after);

// Nesting the recursive writer below accepts; deeper values throw Error (the server refuses
// requests far shallower than this, see --max-json-depth).
constexpr size_t kMaxJsonWriteDepth = 1024;

// json.dumps(value, ensure_ascii=False): ", " and ": " separators, keys in their order,
// non-ASCII kept, control characters as \uXXXX (lowercase hex). Throws Error when the value
// nests deeper than kMaxJsonWriteDepth.
std::string py_json(const nlohmann::ordered_json& j);
// A JSON string literal, same escaping. Ill-formed UTF-8 is replaced by U+FFFD first.
std::string py_json_string(std::string_view s);

struct JsonMember {
  std::string key;
  std::string raw;        // the value's exact text (string values: with quotes and escapes)
  bool is_string = false;
  std::string str;        // the decoded value when is_string
};

// Splits a JSON object into its top-level members, in order (repeated keys kept). Returns
// false, leaving `out` empty, when `text` is not one well-formed JSON object.
bool split_json_object(std::string_view text, std::vector<JsonMember>& out);

}  // namespace sluice::text
