// The HTTP transport in-process (no model): connection slots, eviction of slow senders, the
// request deadline, reserved slots for /health, and that a refusal reaches the client intact.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "server/http.h"

#include "server_harness.h"

namespace sluice::server {
namespace {

using Clock = std::chrono::steady_clock;

// 127.0.0.x source addresses are distinct clients to the server.
using sluice::test::connect_to;

void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += (size_t)n;
  }
}

// false when a write fails (errno says why).
bool send_all_checked(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += (size_t)n;
  }
  return true;
}

// Reads until EOF, an error or the timeout. `reset` tells whether the read ended in an error
// (a reset) rather than EOF.
std::string read_until_close(int fd, double timeout_s, bool* reset = nullptr, bool* closed = nullptr) {
  std::string out;
  const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[16384];
  if (reset) *reset = false;
  if (closed) *closed = false;
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && reset) *reset = true;
    if (n <= 0) {
      if (closed) *closed = true;
      break;
    }
    out.append(buf, (size_t)n);
  }
  return out;
}

int status_of(const std::string& raw) {
  int st = 0;
  return std::sscanf(raw.c_str(), "HTTP/1.1 %d", &st) == 1 ? st : 0;
}

// A transport whose handler answers at once, except on /block, which waits until release().
class Transport {
 public:
  explicit Transport(HttpLimits limits)
      : http_(std::move(limits), [this](const HttpRequest& r, Connection& c) { handle(r, c); }) {
    port_ = http_.listen("127.0.0.1", 0);
    thread_ = std::thread([this] { http_.serve(); });
  }
  ~Transport() {
    release();
    http_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  void release() {
    std::lock_guard lk(mu_);
    released_ = true;
    cv_.notify_all();
  }
  bool wait_blocked(int n) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, std::chrono::seconds(10), [&] { return blocked_ >= n; });
  }

 private:
  void handle(const HttpRequest& r, Connection& c) {
    if (r.path == "/block") {
      std::unique_lock lk(mu_);
      ++blocked_;
      cv_.notify_all();
      cv_.wait(lk, [&] { return released_; });
    }
    send_response(c, 200, "text/plain", "ok " + r.path);
  }
  HttpServer http_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  int blocked_ = 0;
  bool released_ = false;
};

HttpLimits small_limits() {
  HttpLimits l;
  l.max_connections = 4;
  l.max_reading_per_client = 4;
  l.reserved_connections = 0;
  l.request_timeout_ms = 5000;
  l.idle_timeout_ms = 5000;
  return l;
}

const std::string kGet = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

// Every slot busy with a running request: the next connection gets a 503 it can read, even
// though it sent a large body the server never reads (a close with unread input would reset
// the connection and destroy the answer).
TEST(HttpTransport, RefusalAtTheLimitReachesTheClient) {
  Transport t(small_limits());
  std::vector<int> busy;
  for (int i = 0; i < 4; ++i) {
    busy.push_back(connect_to(t.port()));
    send_all(busy.back(), "GET /block HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  }
  ASSERT_TRUE(t.wait_blocked(4));
  // The client writes its whole request before it reads, as most HTTP clients do; a server that
  // closes on unread input resets the connection and the write fails before the answer is read.
  const int fd = connect_to(t.port());
  const std::string body(2 << 20, 'a');
  bool wrote = send_all_checked(fd, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
                                        "\r\n\r\n");
  for (size_t off = 0; wrote && off < body.size(); off += 32768) {
    wrote = send_all_checked(fd, body.substr(off, 32768));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(wrote) << "the request write failed: " << std::strerror(errno);
  bool reset = false;
  const std::string got = read_until_close(fd, 5, &reset);
  EXPECT_EQ(status_of(got), 503) << "reset: " << reset << ", got: " << got;
  EXPECT_NE(got.find("too many open connections"), std::string::npos);
  EXPECT_NE(got.find("Retry-After: 1"), std::string::npos);
  ::close(fd);
  t.release();
  for (int b : busy) {
    EXPECT_EQ(status_of(read_until_close(b, 5)), 200);
    ::close(b);
  }
}

// Connections that never finish their request hold every slot; a new client still gets in
// (the quietest slow one is dropped with a 503 it can read).
TEST(HttpTransport, SlowSendersDoNotLockOutNewClients) {
  Transport t(small_limits());
  std::vector<int> slow;
  for (int i = 0; i < 4; ++i) {
    slow.push_back(connect_to(t.port()));
    send_all(slow.back(), "GET /health HTTP/1.1\r\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // quiet long enough to be dropped
  const auto t0 = Clock::now();
  const int fd = connect_to(t.port());
  send_all(fd, kGet);
  const std::string got = read_until_close(fd, 5);
  EXPECT_EQ(status_of(got), 200) << got;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
  ::close(fd);
  const std::string first = read_until_close(slow[0], 2);
  EXPECT_EQ(status_of(first), 503) << "the quietest slow connection is the one dropped: " << first;
  EXPECT_NE(first.find("slowest still sending"), std::string::npos);
  for (int s : slow) ::close(s);
}

// The deadline covers the whole head: a header line every 300 ms does not keep a request alive
// past request_timeout_ms.
TEST(HttpTransport, RequestDeadlineCoversTheWholeHead) {
  HttpLimits l = small_limits();
  l.request_timeout_ms = 1000;
  Transport t(l);
  const int fd = connect_to(t.port());
  const auto t0 = Clock::now();
  send_all(fd, "GET /health HTTP/1.1\r\n");
  std::atomic<bool> done{false};
  std::thread drip([&] {
    for (int i = 0; i < 20 && !done; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      send_all(fd, "X-Slow-" + std::to_string(i) + ": a\r\n");
    }
  });
  const std::string got = read_until_close(fd, 8);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  done = true;
  drip.join();
  EXPECT_EQ(status_of(got), 408) << got;
  EXPECT_NE(got.find("--request-timeout"), std::string::npos);
  EXPECT_LT(took, 3.0);
  ::close(fd);
}

// One address with many slow connections loses its own oldest one; another address's slow
// connections are left alone.
TEST(HttpTransport, OneAddressHoldsOnlyItsShareOfReadingSlots) {
  HttpLimits l = small_limits();
  l.max_connections = 8;
  l.max_reading_per_client = 2;
  Transport t(l);
  std::vector<int> other;
  for (int i = 0; i < 2; ++i) {
    other.push_back(connect_to(t.port(), 0x7f000002));
    ASSERT_GE(other.back(), 0);
    send_all(other.back(), "GET /health HTTP/1.1\r\n");
  }
  std::vector<int> mine;
  for (int i = 0; i < 3; ++i) {
    mine.push_back(connect_to(t.port()));
    send_all(mine.back(), "GET /health HTTP/1.1\r\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the first is the quietest
  }
  EXPECT_EQ(status_of(read_until_close(mine[0], 2)), 503);
  for (int o : other) {
    bool closed = true;
    read_until_close(o, 0.3, nullptr, &closed);
    EXPECT_FALSE(closed) << "another address's connection was dropped";
    send_all(o, "Host: x\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(status_of(read_until_close(o, 5)), 200);
    ::close(o);
  }
  for (int m : mine) ::close(m);
}

// A burst of new connections from one address fills every slot, and none of them goes quiet
// long enough to be dropped (each keeps sending a header line every 30 ms). Another client's
// /health still gets in: a reserved slot admits a connection beyond the limit to read its head.
// A request on another path admitted that way finds no room and is refused with a 503.
TEST(HttpTransport, ConnectionBurstDoesNotLockOutHealth) {
  HttpLimits l = small_limits();
  l.max_connections = 8;
  l.max_reading_per_client = 2;
  l.reserved_connections = 2;
  l.reserved_paths = {"/health"};
  Transport t(l);
  std::vector<int> burst;
  for (int i = 0; i < 10; ++i) {  // beyond the limit: the last ones are refused or on probation
    burst.push_back(connect_to(t.port()));
    send_all(burst.back(), "GET /health HTTP/1.1\r\n");
  }
  std::atomic<bool> done{false};
  std::thread drip([&] {
    for (int i = 0; !done; ++i) {
      for (int b : burst) send_all(b, "X-Drip-" + std::to_string(i) + ": a\r\n");
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the burst is older than the eviction grace
  for (int round = 0; round < 3; ++round) {
    const int fd = connect_to(t.port(), 0x7f000002);
    ASSERT_GE(fd, 0);
    send_all(fd, kGet);
    const std::string got = read_until_close(fd, 5);
    EXPECT_EQ(status_of(got), 200) << "round " << round << ": " << got;
    ::close(fd);
  }
  // Any other request gets in too: the burst, older than the grace and still sending its heads a
  // line at a time, is slower than a client that sends its head at once, so one of them is
  // dropped for it (issue 53 finding 4; before, dripping kept them safe and this was a 503).
  const int fd = connect_to(t.port(), 0x7f000003);
  ASSERT_GE(fd, 0);
  send_all(fd, "GET /other HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string other = read_until_close(fd, 5);
  EXPECT_NE(status_of(other), 503) << other;
  ::close(fd);
  done = true;
  drip.join();
  for (int b : burst) ::close(b);
}

// Running requests cannot take the slots kept for reserved paths.
TEST(HttpTransport, ReservedSlotsKeepHealthAnswerable) {
  HttpLimits l = small_limits();
  l.reserved_connections = 1;
  l.reserved_paths = {"/health"};
  Transport t(l);
  std::vector<int> busy;
  for (int i = 0; i < 3; ++i) {
    busy.push_back(connect_to(t.port()));
    send_all(busy.back(), "GET /block HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  }
  ASSERT_TRUE(t.wait_blocked(3));
  int fd = connect_to(t.port());
  send_all(fd, "GET /block HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string refused = read_until_close(fd, 5);
  EXPECT_EQ(status_of(refused), 503) << refused;
  EXPECT_NE(refused.find("kept for /health"), std::string::npos);
  ::close(fd);
  fd = connect_to(t.port());
  send_all(fd, kGet);
  EXPECT_EQ(status_of(read_until_close(fd, 5)), 200);
  ::close(fd);
  t.release();
  for (int b : busy) ::close(b);
}

}  // namespace
}  // namespace sluice::server
