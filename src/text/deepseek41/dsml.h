// DSML, DeepSeek's tool-call markup (spec section 5):
//
//   \n\n<｜DSML｜tool_calls>
//   <｜DSML｜invoke name="NAME">
//   <｜DSML｜parameter name="KEY" string="true">raw text</｜DSML｜parameter>
//   <｜DSML｜parameter name="KEY" string="false">JSON value</｜DSML｜parameter>
//   </｜DSML｜invoke>
//   </｜DSML｜tool_calls>
//
// Parsing is lenient about whitespace between tags and strict about everything else; a block
// that does not parse is handed back as ordinary content text (with the reason in `error`),
// never thrown. Rendering follows DeepSeek's encoding_dsv4.py, and keeps the exact text of
// JSON values that came from a parse, so a call the model generated replays byte for byte.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "text/prompt_text.h"

namespace sluice::text {

inline constexpr std::string_view kToolCallsOpen = "<｜DSML｜tool_calls>";
inline constexpr std::string_view kToolCallsClose = "</｜DSML｜tool_calls>";
inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";

struct ToolCall {
  std::string id;         // client-side id (not part of DSML); used to order tool results
  std::string name;
  std::string arguments;  // a JSON object, as text (OpenAI "arguments")
};

// "\n\n<｜DSML｜tool_calls>\n...</｜DSML｜tool_calls>" for a history turn; "" for no calls.
// String members become string="true" raw text, every other member string="false" with its
// exact JSON text. Arguments that are not a JSON object become one string parameter named
// "arguments" holding the text as given (what DeepSeek's encoder does).
std::string render_tool_calls(const std::vector<ToolCall>& calls);
// The same, appended to a prompt: the DSML tags are markup, names and values are data.
void append_tool_calls(PromptText& out, const std::vector<ToolCall>& calls);

// Parses one whole block, from "<｜DSML｜tool_calls>" through "</｜DSML｜tool_calls>". On failure
// returns false with a reason in `error` and leaves `calls` unchanged.
bool parse_tool_calls_block(std::string_view block, std::vector<ToolCall>& calls, std::string& error);

// Splits generated text (after the generation prompt) into reasoning, content and tool calls,
// incrementally. With thinking = true the text starts inside <think> and reasoning runs to
// "</think>". Content is emitted as soon as it cannot be the start of a tool-call block (a
// partial "<｜DSML｜tool_calls>" and up to two newlines before it are held back); a block is
// emitted as calls once its closing tag arrives. Feed text without the EOS token.
class OutputParser {
 public:
  struct Delta {
    std::string reasoning;
    std::string content;
    std::vector<ToolCall> calls;
    std::string error;  // set when a block was malformed and went out as content
    bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
  };

  explicit OutputParser(bool thinking) : state_(thinking ? State::Reasoning : State::Content) {}
  Delta push(std::string_view text);
  Delta finish();  // end of generation: flushes held text; an unclosed block is content

 private:
  enum class State { Reasoning, Content, Block };
  void run(bool final, Delta& d);
  State state_;
  std::string buf_;          // text not yet emitted
  std::string block_lead_;   // the "\n\n" cut from the content before the current block
};

struct ParsedOutput {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  std::string error;
};
// OutputParser over the whole text at once.
ParsedOutput parse_output(std::string_view text, bool thinking);

}  // namespace sluice::text
