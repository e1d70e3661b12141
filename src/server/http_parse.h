// Parsing of an HTTP/1.1 request head (request line + header fields) from a byte buffer, with
// no sockets involved, so the same function serves the connection threads and the fuzzer.
// Strict on purpose (RFC 9112): anything two parsers could read differently — duplicate or
// malformed Content-Length, Transfer-Encoding with Content-Length, obs-fold, bare LF or CR,
// whitespace before a colon — is refused, because a proxy in front that reads it the other way
// lets a client smuggle a second request past it.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::server {

struct HttpRequest {
  std::string method;   // "GET", "POST", ...
  std::string target;   // as sent: path plus query
  std::string path;     // without the query string
  std::string query;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  // The first header with this (lower-case) name, or "".
  std::string header(std::string_view name) const;
};

// Header values as RFC 9110 reads them: case folded (ASCII), optional whitespace (SP, HTAB) trimmed.
std::string lower(std::string_view s);
std::string_view trim_ows(std::string_view s);

struct HeadParse {
  enum class State { Incomplete, Done, Failed };
  State state = State::Incomplete;
  // Done: the request without its body; head_bytes is the length of the head including the
  // blank line, content_length the body that follows it.
  HttpRequest request;
  size_t head_bytes = 0;
  size_t content_length = 0;
  bool keep_alive = true;       // what the client asked for (HTTP/1.0 defaults to close)
  bool http11 = true;           // HTTP/1.1 (an HTTP/1.0 client is sent no interim 1xx response)
  bool expect_continue = false;
  // Failed: the status to answer (400, 411, 413, 431, 505) and why. The connection must be closed
  // afterwards: after a malformed head nothing says where the next request would start.
  int status = 0;
  std::string message;
};

// buf holds the bytes received so far for this request (it may hold more: a body, a pipelined
// request). Incomplete means "read more"; a head that cannot fit in max_header_bytes, or a
// framing error in the part already received, fails at once.
// scan (optional): where the search for the head's end resumes, kept by the caller across calls
// for one request (reset for the next): each call then looks only at the bytes that arrived since
// the last, so a client dribbling a 64 KiB head a line at a time costs linear time, not quadratic.
struct HeadScan {
  size_t resume = 0;      // bytes already checked for line ends without finding the blank line
  uint64_t examined = 0;  // bytes the search has looked at over all calls (for the tests)
};
HeadParse parse_request_head(std::string_view buf, size_t max_header_bytes, size_t max_body_bytes,
                             HeadScan* scan = nullptr);

}  // namespace sluice::server
