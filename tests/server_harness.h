// Raw-HTTP helpers for the tests that run `sluice serve` as a child process on the tiny model:
// a server on an ephemeral port, requests written by hand, responses and SSE streams parsed
// strictly (so framing mistakes fail the test). Shared by every server test file.
#pragma once
#include <algorithm>
#include <fstream>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace sluice::test {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

// from: the loopback source address, host order (127.0.0.2 for "another client than the rest").
inline int connect_to(int port, uint32_t from = INADDR_LOOPBACK) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (from != INADDR_LOOPBACK) {
    sockaddr_in b{};
    b.sin_family = AF_INET;
    b.sin_addr.s_addr = htonl(from);
    if (::bind(fd, (sockaddr*)&b, sizeof b) != 0) {
      ::close(fd);
      return -1;
    }
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, (sockaddr*)&a, sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += (size_t)n;
  }
}

inline std::string request_text(const std::string& method, const std::string& path, const std::string& body,
                         const std::string& extra_headers = "") {
  return method + " " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\n" +
         extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Reads until EOF (requests say Connection: close) or the timeout.
inline std::string read_all(int fd, double timeout_s = 60) {
  std::string out;
  const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
  char buf[16384];
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, (size_t)n);
  }
  return out;
}

// A field of /proc/PID/status in bytes' KiB (VmRSS, VmHWM), 0 when absent.
inline uint64_t status_kib(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1));
  return 0;
}

inline Response parse_response(const std::string& raw) {
  Response r;
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return r;
  std::sscanf(raw.c_str(), "HTTP/1.1 %d", &r.status);
  size_t pos = raw.find("\r\n") + 2;
  while (pos < end) {
    const size_t e = raw.find("\r\n", pos);
    const std::string line = raw.substr(pos, e - pos);
    const size_t colon = line.find(':');
    std::string name = line.substr(0, colon);
    for (char& c : name) c = (char)std::tolower((unsigned char)c);
    r.headers[name] = line.substr(colon + 2);
    pos = e + 2;
  }
  r.body = raw.substr(end + 4);
  return r;
}

class Server {
 public:
  // Starts `sluice serve` on the tiny model with extra flags; waits for /health 200.
  // file_size_limit: RLIMIT_FSIZE for the server process alone (bytes), as `ulimit -f` sets it.
  explicit Server(const std::vector<std::string>& flags, rlim_t file_size_limit = RLIM_INFINITY) {
    dir_ = std::filesystem::temp_directory_path() / ("sluice_server_test_" + std::to_string(::getpid()) + "_" +
                                                     std::to_string(counter_++));
    std::filesystem::create_directories(dir_);
    model_ = (dir_ / "tiny.gguf").string();
    // SLUICE_SERVER_BINARY runs these tests against another build (e.g. an older one, to see a
    // regression test fail there).
    const char* other = std::getenv("SLUICE_SERVER_BINARY");
    const std::string binary = other && *other ? other : SLUICE_BINARY;
    const std::string make = binary + " make-model --preset tiny -o " + model_ + " >/dev/null";
    if (std::system(make.c_str()) != 0) throw std::runtime_error("make-model failed");
    int pipefd[2];
    if (::pipe(pipefd) != 0) throw std::runtime_error("pipe");
    pid_ = ::fork();
    if (pid_ == 0) {
      // The server dies with the test process: a test that aborts (an assertion under ASan)
      // must not leave a server holding ctest's output pipe open until the timeout.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (file_size_limit != RLIM_INFINITY) {
        const rlimit fsize{file_size_limit, file_size_limit};
        ::setrlimit(RLIMIT_FSIZE, &fsize);
      }
      ::dup2(pipefd[1], 2);
      ::close(pipefd[0]);
      ::close(pipefd[1]);
      std::vector<std::string> args = {binary, "serve", "-m", model_, "--port", "0", "--allow-swap"};
      // Exact cached_tokens unless a test asks for the server's default rounding (the tests that
      // check what a request reused compare counts to the token).
      if (std::find(flags.begin(), flags.end(), "--cached-tokens-granularity") == flags.end())
        args.insert(args.end(), {"--cached-tokens-granularity", "1"});
      args.insert(args.end(), flags.begin(), flags.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      _exit(127);
    }
    ::close(pipefd[1]);
    err_fd_ = pipefd[0];
    // The bound port comes on stderr.
    const std::string marker = "listening on http://127.0.0.1:";
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    auto bound = [&] { return log_.find(marker) != std::string::npos && log_.find('\n', log_.find(marker)) != std::string::npos; };
    while (Clock::now() < deadline && !bound()) {
      pollfd p{err_fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(err_fd_, buf, sizeof buf);
      if (n <= 0) break;
      log_.append(buf, (size_t)n);
    }
    if (!bound()) throw std::runtime_error("server did not start: " + log_);
    port_ = std::stoi(log_.substr(log_.find(marker) + marker.size()));
    // From here on a thread drains stderr (the server logs a line per request: a full pipe
    // would stall it) into log_, for log().
    reader_ = std::thread([this] {
      char buf[4096];
      for (;;) {
        const ssize_t n = ::read(err_fd_, buf, sizeof buf);
        if (n <= 0) break;
        std::lock_guard lk(log_mu_);
        log_.append(buf, (size_t)n);
      }
    });
    while (Clock::now() < deadline && get("/health").status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ~Server() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
    if (reader_.joinable()) reader_.join();  // the pipe ends with the process
    if (err_fd_ >= 0) ::close(err_fd_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // SIGTERM, then the exit status (expected 0).
  int stop() {
    ::kill(pid_, SIGTERM);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  // Waits for the process to end (after a signal the test sent) and returns its exit status.
  int wait_exit() {
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  int port() const { return port_; }
  // Waits (up to timeout_s) until the server's stderr holds `needle`; the log, either way. The
  // server writes a request's log line before its response, but the reader thread may not have
  // read it yet when the response arrives.
  std::string wait_log(const std::string& needle, double timeout_s = 10) const {
    const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
    std::string l = log();
    while (l.find(needle) == std::string::npos && Clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      l = log();
    }
    return l;
  }
  // Everything the server wrote on stderr so far.
  std::string log() const {
    std::lock_guard lk(log_mu_);
    return log_;
  }
  pid_t pid() const { return pid_; }

  Response roundtrip(const std::string& raw, double timeout_s = 60, uint32_t from = INADDR_LOOPBACK) const {
    const int fd = connect_to(port_, from);
    if (fd < 0) return {};
    send_all(fd, raw);
    const std::string r = read_all(fd, timeout_s);
    ::close(fd);
    return parse_response(r);
  }
  Response get(const std::string& path) const { return roundtrip(request_text("GET", path, "")); }
  Response post(const std::string& path, const json& body, const std::string& headers = "") const {
    return roundtrip(request_text("POST", path, body.dump(), headers));
  }
  // Opens a streaming request and returns the socket without reading.
  int open_stream(const std::string& path, const json& body) const {
    const int fd = connect_to(port_);
    send_all(fd, request_text("POST", path, body.dump()));
    return fd;
  }

 private:
  static inline int counter_ = 0;
  std::filesystem::path dir_;
  std::string model_, log_;
  mutable std::mutex log_mu_;
  std::thread reader_;
  pid_t pid_ = -1;
  int err_fd_ = -1;
  int port_ = 0;
};


struct SseEvent {
  std::string name;   // "" for unnamed
  std::string data;
  bool comment = false;
};

// Splits an event-stream body into events; fails on framing errors (a line that is not
// "event:", "data:" or a comment; an event block not ended by a blank line).
inline std::vector<SseEvent> parse_sse(const std::string& body) {
  std::vector<SseEvent> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) {
      ADD_FAILURE() << "unterminated SSE event: " << body.substr(pos);
      break;
    }
    const std::string block = body.substr(pos, end - pos);
    pos = end + 2;
    SseEvent ev;
    size_t lp = 0;
    while (lp <= block.size()) {
      size_t le = block.find('\n', lp);
      if (le == std::string::npos) le = block.size();
      const std::string line = block.substr(lp, le - lp);
      lp = le + 1;
      if (line.rfind(": ", 0) == 0) ev.comment = true;
      else if (line.rfind("event: ", 0) == 0) ev.name = line.substr(7);
      else if (line.rfind("data: ", 0) == 0) ev.data = line.substr(6);
      else ADD_FAILURE() << "bad SSE line: " << line;
    }
    if (ev.comment) {
      EXPECT_TRUE(ev.data.empty() && ev.name.empty()) << "comment mixed into an event: " << block;
    }
    out.push_back(std::move(ev));
  }
  return out;
}


}  // namespace sluice::test
