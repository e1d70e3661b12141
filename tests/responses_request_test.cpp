// The Responses API without a model: the request conversion (server/responses_request.h) — each
// input item type, namespace flattening, built-in tools dropped and recorded, the settings
// echoed, bad input refused with a 400 that names the field — and the output builder
// (server/responses_events.h): the event sequence for reasoning, text and tool calls, namespaced
// calls split back. Against a running server: server_responses_test.cpp.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/responses_events.h"
#include "server/responses_request.h"
#include "server_harness.h"
#include "text/deepseek41/chat.h"

namespace sluice::server {
namespace {

using nlohmann::json;

ResponsesRequest convert(const json& body) { return responses_request(body, 32); }

// The message of the 400 the body gets ("" when it is accepted, which fails the caller's check).
std::string refusal(const json& body) {
  try {
    convert(body);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << e.what();
    return e.what();
  }
  return "";
}

TEST(ResponsesRequest, StringInputAndInstructions) {
  const ResponsesRequest r = convert({{"input", "hi"}, {"instructions", "be brief"}});
  ASSERT_EQ(r.chat.messages.size(), 2u);
  EXPECT_EQ(r.chat.messages[0].role, "system");
  EXPECT_EQ(r.chat.messages[0].content, "be brief");
  EXPECT_EQ(r.chat.messages[1].role, "user");
  EXPECT_EQ(r.chat.messages[1].content, "hi");
  EXPECT_EQ(r.instructions, "be brief");
  EXPECT_FALSE(r.chat.stream);
  EXPECT_FALSE(r.max_output_tokens.has_value());
  // Thinking is on by default at high effort.
  EXPECT_TRUE(r.chat.options.thinking);
  EXPECT_EQ(r.chat.options.reasoning_effort, text::kEffortHigh);
}

TEST(ResponsesRequest, MessagesWithRolesAndParts) {
  const json input = json::array({
      {{"type", "message"}, {"role", "developer"}, {"content", json::array({{{"type", "input_text"}, {"text", "rules"}}})}},
      {{"role", "system"}, {"content", "more rules"}},  // no "type": an easy input message
      {{"type", "message"}, {"role", "user"},
       {"content", json::array({{{"type", "input_text"}, {"text", "a"}}, {{"type", "input_text"}, {"text", "b"}}})}},
      {{"type", "message"}, {"role", "assistant"}, {"content", json::array({{{"type", "output_text"}, {"text", "ok"}}})}},
  });
  const ResponsesRequest r = convert({{"input", input}});
  ASSERT_EQ(r.chat.messages.size(), 4u);
  EXPECT_EQ(r.chat.messages[0].role, "system");
  EXPECT_EQ(r.chat.messages[0].content, "rules");
  EXPECT_EQ(r.chat.messages[1].role, "system");
  EXPECT_EQ(r.chat.messages[2].role, "user");
  EXPECT_EQ(r.chat.messages[2].content, "a\n\nb");
  EXPECT_EQ(r.chat.messages[3].role, "assistant");
  EXPECT_EQ(r.chat.messages[3].content, "ok");
}

// One model response comes back as reasoning, message and function_call items: one assistant
// turn, then the outputs as tool messages.
TEST(ResponsesRequest, ReasoningTextAndCallsFormOneAssistantTurn) {
  const json input = json::array({
      {{"role", "user"}, {"content", "list files"}},
      {{"type", "reasoning"}, {"id", "rs_1"}, {"summary", json::array()},
       {"content", json::array({{{"type", "reasoning_text"}, {"text", "use ls"}}})}, {"encrypted_content", nullptr}},
      {{"type", "message"}, {"role", "assistant"}, {"content", json::array({{{"type", "output_text"}, {"text", "running"}}})}},
      {{"type", "function_call"}, {"call_id", "c1"}, {"name", "exec_command"}, {"arguments", R"({"cmd":"ls"})"}},
      {{"type", "function_call"}, {"call_id", "c2"}, {"name", "wait_agent"}, {"namespace", "multi_agent_v1"},
       {"arguments", "{}"}},
      {{"type", "function_call_output"}, {"call_id", "c1"}, {"output", "a.txt"}},
      {{"type", "function_call_output"}, {"call_id", "c2"},
       {"output", json::array({{{"type", "input_text"}, {"text", "done"}}})}},
      {{"type", "reasoning"}, {"summary", json::array({{{"type", "summary_text"}, {"text", "only a summary"}}})}},
      {{"type", "message"}, {"role", "assistant"}, {"content", "a.txt is there"}},
  });
  const ResponsesRequest r = convert({{"input", input}});
  ASSERT_EQ(r.chat.messages.size(), 5u);
  const text::ChatMessage& a = r.chat.messages[1];
  EXPECT_EQ(a.role, "assistant");
  EXPECT_EQ(a.reasoning, "use ls");
  EXPECT_EQ(a.content, "running");
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(a.tool_calls[0].id, "c1");
  EXPECT_EQ(a.tool_calls[0].name, "exec_command");
  EXPECT_EQ(a.tool_calls[0].arguments, R"({"cmd":"ls"})");
  EXPECT_EQ(a.tool_calls[1].name, "multi_agent_v1.wait_agent");  // the flattened name
  EXPECT_EQ(r.chat.messages[2].role, "tool");
  EXPECT_EQ(r.chat.messages[2].tool_call_id, "c1");
  EXPECT_EQ(r.chat.messages[2].content, "a.txt");
  EXPECT_EQ(r.chat.messages[3].content, "done");
  EXPECT_EQ(r.chat.messages[4].role, "assistant");
  EXPECT_EQ(r.chat.messages[4].reasoning, "only a summary");
  EXPECT_EQ(r.chat.messages[4].content, "a.txt is there");
  // And it renders.
  EXPECT_NO_THROW(text::render_chat(r.chat.messages, r.chat.options));
}

TEST(ResponsesRequest, NamespaceToolsAreFlattenedAndBuiltinsDropped) {
  const json tools = json::array({
      {{"type", "function"}, {"name", "exec_command"}, {"description", "run"}, {"strict", false},
       {"parameters", {{"type", "object"}, {"properties", {{"cmd", {{"type", "string"}}}}}}}},
      {{"type", "namespace"}, {"name", "multi_agent_v1"}, {"description", "Sub-agents."},
       {"tools", json::array({{{"type", "function"}, {"name", "spawn_agent"}, {"description", "Spawn one."},
                               {"parameters", {{"type", "object"}}}},
                              {{"type", "function"}, {"name", "wait_agent"}}})}},
      {{"type", "web_search"}, {"external_web_access", false}},
  });
  const ResponsesRequest r = convert({{"input", "x"}, {"tools", tools}});
  ASSERT_EQ(r.chat.options.tools.size(), 3u);
  const json t0 = json::parse(r.chat.options.tools[0]);
  EXPECT_EQ(t0["function"]["name"], "exec_command");
  EXPECT_EQ(t0["function"]["parameters"]["properties"]["cmd"]["type"], "string");
  const json t1 = json::parse(r.chat.options.tools[1]);
  EXPECT_EQ(t1["function"]["name"], "multi_agent_v1.spawn_agent");
  EXPECT_EQ(t1["function"]["description"], "Sub-agents.\n\nSpawn one.");
  const json t2 = json::parse(r.chat.options.tools[2]);
  EXPECT_EQ(t2["function"]["name"], "multi_agent_v1.wait_agent");
  EXPECT_EQ(t2["function"]["parameters"]["type"], "object");
  ASSERT_EQ(r.namespaced.count("multi_agent_v1.wait_agent"), 1u);
  EXPECT_EQ(r.namespaced.at("multi_agent_v1.wait_agent").first, "multi_agent_v1");
  EXPECT_EQ(r.namespaced.at("multi_agent_v1.wait_agent").second, "wait_agent");
  EXPECT_EQ(r.namespaced.count("exec_command"), 0u);
  ASSERT_EQ(r.dropped.size(), 1u);
  EXPECT_EQ(r.dropped[0].what, "tool web_search");
  EXPECT_EQ(r.dropped[0].where, "tools[2]");
  EXPECT_EQ(r.tools, tools);  // echoed as given
  // The tools reach the prompt under the flattened names.
  const std::string prompt = text::render_chat(r.chat.messages, r.chat.options);
  EXPECT_NE(prompt.find("\"multi_agent_v1.spawn_agent\""), std::string::npos);
  EXPECT_EQ(prompt.find("web_search"), std::string::npos);
}

// Issue 53 (also noted): a dot is accepted in a function name (agents send what their tool
// servers call things), so a top-level "ns.f" could meet namespace ns's f: that is refused as a
// second tool of the name, never two tools the model cannot tell apart.
TEST(ResponsesRequest, ADottedNameThatMeetsANamespacedOneIsRefused) {
  const json fn = {{"type", "function"}, {"name", "ns.f"}};
  const json ns = {{"type", "namespace"}, {"name", "ns"}, {"tools", json::array({{{"type", "function"}, {"name", "f"}}})}};
  EXPECT_NE(refusal({{"input", "x"}, {"tools", json::array({fn, ns})}}).find("a second tool named 'ns.f'"), std::string::npos);
  EXPECT_NE(refusal({{"input", "x"}, {"tools", json::array({ns, fn})}}).find("a second tool named 'ns.f'"), std::string::npos);
  EXPECT_EQ(convert({{"input", "x"}, {"tools", json::array({fn})}}).chat.options.tools.size(), 1u);
}

TEST(ResponsesRequest, NonTextPartsBecomePlaceholdersAndBuiltinItemsAreDropped) {
  const json input = json::array({
      {{"role", "user"},
       {"content", json::array({{{"type", "input_text"}, {"text", "look"}}, {{"type", "input_image"}, {"image_url", "data:..."}}})}},
      {{"type", "web_search_call"}, {"id", "ws_1"}, {"status", "completed"}},
  });
  const ResponsesRequest r = convert({{"input", input}});
  ASSERT_EQ(r.chat.messages.size(), 1u);
  // The placeholder every endpoint writes (media_placeholder.h), listed for the request log.
  EXPECT_EQ(r.chat.messages[0].content.rfind("look\n\n[image omitted: ", 0), 0u) << r.chat.messages[0].content;
  EXPECT_NE(r.chat.messages[0].content.find("this model reads text only]"), std::string::npos);
  EXPECT_EQ(r.chat.omitted.size(), 1u);
  ASSERT_EQ(r.dropped.size(), 1u);
  EXPECT_EQ(r.dropped[0].what, "web_search_call");
}

TEST(ResponsesRequest, SettingsAndEchoes) {
  const json body = {{"input", "x"},
                     {"reasoning", {{"effort", "none"}, {"summary", "auto"}}},
                     {"store", false},
                     {"include", json::array({"reasoning.encrypted_content"})},
                     {"prompt_cache_key", "k"},
                     {"parallel_tool_calls", false},
                     {"max_output_tokens", 7},
                     {"temperature", 0.5},
                     {"top_p", 0.9},
                     {"stream", true},
                     {"tool_choice", "none"},
                     {"tools", json::array({{{"type", "function"}, {"name", "f"}}})},
                     {"text", {{"format", {{"type", "json_schema"}, {"name", "s"}, {"schema", {{"type", "object"}}}}}}},
                     {"metadata", {{"a", "b"}}}};
  const ResponsesRequest r = convert(body);
  EXPECT_FALSE(r.chat.options.thinking);
  EXPECT_EQ(r.chat.options.reasoning_effort, 0);
  EXPECT_EQ(r.reasoning, json({{"effort", "none"}, {"summary", "auto"}}));
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_EQ(r.max_output_tokens, 7);
  EXPECT_EQ(r.chat.max_tokens, 7);
  EXPECT_EQ(r.chat.sampling.temperature, 0.5);
  EXPECT_EQ(r.chat.sampling.top_p, 0.9);
  EXPECT_TRUE(r.chat.stream);
  EXPECT_TRUE(r.chat.options.tools.empty());  // tool_choice none
  EXPECT_EQ(r.tool_choice, "none");
  EXPECT_EQ(json::parse(r.chat.options.response_format), json({{"type", "object"}}));
  EXPECT_EQ(r.metadata, json({{"a", "b"}}));
  // Effort names.
  EXPECT_EQ(convert({{"input", "x"}, {"reasoning", {{"effort", "low"}}}}).chat.options.reasoning_effort, text::kEffortLow);
  EXPECT_EQ(convert({{"input", "x"}, {"reasoning", {{"effort", "max"}}}}).chat.options.reasoning_effort, text::kEffortMax);
  // tool_choice naming a namespaced function.
  const json ns = json::array({{{"type", "namespace"}, {"name", "n"}, {"tools", json::array({{{"type", "function"}, {"name", "f"}}})}}});
  EXPECT_NO_THROW(convert({{"input", "x"}, {"tools", ns}, {"tool_choice", {{"type", "function"}, {"namespace", "n"}, {"name", "f"}}}}));
}

TEST(ResponsesRequest, BadInputNamesTheField) {
  auto has = [](const std::string& msg, const std::string& part) {
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << msg << "' should name " << part;
  };
  has(refusal(json::object()), "'input'");
  has(refusal({{"input", 3}}), "'input'");
  has(refusal({{"input", json::array()}}), "'input'");
  has(refusal({{"input", json::array({3})}}), "input[0]");
  has(refusal({{"input", json::array({{{"role", "narrator"}, {"content", "x"}}})}}), "input[0]: unknown role");
  has(refusal({{"input", json::array({{{"role", "user"}}})}}), "input[0]: 'content'");
  has(refusal({{"input", json::array({{{"role", "user"}, {"content", json::array({{{"type", "input_text"}}})}}})}}),
      "input[0].content[0]: 'text'");
  has(refusal({{"input", json::array({{{"role", "user"}, {"content", json::array({{{"type", "hologram"}}})}}})}}),
      "input[0].content[0]");
  has(refusal({{"input", json::array({{{"type", "function_call"}, {"name", "f"}}})}}), "input[0]: 'call_id'");
  has(refusal({{"input", json::array({{{"type", "function_call"}, {"call_id", "c"}, {"name", "f"}, {"arguments", 5}}})}}),
      "input[0]: 'arguments'");
  has(refusal({{"input", json::array({{{"type", "function_call_output"}, {"call_id", "c"}}})}}), "input[0]: 'output'");
  has(refusal({{"input", json::array({{{"type", "item_reference"}, {"id", "x"}}})}}), "input[0]: 'item_reference'");
  has(refusal({{"input", json::array({{{"type", "teleport"}}})}}), "input[0]: items of type 'teleport'");
  // Arguments nested deeper than the bound are refused before anything walks them.
  std::string deep(40, '[');
  deep += std::string(40, ']');
  has(refusal({{"input", json::array({{{"type", "function_call"}, {"call_id", "c"}, {"name", "f"}, {"arguments", deep}}})}}),
      "nesting");
  has(refusal({{"input", "x"}, {"tools", json::array({{{"type", "function"}}})}}), "tools[0]");
  has(refusal({{"input", "x"}, {"tools", json::array({{{"type", "hologram"}}})}}), "tools[0]: unknown tool type");
  has(refusal({{"input", "x"}, {"tools", json::array({{{"type", "namespace"}, {"name", "n"}}})}}), "tools[0]: a namespace");
  has(refusal({{"input", "x"}, {"tools", json::array({{{"type", "function"}, {"name", "f"}}, {{"type", "function"}, {"name", "f"}}})}}),
      "a second tool named 'f'");
  has(refusal({{"input", "x"}, {"tools", json::array({{{"type", "function"}, {"name", "f"}, {"parameters", 1}}})}}),
      "tools[0].parameters");
  has(refusal({{"input", "x"}, {"tool_choice", {{"type", "function"}, {"name", "g"}}}}), "tool_choice names the function 'g'");
  has(refusal({{"input", "x"}, {"tool_choice", "sometimes"}}), "tool_choice");
  has(refusal({{"input", "x"}, {"reasoning", {{"effort", "extreme"}}}}), "reasoning.effort");
  has(refusal({{"input", "x"}, {"reasoning", "high"}}), "'reasoning'");
  has(refusal({{"input", "x"}, {"max_output_tokens", 0}}), "max_tokens");
  has(refusal({{"input", "x"}, {"max_output_tokens", "many"}}), "'max_output_tokens'");
  has(refusal({{"input", "x"}, {"temperature", "hot"}}), "'temperature'");
  has(refusal({{"input", "x"}, {"stream", "yes"}}), "'stream'");
  has(refusal({{"input", "x"}, {"previous_response_id", "resp_1"}}), "'previous_response_id'");
  has(refusal({{"input", "x"}, {"truncation", "auto"}}), "truncation");
  has(refusal({{"input", "x"}, {"background", true}}), "'background'");
  has(refusal({{"input", "x"}, {"text", {{"format", {{"type", "yaml"}}}}}}), "text.format");
  has(refusal({{"input", "x"}, {"instructions", 5}}), "'instructions'");
}

TEST(ResponseBuilder, EventSequenceForReasoningTextAndCalls) {
  const json tools = json::array({{{"type", "function"}, {"name", "exec_command"}},
                                  {{"type", "namespace"}, {"name", "multi_agent_v1"},
                                   {"tools", json::array({{{"type", "function"}, {"name", "wait_agent"}}})}}});
  const ResponsesRequest rr = convert({{"input", "x"}, {"tools", tools}});
  int n = 0;
  ResponseBuilder b(rr, {"resp_1", "m", 7, 0.5, 0.9}, [&](const char* p) { return p + std::to_string(n++); });
  std::string sse = b.created();
  auto delta = [](std::string reasoning, std::string content, std::vector<text::ToolCall> calls) {
    text::OutputParser::Delta d;
    d.reasoning = std::move(reasoning);
    d.content = std::move(content);
    d.calls = std::move(calls);
    return d;
  };
  sse += b.delta(delta("ab", "", {}));
  sse += b.delta(delta("c", "hi", {}));
  sse += b.delta(delta("", "", {{"", "multi_agent_v1.wait_agent", R"({"t":1})"}, {"", "exec_command", "{}"}}));
  sse += b.delta(delta("", "after", {}));
  const json usage = {{"input_tokens", 3}};
  sse += b.finish(false, usage);

  std::vector<std::string> types;
  std::vector<json> ev;
  for (const test::SseEvent& e : test::parse_sse(sse)) {
    const json j = json::parse(e.data);
    EXPECT_EQ(e.name, j["type"]);
    EXPECT_EQ(j["sequence_number"], ev.size());
    types.push_back(j["type"]);
    ev.push_back(j);
  }
  const std::vector<std::string> want = {
      "response.created", "response.in_progress",
      // reasoning, two deltas
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
      "response.output_item.done",
      // text
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      // two calls
      "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done",
      "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done",
      // text again: a new message item
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.completed"};
  EXPECT_EQ(types, want);
  ASSERT_EQ(ev.size(), want.size());
  EXPECT_EQ(ev[0]["response"]["status"], "in_progress");
  EXPECT_EQ(ev[0]["response"]["temperature"], 0.5);
  EXPECT_EQ(ev[6]["text"], "abc");
  EXPECT_EQ(ev[8]["item"]["content"][0], json({{"type", "reasoning_text"}, {"text", "abc"}}));
  EXPECT_EQ(ev[12]["text"], "hi");
  EXPECT_EQ(ev[12]["output_index"], 1);
  // The namespaced call: added with empty arguments, done with its own name and namespace.
  EXPECT_EQ(ev[15]["item"]["arguments"], "");
  EXPECT_EQ(ev[15]["output_index"], 2);
  const json& c1 = ev[18]["item"];
  EXPECT_EQ(c1["type"], "function_call");
  EXPECT_EQ(c1["name"], "wait_agent");
  EXPECT_EQ(c1["namespace"], "multi_agent_v1");
  EXPECT_EQ(c1["arguments"], R"({"t":1})");
  EXPECT_EQ(c1["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(ev[16]["delta"], R"({"t":1})");
  EXPECT_EQ(ev[16]["item_id"], c1["id"]);
  const json& c2 = ev[22]["item"];
  EXPECT_EQ(c2["name"], "exec_command");
  EXPECT_FALSE(c2.contains("namespace"));
  EXPECT_NE(c1["call_id"], c2["call_id"]);
  const json& fin = ev.back()["response"];
  EXPECT_EQ(fin["status"], "completed");
  EXPECT_EQ(fin["usage"], usage);
  ASSERT_EQ(fin["output"].size(), 5u);
  EXPECT_EQ(fin["output"][2], c1);
  EXPECT_EQ(fin["output"][4]["content"][0]["text"], "after");
  EXPECT_EQ(b.reasoning(), "abc");
  EXPECT_TRUE(b.reasoning_closed());
  // The plain answer is the same object.
  EXPECT_EQ(b.final_object(false, usage), fin);
}

TEST(ResponseBuilder, FailedAndIncomplete) {
  const ResponsesRequest rr = convert({{"input", "x"}, {"max_output_tokens", 2}});
  ResponseBuilder b(rr, {"resp_2", "m", 0, 1, 1}, [](const char* p) { return std::string(p) + "x"; });
  text::OutputParser::Delta d;
  d.reasoning = "r";
  b.delta(d);
  const json inc = b.final_object(true, json::object());
  EXPECT_EQ(inc["status"], "incomplete");
  EXPECT_EQ(inc["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(inc["max_output_tokens"], 2);
  const auto ev = test::parse_sse(b.failed({{"code", "server_error"}, {"message", "m"}}));
  ASSERT_EQ(ev.size(), 4u);  // the open reasoning item closes first
  EXPECT_EQ(ev.back().name, "response.failed");
  const json f = json::parse(ev.back().data);
  EXPECT_EQ(f["response"]["status"], "failed");
  EXPECT_EQ(f["response"]["error"]["code"], "server_error");
  EXPECT_EQ(f["response"]["output"].size(), 1u);
}

}  // namespace
}  // namespace sluice::server
