// DeepSeek-V4 chat rendering (Chat*) and DSML tool-call parsing / rendering (Dsml*).
// Expected prompts are written out by hand from DeepSeek's encoding_dsv4.py rules.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/gguf.h"
#include "text/deepseek41/chat.h"
#include "text/deepseek41/dsml.h"
#include "text/json_text.h"
#include "text/tokenizer.h"
#include "util/error.h"

using sluice::Error;
using sluice::text::ChatMessage;
using sluice::text::ChatOptions;
using sluice::text::ToolCall;
using sluice::text::render_chat;

namespace {

const std::string BOS = "<｜begin▁of▁sentence｜>";
const std::string EOS = "<｜end▁of▁sentence｜>";
const std::string U = "<｜User｜>";
const std::string A = "<｜Assistant｜>";

ChatMessage msg(std::string role, std::string content, std::string reasoning = "") {
  ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  m.reasoning = std::move(reasoning);
  return m;
}

ChatMessage call_msg(std::string reasoning, std::vector<ToolCall> calls, std::string content = "") {
  ChatMessage m = msg("assistant", std::move(content), std::move(reasoning));
  m.tool_calls = std::move(calls);
  return m;
}

ChatMessage tool_msg(std::string id, std::string content) {
  ChatMessage m = msg("tool", std::move(content));
  m.tool_call_id = std::move(id);
  return m;
}

ChatOptions opts(bool thinking) {
  ChatOptions o;
  o.thinking = thinking;
  return o;
}

const std::string kWeatherTool =
    R"({"type":"function","function":{"name":"get_weather","description":"Weather now","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}})";

// The DSML of one get_weather(city) call, as the model writes it.
std::string weather_dsml(const std::string& city) {
  return "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
         "<｜DSML｜parameter name=\"city\" string=\"true\">" + city +
         "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
}

}  // namespace

TEST(ChatRender, SystemUserAssistantThinkingOnAndOff) {
  const std::vector<ChatMessage> m = {msg("system", "You are helpful."), msg("user", "Hi"),
                                      msg("assistant", "Hello!", "greet back"), msg("user", "2+2?")};
  const std::string earlier = BOS + "You are helpful." + U + "Hi" + A + "</think>Hello!" + EOS + U + "2+2?" + A;
  EXPECT_EQ(render_chat(m, opts(true)), earlier + "<think>");
  EXPECT_EQ(render_chat(m, opts(false)), earlier + "</think>");
}

TEST(ChatRender, LeadingSystemMessagesJoined) {
  const std::vector<ChatMessage> m = {msg("system", "A"), msg("developer", "B"), msg("user", "q")};
  EXPECT_EQ(render_chat(m, opts(false)), BOS + "A\n\nB" + U + "q" + A + "</think>");
}

// A system (or developer) message after the first turn is a text part of the user turn it
// falls in, so the tokens before it do not change (prefix reuse) — Claude Code sends one on
// every request.
TEST(ChatRender, LaterSystemMessagesStayInPlace) {
  const std::vector<ChatMessage> after_user = {msg("system", "A"), msg("user", "q"), msg("developer", "B")};
  EXPECT_EQ(render_chat(after_user, opts(false)), BOS + "A" + U + "q\n\nB" + A + "</think>");
  const std::vector<ChatMessage> between = {msg("user", "q1"), msg("assistant", "a1"), msg("system", "S"),
                                            msg("user", "q2")};
  const std::string prefix = BOS + U + "q1" + A + "</think>a1" + EOS;
  EXPECT_EQ(render_chat(between, opts(false)), prefix + U + "S\n\nq2" + A + "</think>");
  // The conversation before the late system message renders exactly as without it.
  const std::vector<ChatMessage> without = {msg("user", "q1"), msg("assistant", "a1"), msg("user", "q2")};
  EXPECT_EQ(render_chat(without, opts(false)).substr(0, prefix.size()), prefix);
  const std::vector<ChatMessage> last = {msg("user", "q1"), msg("assistant", "a1"), msg("system", "S")};
  EXPECT_EQ(render_chat(last, opts(true)), prefix + U + "S" + A + "<think>");
}

TEST(ChatRender, NoBosAndNoSystem) {
  ChatOptions o = opts(true);
  o.add_bos = false;
  EXPECT_EQ(render_chat({msg("user", "x")}, o), U + "x" + A + "<think>");
}

TEST(ChatRender, EarlierReasoningDroppedLatestKept) {
  // Reasoning of turns before the last user message disappears; an assistant turn after it
  // (here a prefilled continuation) keeps its <think> block.
  std::vector<ChatMessage> m = {msg("user", "q1"), msg("assistant", "a1", "r1"), msg("user", "q2"),
                                msg("assistant", "a2", "r2")};
  const std::string want = BOS + U + "q1" + A + "</think>a1" + EOS + U + "q2" + A + "<think>r2</think>a2" + EOS;
  EXPECT_EQ(render_chat(m, opts(true)), want);
  ChatOptions keep = opts(true);
  keep.drop_thinking = false;
  EXPECT_EQ(render_chat(m, keep), BOS + U + "q1" + A + "<think>r1</think>a1" + EOS + U + "q2" + A +
                                      "<think>r2</think>a2" + EOS);
  // Thinking off: no reasoning anywhere.
  EXPECT_EQ(render_chat(m, opts(false)),
            BOS + U + "q1" + A + "</think>a1" + EOS + U + "q2" + A + "</think>a2" + EOS);
}

TEST(ChatRender, ContinueFinalLeavesTheTurnOpen) {
  ChatOptions o = opts(false);
  o.continue_final = true;
  EXPECT_EQ(render_chat({msg("user", "q"), msg("assistant", "The answer is")}, o),
            BOS + U + "q" + A + "</think>The answer is");
}

TEST(ChatRender, ToolLoopKeepsReasoningAfterTheLastUserTurn) {
  ChatOptions o = opts(true);
  o.tools = {kWeatherTool};
  const std::vector<ChatMessage> m = {
      msg("system", "Be brief."), msg("user", "Weather in Paris?"),
      call_msg("Need the tool.", {{"c1", "get_weather", R"({"city":"Paris"})"}}), tool_msg("c1", "sunny, 21C")};
  const std::string tools = sluice::text::render_tools(o.tools);
  const std::string want = BOS + "Be brief.\n\n" + tools + U + "Weather in Paris?" + A + "<think>Need the tool.</think>" +
                           weather_dsml("Paris") + EOS + U + "<tool_result>sunny, 21C</tool_result>" + A + "<think>";
  EXPECT_EQ(render_chat(m, o), want);
  // Without schemas the calls and results alone make it a tool loop: same turns, no tools block.
  EXPECT_EQ(render_chat(m, opts(true)),
            BOS + "Be brief." + U + "Weather in Paris?" + A + "<think>Need the tool.</think>" + weather_dsml("Paris") +
                EOS + U + "<tool_result>sunny, 21C</tool_result>" + A + "<think>");
}

TEST(ChatRender, ToolContextKeepsEarlierReasoningToo) {
  // DeepSeek's encoder disables the reasoning drop whenever tools are in play.
  ChatOptions o = opts(true);
  o.tools = {kWeatherTool};
  const std::vector<ChatMessage> m = {msg("user", "hi"), msg("assistant", "hello", "r0"), msg("user", "q")};
  EXPECT_EQ(render_chat(m, o), BOS + sluice::text::render_tools(o.tools) + U + "hi" + A + "<think>r0</think>hello" +
                                   EOS + U + "q" + A + "<think>");
}

TEST(ChatRender, ConsecutiveToolResultsShareOneUserTurnInCallOrder) {
  const std::vector<ChatMessage> m = {
      msg("user", "both"),
      call_msg("", {{"c1", "get_weather", R"({"city":"Paris"})"}, {"c2", "get_weather", R"({"city":"Rome"})"}}),
      tool_msg("c2", "Rome: rain"), tool_msg("c1", "Paris: sun"), msg("user", "thanks, and?")};
  const std::string calls = "\n\n<｜DSML｜tool_calls>\n"
                            "<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                            "<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                            "</｜DSML｜tool_calls>";
  EXPECT_EQ(render_chat(m, opts(false)),
            BOS + U + "both" + A + "</think>" + calls + EOS + U + "<tool_result>Paris: sun</tool_result>\n\n" +
                "<tool_result>Rome: rain</tool_result>\n\nthanks, and?" + A + "</think>");
}

TEST(ChatRender, MaxEffortPrefixOnlyForMaxThinking) {
  const std::vector<ChatMessage> m = {msg("system", "S"), msg("user", "q")};
  ChatOptions o = opts(true);
  o.reasoning_effort = sluice::text::kEffortMax;
  const std::string r = render_chat(m, o);
  EXPECT_EQ(r, BOS + sluice::text::kMaxEffortPrefix + "S" + U + "q" + A + "<think>");
  EXPECT_EQ(r.find("Reasoning Effort: Absolute maximum"), BOS.size());
  o.reasoning_effort = sluice::text::kEffortHigh;
  EXPECT_EQ(render_chat(m, o), BOS + "S" + U + "q" + A + "<think>");
  o.thinking = false;
  o.reasoning_effort = sluice::text::kEffortMax;
  EXPECT_EQ(render_chat(m, o), BOS + "S" + U + "q" + A + "</think>");
  o.thinking = true;
  o.reasoning_effort = 101;
  EXPECT_THROW(render_chat(m, o), Error);
}

TEST(ChatRender, ReasoningEffortNames) {
  using sluice::text::parse_reasoning_effort;
  EXPECT_EQ(parse_reasoning_effort("max"), 100);
  EXPECT_EQ(parse_reasoning_effort("high"), 75);
  EXPECT_EQ(parse_reasoning_effort("xhigh"), 75);
  EXPECT_EQ(parse_reasoning_effort("low"), 50);
  EXPECT_EQ(parse_reasoning_effort("none"), 0);
  EXPECT_FALSE(parse_reasoning_effort("extreme").has_value());
  // Effort 0 is thinking off.
  ChatOptions o = opts(true);
  o.reasoning_effort = 0;
  EXPECT_EQ(render_chat({msg("user", "q")}, o), BOS + U + "q" + A + "</think>");
}

TEST(ChatRender, ToolsBlockUsesPythonJsonLayout) {
  const std::string t = sluice::text::render_tools({kWeatherTool, R"({"name":"now","parameters":{}})"});
  EXPECT_EQ(t.rfind("## Tools\n\n", 0), 0u);
  EXPECT_NE(t.find("### Available Tool Schemas\n\n"
                   R"({"name": "get_weather", "description": "Weather now", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})"
                   "\n"
                   R"({"name": "now", "parameters": {}})"
                   "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">"), std::string::npos);
  EXPECT_THROW(sluice::text::render_tools({"{not json"}), Error);
  EXPECT_THROW(sluice::text::render_tools({"[1,2]"}), Error);
}

TEST(ChatRender, ResponseFormatAppendedToSystem) {
  ChatOptions o = opts(false);
  o.response_format = R"({"type":"object"})";
  EXPECT_EQ(render_chat({msg("system", "S"), msg("user", "q")}, o),
            BOS + "S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
                  "{\"type\": \"object\"}" + U + "q" + A + "</think>");
}

TEST(ChatRender, UnknownRoleThrows) {
  EXPECT_THROW(render_chat({msg("narrator", "x")}, opts(true)), Error);
}

TEST(ChatRender, TokenizesWithAtomicRoleTokens) {
  const auto tok = sluice::text::Tokenizer::from_gguf(
      sluice::gguf::File::open(std::string(SLUICE_DATA_DIR) + "/deepseek-v3-vocab.gguf"));
  const std::string text = render_chat({msg("system", "S"), msg("user", "hi")}, opts(false));
  const auto ids = tok.encode(text, /*add_bos=*/false);  // the BOS is in the text
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok.find("<｜User｜>")), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok.find("<｜Assistant｜>")), 1);
  EXPECT_EQ(tok.decode(ids), text);
}

// ---------------------------------------------------------------------------------------------

TEST(DsmlParse, CanonicalBlock) {
  const std::string text = "Let me check." + weather_dsml("Paris");
  const auto p = sluice::text::parse_output(text, false);
  EXPECT_EQ(p.content, "Let me check.");
  EXPECT_TRUE(p.error.empty()) << p.error;
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city": "Paris"})");
}

TEST(DsmlParse, TypedValuesAndSeveralInvokes) {
  const std::string block =
      "<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"search\">\n"
      "<｜DSML｜parameter name=\"query\" string=\"true\">a \"quoted\" <b>&amp;\nline</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"limit\" string=\"false\">5</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"tags\" string=\"false\">[\"x\",1,true,null]</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"deep\": {\"k\": 1.5}}</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"now\">\n\n</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>";
  std::vector<ToolCall> calls;
  std::string error;
  ASSERT_TRUE(sluice::text::parse_tool_calls_block(block, calls, error)) << error;
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].name, "search");
  const auto args = nlohmann::json::parse(calls[0].arguments);
  EXPECT_EQ(args["query"], "a \"quoted\" <b>&amp;\nline");
  EXPECT_EQ(args["limit"], 5);
  EXPECT_EQ(args["tags"], nlohmann::json::parse(R"(["x",1,true,null])"));
  EXPECT_EQ(args["opts"]["deep"]["k"], 1.5);
  EXPECT_EQ(calls[1].name, "now");
  EXPECT_EQ(calls[1].arguments, "{}");
}

TEST(DsmlParse, ReasoningContentAndCalls) {
  const std::string out = "I should look it up.</think>Checking." + weather_dsml("Oslo");
  const auto p = sluice::text::parse_output(out, true);
  EXPECT_EQ(p.reasoning, "I should look it up.");
  EXPECT_EQ(p.content, "Checking.");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, R"({"city": "Oslo"})");
  // No tool call, no closing think: all reasoning.
  const auto q = sluice::text::parse_output("still thinking", true);
  EXPECT_EQ(q.reasoning, "still thinking");
  EXPECT_TRUE(q.content.empty());
}

TEST(DsmlRender, RoundTripIsExact) {
  // Model output -> parsed calls -> (client echoes them in history) -> rendered DSML: the
  // same bytes, including JSON values in their original spelling.
  const std::string dsml =
      "\n\n<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"edit\">\n"
      "<｜DSML｜parameter name=\"path\" string=\"true\">src/ä.cpp</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"text\" string=\"true\">if (a < b && c > d) {\n\t\"x\";\n}</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"lines\" string=\"false\">[1,2,  3]</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"n\" string=\"false\">1.0e3</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"noargs\">\n\n</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>";
  const auto p = sluice::text::parse_output("ok" + dsml, false);
  ASSERT_EQ(p.calls.size(), 2u) << p.error;
  EXPECT_EQ(sluice::text::render_tool_calls(p.calls), dsml);
  // And through a chat history.
  ChatMessage a = msg("assistant", p.content);
  a.tool_calls = p.calls;
  EXPECT_EQ(render_chat({msg("user", "go"), a}, opts(false)), BOS + U + "go" + A + "</think>ok" + dsml + EOS);
}

TEST(DsmlRender, ClientArgumentsJson) {
  const std::vector<ToolCall> calls = {{"id1", "f", R"({"s":"x\ny","n":3,"o":{"a":[1, 2]},"b":false})"}};
  const std::string r = sluice::text::render_tool_calls(calls);
  EXPECT_EQ(r, "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
               "<｜DSML｜parameter name=\"s\" string=\"true\">x\ny</｜DSML｜parameter>\n"
               "<｜DSML｜parameter name=\"n\" string=\"false\">3</｜DSML｜parameter>\n"
               "<｜DSML｜parameter name=\"o\" string=\"false\">{\"a\":[1, 2]}</｜DSML｜parameter>\n"
               "<｜DSML｜parameter name=\"b\" string=\"false\">false</｜DSML｜parameter>\n"
               "</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
  const auto back = sluice::text::parse_output(r, false);
  ASSERT_EQ(back.calls.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(back.calls[0].arguments), nlohmann::json::parse(calls[0].arguments));
  // Arguments that are not a JSON object travel as one raw string parameter.
  EXPECT_NE(sluice::text::render_tool_calls({{"", "g", "not json"}})
                .find("<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>"),
            std::string::npos);
  EXPECT_EQ(sluice::text::render_tool_calls({}), "");
}

TEST(DsmlMalformed, ReportedAsPlainText) {
  const std::string open = "<｜DSML｜tool_calls>\n";
  const std::string close = "</｜DSML｜tool_calls>";
  const std::string inv = "<｜DSML｜invoke name=\"f\">\n";
  const std::string endinv = "</｜DSML｜invoke>\n";
  const std::vector<std::string> bad = {
      // parameter outside an invoke
      open + "<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n" + close,
      // invoke not closed before the block ends
      open + inv + "<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n" + close,
      // bad JSON with string="false"
      open + inv + "<｜DSML｜parameter name=\"a\" string=\"false\">{oops</｜DSML｜parameter>\n" + endinv + close,
      // missing / invalid string attribute
      open + inv + "<｜DSML｜parameter name=\"a\">x</｜DSML｜parameter>\n" + endinv + close,
      open + inv + "<｜DSML｜parameter name=\"a\" string=\"maybe\">x</｜DSML｜parameter>\n" + endinv + close,
      // duplicate parameter
      open + inv + "<｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n"
                   "<｜DSML｜parameter name=\"a\" string=\"true\">y</｜DSML｜parameter>\n" + endinv + close,
      // parameter never closed
      open + inv + "<｜DSML｜parameter name=\"a\" string=\"true\">x\n" + endinv + close,
      // nested invoke
      open + inv + inv + endinv + endinv + close,
      // empty block, empty name
      open + close,
      open + "<｜DSML｜invoke name=\"\">\n" + endinv + close,
      // stray text between tags
      open + "hello " + inv + endinv + close,
  };
  for (const std::string& b : bad) {
    const auto p = sluice::text::parse_output("pre\n\n" + b + "post", false);
    EXPECT_TRUE(p.calls.empty()) << b;
    EXPECT_FALSE(p.error.empty()) << b;
    EXPECT_EQ(p.content, "pre\n\n" + b + "post") << b;
  }
}

TEST(DsmlMalformed, UnterminatedBlockAndEveryTruncation) {
  const std::string full = "Sure." + weather_dsml("Paris");
  for (size_t n = 0; n <= full.size(); ++n) {
    const std::string prefix = full.substr(0, n);
    const auto p = sluice::text::parse_output(prefix, false);
    if (n == full.size()) {
      EXPECT_EQ(p.content, "Sure.");
      EXPECT_EQ(p.calls.size(), 1u);
    } else {
      EXPECT_TRUE(p.calls.empty());
      EXPECT_EQ(p.content, prefix) << n;  // nothing lost, nothing invented
    }
  }
}

TEST(DsmlMalformed, RandomMutationsNeverCrash) {
  const std::string full = "<think>r</think>x" + weather_dsml("Paris") + "tail";
  std::mt19937 rng(42);
  for (int i = 0; i < 2000; ++i) {
    std::string s = full;
    for (int k = 0, n = 1 + rng() % 4; k < n && !s.empty(); ++k) {
      const size_t at = rng() % s.size();
      switch (rng() % 3) {
        case 0: s.erase(at, 1 + rng() % 8); break;
        case 1: s.insert(at, 1, "<>\"/\n|"[rng() % 6]); break;
        default: s[at] = (char)(rng() % 256);
      }
    }
    for (bool thinking : {false, true}) {
      const auto p = sluice::text::parse_output(s, thinking);
      if (!p.calls.empty()) continue;
      const bool closed = thinking && s.find("</think>") != std::string::npos;
      EXPECT_EQ(p.reasoning + (closed ? "</think>" : "") + p.content, s);
    }
  }
}

TEST(DsmlStream, ByteByByteEqualsWhole) {
  const std::string out = "Thinking hard.</think>Here:\n\nnot a block\n\n" + weather_dsml("Köln") + "\nafter";
  for (bool thinking : {true, false}) {
    const auto whole = sluice::text::parse_output(out, thinking);
    sluice::text::OutputParser sp(thinking);
    std::string reasoning, content;
    std::vector<ToolCall> calls;
    for (char ch : out) {
      auto d = sp.push(std::string_view(&ch, 1));
      // Content never shows the beginning of a tool-call block.
      EXPECT_EQ(d.content.find("<｜DSML"), std::string::npos);
      reasoning += d.reasoning;
      content += d.content;
      for (auto& c : d.calls) calls.push_back(c);
    }
    auto d = sp.finish();
    reasoning += d.reasoning;
    content += d.content;
    for (auto& c : d.calls) calls.push_back(c);
    EXPECT_EQ(reasoning, whole.reasoning);
    EXPECT_EQ(content, whole.content);
    ASSERT_EQ(calls.size(), whole.calls.size());
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].arguments, R"({"city": "Köln"})");
  }
  const auto w = sluice::text::parse_output(out, true);
  EXPECT_EQ(w.reasoning, "Thinking hard.");
  EXPECT_EQ(w.content, "Here:\n\nnot a block\n\n\nafter");  // the block's own "\n\n" is cut
}

TEST(DsmlStream, NewlinesHeldOnlyUntilTheyCannotStartABlock) {
  sluice::text::OutputParser sp(false);
  EXPECT_EQ(sp.push("a\n\n").content, "a");
  EXPECT_EQ(sp.push("b").content, "\n\nb");
  EXPECT_EQ(sp.push("<｜DS").content, "");
  EXPECT_EQ(sp.push("x").content, "<｜DSx");
  EXPECT_EQ(sp.finish().content, "");
}

TEST(DsmlJson, PythonLayoutAndMemberSplit) {
  using sluice::text::py_json;
  EXPECT_EQ(py_json(nlohmann::ordered_json::parse(R"({"b":1,"a":[true,null,"x\u0001é"],"c":{}})")),
            "{\"b\": 1, \"a\": [true, null, \"x\\u0001é\"], \"c\": {}}");
  std::vector<sluice::text::JsonMember> m;
  ASSERT_TRUE(sluice::text::split_json_object(R"( { "k" : "v\"w" , "n":[1, {"x":"]"}] ,"z":-2.5e3} )", m));
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].key, "k");
  EXPECT_TRUE(m[0].is_string);
  EXPECT_EQ(m[0].str, "v\"w");
  EXPECT_EQ(m[1].raw, R"([1, {"x":"]"}])");
  EXPECT_EQ(m[2].raw, "-2.5e3");
  EXPECT_FALSE(sluice::text::split_json_object("[1]", m));
  EXPECT_FALSE(sluice::text::split_json_object("{\"a\":1", m));
  EXPECT_TRUE(m.empty());
}

// The guard the server runs before parsing (json_nesting_depth) and the writer's own bound.
TEST(JsonText, NestingDepthScanAndWriterBound) {
  using sluice::text::json_nesting_depth;
  EXPECT_EQ(json_nesting_depth("{}", 10), 1u);
  EXPECT_EQ(json_nesting_depth(R"({"a":[1,{"b":[]}]})", 10), 4u);
  EXPECT_EQ(json_nesting_depth(R"({"a":"[[[[{{{{"})", 10), 1u) << "brackets in strings do not count";
  EXPECT_EQ(json_nesting_depth(R"({"a":"\"[[[["})", 10), 1u) << "an escaped quote does not end the string";
  EXPECT_EQ(json_nesting_depth("[]]]][", 10), 1u) << "stray closers do not go below zero";
  EXPECT_EQ(json_nesting_depth(std::string(100000, '['), 64), 65u) << "stops once past the limit";
  const std::string deep = std::string(2000, '[') + std::string(2000, ']');
  const auto j = nlohmann::ordered_json::parse(deep);
  EXPECT_THROW(sluice::text::py_json(j), Error);
  ChatOptions o;
  o.tools = {"{\"name\": \"f\", \"parameters\": " + deep + "}"};
  EXPECT_THROW(render_chat({ChatMessage{"user", "x", "", {}, ""}}, o), Error) << "a 400 in the server, not a crash";
}
