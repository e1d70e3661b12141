// API-key checks for `sluice serve --api-key / --api-key-file / SLUICE_API_KEY`: which headers
// carry the key, and a comparison whose time does not depend on where a guess goes wrong.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "server/http_parse.h"

namespace sluice::server {

// True when a == b. The time taken depends on the lengths only, not on the bytes, so a client
// cannot find the key one byte at a time by timing the 401s.
bool same_secret(std::string_view a, std::string_view b);

// True when the request carries the key as `Authorization: Bearer KEY` (scheme name in any case,
// RFC 9110 §11.1) or as Anthropic's `x-api-key: KEY`.
bool has_api_key(const HttpRequest& req, std::string_view key);

// Why no request could ever carry `key`, or "" when one can: an empty key; whitespace at either
// end (HTTP takes the spaces around a header value off, so " k" never matches); a control
// character (HTTP refuses them in header values). Names the problem, never the key.
std::string api_key_problem(std::string_view key);

// Which of `keys` the request carries (has_api_key), or -1. Every key is compared, whichever
// matches, so the time does not tell which.
int matched_key(const HttpRequest& req, const std::vector<std::string>& keys);

// The cache scope of a key among several (GenerateRequest::scope): a hash of the key, never 0,
// the same after a restart, so a key's state files serve it again.
uint64_t key_scope(std::string_view key);

// The keys in a file: each line that is not blank or a '#' comment, without surrounding
// whitespace. Throws Error naming the file and the line when it cannot be read, holds no key,
// repeats one, or a key has a problem (api_key_problem).
std::vector<std::string> read_api_key_file(const std::string& path);

}  // namespace sluice::server
