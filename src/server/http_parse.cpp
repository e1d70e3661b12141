// HTTP/1.1 request-head parsing (RFC 9112 §2-§6), pure: bytes in, a request or a refusal out.
#include "server/http_parse.h"

#include <algorithm>

#include <cctype>

namespace sluice::server {

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return "";
}

namespace {

// Beyond these the head is refused (431): each field costs a re-parse while a slow client
// sends its head, so their number bounds the work one request can cause.
constexpr size_t kMaxFields = 100;
// Empty lines before the request line are tolerated (RFC 9112 §2.2: a client may send a CRLF
// after a POST body), but only a few.
constexpr size_t kMaxLeadingEmptyLines = 4;
// 18 digits cannot overflow a 64-bit size; any such length is far above every body limit.
constexpr size_t kMaxLengthDigits = 18;

bool is_tchar(unsigned char c) {
  if (std::isalnum(c)) return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '-': case '.':
    case '^': case '_': case '`': case '|': case '~': return true;
    default: return false;
  }
}

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (!is_tchar(c)) return false;
  return true;
}

// field-value characters: VCHAR, obs-text, SP, HTAB. NUL, other controls and DEL are refused.
bool is_field_char(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

// Whether a comma-separated header value (Connection) holds this token, case-insensitively.
bool has_token(std::string_view value, std::string_view token) {
  while (!value.empty()) {
    const size_t comma = value.find(',');
    if (lower(trim_ows(value.substr(0, comma))) == token) return true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return false;
}

HeadParse fail(int status, std::string message) {
  HeadParse r;
  r.state = HeadParse::State::Failed;
  r.status = status;
  r.message = std::move(message);
  return r;
}

// The path part of the request target: origin-form "/p?q", absolute-form "http://host/p?q"
// (which a server must accept, RFC 9112 §3.2.2), or "*" (OPTIONS). false: none of those.
bool split_target(const std::string& target, HttpRequest& req) {
  std::string_view t = target;
  if (t == "*") {
    req.path = target;  // (assigning the literal trips a GCC 12 -Wrestrict false positive)
    return true;
  }
  if (t.empty()) return false;
  if (t.front() != '/') {
    const std::string scheme = lower(t.substr(0, 8));
    size_t start;
    if (scheme.starts_with("http://")) start = 7;
    else if (scheme.starts_with("https://")) start = 8;
    else return false;
    const size_t slash = t.find_first_of("/?", start);
    if (slash == start) return false;  // no authority
    t = slash == std::string_view::npos ? std::string_view("/") : t.substr(slash);
    if (t.front() == '?') return false;
  }
  const size_t q = t.find('?');
  req.path = std::string(t.substr(0, q));
  if (q != std::string_view::npos) req.query = std::string(t.substr(q + 1));
  return true;
}

}  // namespace

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& ch : r) ch = (char)std::tolower((unsigned char)ch);
  return r;
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

HeadParse parse_request_head(std::string_view buf, size_t max_header_bytes, size_t max_body_bytes, HeadScan* scan) {
  // Leading empty lines.
  size_t start = 0;
  for (size_t n = 0; buf.substr(start, 2) == "\r\n"; ++n) {
    if (n == kMaxLeadingEmptyLines) return fail(400, "too many empty lines before the request line");
    start += 2;
  }
  // Find the blank line that ends the head, refusing a lone LF or CR on the way: a parser that
  // accepts LF as a line end and one that does not see different headers in the same bytes.
  size_t end = std::string_view::npos;  // one past the blank line
  // Each position's checks look back two bytes and ahead one (a CR at the end is looked at again).
  const size_t from = scan ? std::max(start, scan->resume) : start;
  for (size_t i = from; i < buf.size(); ++i) {
    if (scan) ++scan->examined;
    if (i >= max_header_bytes)
      return fail(431, "request head larger than " + std::to_string(max_header_bytes) + " bytes");
    const char c = buf[i];
    if (c == '\r') {
      if (i + 1 < buf.size() && buf[i + 1] != '\n') return fail(400, "bare CR in the request head (lines end with CRLF)");
    } else if (c == '\n') {
      if (i == 0 || buf[i - 1] != '\r') return fail(400, "bare LF in the request head (lines end with CRLF)");
      if (i >= start + 3 && buf[i - 2] == '\n') {
        end = i + 1;
        break;
      }
    }
  }
  if (end == std::string_view::npos) {  // Incomplete
    if (scan) scan->resume = buf.empty() || buf.back() != '\r' ? buf.size() : buf.size() - 1;
    return {};
  }

  HeadParse r;
  HttpRequest& req = r.request;
  const std::string_view head = buf.substr(start, end - 4 - start);  // without the final CRLFCRLF
  const size_t line_end = head.find("\r\n");
  const std::string_view line = head.substr(0, line_end);

  // request-line = method SP request-target SP HTTP-version, single spaces.
  const size_t s1 = line.find(' ');
  const size_t s2 = s1 == std::string_view::npos ? s1 : line.find(' ', s1 + 1);
  if (s1 == std::string_view::npos || s2 == std::string_view::npos || line.find(' ', s2 + 1) != std::string_view::npos)
    return fail(400, "malformed request line (expected METHOD SP TARGET SP HTTP/1.1)");
  const std::string_view method = line.substr(0, s1), target = line.substr(s1 + 1, s2 - s1 - 1),
                         version = line.substr(s2 + 1);
  if (!is_token(method)) return fail(400, "malformed request method");
  for (unsigned char c : target)
    if (c <= 0x20 || c >= 0x7f) return fail(400, "request target holds a space, a control or a non-ASCII byte");
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    if (version.starts_with("HTTP/")) return fail(505, "only HTTP/1.0 and HTTP/1.1 are supported");
    return fail(400, "malformed HTTP version in the request line");
  }
  req.method = std::string(method);
  req.target = std::string(target);
  if (!split_target(req.target, req)) return fail(400, "malformed request target");

  // Header fields.
  size_t n_length = 0, n_host = 0;
  bool has_te = false;
  std::string length_text;
  size_t pos = line_end == std::string_view::npos ? head.size() : line_end + 2;
  while (pos < head.size()) {
    size_t e = head.find("\r\n", pos);
    if (e == std::string_view::npos) e = head.size();
    const std::string_view h = head.substr(pos, e - pos);
    pos = e + 2;
    if (req.headers.size() == kMaxFields)
      return fail(431, "more than " + std::to_string(kMaxFields) + " header fields");
    if (h.empty()) return fail(400, "malformed header line");
    if (h.front() == ' ' || h.front() == '\t')
      return fail(400, "obsolete line folding (a header line starting with whitespace) is not accepted");
    const size_t colon = h.find(':');
    if (colon == std::string_view::npos) return fail(400, "malformed header line (no colon)");
    const std::string_view name = h.substr(0, colon);
    if (!name.empty() && (name.back() == ' ' || name.back() == '\t'))
      return fail(400, "whitespace between a header name and its colon");
    if (!is_token(name)) return fail(400, "malformed header name");
    const std::string_view value = trim_ows(h.substr(colon + 1));
    for (unsigned char c : value)
      if (!is_field_char(c)) return fail(400, "header " + std::string(name) + " holds a control character");
    std::string lname = lower(name);
    if (lname == "content-length") {
      ++n_length;
      length_text = std::string(value);
    } else if (lname == "transfer-encoding") {
      has_te = true;
    } else if (lname == "host") {
      ++n_host;
    }
    req.headers.emplace_back(std::move(lname), std::string(value));
  }

  // Message framing (RFC 9112 §6.3): exactly one way to find the end of the body.
  if (n_length > 1) return fail(400, "more than one Content-Length header");
  if (has_te && n_length) return fail(400, "both Transfer-Encoding and Content-Length");
  if (has_te) return fail(411, "chunked request bodies are not supported; send Content-Length");
  if (n_host > 1) return fail(400, "more than one Host header");
  // RFC 9112 3.2: an HTTP/1.1 request without Host is answered 400 (a proxy in front may route by it).
  if (n_host == 0 && version == "HTTP/1.1") return fail(400, "an HTTP/1.1 request needs a Host header");
  if (n_length) {
    if (length_text.empty() || length_text.size() > kMaxLengthDigits)
      return fail(400, "malformed Content-Length (1 to 18 decimal digits)");
    size_t length = 0;
    for (char ch : length_text) {
      if (ch < '0' || ch > '9') return fail(400, "malformed Content-Length (1 to 18 decimal digits)");
      length = length * 10 + (size_t)(ch - '0');
    }
    if (length > max_body_bytes)
      return fail(413, "request body of " + std::to_string(length) + " bytes exceeds the limit of " +
                           std::to_string(max_body_bytes) + " bytes (--max-body)");
    r.content_length = length;
  }

  const std::string connection = req.header("connection");
  r.keep_alive = version == "HTTP/1.1" ? !has_token(connection, "close") : has_token(connection, "keep-alive");
  r.http11 = version == "HTTP/1.1";
  r.expect_continue = lower(req.header("expect")) == "100-continue";
  r.head_bytes = end;
  r.state = HeadParse::State::Done;
  return r;
}

}  // namespace sluice::server
