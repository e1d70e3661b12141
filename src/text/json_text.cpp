#include "text/json_text.h"

#include <cstdio>

#include "text/utf8.h"
#include "util/error.h"

namespace sluice::text {
namespace {

void put_string(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += (char)c;
        }
    }
  }
  out += '"';
}

void put(std::string& out, const nlohmann::ordered_json& j, size_t depth) {
  if ((j.is_object() || j.is_array()) && depth >= kMaxJsonWriteDepth)
    throw Error("JSON nested deeper than " + std::to_string(kMaxJsonWriteDepth) + " levels");
  if (j.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [k, v] : j.items()) {
      if (!first) out += ", ";
      first = false;
      put_string(out, utf8_sanitize(k));
      out += ": ";
      put(out, v, depth + 1);
    }
    out += '}';
  } else if (j.is_array()) {
    out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) out += ", ";
      put(out, j[i], depth + 1);
    }
    out += ']';
  } else if (j.is_string()) {
    put_string(out, utf8_sanitize(j.get_ref<const std::string&>()));
  } else {
    out += j.dump();  // numbers, true/false/null
  }
}

size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  return i;
}

// End of the string literal starting at s[i] == '"'.
size_t string_end(std::string_view s, size_t i) {
  for (++i; i < s.size(); ++i) {
    if (s[i] == '\\') ++i;
    else if (s[i] == '"') return i + 1;
  }
  return s.size();
}

// End of the (already validated) JSON value starting at s[i].
size_t value_end(std::string_view s, size_t i) {
  if (s[i] == '"') return string_end(s, i);
  if (s[i] == '{' || s[i] == '[') {
    int depth = 0;
    for (; i < s.size(); ++i) {
      if (s[i] == '"') {
        i = string_end(s, i) - 1;
      } else if (s[i] == '{' || s[i] == '[') {
        ++depth;
      } else if (s[i] == '}' || s[i] == ']') {
        if (--depth == 0) return i + 1;
      }
    }
    return s.size();
  }
  while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\t' &&
         s[i] != '\n' && s[i] != '\r')
    ++i;
  return i;
}

}  // namespace

size_t json_nesting_depth(std::string_view text, size_t stop_after) {
  size_t depth = 0, deepest = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i)
        if (text[i] == '\\') ++i;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest && (deepest = depth) > stop_after) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

std::string py_json(const nlohmann::ordered_json& j) {
  std::string out;
  put(out, j, 0);
  return out;
}

std::string py_json_string(std::string_view s) {
  std::string out;
  put_string(out, utf8_sanitize(s));
  return out;
}

bool split_json_object(std::string_view text, std::vector<JsonMember>& out) {
  out.clear();
  // Validate first (nlohmann checks UTF-8 and the grammar), then walk the known-good text.
  if (!nlohmann::json::accept(text)) return false;
  size_t i = skip_ws(text, 0);
  if (i >= text.size() || text[i] != '{') return false;
  i = skip_ws(text, i + 1);
  while (i < text.size() && text[i] != '}') {
    const size_t kend = string_end(text, i);
    JsonMember m;
    m.key = nlohmann::json::parse(text.substr(i, kend - i)).get<std::string>();
    i = skip_ws(text, kend);
    i = skip_ws(text, i + 1);  // ':'
    const size_t vend = value_end(text, i);
    m.raw = std::string(text.substr(i, vend - i));
    m.is_string = text[i] == '"';
    if (m.is_string) m.str = nlohmann::json::parse(m.raw).get<std::string>();
    out.push_back(std::move(m));
    i = skip_ws(text, vend);
    if (i < text.size() && text[i] == ',') i = skip_ws(text, i + 1);
  }
  return true;
}

}  // namespace sluice::text
