#include "server/stop_strings.h"

#include <algorithm>

#include "server/api_error.h"

namespace sluice::server {

std::vector<std::string> parse_stop_strings(const nlohmann::json& body, const char* key) {
  std::vector<std::string> out;
  if (!body.contains(key) || body[key].is_null()) return out;
  const nlohmann::json& v = body[key];
  auto add = [&](const nlohmann::json& s) {
    if (!s.is_string()) throw bad_request(std::string("'") + key + "' must be a string or an array of strings");
    const std::string& t = s.get_ref<const std::string&>();
    if (t.empty()) throw bad_request(std::string("'") + key + "' holds an empty string");
    if (t.size() > kMaxStopBytes)
      throw bad_request(std::string("'") + key + "': a stop string is longer than " + std::to_string(kMaxStopBytes) + " bytes");
    out.push_back(t);
  };
  if (v.is_array()) {
    if (v.size() > kMaxStopStrings)
      throw bad_request(std::string("'") + key + "' holds more than " + std::to_string(kMaxStopStrings) + " strings");
    for (const auto& s : v) add(s);
  } else {
    add(v);
  }
  return out;
}

std::string StopMatcher::push(std::string_view text) {
  if (hit_) return {};
  held_.append(text);
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at != std::string::npos && at < first) first = at, matched_ = s;
  }
  if (first != std::string::npos) {
    hit_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Keep the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::finish() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace sluice::server
