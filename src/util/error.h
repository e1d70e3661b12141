// Errors that cross layer boundaries. Every failure a user can cause (bad file, bad option,
// I/O error, budget too small) is an Error whose message names the cause; nothing aborts.
#pragma once
#include <stdexcept>
#include <string>

namespace sluice {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
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
