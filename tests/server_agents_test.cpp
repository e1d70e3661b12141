// The server side of what coding agents need (issue 16), over raw HTTP against the tiny model:
// max_tokens clamped and reported, streamed Anthropic usage with the cache fields, placeholders
// for images, HEAD / and GET /, ?beta=true and unknown anthropic-beta values, the per-request
// log line, and the server-wide --stop / --thinking settings. Conversion itself is tested in
// tests/agent_requests_test.cpp.
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server_harness.h"

namespace {

using namespace sluice::test;

json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

// The data of every named event of an Anthropic stream.
std::vector<json> anthropic_events(const std::string& body, const std::string& name) {
  std::vector<json> out;
  for (const SseEvent& e : parse_sse(body))
    if (e.name == name) out.push_back(json::parse(e.data));
  return out;
}

class AgentServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new Server({"--max-tokens-limit", "8", "--sse-ping-interval", "0.2"}); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static inline Server* server_ = nullptr;
};

TEST_F(AgentServerTest, RootAnswersHeadAndGet) {
  Response r = server_->roundtrip(request_text("HEAD", "/", ""));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "");
  r = server_->get("/");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["name"], "sluice");
  EXPECT_EQ(server_->post("/", json::object()).status, 405);
}

TEST_F(AgentServerTest, BetaQueryAndUnknownBetaHeaderAccepted) {
  const json body = {{"max_tokens", 2}, {"messages", json::array({user("hi")})}};
  const Response r = server_->post("/v1/messages?beta=true", body,
                                   "anthropic-beta: claude-code-20250219,no-such-beta-2099-01-01\r\nanthropic-version: 2023-06-01\r\n");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["type"], "message");
}

// 128000 against --max-tokens-limit 8: generated up to 8, reported in headers and the log, and
// the stop reason says the limit was hit.
TEST_F(AgentServerTest, MaxTokensAboveTheLimitIsClamped) {
  const json oa = {{"max_tokens", 128000}, {"ignore_eos", true}, {"messages", json::array({user("count")})}};
  Response r = server_->post("/v1/chat/completions", oa);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["x-max-tokens"], "8");
  EXPECT_EQ(r.headers["x-max-tokens-capped-by"], "--max-tokens-limit");
  json j = json::parse(r.body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  const std::string capped = "max_tokens=8 (asked 128000, capped by --max-tokens-limit)";
  const std::string log = server_->wait_log(capped);
  EXPECT_NE(log.find(capped), std::string::npos) << log;

  // Anthropic, streamed: the headers come with the stream head; the stop reason is max_tokens only
  // when all 8 tokens were generated, and end_turn when fewer were (the tiny model may stop on its
  // own first, also with its 8th token, which then counts and ends the turn).
  const json an = {{"max_tokens", 64000}, {"stream", true}, {"messages", json::array({user("count")})}};
  r = server_->post("/v1/messages", an);
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["x-max-tokens"], "8");
  const std::vector<json> delta = anthropic_events(r.body, "message_delta");
  ASSERT_EQ(delta.size(), 1u);
  const int out = delta[0]["usage"]["output_tokens"];
  EXPECT_LE(out, 8);
  const std::string stop = delta[0]["delta"]["stop_reason"];
  EXPECT_TRUE(stop == "max_tokens" || stop == "end_turn") << delta[0].dump();
  if (stop == "max_tokens") {
    EXPECT_EQ(out, 8) << delta[0].dump();
  }
  if (out < 8) {
    EXPECT_EQ(stop, "end_turn") << delta[0].dump();
  }

  // Invalid values are still a 400 naming the field.
  for (const json& v : {json(-5), json(0), json(1.5)}) {
    json bad = oa;
    bad["max_tokens"] = v;
    r = server_->post("/v1/chat/completions", bad);
    EXPECT_EQ(r.status, 400) << v.dump();
    EXPECT_NE(r.body.find("max_tokens"), std::string::npos) << r.body;
  }
}

// Claude Code reads cache_read_input_tokens from message_start: the second request extends the
// first conversation, so its start event reports the reused tokens, as the final usage does.
TEST_F(AgentServerTest, StreamedAnthropicUsageHasCacheFields) {
  // One token: the sampled token is not evaluated, so the kept sequence is exactly this prompt,
  // which the next one extends whatever the assistant text.
  json body = {{"max_tokens", 1}, {"messages", json::array({user("Tell me about rivers")})}};
  Response r = server_->post("/v1/messages", body);
  ASSERT_EQ(r.status, 200);
  body["max_tokens"] = 4;
  body["messages"].push_back({{"role", "assistant"}, {"content", "Rivers flow."}});
  body["messages"].push_back(user("And lakes?"));
  body["stream"] = true;
  const json count = json::parse(server_->post("/v1/messages/count_tokens", body).body);
  r = server_->post("/v1/messages", body);
  ASSERT_EQ(r.status, 200);
  const std::vector<json> start = anthropic_events(r.body, "message_start");
  ASSERT_EQ(start.size(), 1u);
  const json su = start[0]["message"]["usage"];
  ASSERT_TRUE(su.contains("cache_read_input_tokens")) << su.dump();
  ASSERT_TRUE(su.contains("cache_creation_input_tokens")) << su.dump();
  EXPECT_GT(su["cache_read_input_tokens"].get<int>(), 0) << su.dump();
  EXPECT_EQ(su["cache_creation_input_tokens"], 0);
  // input_tokens is what was not read from the cache (Anthropic's meaning).
  EXPECT_EQ(su["input_tokens"].get<int>() + su["cache_read_input_tokens"].get<int>(), count["input_tokens"].get<int>());
  const std::vector<json> delta = anthropic_events(r.body, "message_delta");
  ASSERT_EQ(delta.size(), 1u);
  EXPECT_EQ(delta[0]["usage"]["cache_read_input_tokens"], su["cache_read_input_tokens"]);
  EXPECT_EQ(delta[0]["usage"]["input_tokens"], su["input_tokens"]);
}

TEST_F(AgentServerTest, ImagesAreReplacedAndLoggedOnce) {
  const json img = {{"type", "image"}, {"source", {{"type", "base64"}, {"media_type", "image/png"}, {"data", "iVBORw0KGgo="}}}};
  const json body = {{"max_tokens", 2},
                     {"messages", json::array({{{"role", "user"},
                                                {"content", json::array({{{"type", "text"}, {"text", "what is this"}}, img, img})}}})}};
  const Response r = server_->post("/v1/messages", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string line = "/v1/messages: 2 part(s) replaced by a text placeholder (the model reads text only): "
                           "image (image/png, 12 bytes base64); image (image/png, 12 bytes base64)";
  const std::string log = server_->wait_log(line);
  EXPECT_NE(log.find(line), std::string::npos) << log;
}

// One line per request with what the agent tests record.
TEST_F(AgentServerTest, RequestLogLine) {
  const json tool = {{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}};
  const json body = {{"max_tokens", 3}, {"tools", json::array({tool, tool})}, {"messages", json::array({user("log me")})}};
  const Response r = server_->post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200);
  const std::string head = "sluice serve: request /v1/chat/completions body=" + std::to_string(body.dump().size()) +
                           "B tools=2 prompt=";
  const std::string log = server_->wait_log(head);
  const size_t at = log.rfind(head);
  ASSERT_NE(at, std::string::npos) << log;
  const std::string line = log.substr(at, log.find('\n', at) - at);
  for (const char* field : {" cached=", " max_tokens=3 ", " ttft=", " generated=", " finish="})
    EXPECT_NE(line.find(field), std::string::npos) << field << " in " << line;
  // Thinking is off by default for chat completions: the answer is content, no reasoning.
  EXPECT_FALSE(json::parse(r.body)["choices"][0]["message"].contains("reasoning_content")) << r.body;
}

// --stop ends every request at the string (here one taken from a greedy answer), and
// --thinking off answers a request that asks for thinking without any.
TEST(AgentServerOptions, ServerStopListAndThinkingOff) {
  const json body = {{"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}, {"messages", json::array({user("say")})}};
  std::string full;
  {
    Server plain({"--max-tokens-limit", "8"});
    const Response r = plain.post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200);
    full = json::parse(r.body)["choices"][0]["message"]["content"].get<std::string>();
  }
  ASSERT_GE(full.size(), 4u) << full;
  const std::string stop = full.substr(full.size() / 2, 2);
  Server s({"--max-tokens-limit", "8", "--stop", stop, "--thinking", "off"});
  Response r = s.post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200);
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["message"]["content"], full.substr(0, full.find(stop)));
  const json think = {{"max_tokens", 4}, {"thinking", {{"type", "enabled"}}}, {"messages", json::array({user("hm")})}};
  r = s.post("/v1/messages", think);
  ASSERT_EQ(r.status, 200);
  // The parsed body is kept: a range-for over a member of a temporary reads freed memory.
  const json answer = json::parse(r.body);
  for (const json& b : answer["content"]) EXPECT_NE(b["type"], "thinking") << r.body;
}

}  // namespace
