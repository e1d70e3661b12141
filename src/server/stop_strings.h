// Stop strings (OpenAI `stop`, Anthropic `stop_sequences`): generation ends where one of them
// first appears in the generated content, and the text from it on is not sent. The matcher
// holds back the end of the stream while it could still be the start of a stop string, so a
// client never sees part of one.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace sluice::server {

constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopBytes = 256;

// body[key] as a list: absent or null -> {}, a string -> {it}, an array of strings -> them.
// ApiError 400 for other types, empty strings, more than kMaxStopStrings or longer than
// kMaxStopBytes.
std::vector<std::string> parse_stop_strings(const nlohmann::json& body, const char* key);

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  bool active() const { return !stops_.empty(); }
  // The part of held + text that can be sent now. When a stop string completes, returns the
  // text before it, sets matched() and drops everything after.
  std::string push(std::string_view text);
  std::string finish();  // the held text, at the end of generation (no stop string matched)
  bool hit() const { return hit_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_, matched_;
  bool hit_ = false;
};

}  // namespace sluice::server
