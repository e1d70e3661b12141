// parse_request_head on byte buffers: what it accepts, what it refuses (RFC 9112 framing) and
// that a refusal names the cause. The same rules over a real socket: server_transport_test.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/http_parse.h"

namespace sluice::server {
namespace {

HeadParse parse(const std::string& s) { return parse_request_head(s, 1024, 100); }

TEST(HttpParse, AcceptsAnOrdinaryRequestAndFindsTheBody) {
  const std::string raw = "POST /v1/x?a=1 HTTP/1.1\r\nHost: h\r\nContent-Length:  3 \r\nX-Y:\r\n\r\nabcGET";
  const HeadParse r = parse(raw);
  ASSERT_EQ(r.state, HeadParse::State::Done) << r.message;
  EXPECT_EQ(r.request.method, "POST");
  EXPECT_EQ(r.request.path, "/v1/x");
  EXPECT_EQ(r.request.query, "a=1");
  EXPECT_EQ(r.request.header("content-length"), "3");
  EXPECT_EQ(r.request.header("x-y"), "");
  EXPECT_EQ(r.content_length, 3u);
  EXPECT_EQ(raw.substr(r.head_bytes, r.content_length), "abc");
  EXPECT_TRUE(r.keep_alive);
}

TEST(HttpParse, IncompleteUntilTheBlankLine) {
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nHost: h\r\n").state, HeadParse::State::Incomplete);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nHost: h\r\n\r").state, HeadParse::State::Incomplete);
  EXPECT_EQ(parse("").state, HeadParse::State::Incomplete);
}

// Issue 53 finding 11: a head dribbled a line at a time is searched once per byte (the server
// re-parsed the whole buffer at every line end: 16 such connections cost a core), and ends as a
// one-shot parse does.
TEST(HttpParse, ADribbledHeadIsSearchedOncePerByte) {
  std::string head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n";
  std::vector<size_t> line_ends;
  while (head.size() < 60000) {
    head += "X-A: b\r\n";
    line_ends.push_back(head.size());
  }
  head += "Content-Length: 0\r\n\r\n";
  line_ends.push_back(head.size());
  HeadScan scan;
  HeadParse r;
  for (const size_t end : line_ends) {
    r = parse_request_head(std::string_view(head).substr(0, end), 65536, 1024, &scan);
    if (r.state != HeadParse::State::Incomplete) break;
  }
  // Refused in the end (more than 100 fields), as a one-shot parse refuses it: the cost of
  // getting there is what counts.
  const HeadParse once = parse_request_head(head, 65536, 1024);
  EXPECT_EQ(r.state, once.state);
  EXPECT_EQ(r.status, once.status);
  EXPECT_EQ(r.message, once.message);
  EXPECT_LE(scan.examined, head.size() + 2 * line_ends.size()) << "the head was searched again from its start";
}

TEST(HttpParse, ConnectionAndVersion) {
  EXPECT_FALSE(parse("GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, Close\r\n\r\n").keep_alive);
  EXPECT_FALSE(parse("GET / HTTP/1.0\r\n\r\n").keep_alive);
  EXPECT_TRUE(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
  EXPECT_EQ(parse("GET / HTTP/2.0\r\n\r\n").status, 505);
  EXPECT_EQ(parse("GET http://h:1/p?q HTTP/1.1\r\nHost: h:1\r\n\r\n").request.path, "/p");
  // RFC 9112 3.2: HTTP/1.1 needs Host; HTTP/1.0 does not.
  const HeadParse no_host = parse("GET / HTTP/1.1\r\nX: y\r\n\r\n");
  EXPECT_EQ(no_host.status, 400);
  EXPECT_NE(no_host.message.find("Host"), std::string::npos) << no_host.message;
  EXPECT_EQ(parse("GET / HTTP/1.0\r\n\r\n").state, HeadParse::State::Done);
}

struct Refusal {
  const char* name;
  std::string raw;
  int status;
  const char* says;  // a piece of the message
};

TEST(HttpParse, RefusesAmbiguousFraming) {
  const std::string l = "GET / HTTP/1.1\r\nHost: h\r\n";
  const Refusal cases[] = {
      {"duplicate Content-Length", l + "Content-Length: 1\r\nContent-Length: 1\r\n\r\n", 400, "more than one Content-Length"},
      {"TE and CL", l + "Transfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n", 400, "both Transfer-Encoding"},
      {"TE alone", l + "Transfer-Encoding: chunked\r\n\r\n", 411, "chunked"},
      {"obs-fold", l + "X-A: b\r\n c: d\r\n\r\n", 400, "line folding"},
      {"bare LF", "GET / HTTP/1.1\nHost: h\n\n", 400, "bare LF"},
      {"bare LF inside", l + "X-A: b\nX-B: c\r\n\r\n", 400, "bare LF"},
      {"bare CR", l + "X-A: b\rX-B: c\r\n\r\n", 400, "bare CR"},
      {"space before colon", l + "Content-Length : 1\r\n\r\n", 400, "whitespace between a header name"},
      {"CL sign", l + "Content-Length: +1\r\n\r\n", 400, "malformed Content-Length"},
      {"CL negative", l + "Content-Length: -1\r\n\r\n", 400, "malformed Content-Length"},
      {"CL hex", l + "Content-Length: 0x1\r\n\r\n", 400, "malformed Content-Length"},
      {"CL list", l + "Content-Length: 1, 1\r\n\r\n", 400, "malformed Content-Length"},
      {"CL empty", l + "Content-Length:\r\n\r\n", 400, "malformed Content-Length"},
      {"CL overflow", l + "Content-Length: 18446744073709551617\r\n\r\n", 400, "malformed Content-Length"},
      {"CL too large", l + "Content-Length: 101\r\n\r\n", 413, "--max-body"},
      {"duplicate Host", l + "Host: h2\r\n\r\n", 400, "more than one Host"},
      {"NUL in value", l + std::string("X-A: a\0b\r\n\r\n", 12), 400, "control character"},
      {"double space in request line", "GET  / HTTP/1.1\r\n\r\n", 400, "request line"},
      {"no colon", l + "nonsense\r\n\r\n", 400, "no colon"},
      {"bad target", "GET nowhere HTTP/1.1\r\n\r\n", 400, "target"},
      {"too large", "GET / HTTP/1.1\r\nX: " + std::string(2000, 'a'), 431, "larger than"},
  };
  for (const Refusal& c : cases) {
    const HeadParse r = parse(c.raw);
    EXPECT_EQ(r.state, HeadParse::State::Failed) << c.name;
    EXPECT_EQ(r.status, c.status) << c.name;
    EXPECT_NE(r.message.find(c.says), std::string::npos) << c.name << ": " << r.message;
  }
}

}  // namespace
}  // namespace sluice::server
