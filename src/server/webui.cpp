#include "server/webui.h"

#include <random>

namespace sluice::server {

namespace {

const char kPage[] = {
#include "chat_page.html.inc"
};

std::string new_nonce() {
  static const char digits[] = "0123456789abcdef";
  std::random_device rd;
  std::string n;
  for (int i = 0; i < 4; ++i) {
    uint32_t r = rd();
    for (int k = 0; k < 8; ++k, r >>= 4) n += digits[r & 15];
  }
  return n;
}

}  // namespace

std::string_view chat_page() { return {kPage, sizeof kPage - 1}; }

std::string page_with_nonce(std::string_view page, const std::string& nonce) {
  std::string out;
  out.reserve(page.size() + 64);
  size_t at = 0;
  for (;;) {
    size_t best = std::string_view::npos;
    std::string_view tag;
    for (std::string_view t : {std::string_view("<script>"), std::string_view("<style>")}) {
      const size_t p = page.find(t, at);
      if (p < best) best = p, tag = t;
    }
    if (best == std::string_view::npos) break;
    out.append(page.substr(at, best - at));
    out.append(tag.substr(0, tag.size() - 1));
    out.append(" nonce=\"" + nonce + "\">");
    at = best + tag.size();
  }
  out.append(page.substr(at));
  return out;
}

int handle_chat_page(const HttpRequest& req, Connection& conn) {
  const std::string nonce = new_nonce();
  // connect-src 'self': the page's fetches reach this server only. No other source is allowed
  // for anything; images only as data: URLs (the page's icon).
  const std::string csp = "Content-Security-Policy: default-src 'none'; script-src 'nonce-" + nonce +
                          "'; style-src 'nonce-" + nonce +
                          "'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
                          "frame-ancestors 'none'";
  const std::vector<std::string> headers = {csp, "Cache-Control: no-store", "X-Content-Type-Options: nosniff",
                                            "Referrer-Policy: no-referrer", "X-Frame-Options: DENY"};
  const std::string body = req.method == "HEAD" ? std::string() : page_with_nonce(chat_page(), nonce);
  send_response(conn, 200, "text/html; charset=utf-8", body, headers);
  return 200;
}

}  // namespace sluice::server
