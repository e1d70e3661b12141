// Server-sent events framing (text/event-stream): OpenAI streams are unnamed `data:` events
// ending with `data: [DONE]`; Anthropic streams name every event. Comments (": ...") are
// keep-alives every SSE parser ignores.
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace sluice::server {

// "data: {json}\n\n" (JSON is one line: dump() escapes newlines inside strings).
std::string sse_data(const nlohmann::json& j);
std::string sse_done();  // "data: [DONE]\n\n"
// "event: NAME\ndata: {json}\n\n"
std::string sse_event(std::string_view name, const nlohmann::json& j);
// ": text\n\n"; newlines in text are replaced so the comment stays one line.
std::string sse_comment(std::string_view text);

}  // namespace sluice::server
