#include "text/prompt_text.h"

#include <algorithm>

namespace sluice::text {

void PromptText::add_data(std::string_view s) {
  if (s.empty()) return;
  const size_t at = text.size();
  text += s;
  if (!data.empty() && data.back().end == at) data.back().end = text.size();
  else data.push_back({at, text.size()});
}

void PromptText::append(const PromptText& p) {
  size_t at = 0;
  for (const TextRange& r : p.data) {
    markup(std::string_view(p.text).substr(at, r.begin - at));
    add_data(std::string_view(p.text).substr(r.begin, r.end - r.begin));
    at = r.end;
  }
  markup(std::string_view(p.text).substr(at));
}

std::vector<TextRange> data_from(std::span<const TextRange> r, size_t from) {
  std::vector<TextRange> out;
  for (const TextRange& x : r)
    if (x.end > from) out.push_back({std::max(x.begin, from) - from, x.end - from});
  return out;
}

bool overlaps_data(std::span<const TextRange> r, size_t b, size_t e) {
  // The first range that ends after b; it overlaps when it starts before e.
  auto it = std::upper_bound(r.begin(), r.end(), b, [](size_t v, const TextRange& x) { return v < x.end; });
  return it != r.end() && it->begin < e;
}

}  // namespace sluice::text
