// /tokenize inside the memory budget (issue 9, item 3): four concurrent requests at the largest
// body the server accepts (8 MiB, with_pieces) must not take the server's peak RSS more than
// kBoundMiB above its peak before them, and its RSS must come back down afterwards. At most
// max_token_requests (2) of them run at once; the others get 503 + Retry-After.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server_harness.h"

namespace {

using namespace sluice::test;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;  // shadow memory and the quarantine make RSS meaningless
#else
constexpr bool kSanitized = false;
#endif

// Peak growth allowed: two running requests, each holding its body, the parsed body, the
// tokenizer's piece and id vectors and one write buffer (measured: +289 MiB for the two; the
// old code, which built the answer as a JSON tree, peaked at +13.4 GiB).
constexpr uint64_t kBoundMiB = 400;
// RSS allowed above idle once they are done: the server trims after large requests, but the
// transport frees the last bodies after that (measured: +53 MiB; the old code kept +4.9 GiB).
constexpr uint64_t kSettleMiB = 96;

struct Result {
  int status = 0;
  size_t bytes = 0;
  std::string head, tail;
};

// Posts raw and reads the whole response, keeping only its head and the last bytes.
Result post_counting(int port, const std::string& raw) {
  Result r;
  const int fd = connect_to(port);
  if (fd < 0) return r;
  send_all(fd, raw);
  std::string first;
  char buf[65536];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    if (first.size() < 4096) first.append(buf, (size_t)n);
    r.bytes += (size_t)n;
    r.tail = (r.tail + std::string(buf, (size_t)n));
    if (r.tail.size() > 64) r.tail = r.tail.substr(r.tail.size() - 64);
  }
  ::close(fd);
  std::sscanf(first.c_str(), "HTTP/1.1 %d", &r.status);
  r.head = first.substr(0, first.find("\r\n\r\n"));
  return r;
}

TEST(TokenizeMemory, ConcurrentMaxSizeRequestsStayBounded) {
  Server s({});
  // The largest body the server takes (--max-body 8MiB): ordinary text, many small tokens.
  const std::string prefix = R"({"with_pieces":true,"content":")", suffix = "\"}";
  const std::string pattern = "The cat 42 sat; on the mat.\\n";
  std::string content;
  while (content.size() + pattern.size() + prefix.size() + suffix.size() < (8u << 20)) content += pattern;
  const std::string raw = request_text("POST", "/tokenize", prefix + content + suffix);
  const uint64_t idle_hwm = status_kib(s.pid(), "VmHWM"), idle_rss = status_kib(s.pid(), "VmRSS");

  std::vector<Result> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results) threads.emplace_back([&] { r = post_counting(s.port(), raw); });
  for (auto& t : threads) t.join();
  int ok = 0;
  for (const auto& r : results) {
    if (r.status == 200) {
      ++ok;
      EXPECT_GT(r.bytes, 1u << 20);
      EXPECT_EQ(r.tail.substr(r.tail.size() - 3), "}]}") << "a whole JSON body";
    } else {
      EXPECT_EQ(r.status, 503) << r.head;
      EXPECT_NE(r.head.find("Retry-After"), std::string::npos) << r.head;
    }
  }
  EXPECT_GE(ok, 1);
  const uint64_t peak_hwm = status_kib(s.pid(), "VmHWM");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const uint64_t after_rss = status_kib(s.pid(), "VmRSS");
  std::printf("tokenize x4 (%d served): idle RSS %llu MiB, peak RSS %llu -> %llu MiB (+%llu), after %llu MiB\n", ok,
              (unsigned long long)idle_rss / 1024, (unsigned long long)idle_hwm / 1024,
              (unsigned long long)peak_hwm / 1024, (unsigned long long)(peak_hwm - idle_hwm) / 1024,
              (unsigned long long)after_rss / 1024);
  // Still serving, and a small request is answered whole (Content-Length, keep-alive).
  const Response small = s.post("/tokenize", {{"content", "hello"}});
  EXPECT_EQ(small.status, 200);
  EXPECT_TRUE(small.headers.count("content-length"));
  if (kSanitized) GTEST_SKIP() << "RSS under AddressSanitizer includes shadow memory; checked in the optimized build";
  EXPECT_LT(peak_hwm - idle_hwm, kBoundMiB * 1024) << "peak RSS grew by " << (peak_hwm - idle_hwm) / 1024 << " MiB";
  EXPECT_LT(after_rss, idle_rss + kSettleMiB * 1024) << "RSS stayed at " << after_rss / 1024 << " MiB";
}

}  // namespace

namespace {

// Two clients each sending /tokenize requests one after another, on fresh connections, never
// exceed the two places, but a place is given back only after its answer was written: the next
// request of one client could arrive while the thread of its last still held the place, and was
// refused. A request now waits briefly for a place before it is refused.
// The status of a request whose answer is read only up to its Content-Length, as a client that
// reuses or drops the connection does, without waiting for the server to close it.
int post_until_answered(int port, const std::string& raw) {
  const int fd = connect_to(port);
  if (fd < 0) return 0;
  send_all(fd, raw);
  std::string got;
  char buf[4096];
  int status = 0;
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, (size_t)n);
    const size_t end = got.find("\r\n\r\n");
    if (end == std::string::npos) continue;
    std::sscanf(got.c_str(), "HTTP/1.1 %d", &status);
    const size_t cl = got.find("Content-Length: ");
    if (cl != std::string::npos && cl < end && got.size() >= end + 4 + std::stoul(got.substr(cl + 16))) break;
  }
  ::close(fd);
  return status;
}

TEST(TokenizeSlots, TwoClientsInALoopAreNeverRefused) {
  Server s({});
  const std::string body = R"({"content": "the cat sat on the mat"})";
  std::vector<int> refused(2, 0), other(2, 0);
  std::vector<std::thread> clients;
  for (int c = 0; c < 2; ++c)
    clients.emplace_back([&, c] {
      for (int i = 0; i < 300; ++i) {
        const int status = post_until_answered(s.port(), request_text("POST", "/tokenize", body));
        if (status == 503) ++refused[c];
        else if (status != 200) ++other[c];
      }
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(refused[0] + refused[1], 0) << "of 600 requests";
  EXPECT_EQ(other[0] + other[1], 0);
}

}  // namespace
