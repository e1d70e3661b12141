// `sluice serve` over raw HTTP: the server runs as a child process on the tiny model and an
// ephemeral port; requests are written by hand so the tests see the exact bytes (SSE framing,
// status lines, headers). The real-client tests (OpenAI / Anthropic SDKs) are in tests/clients.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "server_harness.h"

namespace {

using namespace sluice::test;

bool metric_name_ok(const std::string& n) {
  if (n.empty() || std::isdigit((unsigned char)n[0])) return false;
  for (char c : n)
    if (!std::isalnum((unsigned char)c) && c != '_' && c != ':') return false;
  return true;
}

// A small Prometheus text-format parser: returns "name{labels}" -> value; fails the test on a
// line that is not a comment or a well-formed sample, or on a sample without a TYPE. (No
// std::regex: GCC 12 warns inside <regex> under the sanitizer build's -Werror.)
std::map<std::string, double> parse_prometheus(const std::string& text) {
  std::map<std::string, double> out;
  std::map<std::string, std::string> types;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t e = text.find('\n', pos);
    if (e == std::string::npos) e = text.size();
    const std::string line = text.substr(pos, e - pos);
    pos = e + 1;
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (line.rfind("# TYPE ", 0) == 0) {
        const size_t sp = line.find(' ', 7);
        const std::string name = line.substr(7, sp - 7), type = sp == std::string::npos ? "" : line.substr(sp + 1);
        EXPECT_TRUE(metric_name_ok(name)) << line;
        EXPECT_TRUE(type == "counter" || type == "gauge" || type == "histogram" || type == "summary" || type == "untyped")
            << line;
        types[name] = type;
      }
      continue;
    }
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    const std::string name = line.substr(0, i);
    std::string labels;
    if (i < line.size() && line[i] == '{') {
      // name="value" pairs; values escape \\, \" and \n.
      const size_t start = i++;
      bool ok = true;
      while (ok && i < line.size() && line[i] != '}') {
        size_t k = i;
        while (k < line.size() && (std::isalnum((unsigned char)line[k]) || line[k] == '_')) ++k;
        ok = k > i && k + 1 < line.size() && line[k] == '=' && line[k + 1] == '"';
        i = k + 2;
        while (ok && i < line.size() && line[i] != '"') i += line[i] == '\\' ? 2 : 1;
        ok = ok && i < line.size();
        ++i;
        if (ok && i < line.size() && line[i] == ',') ++i;
      }
      if (!ok || i >= line.size()) {
        ADD_FAILURE() << "malformed labels: " << line;
        continue;
      }
      labels = line.substr(start, i + 1 - start);
      ++i;
    }
    if (!metric_name_ok(name) || i >= line.size() || line[i] != ' ') {
      ADD_FAILURE() << "malformed sample line: " << line;
      continue;
    }
    const std::string value = line.substr(i + 1);
    // A histogram's samples are its name + _bucket (with le), _sum and _count.
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (name.ends_with(suffix) && types.count(name.substr(0, name.size() - std::strlen(suffix))) &&
          types[name.substr(0, name.size() - std::strlen(suffix))] == "histogram")
        family = name.substr(0, name.size() - std::strlen(suffix));
    EXPECT_TRUE(types.count(family)) << "sample before its TYPE: " << line;
    if (family == name && types[name] == "histogram") ADD_FAILURE() << "a histogram sample without a suffix: " << line;
    if (types[family] == "counter") {
      EXPECT_TRUE(name.ends_with("_total")) << line;
    }
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(value, &used);
    } catch (const std::exception&) {
    }
    EXPECT_EQ(used, value.size()) << "bad value: " << line;
    out[name + labels] = v;
  }
  return out;
}

const json kChat = {{"messages", json::array({{{"role", "user"}, {"content", "Hello there"}}})}, {"max_tokens", 6},
                    {"temperature", 0}};

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new Server({"--queue", "1", "--max-body", "65536", "--max-tokens-limit", "4000",
                          "--sse-ping-interval", "0.2", "-c", "4k"});
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static std::map<std::string, double> metrics() {
    const Response r = server_->get("/metrics");
    EXPECT_EQ(r.status, 200);
    return parse_prometheus(r.body);
  }
  // Polls /metrics until `key` reaches `value` (or 10 s).
  static bool wait_metric(const std::string& key, double value) {
    const auto end = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < end) {
      if (metrics()[key] >= value) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  static inline Server* server_ = nullptr;
};

TEST_F(ServerTest, HealthModelsTokenize) {
  Response h = server_->get("/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(json::parse(h.body), json({{"status", "ok"}}));
  Response m = server_->get("/v1/models");
  ASSERT_EQ(m.status, 200);
  const json mj = json::parse(m.body);
  EXPECT_EQ(mj["object"], "list");
  EXPECT_EQ(mj["data"][0]["id"], "tiny");
  // The context (-c 4k) under the names clients read: llama.cpp's meta.n_ctx, context_length
  // (OpenRouter, LiteLLM) and vLLM's max_model_len.
  EXPECT_EQ(mj["data"][0]["meta"]["n_ctx"], 4096);
  EXPECT_EQ(mj["data"][0]["context_length"], 4096);
  EXPECT_EQ(mj["data"][0]["max_model_len"], 4096);
  Response t = server_->post("/tokenize", {{"content", "hello <｜User｜>"}, {"with_pieces", true}});
  ASSERT_EQ(t.status, 200);
  const json tj = json::parse(t.body);
  ASSERT_FALSE(tj["tokens"].empty());
  std::string joined;
  for (const auto& p : tj["tokens"]) joined += p["piece"].get<std::string>();
  EXPECT_EQ(joined, "hello <｜User｜>");
  EXPECT_EQ(tj["tokens"].back()["piece"], "<｜User｜>") << "control tokens match as one token";
}

// A prompt longer than the context is refused with a 400 that says so, on every chat API;
// nothing is cut silently.
TEST_F(ServerTest, PromptBeyondTheContextIsA400) {
  std::string text;
  for (int i = 0; i < 5000; ++i) text += " hello";  // > 4096 tokens
  json chat = kChat;
  chat["messages"][0]["content"] = text;
  Response r = server_->post("/v1/chat/completions", chat);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("context holds 4096"), std::string::npos) << r.body;
  r = server_->post("/v1/messages", {{"model", "tiny"}, {"max_tokens", 4},
                                     {"messages", json::array({{{"role", "user"}, {"content", text}}})}});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("context holds 4096"), std::string::npos) << r.body;
  EXPECT_EQ(server_->get("/health").status, 200);  // and the server goes on
}

TEST_F(ServerTest, OpenAiStreamFraming) {
  json body = kChat;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const Response r = server_->post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.at("content-type"), "text/event-stream");
  EXPECT_EQ(r.headers.count("content-length"), 0u);
  const auto events = parse_sse(r.body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_TRUE(events[0].comment) << "a comment goes out before anything else";
  EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n"));
  std::vector<json> chunks;
  for (const auto& e : events) {
    if (e.comment) continue;
    EXPECT_TRUE(e.name.empty());
    if (e.data == "[DONE]") continue;
    chunks.push_back(json::parse(e.data));
  }
  ASSERT_GE(chunks.size(), 3u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  for (const auto& c : chunks) {
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["id"], chunks[0]["id"]);
  }
  const json& usage = chunks.back();
  EXPECT_TRUE(usage["choices"].is_array() && usage["choices"].empty());
  const json& fin = chunks[chunks.size() - 2];
  EXPECT_TRUE(fin["choices"][0]["finish_reason"] == "length" || fin["choices"][0]["finish_reason"] == "stop");
  EXPECT_EQ(usage["usage"]["completion_tokens"].get<int>() + usage["usage"]["prompt_tokens"].get<int>(),
            usage["usage"]["total_tokens"].get<int>());
  EXPECT_LE(usage["usage"]["completion_tokens"].get<int>(), 6);
}

TEST_F(ServerTest, AnthropicStreamFraming) {
  const json body = {{"model", "tiny"}, {"max_tokens", 6}, {"stream", true}, {"thinking", {{"type", "enabled"}}},
                     {"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}};
  const Response r = server_->post("/v1/messages", body);
  ASSERT_EQ(r.status, 200);
  const auto events = parse_sse(r.body);
  std::vector<std::string> names;
  for (const auto& e : events) {
    ASSERT_FALSE(e.comment);
    ASSERT_FALSE(e.name.empty()) << "every Anthropic event is named";
    const json d = json::parse(e.data);
    EXPECT_EQ(d["type"], e.name) << "event name and data type agree";
    names.push_back(e.name);
  }
  ASSERT_GE(names.size(), 4u);
  EXPECT_EQ(names.front(), "message_start");
  EXPECT_EQ(names[names.size() - 2], "message_delta");
  EXPECT_EQ(names.back(), "message_stop");
  int open = 0;
  for (const auto& n : names) {
    if (n == "content_block_start") {
      EXPECT_EQ(open++, 0);
    } else if (n == "content_block_delta") {
      EXPECT_EQ(open, 1);
    } else if (n == "content_block_stop") {
      EXPECT_EQ(--open, 0);
    }
  }
  EXPECT_EQ(open, 0);
}

TEST_F(ServerTest, MalformedRequestsGetJsonErrors) {
  Response r = server_->roundtrip(request_text("POST", "/v1/chat/completions", "{\"messages\": [oops"));
  ASSERT_EQ(r.status, 400);
  json j = json::parse(r.body);
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["code"], 400);
  EXPECT_NE(j["error"]["message"].get<std::string>().find("malformed JSON"), std::string::npos);

  r = server_->post("/v1/chat/completions", {{"messages", "not an array"}});
  EXPECT_EQ(r.status, 400);
  // Above --max-tokens-limit is clamped (tests/server_agents_test.cpp); below 1 is invalid.
  json too_few = kChat;
  too_few["max_tokens"] = -3;
  r = server_->post("/v1/chat/completions", too_few);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("max_tokens"), std::string::npos);
  r = server_->post("/v1/messages", {{"messages", json::array({{{"role", "user"}, {"content", "x"}}})}});
  ASSERT_EQ(r.status, 400);
  j = json::parse(r.body);
  EXPECT_EQ(j["type"], "error");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  // Bad request line and unknown path.
  r = server_->roundtrip("NONSENSE\r\n\r\n");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(server_->get("/nowhere").status, 404);
  // Too large: refused from the Content-Length alone, body never read.
  r = server_->roundtrip("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n");
  EXPECT_EQ(r.status, 413);
  EXPECT_NE(json::parse(r.body)["error"]["message"].get<std::string>().find("--max-body"), std::string::npos);
  // Still serving.
  EXPECT_EQ(server_->post("/v1/chat/completions", kChat).status, 200);
}

TEST_F(ServerTest, MetricsParseAndCount) {
  const auto before = metrics();
  ASSERT_EQ(server_->post("/v1/chat/completions", kChat).status, 200);
  const auto after = metrics();
  for (const char* k : {"sluice_prompt_tokens_total", "sluice_tokens_predicted_total", "sluice_expert_cache_hits_total",
                        "sluice_expert_cache_misses_total", "sluice_memory_rss_bytes", "sluice_memory_budget_bytes",
                        "sluice_prompt_seconds_total", "sluice_requests_waiting"})
    EXPECT_TRUE(after.count(k)) << k;
  const std::string key = "sluice_http_requests_total{endpoint=\"/v1/chat/completions\",code=\"200\"}";
  EXPECT_EQ(after.at(key), (before.count(key) ? before.at(key) : 0) + 1);
  EXPECT_GT(after.at("sluice_tokens_predicted_total"), before.at("sluice_tokens_predicted_total"));
  EXPECT_GT(after.at("sluice_memory_rss_bytes"), 0);
}

TEST_F(ServerTest, PrefixReuseShowsInUsageAndMetrics) {
  std::vector<int> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(10 + i * 7 % 400);
  const json first = {{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}};
  Response r = server_->post("/v1/completions", first);
  ASSERT_EQ(r.status, 200);
  const double cached_before = metrics()["sluice_prompt_tokens_cached_total"];
  // The kept sequence is exactly the previous prompt (the one sampled token was not evaluated),
  // so a prompt that extends it evaluates only its new tokens.
  std::vector<int> longer = prompt;
  for (int i = 0; i < 10; ++i) longer.push_back(300 + i);
  r = server_->post("/v1/completions", {{"prompt", longer}, {"max_tokens", 1}, {"temperature", 0}});
  ASSERT_EQ(r.status, 200);
  const json j = json::parse(r.body);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 50);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 40);
  EXPECT_EQ(j["timings"]["prompt_n"], 10);
  EXPECT_EQ(metrics()["sluice_prompt_tokens_cached_total"], cached_before + 40);
}

// Two conversations with the same 2,000-token system prompt: the second prefills only its own
// messages (the first left a checkpoint after the user-turn marker that follows the system
// prompt).
TEST_F(ServerTest, ASecondConversationReusesASharedSystemPrompt) {
  std::string system;
  for (int i = 0; system.size() < 2100; ++i) system += "rule " + std::to_string(i) + ": be brief. ";
  auto chat = [&](const std::string& user) {
    return json{{"messages", json::array({{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", user}}})},
                {"max_tokens", 2}, {"temperature", 0}};
  };
  Response r = server_->post("/v1/chat/completions", chat("first conversation"));
  ASSERT_EQ(r.status, 200) << r.body;
  const int prompt_a = json::parse(r.body)["usage"]["prompt_tokens"];
  ASSERT_GT(prompt_a, 2000);
  r = server_->post("/v1/chat/completions", chat("a different question altogether"));
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  const int cached = j["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, 2000);
  // The tiny model's vocabulary is bytes: the system prompt is system.size() tokens.
  EXPECT_GE(cached, (int)system.size()) << "part of the system prompt was evaluated again";
  EXPECT_LT(cached, j["usage"]["prompt_tokens"].get<int>());
}

// One running, one waiting (--queue 1), the third gets 503 + Retry-After; closing the sockets
// cancels both generations at the next token.
TEST_F(ServerTest, FullQueueGets503AndDisconnectCancels) {
  const std::string cancelled = "sluice_requests_cancelled_total{reason=\"disconnect\"}";
  const double cancelled_before = metrics()[cancelled];
  const json long_gen = {{"prompt", "tell me everything"}, {"max_tokens", 4000}, {"ignore_eos", true}, {"stream", true}};
  const int a = server_->open_stream("/v1/completions", long_gen);
  ASSERT_TRUE(wait_metric("sluice_requests_processing", 1));
  const int b = server_->open_stream("/v1/completions", long_gen);
  ASSERT_TRUE(wait_metric("sluice_requests_waiting", 1));
  const Response c = server_->post("/v1/completions", long_gen);
  EXPECT_EQ(c.status, 503);
  ASSERT_TRUE(c.headers.count("retry-after"));
  EXPECT_GE(std::stoi(c.headers.at("retry-after")), 1);
  EXPECT_EQ(json::parse(c.body)["error"]["code"], 503);
  // The running stream is producing tokens; drop both clients.
  char buf[4096];
  ASSERT_GT(::recv(a, buf, sizeof buf, 0), 0);
  ::close(a);
  ::close(b);
  EXPECT_TRUE(wait_metric(cancelled, cancelled_before + 1));
  const auto end = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < end && (metrics()["sluice_requests_processing"] != 0 || metrics()["sluice_requests_waiting"] != 0))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto m = metrics();
  EXPECT_EQ(m.at("sluice_requests_processing"), 0);
  EXPECT_EQ(m.at("sluice_requests_waiting"), 0);
  EXPECT_LT(m.at("sluice_tokens_predicted_total"), 4000) << "the generation ran on after the client left";
  EXPECT_EQ(server_->post("/v1/chat/completions", kChat).status, 200);
}

// A plain (not streamed) request whose client closes its socket is cancelled at once, although
// a half-close looks the same on the wire until the server writes (it probes with a 102).
TEST_F(ServerTest, ClosingAPlainRequestCancelsIt) {
  const std::string cancelled = "sluice_requests_cancelled_total{reason=\"disconnect\"}";
  const double cancelled_before = metrics()[cancelled];
  const double predicted_before = metrics()["sluice_tokens_predicted_total"];
  const json long_gen = {{"prompt", "tell me everything"}, {"max_tokens", 4000}, {"ignore_eos", true}};
  const int fd = connect_to(server_->port());
  ASSERT_GE(fd, 0);
  send_all(fd, request_text("POST", "/v1/completions", long_gen.dump()));
  ASSERT_TRUE(wait_metric("sluice_requests_processing", 1));
  ::close(fd);
  EXPECT_TRUE(wait_metric(cancelled, cancelled_before + 1)) << "the generation ran on after the client left";
  EXPECT_LT(metrics()["sluice_tokens_predicted_total"] - predicted_before, 4000);
}

// A long prompt: the status line and a first SSE comment arrive at once, before the prefill.
TEST_F(ServerTest, FirstByteBeforeLongPrefill) {
  std::vector<int> prompt;
  for (int i = 0; i < 3000; ++i) prompt.push_back(3 + (i * 31) % 500);
  const auto t0 = Clock::now();
  const int fd = server_->open_stream("/v1/completions", {{"prompt", prompt}, {"max_tokens", 1}, {"stream", true}});
  std::string got;
  char buf[4096];
  while (got.find("\r\n\r\n: ") == std::string::npos) {
    pollfd p{fd, POLLIN, 0};
    ASSERT_GT(::poll(&p, 1, 5000), 0);
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, (size_t)n);
  }
  const double first = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(first, 1.0);
  EXPECT_EQ(got.find("data: "), std::string::npos) << "no data yet: the prompt is still being evaluated";
  // Leave: the prefill is cancelled at its next chunk, and the server goes on serving.
  ::close(fd);
  EXPECT_EQ(server_->post("/v1/chat/completions", kChat).status, 200);
}

TEST(ServerAuth, ApiKeyRequiredExceptHealth) {
  Server s({"--api-key", "sekrit"});
  EXPECT_EQ(s.get("/health").status, 200);
  const Response r = s.post("/v1/chat/completions", kChat);
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "authentication_error");
  EXPECT_EQ(s.post("/v1/chat/completions", kChat, "Authorization: Bearer sekrit\r\n").status, 200);
  EXPECT_EQ(s.post("/v1/chat/completions", kChat, "x-api-key: sekrit\r\n").status, 200);
  EXPECT_EQ(s.stop(), 0) << "SIGTERM ends the server cleanly";
}

// --parallel 3 --queue 0: three long streams run at once (GET /slots shows them, each slot's
// state and tokens), a fourth request gets 503; the steps batched several sequences
// (sluice_batch_sequences) and every stream's time to first token is in its histogram.
// --cache-ram: conversation A (a long system prompt), then an unrelated one that takes the only
// slot's sequence and checkpoints, then B with A's system prompt: B starts from the state the
// shared prefix cache kept at A's user-turn boundary. Without the cache B evaluates it all again.
TEST(PrefixCacheServer, AConversationComingBackAfterAnotherReusesTheSharedSystemPrompt) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "three long streams and 2,100-character prompts through a server: checked in the optimized build "
                  "(the prefix cache's own tests and ServerTest.ASecondConversationReusesASharedSystemPrompt run here)";
#endif
  std::string system;
  for (int i = 0; system.size() < 2100; ++i) system += "rule " + std::to_string(i) + ": be brief. ";
  auto chat = [&](const std::string& sys, const std::string& user) {
    return json{{"messages", json::array({{{"role", "system"}, {"content", sys}}, {{"role", "user"}, {"content", user}}})},
                {"max_tokens", 2}, {"temperature", 0}};
  };
  for (const bool cached : {true, false}) {
    SCOPED_TRACE(cached ? "--cache-ram 64MiB" : "no prefix cache");
    std::vector<std::string> args = {"-c", "4k"};
    if (cached) args.insert(args.end(), {"--cache-ram", "64MiB"});
    Server s(args);
    ASSERT_EQ(s.post("/v1/chat/completions", chat(system, "first conversation")).status, 200);
    ASSERT_EQ(s.post("/v1/chat/completions", chat("you are another agent", "something else")).status, 200);
    const Response r = s.post("/v1/chat/completions", chat(system, "a different question altogether"));
    ASSERT_EQ(r.status, 200) << r.body;
    const int reused = json::parse(r.body)["usage"]["prompt_tokens_details"]["cached_tokens"];
    std::map<std::string, double> m = parse_prometheus(s.get("/metrics").body);
    if (cached) {
      EXPECT_GE(reused, (int)system.size()) << "the system prompt was evaluated again";
      EXPECT_EQ(m["sluice_prefix_cache_hits_total"], 1);
      EXPECT_GE(m["sluice_prefix_cache_hit_tokens_total"], (double)system.size());
      EXPECT_GE(m["sluice_prefix_cache_entries"], 2);
      EXPECT_LE(m["sluice_prefix_cache_bytes"], m["sluice_prefix_cache_budget_bytes"]);
      EXPECT_EQ(m["sluice_prefix_cache_budget_bytes"], 64 << 20);
    } else {
      EXPECT_LT(reused, 100);
      EXPECT_EQ(m["sluice_prefix_cache_budget_bytes"], 0);
    }
  }
}

// --kv-disk-dir: the states written by one server are found by the next one on the same directory.
TEST(StateDiskServer, AConversationAfterARestartReusesItsStateFromDisk) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "two servers started one after the other: checked in the optimized build (the state disk's "
                  "own tests and StateDiskServer.AThinkingTurnTwoPrefillsFromTheDivergencePoint run here)";
#endif
  std::string system;
  for (int i = 0; system.size() < 2100; ++i) system += "rule " + std::to_string(i) + ": be brief. ";
  const json chat = {{"messages", json::array({{{"role", "system"}, {"content", system}},
                                               {{"role", "user"}, {"content", "the question"}}})},
                     {"max_tokens", 2}, {"temperature", 0}};
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("sluice_state_disk_server_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::vector<std::string> args = {"-c", "4k", "--kv-disk-dir", dir.string(), "--kv-disk-budget", "256MiB"};
  std::string first;
  {
    Server s(args);
    const Response r = s.post("/v1/chat/completions", chat);
    ASSERT_EQ(r.status, 200) << r.body;
    first = json::parse(r.body)["choices"][0]["message"]["content"];
    EXPECT_EQ(json::parse(r.body)["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  }
  auto s = std::make_unique<Server>(args);
  const Response r = s->post("/v1/chat/completions", chat);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_GE(j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), (int)system.size())
      << "the restarted server evaluated the prompt again";
  EXPECT_EQ(j["choices"][0]["message"]["content"], first);
  std::map<std::string, double> m = parse_prometheus(s->get("/metrics").body);
  EXPECT_EQ(m["sluice_state_disk_hits_total"], 1);
  EXPECT_GE(m["sluice_state_disk_entries"], 2);
  EXPECT_LE(m["sluice_state_disk_bytes"], m["sluice_state_disk_budget_bytes"]);
  EXPECT_EQ(m["sluice_state_disk_budget_bytes"], 256 << 20);
  // Every state file damaged (one byte flipped in the middle): detected, recomputed, the same answer.
  s.reset();
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".sstate") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    const std::streamoff mid = (std::streamoff)std::filesystem::file_size(e.path()) / 2;
    f.seekg(mid);
    const char c = (char)f.get();
    f.seekp(mid);
    f.put((char)(c ^ 0x40));
  }
  Server again(args);
  const Response r2 = again.post("/v1/chat/completions", chat);
  ASSERT_EQ(r2.status, 200) << r2.body;
  const json j2 = json::parse(r2.body);
  EXPECT_LT(j2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 10) << "a damaged state was used";
  EXPECT_EQ(j2["choices"][0]["message"]["content"], first);
  EXPECT_NE(again.wait_log("signature does not verify").find("signature does not verify"), std::string::npos) << again.log();
  std::filesystem::remove_all(dir);
}

// Under a file size limit (ulimit -f) smaller than a state file, the write fails with EFBIG
// instead of SIGXFSZ killing the server: the failure is logged once and counted, the temporary
// file is removed, and the server goes on answering.
TEST(StateDiskServer, AFileSizeLimitFailsTheStateWriteNotTheServer) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("sluice_state_disk_fsize_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::string system;
  for (int i = 0; system.size() < 600; ++i) system += "rule " + std::to_string(i) + ": be brief. ";
  const json chat = {{"messages", json::array({{{"role", "system"}, {"content", system}},
                                               {{"role", "user"}, {"content", "the question"}}})},
                     {"max_tokens", 2}, {"temperature", 0}};
  Server s({"-c", "4k", "--kv-disk-dir", dir.string(), "--kv-disk-budget", "64MiB"}, 4096);
  ASSERT_EQ(s.post("/v1/chat/completions", chat).status, 200);
  // The writer thread writes after the response: wait for its verdict.
  std::map<std::string, double> m;
  for (const auto end = Clock::now() + std::chrono::seconds(20); Clock::now() < end;) {
    m = parse_prometheus(s.get("/metrics").body);
    if (m["sluice_state_disk_write_errors_total"] >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GE(m["sluice_state_disk_write_errors_total"], 1) << s.log();
  EXPECT_EQ(m["sluice_state_disk_written_total"], 0);
  EXPECT_EQ(s.get("/health").status, 200) << s.log();
  const std::string log = s.wait_log("File too large");
  EXPECT_NE(log.find("File too large"), std::string::npos) << log;
  EXPECT_NE(log.find("ulimit -f"), std::string::npos) << log;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_NE(e.path().extension(), ".tmp") << e.path() << " was left behind";
  EXPECT_EQ(s.stop(), 0) << s.log();
  std::filesystem::remove_all(dir);
}

// Thinking mode: turn 2's rendering drops turn 1's reasoning, so its prompt diverges from what
// turn 1 evaluated right after turn 1's prompt less its last token (the generation prompt ends
// "<｜Assistant｜><think>", the earlier turn is rendered "<｜Assistant｜></think>answer"; docs/chat.md).
// Turn 2 prefills from that point, not from 0: after another conversation took the only slot (from
// the shared prefix cache) and after a restart (from --kv-disk-dir); without either it cannot.
TEST(StateDiskServer, AThinkingTurnTwoPrefillsFromTheDivergencePoint) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("sluice_thinking_turns_" + std::to_string(::getpid()));
  const json sys = {{"role", "system"}, {"content", "you are terse, kind and helpful to everyone who asks"}};
  const json q1 = {{"role", "user"}, {"content", "the first question of this conversation"}};
  auto body = [](json messages, int max_tokens) {
    return json{{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}, {"thinking", {{"type", "enabled"}}}};
  };
  for (const std::string how : {"cache-ram", "kv-disk", "neither"}) {
    SCOPED_TRACE(how);
    std::filesystem::remove_all(dir);
    std::vector<std::string> args = {"-c", "4k"};
    if (how == "cache-ram") args.insert(args.end(), {"--cache-ram", "64MiB"});
    if (how == "kv-disk") args.insert(args.end(), {"--kv-disk-dir", dir.string(), "--kv-disk-budget", "64MiB"});
    auto s = std::make_unique<Server>(args);
    Response r = s->post("/v1/chat/completions", body(json::array({sys, q1}), 10));
    ASSERT_EQ(r.status, 200) << r.body;
    const json t1 = json::parse(r.body);
    const int p1 = t1["usage"]["prompt_tokens"];
    ASSERT_FALSE(t1["choices"][0]["message"]["reasoning_content"].get<std::string>().empty()) << "no reasoning: " << r.body;
    if (how == "kv-disk") {
      s.reset();
      s = std::make_unique<Server>(args);
    } else {  // another conversation takes the slot
      ASSERT_EQ(s->post("/v1/chat/completions", body(json::array({{{"role", "user"}, {"content", "unrelated"}}}), 2)).status, 200);
    }
    const json answer = {{"role", "assistant"}, {"content", t1["choices"][0]["message"]["content"]}};
    r = s->post("/v1/chat/completions", body(json::array({sys, q1, answer, {{"role", "user"}, {"content", "and a second one"}}}), 2));
    ASSERT_EQ(r.status, 200) << r.body;
    const json t2 = json::parse(r.body);
    const int cached = t2["usage"]["prompt_tokens_details"]["cached_tokens"];
    EXPECT_GT(t2["usage"]["prompt_tokens"].get<int>(), p1);
    if (how == "neither") EXPECT_LT(cached, 4) << "reuse without a cache";
    else EXPECT_EQ(cached, p1 - 1) << "turn 2 did not restart at the divergence point";
  }
  std::filesystem::remove_all(dir);
}

TEST(ParallelServer, SlotsMetricsAndTheLimitOfParallelPlusQueue) {
  Server s({"--parallel", "3", "--queue", "0", "-c", "4k", "--max-tokens-limit", "4000"});
  auto metrics = [&] { return parse_prometheus(s.get("/metrics").body); };
  auto wait_metric = [&](const std::string& key, double value) {
    const auto end = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < end) {
      if (metrics()[key] == value) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  Response r = s.get("/slots");
  ASSERT_EQ(r.status, 200) << r.body;
  json slots = json::parse(r.body);
  ASSERT_EQ(slots.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(slots[k]["id"], k);
    EXPECT_EQ(slots[k]["n_ctx"], 4096);
    EXPECT_EQ(slots[k]["is_processing"], false);
    EXPECT_EQ(slots[k]["state"], "idle");
  }
  EXPECT_EQ(metrics()["sluice_slots"], 3);

  std::vector<int> streams;
  for (int i = 0; i < 3; ++i) {
    const json long_gen = {{"prompt", "stream number " + std::to_string(i)}, {"max_tokens", 4000},
                           {"ignore_eos", true}, {"stream", true}};
    streams.push_back(s.open_stream("/v1/completions", long_gen));
  }
  ASSERT_TRUE(wait_metric("sluice_requests_processing", 3));
  const Response refused = s.post("/v1/completions", {{"prompt", "a fourth"}, {"max_tokens", 2}});
  EXPECT_EQ(refused.status, 503) << "3 slots and --queue 0 took a 4th request";
  char buf[4096];
  for (const int fd : streams) ASSERT_GT(::recv(fd, buf, sizeof buf, 0), 0);
  r = s.get("/slots");
  slots = json::parse(r.body);
  int processing = 0;
  for (const json& x : slots) {
    if (x["is_processing"] == true) {
      ++processing;
      EXPECT_TRUE(x["state"] == "decode" || x["state"] == "prefill") << x.dump();
      EXPECT_GT(x["n_prompt_tokens"].get<int>(), 0) << x.dump();
      EXPECT_GT(x["next_token"]["n_remain"].get<int>(), 0) << x.dump();
    }
  }
  EXPECT_EQ(processing, 3) << r.body;
  for (const int fd : streams) ::close(fd);
  ASSERT_TRUE(wait_metric("sluice_requests_processing", 0));
  // A request that runs to its end records its time to first token (the handler does, as it
  // finishes: before the answer is sent).
  const double ttft_before = metrics()["sluice_time_to_first_token_seconds_count"];
  EXPECT_EQ(s.post("/v1/chat/completions", kChat).status, 200);
  const auto m = metrics();
  EXPECT_GT(m.at("sluice_batch_sequences_sum"), m.at("sluice_batch_sequences_count"))
      << "no step evaluated more than one sequence";
  EXPECT_GE(m.at("sluice_batch_sequences_count"), m.at("sluice_batch_sequences_bucket{le=\"1\"}"));
  EXPECT_EQ(m.at("sluice_batch_sequences_bucket{le=\"+Inf\"}"), m.at("sluice_batch_sequences_count"));
  EXPECT_EQ(m.at("sluice_time_to_first_token_seconds_count"), ttft_before + 1);
  EXPECT_EQ(m.at("sluice_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), m.at("sluice_time_to_first_token_seconds_count"));
  double kept = 0;
  for (int k = 0; k < 3; ++k) kept += m.at("sluice_slot_tokens{slot=\"" + std::to_string(k) + "\"}");
  EXPECT_GT(kept, 0);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(m.at("sluice_slot_busy{slot=\"" + std::to_string(k) + "\"}"), 0);
  EXPECT_EQ(s.stop(), 0);
}

}  // namespace
