// POST /v1/responses against `sluice serve` on the tiny model: the streamed event sequence
// (named, numbered, every item opened and closed, deltas adding up to the items), usage with
// cached and reasoning tokens, completed vs incomplete, the non-streaming object, a continued
// conversation reporting cached tokens, and context_length_exceeded both ways. The conversion
// alone: responses_request_test.cpp; the real OpenAI SDK: tests/clients/responses.mjs.
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server_harness.h"

namespace {

using namespace sluice::test;

class ResponsesServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // --max-tokens-limit 8: a request without max_output_tokens ends there (as "completed");
    // -c 2048: a long input overflows the context.
    server_ = new Server({"--max-tokens-limit", "8", "-c", "2048", "--sse-ping-interval", "0.2"});
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static inline Server* server_ = nullptr;
};

// The events of one stream, each checked for framing: a name equal to data.type and
// sequence_number counting up from 0. Comments (keep-alives) are skipped.
std::vector<json> events_of(const Response& r) {
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers.count("content-type") ? r.headers.at("content-type") : "", "text/event-stream");
  std::vector<json> out;
  for (const SseEvent& e : parse_sse(r.body)) {
    if (e.comment) continue;
    const json j = json::parse(e.data);
    EXPECT_EQ(e.name, j.value("type", "")) << e.data;
    EXPECT_EQ(j.value("sequence_number", -1), (int)out.size()) << e.data;
    EXPECT_FALSE(j.contains("error") && j["type"] != "error") << "a top-level 'error' makes SDKs throw: " << e.data;
    out.push_back(j);
  }
  return out;
}

// Checks the item lifecycle of a stream and returns the final event. Every item is added, its
// parts opened, its deltas appended, then done; the final response lists the done items.
json check_lifecycle(const std::vector<json>& ev) {
  EXPECT_GE(ev.size(), 3u);
  if (ev.size() < 3) return json();
  EXPECT_EQ(ev[0]["type"], "response.created");
  EXPECT_EQ(ev[0]["response"]["status"], "in_progress");
  EXPECT_EQ(ev[1]["type"], "response.in_progress");
  const std::string id = ev[0]["response"]["id"];
  EXPECT_EQ(id.rfind("resp_", 0), 0u);
  json done_items = json::array();
  std::map<std::string, std::string> text;   // item id -> deltas so far
  std::string open;                           // id of the item between added and done
  for (size_t i = 2; i + 1 < ev.size(); ++i) {
    const json& e = ev[i];
    const std::string type = e["type"];
    if (type == "response.output_item.added") {
      EXPECT_TRUE(open.empty()) << "an item opened before the last one closed";
      open = e["item"]["id"];
      EXPECT_EQ(e["output_index"], done_items.size());
      EXPECT_EQ(e["item"]["status"], "in_progress");
    } else if (type == "response.content_part.added") {
      EXPECT_EQ(e["item_id"], open);
      EXPECT_EQ(e["content_index"], 0);
      text[open] = "";
    } else if (type == "response.output_text.delta" || type == "response.reasoning_text.delta") {
      EXPECT_EQ(e["item_id"], open);
      EXPECT_TRUE(text.count(open)) << "a delta before its content part";
      EXPECT_EQ(e["content_index"], 0);
      EXPECT_EQ(e["output_index"], done_items.size());
      text[open] += e["delta"].get<std::string>();
    } else if (type == "response.output_text.done" || type == "response.reasoning_text.done") {
      EXPECT_EQ(e["item_id"], open);
      EXPECT_EQ(e["text"], text[open]);
    } else if (type == "response.content_part.done") {
      EXPECT_EQ(e["part"]["text"], text[open]);
    } else if (type == "response.function_call_arguments.delta" || type == "response.function_call_arguments.done") {
      EXPECT_EQ(e["item_id"], open);
    } else if (type == "response.output_item.done") {
      const json& item = e["item"];
      EXPECT_EQ(item["id"], open);
      EXPECT_EQ(item["status"], "completed");
      EXPECT_EQ(e["output_index"], done_items.size());
      if (item["type"] == "message") {
        EXPECT_EQ(item["role"], "assistant");
        EXPECT_EQ(item["content"][0]["type"], "output_text");
        EXPECT_EQ(item["content"][0]["text"], text[open]);
      } else if (item["type"] == "reasoning") {
        EXPECT_TRUE(item["summary"].is_array());
        EXPECT_EQ(item["content"][0]["type"], "reasoning_text");
        EXPECT_EQ(item["content"][0]["text"], text[open]);
      } else {
        EXPECT_EQ(item["type"], "function_call");
        EXPECT_TRUE(item["call_id"].is_string() && item["name"].is_string() && item["arguments"].is_string());
      }
      done_items.push_back(item);
      open.clear();
    } else {
      ADD_FAILURE() << "unexpected event " << e.dump();
    }
  }
  EXPECT_TRUE(open.empty()) << "an item was never closed";
  const json& last = ev.back();
  EXPECT_EQ(last["response"]["id"], id);
  EXPECT_EQ(last["response"]["output"], done_items);
  return last;
}

void check_usage(const json& u, int output_tokens) {
  ASSERT_TRUE(u.is_object()) << u.dump();
  EXPECT_GT(u["input_tokens"].get<int>(), 0);
  EXPECT_TRUE(u["input_tokens_details"]["cached_tokens"].is_number());
  EXPECT_EQ(u["output_tokens"], output_tokens);
  EXPECT_LE(u["output_tokens_details"]["reasoning_tokens"].get<int>(), output_tokens);
  EXPECT_EQ(u["total_tokens"], u["input_tokens"].get<int>() + output_tokens);
}

TEST_F(ResponsesServer, StreamWithReasoningEndsIncompleteAtMaxOutputTokens) {
  const json body = {{"input", "Hello there"}, {"max_output_tokens", 5}, {"stream", true}, {"seed", 1}};
  const std::vector<json> ev = events_of(server_->post("/v1/responses", body));
  const json last = check_lifecycle(ev);
  ASSERT_TRUE(last.is_object());
  // The model's own max_output_tokens was reached: incomplete, with the reason.
  EXPECT_EQ(last["type"], "response.incomplete");
  EXPECT_EQ(last["response"]["status"], "incomplete");
  EXPECT_EQ(last["response"]["incomplete_details"]["reason"], "max_output_tokens");
  check_usage(last["response"]["usage"], 5);
  // Thinking is on by default: the random model never closes </think>, so all is reasoning.
  ASSERT_FALSE(last["response"]["output"].empty());
  EXPECT_EQ(last["response"]["output"][0]["type"], "reasoning");
  EXPECT_GT(last["response"]["usage"]["output_tokens_details"]["reasoning_tokens"].get<int>(), 0);
  EXPECT_EQ(last["response"]["max_output_tokens"], 5);
}

TEST_F(ResponsesServer, StreamEndedByTheServerLimitIsCompleted) {
  const json body = {{"input", json::array({{{"role", "developer"}, {"content", "Be brief."}},
                                            {{"role", "user"}, {"content", "Hi"}}})},
                     {"reasoning", {{"effort", "none"}}}, {"stream", true}, {"seed", 2}};
  const std::vector<json> ev = events_of(server_->post("/v1/responses", body));
  const json last = check_lifecycle(ev);
  ASSERT_TRUE(last.is_object());
  EXPECT_EQ(last["type"], "response.completed");
  EXPECT_EQ(last["response"]["status"], "completed");
  EXPECT_TRUE(last["response"]["incomplete_details"].is_null());
  check_usage(last["response"]["usage"], 8);  // --max-tokens-limit 8
  EXPECT_EQ(last["response"]["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
  for (const json& item : last["response"]["output"]) EXPECT_NE(item["type"], "reasoning");
}

TEST_F(ResponsesServer, NonStreamingObject) {
  const json body = {{"input", "Hello"}, {"max_output_tokens", 3}, {"seed", 3}, {"metadata", {{"k", "v"}}},
                     {"tools", json::array({{{"type", "web_search"}}, {{"type", "function"}, {"name", "f"}}})}};
  const Response r = server_->post("/v1/responses", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers.at("content-type"), "application/json");
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(j["status"], "incomplete");
  EXPECT_EQ(j["metadata"], json({{"k", "v"}}));
  EXPECT_EQ(j["tools"], body["tools"]);
  EXPECT_EQ(j["store"], false);
  check_usage(j["usage"], 3);
  ASSERT_FALSE(j["output"].empty());
  EXPECT_EQ(j["output"][0]["type"], "reasoning");
  EXPECT_EQ(j["output"][0]["status"], "completed");
}

// An agent's next turn: the previous output items replayed, plus a new user message. The
// prompt extends the kept sequence, so it is not evaluated again. (One generated token: the
// kept sequence is then exactly the first prompt. Longer replays depend on the random model's
// text re-tokenizing to its own tokens, which the tiny vocabulary's hidden tokens break.)
TEST_F(ResponsesServer, ContinuedConversationReportsCachedTokens) {
  json input = json::array({{{"role", "user"}, {"content", "Count to three"}}});
  const json first = {{"input", input}, {"reasoning", {{"effort", "none"}}}, {"max_output_tokens", 1}, {"seed", 4}};
  Response r = server_->post("/v1/responses", first);
  ASSERT_EQ(r.status, 200) << r.body;
  const json a = json::parse(r.body);
  ASSERT_FALSE(a["output"].empty()) << "seed 4 should give visible text: " << r.body;
  for (const json& item : a["output"]) input.push_back(item);
  input.push_back({{"role", "user"}, {"content", "Go on"}});
  r = server_->post("/v1/responses", {{"input", input}, {"reasoning", {{"effort", "none"}}}, {"max_output_tokens", 2},
                                      {"stream", true}, {"seed", 5}});
  const json last = check_lifecycle(events_of(r));
  ASSERT_TRUE(last.is_object());
  const json& u = last["response"]["usage"];
  EXPECT_EQ(u["input_tokens_details"]["cached_tokens"], a["usage"]["input_tokens"]) << u.dump();
  EXPECT_GT(u["input_tokens"].get<int>(), u["input_tokens_details"]["cached_tokens"].get<int>());
}

TEST_F(ResponsesServer, ContextLengthExceededBothWays) {
  std::string long_text;
  for (int i = 0; i < 1500; ++i) long_text += "word" + std::to_string(i) + " ";
  const json body = {{"input", long_text}};
  const Response plain = server_->post("/v1/responses", body);
  EXPECT_EQ(plain.status, 400) << plain.body;
  const json e = json::parse(plain.body);
  EXPECT_EQ(e["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("context holds 2048"), std::string::npos);

  json sbody = body;
  sbody["stream"] = true;
  const std::vector<json> ev = events_of(server_->post("/v1/responses", sbody));
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0]["type"], "response.created");
  EXPECT_EQ(ev[2]["type"], "response.failed");
  EXPECT_EQ(ev[2]["response"]["status"], "failed");
  EXPECT_EQ(ev[2]["response"]["error"]["code"], "context_length_exceeded");
}

TEST_F(ResponsesServer, BadRequestIsAnOpenAiErrorNamingTheField) {
  const Response r = server_->post("/v1/responses", {{"input", json::array({{{"type", "function_call"}, {"name", "f"}}})}});
  EXPECT_EQ(r.status, 400) << r.body;
  const json e = json::parse(r.body);
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("input[0]: 'call_id'"), std::string::npos) << r.body;
  EXPECT_EQ(server_->get("/v1/responses").status, 405);
}

}  // namespace
