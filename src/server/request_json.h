// Reading a request body: parsing with a bound on nesting (every later walk of the value —
// nlohmann's dump, the prompt's JSON writer — recurses, so depth is refused before anything
// walks it), and typed optional fields that answer a wrong type with a 400 naming the field.
// Needs no model: the fuzz target (fuzz/fuzz_requests.cpp) calls it directly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace sluice::server {

// Default of --max-json-depth.
constexpr size_t kDefaultMaxJsonDepth = 128;

// ApiError 400 "WHERE: JSON nesting deeper than N levels (--max-json-depth)" when `text` nests
// deeper than max_depth.
void check_json_depth(std::string_view text, size_t max_depth, const std::string& where);

// Parses a JSON request body; ApiError 400 when it nests too deep or is not a JSON object.
nlohmann::json parse_body(std::string_view body, size_t max_depth);

// Optional typed fields; ApiError 400 naming the field on a wrong type or value. get_int takes
// integral floats (2.0) but not 2.5, NaN, infinities or integers beyond int64.
std::optional<int64_t> get_int(const nlohmann::json& j, const char* key);
std::optional<double> get_number(const nlohmann::json& j, const char* key);
std::optional<bool> get_bool(const nlohmann::json& j, const char* key);
std::optional<std::string> get_string(const nlohmann::json& j, const char* key);

}  // namespace sluice::server
