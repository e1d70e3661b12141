// Issue 53 finding 3: every endpoint's working memory is charged to the server's request memory
// (--request-memory, a line of the plan) before it is allocated. The pool's rules, the bound on
// a parsed JSON tree that charges a body before parsing, and a server fed a mix of large
// tokenize, detokenize, count_tokens and chat requests staying inside the pool.
#include <malloc.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/request_memory.h"
#include "server_harness.h"
#include "text/json_cost.h"

namespace {

using namespace sluice::test;
using nlohmann::json;
using sluice::server::RequestMemory;
using sluice::text::json_tree_bound;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;  // ASan's allocator: mallinfo2 and RSS say nothing of the heap
#else
constexpr bool kSanitized = false;
#endif

TEST(RequestMemory, TakesWhatIsFreeAndGivesBackWhenTheLeaseGoes) {
  RequestMemory pool(100);
  RequestMemory::Lease a, b;
  EXPECT_EQ(pool.take(60, a), RequestMemory::Take::Ok);
  EXPECT_EQ(pool.take(50, b), RequestMemory::Take::Busy);
  EXPECT_EQ(pool.take(101, b), RequestMemory::Take::TooLarge);
  EXPECT_EQ(pool.take(41, a), RequestMemory::Take::TooLarge) << "one lease of 101 can never fit";
  EXPECT_EQ(pool.take(40, b), RequestMemory::Take::Ok);
  EXPECT_EQ(pool.in_use(), 100u);
  {
    RequestMemory::Lease moved = std::move(a);
    EXPECT_EQ(pool.in_use(), 100u);
  }
  EXPECT_EQ(pool.in_use(), 40u);
  EXPECT_EQ(pool.take(10, b), RequestMemory::Take::Ok);
  EXPECT_EQ(b.bytes(), 50u);
  b.release();
  EXPECT_EQ(pool.in_use(), 0u);
  EXPECT_EQ(pool.peak(), 100u);
  EXPECT_EQ(pool.refused(), 3u);
}

// Heap in use now (glibc): the chunks of the main arena and mmapped ones.
uint64_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

std::string random_json(std::mt19937& rng, int depth) {
  const int kind = (int)(rng() % (depth > 4 ? 3 : 6));
  switch (kind) {
    case 0: return std::to_string((int)(rng() % 1000));
    case 1: {
      std::string s = "\"";
      const size_t n = rng() % 40;
      for (size_t i = 0; i < n; ++i) {
        if (rng() % 8 == 0) {
          s += "\\n";
        } else {
          s += (char)('a' + rng() % 26);
        }
      }
      return s + "\"";
    }
    case 2: return rng() % 2 ? "true" : "null";
    case 3:
    case 4: {
      std::string s = "[";
      const size_t n = rng() % 12;
      for (size_t i = 0; i < n; ++i) {
        if (i) s += ',';
        s += random_json(rng, depth + 1);
      }
      return s + "]";
    }
    default: {
      std::string s = "{";
      const size_t n = rng() % 8;
      for (size_t i = 0; i < n; ++i) {
        if (i) s += ", ";
        s += "\"key";
        s += std::to_string(i);
        s += std::string(rng() % 30, 'k');
        s += "\": ";
        s += random_json(rng, depth + 1);
      }
      return s + "}";
    }
  }
}

// The shapes that cost the most per byte of text, and random documents: what the parsed tree
// holds is within the bound read from the text.
TEST(JsonTreeBound, HoldsWhatTheParsedTreeHolds) {
  std::vector<std::string> docs;
  auto repeat = [](const std::string& open, const std::string& item, const std::string& close, size_t n) {
    std::string s = open;
    for (size_t i = 0; i < n; ++i) {
      if (i) s += ',';
      s += item;
    }
    return s + close;
  };
  docs.push_back(repeat("[", "1", "]", 200000));
  docs.push_back(repeat("[", "{}", "]", 100000));
  docs.push_back(repeat("[", "[]", "]", 100000));
  docs.push_back(repeat("[", "\"\"", "]", 100000));
  docs.push_back(repeat("[", "\"a long string of more than fifteen characters\"", "]", 20000));
  std::string members = "{";
  for (int i = 0; i < 50000; ++i) {
    if (i) members += ',';
    members += "\"k";
    members += std::to_string(i);
    members += "\":0";
  }
  docs.push_back(members + "}");
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) docs.push_back(random_json(rng, 0));
  for (const std::string& d : docs) {
    const uint64_t bound = json_tree_bound(d);
    const uint64_t before = heap_in_use();
    json j = json::parse(d);
    const uint64_t held = heap_in_use() - std::min(heap_in_use(), before);
    if (!kSanitized) {
      EXPECT_LE(held, bound) << d.substr(0, 80);
    }
    EXPECT_GE(bound, d.size() / 8) << "not a bound of any use";
  }
  // A chat body is mostly long strings: its bound is the string and the lexer's buffer (twice the
  // longest string), not a larger multiple.
  const std::string chat = json{{"messages", json::array({{{"role", "user"}, {"content", std::string(1 << 20, 'x')}}})}}.dump();
  EXPECT_LT(json_tree_bound(chat), chat.size() * 3 + 4096);
}

double metric(const Server& s, const std::string& name) {
  const Response r = s.get("/metrics");
  size_t at = r.body.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(r.body.substr(at + name.size() + 2));
}

// A request refused because others hold the pool is counted as such in /metrics, not as a
// connection-limit refusal: a body still arriving holds its charge, the next one does not fit.
TEST(ServerRequestMemory, ARefusalForThePoolIsCountedAsOne) {
  Server s({"--request-memory", "1MiB", "--max-body", "4MiB"});
  const int held = connect_to(s.port());
  ASSERT_GE(held, 0);
  send_all(held, "POST /tokenize HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 "Content-Length: 900000\r\n\r\n{\"content\": \"");
  for (int i = 0; i < 500 && metric(s, "sluice_request_memory_used_bytes") <= 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GT(metric(s, "sluice_request_memory_used_bytes"), 900000) << "the arriving body holds its charge";
  const Response r = s.post("/tokenize", {{"content", std::string(300000, 'x')}});
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_TRUE(r.headers.count("retry-after"));
  EXPECT_NE(r.body.find("--request-memory"), std::string::npos) << r.body;
  EXPECT_EQ(metric(s, "sluice_requests_rejected_total{reason=\"request_memory\"}"), 1);
  EXPECT_EQ(metric(s, "sluice_requests_rejected_total{reason=\"connections\"}"), 0);
  ::close(held);
}

// A detokenized answer many times its request's size is streamed; what one request needs beyond
// the whole pool is 413, naming the option.
TEST(ServerRequestMemory, DetokenizeStreamsItsAnswerAndTooLargeIsRefused) {
  Server s({"--request-memory", "64MiB"});
  // The pool and the transport's own memory are lines of the plan the model was admitted with.
  const std::string log = s.log();
  EXPECT_NE(log.find("request memory        64.00 MiB"), std::string::npos) << log;
  EXPECT_NE(log.find("64 connections x 256 KiB"), std::string::npos) << log;
  const Response t = s.post("/tokenize", {{"content", "hello world, the cat sat on the mat\n"}});
  ASSERT_EQ(t.status, 200) << t.body;
  const json ids = json::parse(t.body)["tokens"];
  const Response one = s.post("/detokenize", {{"tokens", ids}});
  ASSERT_EQ(one.status, 200) << one.body;
  const std::string piece = json::parse(one.body)["content"];
  json many = json::array();
  for (int i = 0; i < 20000; ++i)
    for (const json& id : ids) many.push_back(id);
  const Response all = s.post("/detokenize", {{"tokens", many}});
  ASSERT_EQ(all.status, 200) << all.body.substr(0, 300);
  EXPECT_EQ(all.headers.count("content-length"), 0u) << "the answer was built whole";
  const std::string content = json::parse(all.body)["content"];
  ASSERT_EQ(content.size(), piece.size() * 20000);
  for (size_t i = 0; i < content.size(); i += piece.size()) ASSERT_EQ(content.compare(i, piece.size(), piece), 0) << i;
  // 3 MiB of text charges 3 MiB + its tree + 24 x 3 MiB of tokenization: more than 64 MiB.
  const Response big = s.post("/tokenize", {{"content", std::string(3 << 20, 'a')}});
  EXPECT_EQ(big.status, 413) << big.body.substr(0, 300);
  EXPECT_NE(big.body.find("--request-memory"), std::string::npos) << big.body;
  EXPECT_EQ(s.post("/tokenize", {{"content", "still serving"}}).status, 200);
}

// Issue 53 finding 3's attack: tokenize, detokenize, count_tokens and chats at once, large
// bodies. Every answer is a whole 200 or a refusal (503 + Retry-After, 413), the pool is never
// over-taken, and the process grows by no more than the pool and the per-thread slack.
TEST(ServerRequestMemory, AMixOfEndpointsStaysInsideThePool) {
  constexpr uint64_t kPoolMiB = 64, kSlackMiB = 40;
  Server s({"--request-memory", std::to_string(kPoolMiB) + "MiB", "--parallel", "4", "--max-body", "8MiB"});
  const std::string text((3 << 20) / 2, 'x');
  json ids = json::array();
  while (ids.size() < (2u << 20)) ids.push_back(1 + ids.size() % 200);
  const std::vector<std::pair<std::string, json>> kinds = {
      {"/tokenize", {{"content", text}, {"with_pieces", true}}},
      {"/detokenize", {{"tokens", ids}}},
      {"/v1/messages/count_tokens",
       {{"model", "m"}, {"max_tokens", 4}, {"messages", json::array({{{"role", "user"}, {"content", text}}})}}},
      {"/v1/chat/completions",
       {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 8}, {"temperature", 0}}},
  };
  const uint64_t idle_hwm = status_kib(s.pid(), "VmHWM");
  std::vector<std::thread> threads;
  std::vector<int> statuses(16);
  for (size_t i = 0; i < statuses.size(); ++i)
    threads.emplace_back([&, i] {
      const auto& [path, body] = kinds[i % kinds.size()];
      const Response r = s.post(path, body);
      statuses[i] = r.status;
      if (r.status == 200) {
        EXPECT_TRUE(json::accept(r.body)) << path << ": not a whole answer";
      } else {
        EXPECT_TRUE(r.status == 503 || r.status == 413) << path << ": " << r.status << " " << r.body.substr(0, 200);
        if (r.status == 503) {
          EXPECT_TRUE(r.headers.count("retry-after")) << path;
        }
      }
    });
  for (auto& t : threads) t.join();
  int ok = 0;
  for (const int st : statuses) ok += st == 200;
  EXPECT_GE(ok, 4) << "nothing but refusals";
  EXPECT_LE(metric(s, "sluice_request_memory_peak_bytes"), (double)(kPoolMiB << 20));
  EXPECT_EQ(metric(s, "sluice_request_memory_used_bytes"), 0) << "a lease was not given back";
  const uint64_t grew = (status_kib(s.pid(), "VmHWM") - idle_hwm) / 1024;
  std::printf("mix of 16 requests (%d served) under a %llu MiB request memory: peak RSS +%llu MiB\n", ok,
              (unsigned long long)kPoolMiB, (unsigned long long)grew);
  if (!kSanitized) {
    EXPECT_LE(grew, kPoolMiB + kSlackMiB) << "the server grew past its request memory";
  }
}

}  // namespace
