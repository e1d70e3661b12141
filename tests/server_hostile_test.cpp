// `sluice serve` against hostile or unusual input and faults (issue 9): nesting bombs, a queue of
// zero, shutdown in the middle of a stream, control tokens in generated text. Each test starts its
// own server on the tiny model (tests/server_harness.h) when it needs flags of its own.
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server_harness.h"

namespace {

using namespace sluice::test;

// n nested arrays: "[[[...]]]" (built as text: nlohmann would itself recurse to write it).
std::string nested(size_t n) { return std::string(n, '[') + std::string(n, ']'); }

std::string user_hi() { return R"("messages":[{"role":"user","content":"hi"}])"; }

class HostileJson : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new Server({"--max-json-depth", "64"}); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static Response post_raw(const std::string& path, const std::string& body) {
    return server_->roundtrip(request_text("POST", path, body));
  }
  static void expect_depth_400(const Response& r, const std::string& what) {
    EXPECT_EQ(r.status, 400) << what << ": " << r.body;
    EXPECT_NE(r.body.find("deeper than 64"), std::string::npos) << what << ": " << r.body;
    EXPECT_NE(r.body.find("--max-json-depth"), std::string::npos) << what << ": " << r.body;
  }
  static inline Server* server_ = nullptr;
};

TEST_F(HostileJson, DeepSchemasAndArgumentsAre400NotACrash) {
  const std::string deep = nested(12000);
  expect_depth_400(post_raw("/v1/messages", std::string(R"({"max_tokens":4,)") + user_hi() +
                                                R"(,"tools":[{"name":"f","input_schema":)" + deep + "}]}"),
                   "anthropic input_schema");
  expect_depth_400(post_raw("/v1/messages/count_tokens",
                            std::string("{") + user_hi() + R"(,"tools":[{"name":"f","input_schema":)" + deep + "}]}"),
                   "count_tokens input_schema");
  expect_depth_400(post_raw("/v1/chat/completions", std::string(R"({"max_tokens":4,)") + user_hi() +
                                                        R"(,"tools":[{"type":"function","function":{"name":"f","parameters":)" +
                                                        deep + "}}]}"),
                   "openai parameters");
  expect_depth_400(post_raw("/v1/chat/completions",
                            std::string(R"({"max_tokens":4,)") + user_hi() +
                                R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":)" + deep + "}}}"),
                   "response_format schema");
  // The arguments of a replayed tool call are a JSON string holding JSON: the body is shallow.
  const std::string args = nested(200000);
  const std::string turn = std::string(R"({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",)"
                           R"("function":{"name":"f","arguments":")") + args + R"("}}]})";
  expect_depth_400(post_raw("/v1/chat/completions", std::string(R"({"max_tokens":4,"messages":[{"role":"user","content":"hi"},)") +
                                                        turn + R"(,{"role":"tool","tool_call_id":"c1","content":"ok"}]})"),
                   "tool_calls arguments");
  // Within the limit: served.
  const Response ok = post_raw("/v1/chat/completions", std::string(R"({"max_tokens":2,"temperature":0,)") + user_hi() +
                                                           R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"a":)" +
                                                           nested(40) + "}}}]}");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(server_->get("/health").status, 200) << "still serving";
}

// Issue 53 (also noted): a NUL quoted from a request cut the error message there (what() is a C
// string); control characters in messages are written as \u00XX, so all of it arrives.
TEST_F(HostileJson, AnErrorMessageIsNotCutAtANul) {
  const Response r =
      post_raw("/v1/chat/completions", R"({"max_tokens":2,"messages":[{"role":"us\u0000er","content":"hi"}]})");
  EXPECT_EQ(r.status, 400) << r.body;
  const std::string m = nlohmann::json::parse(r.body)["error"]["message"];
  EXPECT_NE(m.find("unknown role 'us\\u0000er'"), std::string::npos) << m;
}

// --queue 0: nothing waits, but the running request needs no queue place.
TEST(ServerQueue, QueueZeroRunsOneAndRefusesTheSecond) {
  Server s({"--queue", "0"});
  const json quick = {{"prompt", "hi"}, {"max_tokens", 2}, {"temperature", 0}};
  EXPECT_EQ(s.post("/v1/completions", quick).status, 200);
  EXPECT_EQ(s.post("/v1/completions", quick).status, 200) << "one at a time always succeeds";
  const json long_gen = {{"prompt", "tell me"}, {"max_tokens", 2000}, {"ignore_eos", true}, {"stream", true}};
  const int a = s.open_stream("/v1/completions", long_gen);
  std::string got;
  char buf[4096];
  while (got.find("\"text\"") == std::string::npos) {  // the first token is out: the request is running
    const ssize_t n = ::recv(a, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, (size_t)n);
  }
  const Response second = s.post("/v1/completions", quick);
  EXPECT_EQ(second.status, 503) << second.body;
  EXPECT_TRUE(second.headers.count("retry-after"));
  ::close(a);
}

// Reads a stream until the first data event, SIGTERMs the server, then reads to EOF.
std::string stream_through_sigterm(Server& s, const std::string& path, const json& body) {
  const int fd = s.open_stream(path, body);
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, (size_t)n);
  }
  ::kill(s.pid(), SIGTERM);
  got += read_all(fd, 30);
  ::close(fd);
  return parse_response(got).body;
}

TEST(ServerShutdown, SigtermEndsAnOpenAiStreamWithAnErrorEvent) {
  Server s({});
  const json body = {{"messages", json::array({{{"role", "user"}, {"content", "go"}}})}, {"max_tokens", 4000},
                     {"ignore_eos", true}, {"stream", true}};
  const std::string out = stream_through_sigterm(s, "/v1/chat/completions", body);
  const auto events = parse_sse(out);
  ASSERT_GE(events.size(), 2u) << out;
  EXPECT_EQ(events.back().data, "[DONE]") << out.substr(out.size() > 400 ? out.size() - 400 : 0);
  const json err = json::parse(events[events.size() - 2].data);
  ASSERT_TRUE(err.contains("error")) << err;
  EXPECT_NE(err["error"]["message"].get<std::string>().find("shutting down"), std::string::npos) << err;
  EXPECT_EQ(s.wait_exit(), 0);
}

// Issue 53 (also noted): SIGUSR1 and SIGUSR2 killed the server with the default action; they are
// ignored (and logged). SIGHUP stops it cleanly, like SIGTERM.
TEST(ServerShutdown, SigusrIsIgnoredAndSighupStopsCleanly) {
  Server s({});
  ::kill(s.pid(), SIGUSR1);
  ::kill(s.pid(), SIGUSR2);
  EXPECT_NE(s.wait_log("SIGUSR2 ignored").find("SIGUSR2 ignored"), std::string::npos) << s.log();
  EXPECT_EQ(s.get("/health").status, 200) << "a user signal ended the server";
  ::kill(s.pid(), SIGHUP);
  EXPECT_EQ(s.wait_exit(), 0);
  EXPECT_NE(s.log().find("SIGHUP, stopping"), std::string::npos) << s.log();
}

TEST(ServerShutdown, SigtermEndsAnAnthropicStreamWithAnErrorEvent) {
  Server s({});
  const json body = {{"model", "tiny"}, {"max_tokens", 4000}, {"stream", true}, {"temperature", 0},
                     {"messages", json::array({{{"role", "user"}, {"content", "go"}}})}};
  // Greedy on the tiny model runs to max_tokens (no eos), so the stream is still open at the signal.
  const std::string out = stream_through_sigterm(s, "/v1/messages", body);
  const auto events = parse_sse(out);
  ASSERT_FALSE(events.empty()) << out;
  EXPECT_EQ(events.back().name, "error") << out.substr(out.size() > 400 ? out.size() - 400 : 0);
  const json err = json::parse(events.back().data);
  EXPECT_EQ(err["type"], "error");
  EXPECT_EQ(err["error"]["type"], "overloaded_error");
  EXPECT_NE(err["error"]["message"].get<std::string>().find("shutting down"), std::string::npos) << err;
  EXPECT_EQ(s.wait_exit(), 0);
}

}  // namespace
