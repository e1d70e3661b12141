// libFuzzer target for the HTTP/1.1 request-head parser (src/server/http_parse.h): every input
// is the byte stream a client sends on one connection, possibly several pipelined requests.
// The parser may refuse it, but must never crash or read out of bounds, and what it accepts
// must be self-consistent (checked below), or the connection loop would misframe the stream.
// Each request's Accept header is also read as serve reads it for / (server/accept_header.h).
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/accept_header.h"
#include "server/http_parse.h"

namespace {

constexpr size_t kMaxHead = 4096, kMaxBody = 1024;  // small limits so the fuzzer reaches them

void check(bool ok) {
  if (!ok) std::abort();
}

bool token_lower(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (c <= 0x20 || c >= 0x7f || (c >= 'A' && c <= 'Z') || c == ':') return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  using State = sluice::server::HeadParse::State;
  while (!rest.empty()) {
    const sluice::server::HeadParse r = sluice::server::parse_request_head(rest, kMaxHead, kMaxBody);
    // The same bytes arriving in pieces (the server's incremental search, HeadScan) end the same
    // way, and the search looks at each byte about once.
    {
      sluice::server::HeadScan scan;
      sluice::server::HeadParse inc;
      size_t piece = 1 + (rest.size() % 7), calls = 0;
      for (size_t have = std::min(piece, rest.size());; have = std::min(have + piece, rest.size())) {
        inc = sluice::server::parse_request_head(rest.substr(0, have), kMaxHead, kMaxBody, &scan);
        ++calls;
        if (inc.state != State::Incomplete || have == rest.size()) break;
        piece = piece % 13 + 1;
      }
      check(inc.state == r.state && inc.head_bytes == r.head_bytes && inc.status == r.status &&
            inc.content_length == r.content_length);
      check(scan.examined <= std::min(rest.size(), kMaxHead) + 2 * calls);
    }
    if (r.state == State::Incomplete) {
      check(rest.size() <= kMaxHead);  // a head that cannot fit must fail, not wait for more
      break;
    }
    if (r.state == State::Failed) {
      check(r.status == 400 || r.status == 411 || r.status == 413 || r.status == 431 || r.status == 505);
      check(!r.message.empty());
      break;
    }
    check(r.head_bytes >= 4 && r.head_bytes <= rest.size() && r.head_bytes <= kMaxHead);
    // The Accept header's reading (serve's chat page at /): a page only for a request that names it.
    if (sluice::server::accepts_html(r.request)) {
      check(sluice::server::lower(r.request.header("accept")).find("text/html") != std::string::npos);
    }
    check(rest.substr(r.head_bytes - 4, 4) == "\r\n\r\n");
    check(r.content_length <= kMaxBody);
    check(!r.request.method.empty());
    check(r.request.path == "*" || (!r.request.path.empty() && r.request.path[0] == '/'));
    size_t lengths = 0;
    for (const auto& [name, value] : r.request.headers) {
      check(token_lower(name));
      check(value.find_first_of("\r\n") == std::string::npos);
      check(value.empty() || (value.front() != ' ' && value.back() != ' '));
      lengths += name == "content-length";
    }
    check(lengths <= 1);
    // Parsing the head alone gives the same answer: nothing after the blank line is looked at.
    const sluice::server::HeadParse again = sluice::server::parse_request_head(rest.substr(0, r.head_bytes), kMaxHead, kMaxBody);
    check(again.state == State::Done && again.head_bytes == r.head_bytes && again.content_length == r.content_length);
    const size_t total = r.head_bytes + r.content_length;
    if (total > rest.size()) break;  // the body is still arriving
    rest.remove_prefix(total);
  }
  return 0;
}
