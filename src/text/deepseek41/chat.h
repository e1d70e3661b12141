// DeepSeek-V4 / V4.1 chat rendering (spec section 5; DeepSeek's encoding/encoding_dsv4.py is
// the reference, see docs/chat.md for every choice made where it and ds4 differ):
//
//   <BOS> [max-effort prefix] [system text][\n\n tools block]
//   <｜User｜>question<｜Assistant｜></think>answer<｜end▁of▁sentence｜>      (earlier turn)
//   <｜User｜>question<｜Assistant｜><think>                                   (generation prompt)
//
// Thinking on: the generation prompt ends with <think>; off: with </think>. Reasoning of turns
// before the last user message is dropped, unless the conversation uses tools (tool schemas,
// tool calls or tool results anywhere), in which case every assistant turn keeps
// <think>reasoning</think>. Tool results become <tool_result>…</tool_result> blocks of a user
// turn; consecutive results (and user text right after them) share one <｜User｜>, joined by
// blank lines, ordered like the calls they answer. System messages before the first turn form
// the system text; a later one is a text part of the user turn it falls in (or opens).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/deepseek41/dsml.h"
#include "text/prompt_text.h"

namespace sluice::text {

struct ChatMessage {
  std::string role;          // system | developer (= system) | user | assistant | tool | function (= tool)
  std::string content;
  std::string reasoning;     // assistant: reasoning_content
  std::vector<ToolCall> tool_calls;  // assistant
  std::string tool_call_id;  // tool: the call it answers
};

// V4.1 reasoning effort b, 1..100 (API names: max 100, high 75, low 50; 0 = no thinking,
// like ds4's --think-level 0). See docs/chat.md for how it reaches the prompt.
constexpr int kEffortMax = 100;
constexpr int kEffortHigh = 75;
constexpr int kEffortLow = 50;

struct ChatOptions {
  bool thinking = true;
  int reasoning_effort = kEffortHigh;  // 0..100: 0 = thinking off; only kEffortMax adds text
  // Tool schemas, JSON text each: an OpenAI tool {"type":"function","function":{...}} or the
  // function object itself.
  std::vector<std::string> tools;
  std::string response_format;   // JSON schema text; "" for none
  bool add_bos = true;
  bool drop_thinking = true;     // false: keep every turn's reasoning
  bool continue_final = false;   // a trailing assistant turn is left open (no EOS) to be continued
  // true: the messages' text is trusted like the template's own, so control-token spellings in
  // it are the tokens (serve --special-in-content). Off by default: a page an agent reads must
  // not be able to open a turn.
  bool content_is_markup = false;
  // true: the assistant turns are this engine's own output kept verbatim with its hidden tokens
  // (sluice chat's history), so their text is the model's markup, not outside data.
  bool own_assistant_turns = false;
};

// Throws Error on an unknown role, a tool schema or response format that is not JSON, or a
// reasoning effort outside 0..100.
std::string render_chat(const std::vector<ChatMessage>& messages, const ChatOptions& options);
// The same rendering with the byte ranges that are the caller's data (text/prompt_text.h): every
// message's content and reasoning, tool results, tool call names and arguments, tool schemas and
// the response format. Encode it with Tokenizer::encode(PromptText) so none of it can become a
// control token.
PromptText render_chat_prompt(const std::vector<ChatMessage>& messages, const ChatOptions& options);

// The "## Tools" section for these schemas (same JSON forms as ChatOptions::tools).
std::string render_tools(const std::vector<std::string>& tools);
void append_tools(PromptText& out, const std::vector<std::string>& tools);  // schemas as data

// "max" / "xhigh" / "high" / "medium" / "low" / "minimal" -> effort; "none" -> 0 (thinking
// off). nullopt for anything else.
std::optional<int> parse_reasoning_effort(std::string_view name);

extern const char* const kMaxEffortPrefix;

}  // namespace sluice::text
