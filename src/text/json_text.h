// JSON text the way DeepSeek's Python encoder writes it, and a member splitter that keeps the
// exact text of each value (so tool-call arguments replay byte for byte).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace sluice::text {

// json.dumps(value, ensure_ascii=False): ", " and ": " separators, keys in their order,
// non-ASCII kept, control characters as \uXXXX (lowercase hex).
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
