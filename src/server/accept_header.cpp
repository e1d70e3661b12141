#include "server/accept_header.h"

#include <string>
#include <string_view>

namespace sluice::server {

namespace {

// "q=0", "q=0.0", "q=0.000" (RFC 9110 12.4.2: at most three decimals): the type is refused.
bool zero_quality(std::string_view params) {
  size_t at = 0;
  while (at < params.size()) {
    size_t semi = params.find(';', at);
    if (semi == std::string_view::npos) semi = params.size();
    const std::string_view p = trim_ows(params.substr(at, semi - at));
    if (p.size() >= 2 && (p[0] == 'q' || p[0] == 'Q') && p[1] == '=') {
      const std::string_view v = p.substr(2);
      if (v.empty() || v[0] != '0') return false;
      for (char c : v.substr(1))
        if (c != '.' && c != '0') return false;
      return true;
    }
    at = semi + 1;
  }
  return false;
}

}  // namespace

bool accepts_html(const HttpRequest& req) {
  const std::string accept = lower(req.header("accept"));
  size_t at = 0;
  while (at < accept.size()) {
    size_t comma = accept.find(',', at);
    if (comma == std::string::npos) comma = accept.size();
    const std::string_view range = std::string_view(accept).substr(at, comma - at);
    const size_t semi = range.find(';');
    const std::string_view type = trim_ows(range.substr(0, semi));
    if (type == "text/html" && !(semi != std::string_view::npos && zero_quality(range.substr(semi + 1)))) return true;
    at = comma + 1;
  }
  return false;
}

}  // namespace sluice::server
