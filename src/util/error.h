// Errors that cross layer boundaries. Every failure a user can cause (bad file, bad option,
// I/O error, budget too small) is an Error whose message names the cause; nothing aborts.
#pragma once
#include <stdexcept>
#include <string>

namespace sluice {

// A message as it is shown: C0 control characters other than newline and tab written as \u00XX.
// what() is a C string, so a NUL quoted from a request ("unknown role \"a\0b\"") would cut the
// message there; written out, the whole message reaches the client and the log.
inline std::string printable_message(std::string m) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (const char c : m) {
    const unsigned char u = (unsigned char)c;
    if (u < 0x20 && c != '\n' && c != '\t') {
      out += "\\u00";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

struct Error : std::runtime_error {
  explicit Error(const std::string& what) : std::runtime_error(printable_message(what)) {}
  explicit Error(const char* what) : std::runtime_error(printable_message(what)) {}
};

// A GGUF (or other on-disk format) problem: names the field and the byte offset where it was seen.
struct FormatError : Error {
  FormatError(const std::string& field, unsigned long long offset, const std::string& what)
      : Error(what + " (field " + field + " at offset " + std::to_string(offset) + ")"),
        field(field), offset(offset) {}
  std::string field;
  unsigned long long offset;
};

// "path: what", unless `what` already names the path: readers below (the GGUF file, the
// tokenizer) add it themselves, and each layer adding it again printed "X: X: ...".
inline std::string with_path(const std::string& path, const std::string& what) {
  return what.find(path) != std::string::npos ? what : path + ": " + what;
}

}  // namespace sluice
