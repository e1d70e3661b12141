#include "server/request_json.h"

#include <cmath>

#include "server/api_error.h"
#include "text/json_text.h"

namespace sluice::server {

using nlohmann::json;

void check_json_depth(std::string_view text, size_t max_depth, const std::string& where) {
  if (text::json_nesting_depth(text, max_depth) > max_depth)
    throw bad_request(where + ": JSON nesting deeper than " + std::to_string(max_depth) +
                      " levels (--max-json-depth)");
}

json parse_body(std::string_view body, size_t max_depth) {
  // Before parsing: the scan is cheap and allocates nothing, the parsed tree would.
  check_json_depth(body, max_depth, "the request body");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    throw bad_request(std::string("malformed JSON in the request body: ") + e.what());
  }
  if (!j.is_object()) throw bad_request("the request body must be a JSON object");
  return j;
}

std::optional<int64_t> get_int(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (it->is_number_unsigned()) {
    if (it->get<uint64_t>() <= (uint64_t)INT64_MAX) return (int64_t)it->get<uint64_t>();
  } else if (it->is_number_integer()) {
    return it->get<int64_t>();
  } else if (it->is_number_float()) {
    const double d = it->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return (int64_t)d;
  }
  throw bad_request(std::string("'") + key + "' must be an integer");
}

std::optional<double> get_number(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) throw bad_request(std::string("'") + key + "' must be a number");
  const double d = it->get<double>();
  if (!std::isfinite(d)) throw bad_request(std::string("'") + key + "' must be a finite number");
  return d;
}

std::optional<bool> get_bool(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) throw bad_request(std::string("'") + key + "' must be true or false");
  return it->get<bool>();
}

std::optional<std::string> get_string(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) throw bad_request(std::string("'") + key + "' must be a string");
  return it->get<std::string>();
}

}  // namespace sluice::server
