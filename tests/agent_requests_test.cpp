// What coding agents send (Claude Code, Codex, opencode; issue 16), converted without a model:
// system messages inside the conversation, max_tokens far above the server's limit, images and
// documents, thinking settings per API. The server side (headers, streams, the log) is in
// tests/server_agents_test.cpp.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/max_tokens.h"
#include "text/deepseek41/chat.h"

namespace {

using nlohmann::json;
using namespace sluice::server;
using sluice::text::kEffortHigh;
using sluice::text::kEffortLow;

json user(const json& content) { return {{"role", "user"}, {"content", content}}; }

// Claude Code 2.1.332's shape: a system message at messages[1] with text blocks, per-message
// output_config and cache_control.
TEST(AgentRequests, AnthropicSystemMessagesInsideTheConversation) {
  const json body = {
      {"max_tokens", 128000},
      {"system", json::array({{{"type", "text"}, {"text", "S0"}, {"cache_control", {{"type", "ephemeral"}}}}})},
      {"messages", json::array({user("q1"),
                                {{"role", "system"}, {"output_config", {{"effort", "medium"}}},
                                 {"content", json::array({{{"type", "text"}, {"text", "env"}, {"cache_control", {{"type", "ephemeral"}}}}})}},
                                {{"role", "assistant"}, {"content", "a1"}},
                                {{"role", "developer"}, {"content", "dev"}},
                                user("q2")})}};
  const ChatRequest r = anthropic_request(body, false);
  ASSERT_EQ(r.messages.size(), 6u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "S0");
  EXPECT_EQ(r.messages[2].role, "system");
  EXPECT_EQ(r.messages[2].content, "env");
  EXPECT_EQ(r.messages[4].role, "system");
  EXPECT_EQ(r.messages[4].content, "dev");
  // Rendered in place: the late system text is part of the user turns, the leading one in front.
  const std::string p = sluice::text::render_chat(r.messages, r.options);
  EXPECT_NE(p.find("S0<｜User｜>q1\n\nenv<｜Assistant｜>"), std::string::npos) << p;
  EXPECT_NE(p.find("<｜User｜>dev\n\nq2<｜Assistant｜>"), std::string::npos) << p;
  // Still refused: an unknown role, and a system message with a non-text block.
  json bad = body;
  bad["messages"][1]["role"] = "narrator";
  EXPECT_THROW(anthropic_request(bad, false), ApiError);
  bad = body;
  bad["messages"][1]["content"] = json::array({{{"type", "tool_use"}, {"name", "x"}}});
  EXPECT_THROW(anthropic_request(bad, false), ApiError);
}

TEST(AgentRequests, OpenAiSystemAndDeveloperAnywhere) {
  const json body = {{"messages", json::array({{{"role", "developer"}, {"content", "D"}}, user("q"),
                                               {{"role", "system"}, {"content", json::array({{{"type", "text"}, {"text", "late"}}})}}})}};
  const ChatRequest r = openai_chat_request(body, 64);
  ASSERT_EQ(r.messages.size(), 3u);
  const std::string p = sluice::text::render_chat(r.messages, r.options);
  EXPECT_NE(p.find("D<｜User｜>q\n\nlate<｜Assistant｜>"), std::string::npos) << p;
}

// One function decides for every endpoint: larger values are capped, by the limit then by the
// context left; the reason is reported.
TEST(AgentRequests, MaxTokensIsClampedNotRefused) {
  MaxTokens m = clamp_max_tokens(128000, 4096, 60000);
  EXPECT_EQ(m.effective, 4096u);
  EXPECT_STREQ(m.capped_by, "--max-tokens-limit");
  m = clamp_max_tokens(32000, 4096, 100);
  EXPECT_EQ(m.effective, 100u);
  EXPECT_STREQ(m.capped_by, "context");
  m = clamp_max_tokens(16, 4096, 60000);
  EXPECT_EQ(m.effective, 16u);
  EXPECT_EQ(m.capped_by, nullptr);
  m = clamp_max_tokens(std::nullopt, 4096, 60000);  // absent: the limit is the default, not a cap
  EXPECT_EQ(m.effective, 4096u);
  EXPECT_EQ(m.capped_by, nullptr);
  const std::vector<std::string> h = max_tokens_headers(clamp_max_tokens(128000, 16, 60000));
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0], "X-Max-Tokens: 16");
  EXPECT_EQ(h[1], "X-Max-Tokens-Capped-By: --max-tokens-limit");
  // Conversion accepts the large values; invalid ones are still a 400 naming the field.
  EXPECT_EQ(anthropic_request({{"max_tokens", 128000}, {"messages", json::array({user("x")})}}, false).max_tokens, 128000);
  EXPECT_EQ(openai_chat_request({{"max_tokens", 32000}, {"messages", json::array({user("x")})}}, 64).max_tokens, 32000);
  for (const json& v : {json(-1), json(0), json(2.5), json("16"), json(1e300)}) {
    try {
      openai_chat_request({{"max_tokens", v}, {"messages", json::array({user("x")})}}, 64);
      ADD_FAILURE() << "accepted max_tokens " << v.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_NE(std::string(e.what()).find("max_tokens"), std::string::npos) << e.what();
    }
  }
}

TEST(AgentRequests, ImagesAndDocumentsBecomePlaceholders) {
  const json img = {{"type", "image"}, {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", std::string(12, 'A')}}}};
  const json pdf = {{"type", "document"}, {"title", "spec"},
                    {"source", {{"type", "base64"}, {"media_type", "application/pdf"}, {"data", "QUJD"}}}};
  const json txt = {{"type", "document"}, {"source", {{"type", "text"}, {"media_type", "text/plain"}, {"data", "plain words"}}}};
  const json body = {
      {"max_tokens", 10},
      {"messages", json::array({user(json::array({{{"type", "text"}, {"text", "look"}}, img, pdf, txt})),
                                {{"role", "assistant"}, {"content", json::array({{{"type", "tool_use"}, {"id", "t1"}, {"name", "shot"}, {"input", json::object()}}})}},
                                user(json::array({{{"type", "tool_result"}, {"tool_use_id", "t1"},
                                                   {"content", json::array({{{"type", "text"}, {"text", "done"}}, img})}}}))})}};
  const ChatRequest r = anthropic_request(body, false);
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0].content,
            "look\n\n[image omitted: image/png, 12 bytes base64; this model reads text only]\n\n"
            "[document omitted: \"spec\", application/pdf, 4 bytes base64; this model reads text only]\n\nplain words");
  EXPECT_EQ(r.messages[2].role, "tool");
  EXPECT_EQ(r.messages[2].content, "done\n\n[image omitted: image/png, 12 bytes base64; this model reads text only]");
  ASSERT_EQ(r.omitted.size(), 3u);  // the text document is text, not omitted
  EXPECT_EQ(r.omitted[0], "image (image/png, 12 bytes base64)");

  const json oa = {{"messages", json::array({user(json::array({
                       {{"type", "text"}, {"text", "see "}},
                       {{"type", "image_url"}, {"image_url", {{"url", "data:image/jpeg;base64,AAAA"}}}},
                       {{"type", "input_audio"}, {"input_audio", {{"data", "BBBBBB"}, {"format", "wav"}}}},
                       {{"type", "file"}, {"file", {{"filename", "a.pdf"}, {"file_data", "data:application/pdf;base64,CC"}}}}}))})}};
  const ChatRequest o = openai_chat_request(oa, 64);
  EXPECT_EQ(o.messages[0].content,
            "see [image omitted: image/jpeg, 4 bytes base64; this model reads text only]"
            "[audio omitted: wav, 6 bytes base64; this model reads text only]"
            "[file omitted: \"a.pdf\", application/pdf, 2 bytes base64; this model reads text only]");
  EXPECT_EQ(o.omitted.size(), 3u);
}

TEST(AgentRequests, ThinkingDefaultsPerApi) {
  const json msgs = json::array({user("x")});
  // OpenAI chat completions: off unless asked (content holds the answer).
  ChatRequest o = openai_chat_request({{"messages", msgs}}, 64);
  EXPECT_FALSE(o.options.thinking);
  EXPECT_EQ(o.options.reasoning_effort, 0);
  o = openai_chat_request({{"messages", msgs}, {"reasoning_effort", "low"}}, 64);
  EXPECT_TRUE(o.options.thinking);
  EXPECT_EQ(o.options.reasoning_effort, kEffortLow);
  o = openai_chat_request({{"messages", msgs}, {"reasoning", {{"effort", "high"}}}}, 64);
  EXPECT_EQ(o.options.reasoning_effort, kEffortHigh);
  o = openai_chat_request({{"messages", msgs}, {"thinking", {{"type", "enabled"}}}}, 64);
  EXPECT_TRUE(o.options.thinking);
  // Anthropic: off unless `thinking` says enabled or adaptive; output_config.effort sets the effort.
  ChatRequest a = anthropic_request({{"max_tokens", 5}, {"messages", msgs}}, false);
  EXPECT_FALSE(a.options.thinking);
  a = anthropic_request({{"max_tokens", 5}, {"messages", msgs}, {"output_config", {{"effort", "low"}}}}, false);
  EXPECT_FALSE(a.options.thinking);  // effort alone does not turn thinking on
  a = anthropic_request({{"max_tokens", 5}, {"messages", msgs}, {"thinking", {{"type", "adaptive"}, {"display", "omitted"}}},
                         {"output_config", {{"effort", "low"}}}}, false);
  EXPECT_TRUE(a.options.thinking);
  EXPECT_EQ(a.options.reasoning_effort, kEffortLow);
  a = anthropic_request({{"max_tokens", 5}, {"messages", msgs}, {"thinking", {{"type", "adaptive"}}}}, false);
  EXPECT_EQ(a.options.reasoning_effort, kEffortHigh);
  a = anthropic_request({{"max_tokens", 5}, {"messages", msgs}, {"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}},
                         {"output_config", {{"effort", "max"}}}}, false);
  EXPECT_EQ(a.options.reasoning_effort, sluice::text::kEffortMax);
  EXPECT_THROW(anthropic_request({{"max_tokens", 5}, {"messages", msgs}, {"thinking", {{"type", "sometimes"}}}}, false), ApiError);
  EXPECT_THROW(anthropic_request({{"max_tokens", 5}, {"messages", msgs}, {"thinking", {{"type", "adaptive"}}},
                                  {"output_config", {{"effort", "loud"}}}}, false),
               ApiError);
}

}  // namespace
