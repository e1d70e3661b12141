#include "server/sse.h"

namespace sluice::server {

namespace {
// Invalid UTF-8 must not abort the stream (dump() would throw): replace it.
std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }
}  // namespace

std::string sse_data(const nlohmann::json& j) { return "data: " + dump(j) + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

std::string sse_event(std::string_view name, const nlohmann::json& j) {
  return "event: " + std::string(name) + "\ndata: " + dump(j) + "\n\n";
}

std::string sse_comment(std::string_view text) {
  std::string s = ": ";
  for (char c : text) s += (c == '\n' || c == '\r') ? ' ' : c;
  return s + "\n\n";
}

}  // namespace sluice::server
