// A small HTTP/1.1 server over POSIX sockets: one thread per connection, a bounded number of
// connections, bounded header and body sizes, keep-alive for ordinary responses and
// Connection: close for streams. Written here rather than taken from a library so that every
// buffer has a limit we chose and so a handler can ask, while it waits on the model, whether its
// client is still there (poll for hang-up) — the hook cancellation on disconnect needs.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice::server {

struct HttpRequest {
  std::string method;   // "GET", "POST", ...
  std::string target;   // as sent: path plus query
  std::string path;     // without the query string
  std::string query;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  // The first header with this (lower-case) name, or "".
  std::string header(std::string_view name) const;
};

struct HttpLimits {
  size_t max_header_bytes = 64 * 1024;
  size_t max_body_bytes = 8u << 20;
  size_t max_connections = 64;     // beyond: 503 at once, then close
  int idle_timeout_s = 30;         // keep-alive wait for the next request / slow body reads
};

// One client connection, handed to the handler for one request. Writes are blocking and never
// raise SIGPIPE; once a write fails the connection is marked broken and later writes are no-ops.
class Connection {
 public:
  explicit Connection(int fd) : fd_(fd) {}
  bool write(std::string_view data);
  // True when the peer has closed or reset the connection (checked without blocking).
  bool peer_gone();
  bool broken() const { return broken_; }
  // The handler decides whether the connection can carry another request afterwards.
  bool keep_alive = true;
  // A status line has gone out (an error found later can no longer change the status).
  bool responded = false;

 private:
  int fd_;
  bool broken_ = false;
};

// A complete response with a body (Content-Length). Extra headers are "Name: value" lines.
void send_response(Connection& c, int status, std::string_view content_type, std::string_view body,
                   const std::vector<std::string>& extra_headers = {});
// Status line and headers of a response whose body runs until the connection closes (SSE).
void send_stream_head(Connection& c, int status, std::string_view content_type);
const char* status_text(int status);

using Handler = std::function<void(const HttpRequest&, Connection&)>;

class HttpServer {
 public:
  // on_reject (may be empty) hears the status of every request the transport refused itself
  // (413, 431, 400, 411, 503 for too many connections).
  HttpServer(HttpLimits limits, Handler handler, std::function<void(int status)> on_reject = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens; port 0 picks a free one. Returns the bound port. Throws Error.
  uint16_t listen(const std::string& host, uint16_t port);
  // Accepts until stop(); returns after every connection thread has finished.
  void serve();
  // From any thread (not from a signal handler): stops accepting and shuts every open
  // connection down so the threads return.
  void stop();

 private:
  void run_connection(int fd);
  void reject(Connection& c, int status, const std::string& message);

  HttpLimits limits_;
  Handler handler_;
  std::function<void(int)> on_reject_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // self-pipe: stop() wakes the accept loop
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<int> open_;      // connection fds with a live thread
};

}  // namespace sluice::server
