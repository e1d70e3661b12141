#include "text/json_cost.h"

#include <algorithm>
#include <vector>

namespace sluice::text {
namespace {

constexpr uint64_t kValue = 16;          // a json value
constexpr uint64_t kObject = 64;         // the std::map a json object allocates
constexpr uint64_t kMember = 96;         // one map node (tree links + key string object + value)
constexpr uint64_t kArray = 32;          // the std::vector a json array allocates
constexpr uint64_t kElement = 3 * kValue;  // per element, while the vector doubles
constexpr uint64_t kString = 48;         // the std::string a json string allocates
constexpr uint64_t kChars = 32;          // a string's character block beyond its length

}  // namespace

uint64_t json_tree_bound(std::string_view text) {
  // Where the scanner is: which containers are open (true: an object), and in an object whether
  // the next string is a key.
  std::vector<bool> open;
  bool want_key = false;
  uint64_t bound = kValue, longest = 0;
  // A value starts here: charged as an array element or (its key was charged) a member.
  auto value_starts = [&] {
    if (!open.empty() && !open.back()) bound += kElement;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      size_t j = i + 1;
      while (j < text.size() && text[j] != '"') j += text[j] == '\\' ? 2 : 1;
      const uint64_t len = std::min(j, text.size()) - (i + 1);
      longest = std::max(longest, len);
      if (!open.empty() && open.back() && want_key) {
        bound += kMember + len + kChars;  // the node and the key's characters
        want_key = false;
      } else {
        value_starts();
        bound += kString + len + kChars;
      }
      i = j;
    } else if (c == '{' || c == '[') {
      value_starts();
      bound += c == '{' ? kObject : kArray;
      open.push_back(c == '{');
      want_key = c == '{';
    } else if (c == '}' || c == ']') {
      if (!open.empty()) open.pop_back();
      want_key = false;
    } else if (c == ',') {
      want_key = !open.empty() && open.back();
    } else if (c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n') {
      // A number or literal: held inside its value; one charge for the whole run.
      value_starts();
      while (i + 1 < text.size() && text[i + 1] != ',' && text[i + 1] != ']' && text[i + 1] != '}' &&
             text[i + 1] != ' ' && text[i + 1] != '\n' && text[i + 1] != '\t' && text[i + 1] != '\r' &&
             text[i + 1] != '"' && text[i + 1] != '[' && text[i + 1] != '{' && text[i + 1] != ':')
        ++i;
    }
  }
  // The lexer's token buffer, grown by doubling to at most twice the longest string, beside the
  // string value made from it (charged above).
  return bound + 2 * (longest + kChars);
}

}  // namespace sluice::text
