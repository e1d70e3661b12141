// libFuzzer target for the JSON-to-request conversion of the three APIs: every input is a request
// body, given to the OpenAI chat/completions, the Anthropic messages and the OpenAI Responses
// request builders (server/chat_request.h, server/responses_request.h, no model needed) and,
// when accepted, rendered into the prompt text as
// the server does before it tokenizes (text::render_chat). A body may be refused — ApiError 400,
// or sluice::Error from the renderer (the server answers both with 400) — but nothing may crash,
// hang, or throw anything else: an escaping nlohmann type_error would be a 500 in the server.
// The bound the server charges before parsing (text::json_tree_bound) is read from every input
// too: it must end, and for a body that parses it must hold at least its size.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/request_json.h"
#include "server/responses_request.h"
#include "text/deepseek41/chat.h"
#include "text/json_cost.h"
#include "util/error.h"

namespace {

// Shallower than the server's default so the fuzzer reaches the limit often.
constexpr size_t kDepth = 32;

enum class Api { OpenAi, Anthropic, Responses };

void convert(std::string_view body, Api api) {
  try {
    const nlohmann::json j = sluice::server::parse_body(body, kDepth);
    const sluice::server::ChatRequest r = api == Api::Anthropic ? sluice::server::anthropic_request(j, /*count_only=*/false)
                                          : api == Api::OpenAi  ? sluice::server::openai_chat_request(j, kDepth)
                                                                : sluice::server::responses_request(j, kDepth).chat;
    // The data ranges (what can never become a control token) are sorted, disjoint, non-empty
    // and inside the text, whatever the request.
    const sluice::text::PromptText p = sluice::text::render_chat_prompt(r.messages, r.options);
    size_t at = 0;
    for (const sluice::text::TextRange& d : p.data) {
      if (d.begin < at || d.end <= d.begin || d.end > p.text.size()) std::abort();
      at = d.end + 1;  // never adjacent
    }
  } catch (const sluice::server::ApiError& e) {
    if (e.status != 400) std::abort();
  } catch (const sluice::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const uint64_t bound = sluice::text::json_tree_bound(body);
  if (bound < 16) std::abort();
  convert(body, Api::OpenAi);
  convert(body, Api::Anthropic);
  convert(body, Api::Responses);
  return 0;
}
