#include "server/auth.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "util/error.h"
#include "util/hash.h"

namespace sluice::server {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace((unsigned char)s.front())) s.remove_prefix(1);
  while (!s.empty() && std::isspace((unsigned char)s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

bool same_secret(std::string_view a, std::string_view b) {
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  // volatile: keeps the compiler from turning the loop into an early-exit comparison.
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? (unsigned char)a[i] : 0, y = i < b.size() ? (unsigned char)b[i] : 0;
    diff = diff | (unsigned char)(x ^ y);
  }
  return diff == 0;
}

bool has_api_key(const HttpRequest& req, std::string_view key) {
  bool ok = false;
  // Both headers are checked whatever the first says, so the time does not tell which one failed.
  const std::string auth = req.header("authorization");
  const std::string_view a = trim(auth);
  const size_t sp = a.find_first_of(" \t");
  if (sp != std::string_view::npos) {
    std::string scheme(a.substr(0, sp));
    for (char& c : scheme) c = (char)std::tolower((unsigned char)c);
    ok = same_secret(trim(a.substr(sp)), key) && scheme == "bearer";
  }
  const std::string x = req.header("x-api-key");
  const bool x_ok = same_secret(trim(x), key) && !x.empty();
  return ok || x_ok;
}

std::string api_key_problem(std::string_view key) {
  if (key.empty()) return "is empty (a server with a key needs one; leave the option out to serve without)";
  if (std::isspace((unsigned char)key.front()) || std::isspace((unsigned char)key.back()))
    return "has leading or trailing whitespace, which HTTP takes off a header value, so no request could match it";
  for (const char c : key)
    if ((unsigned char)c < 0x20 || c == 0x7f)
      return "holds a control character, which HTTP refuses in a header value, so no request could carry it";
  return "";
}

int matched_key(const HttpRequest& req, const std::vector<std::string>& keys) {
  int found = -1;
  for (size_t k = 0; k < keys.size(); ++k)
    if (has_api_key(req, keys[k]) && found < 0) found = (int)k;
  return found;
}

uint64_t key_scope(std::string_view key) {
  Hasher h(0x73636f7065ull);  // "scope"
  h.update(key.data(), key.size());
  const Digest128 d = h.digest();
  uint64_t s = 0;
  std::memcpy(&s, d.data(), sizeof s);
  return s | 1;
}

std::vector<std::string> read_api_key_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("--api-key-file " + path + ": cannot read it: " + std::strerror(errno));
  std::vector<std::string> keys;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    const std::string key(trim(line));
    if (key.empty() || key.front() == '#') continue;
    const std::string at = "--api-key-file " + path + " line " + std::to_string(n) + ": ";
    if (const std::string why = api_key_problem(key); !why.empty()) throw Error(at + "the key " + why);
    for (const std::string& k : keys)
      if (same_secret(k, key)) throw Error(at + "the key is given twice");
    keys.push_back(key);
  }
  if (in.bad()) throw Error("--api-key-file " + path + ": cannot read it: " + std::strerror(errno));
  if (keys.empty()) throw Error("--api-key-file " + path + ": holds no key (one per line; blank and '#' lines are skipped)");
  return keys;
}

}  // namespace sluice::server
