// A small HTTP/1.1 server over POSIX sockets: one thread per connection, a bounded number of
// connections, bounded header and body sizes, keep-alive for ordinary responses and
// Connection: close for streams. Written here rather than taken from a library so that every
// buffer has a limit we chose and so a handler can ask, while it waits on the model, whether its
// client is still there (poll for hang-up) — the hook cancellation on disconnect needs.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/http_parse.h"
#include "server/request_memory.h"

namespace sluice::server {

// Connection slots. A connection is "reading" while it waits for or receives a request and
// "active" while its handler runs. Reading connections are the cheap ones to drop, so when the
// slots are full a new connection takes the place of a reading one (idle keep-alive first, then
// the one that has received the fewest bytes per second of its request, from the client address
// holding the most; none younger than 100 ms), and an address over max_reading_per_client loses
// its own slowest one: slow senders cannot lock others out, whatever steady rate they keep (a
// byte every 90 ms beat a rule that dropped only connections quiet for 100 ms). An honest client
// sends its head in one go, so it is never the slowest for long. Every request's head must arrive
// within header_timeout_ms and the whole request within request_timeout_ms. Requests for reserved_paths (/health, /metrics)
// keep reserved_connections slots that other active requests cannot take.
struct HttpLimits {
  size_t max_header_bytes = 64 * 1024;
  size_t max_body_bytes = 8u << 20;
  size_t max_connections = 64;       // open at once; beyond: a reading one is dropped, or 503
  size_t max_reading_per_client = 16;
  size_t reserved_connections = 4;
  std::vector<std::string> reserved_paths;
  int request_timeout_ms = 30000;    // head and body of one request, from its first byte (408)
  int header_timeout_ms = 10000;     // the head alone, from the same start (408; nginx's client_header_timeout)
  int idle_timeout_ms = 30000;       // keep-alive wait for the next request (then closed quietly)
  // The pool a body's bytes are taken from before it is read (nullptr: not charged).
  RequestMemory* memory = nullptr;
};

// One client connection, handed to the handler for one request. Writes are blocking and never
// raise SIGPIPE; once a write fails the connection is marked broken and later writes are no-ops.
class Connection {
 public:
  explicit Connection(int fd) : fd_(fd) {}
  bool write(std::string_view data);
  // True when the peer has closed or reset the connection (checked without blocking). A FIN
  // alone is not enough: it may be a half-close (the client finished sending and still reads).
  bool peer_gone();
  bool broken() const { return broken_; }
  // Bytes a streamed body can carry anywhere without changing it (an SSE comment), written to
  // tell a half-closed client from a gone one; none: such a body is not probed.
  void set_stream_probe(std::string bytes) { stream_probe_ = std::move(bytes); }
  // The handler decides whether the connection can carry another request afterwards.
  bool keep_alive = true;
  // A status line has gone out (an error found later can no longer change the status).
  bool responded = false;
  // The client speaks HTTP/1.1, so it may be sent an interim 1xx response.
  bool interim_ok = true;
  // What the request being handled holds of the server's request memory (its body, then what
  // its handler adds); given back when the handler returns.
  RequestMemory::Lease memory;
  // The cache scope of the request being handled (its API key's among several; 0: shared).
  uint64_t scope = 0;

 private:
  void probe();

  int fd_;
  bool broken_ = false;
  std::string stream_probe_;  // after the status line; before it the probe is a 102

  std::chrono::steady_clock::time_point probed_{};
};

// A complete response with a body (Content-Length). Extra headers are "Name: value" lines.
void send_response(Connection& c, int status, std::string_view content_type, std::string_view body,
                   const std::vector<std::string>& extra_headers = {});
// Status line and headers of a response whose body runs until the connection closes (SSE).
void send_stream_head(Connection& c, int status, std::string_view content_type,
                      const std::vector<std::string>& extra_headers = {});
const char* status_text(int status);

using Handler = std::function<void(const HttpRequest&, Connection&)>;

// Why the transport refused a request itself (the label of sluice_requests_rejected_total).
enum class Refusal { BadRequest, TooLarge, Timeout, Connections, RequestMemory };
const char* refusal_label(Refusal r);

class HttpServer {
 public:
  // on_reject (may be empty) hears the status of every request the transport refused itself
  // (400, 408, 411, 413, 431, 505; 503 for too many connections).
  HttpServer(HttpLimits limits, Handler handler, std::function<void(int status, Refusal why)> on_reject = {});
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
  // What the accept loop knows of each open connection (guarded by mu_).
  struct Slot {
    enum class Phase { Fresh, Idle, Reading, Active, Closing };
    std::string client;              // peer address
    // Fresh: no request yet; Idle: between keep-alive requests; Closing: answered, draining.
    Phase phase = Phase::Fresh;
    std::chrono::steady_clock::time_point since;          // when the phase began
    std::chrono::steady_clock::time_point last_progress;  // accept, or the last bytes received
    uint64_t received = 0;           // bytes received in this phase (the eviction's rate)
    bool reserved = false;           // Active on a reserved path
    bool evicted = false;            // dropped for a newer connection; its thread answers 503
    // Admitted beyond max_connections (no slot was free and none could be dropped) to read its
    // head: served only for a reserved path, or when a slot has come free by then.
    bool probation = false;
  };
  enum class Read { Ok, Closed, Timeout };

  void run_connection(int fd);
  // Reads the next request into buf (head and body); false when the connection is to end (the
  // answer, if one was owed, has been sent).
  // The body's bytes are taken from limits_.memory into conn.memory before it is read.
  bool read_request(int fd, Connection& conn, std::string& buf, bool first, HeadParse& hp);
  Read read_some(int fd, std::string& buf, std::chrono::steady_clock::time_point deadline, bool* got_lf);
  void set_phase(int fd, Slot::Phase phase);
  bool evicted(int fd);
  // Under mu_: the reading connection to drop for a new one (only_client: among that address's),
  // or -1.
  int pick_victim(const std::string* only_client);
  void evict(int fd);
  void reject(Connection& c, int status, Refusal why, const std::string& message);
  // Accept loop: 503 for a connection that gets no slot, then its fd lingers (input drained)
  // so the close does not reset the connection before the client read the answer.
  void refuse_at_accept(int fd);
  void drain_lingering(bool all_expired);

  HttpLimits limits_;
  Handler handler_;
  std::function<void(int, Refusal)> on_reject_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // self-pipe: stop() wakes the accept loop
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, Slot> open_;  // connection fds with a live thread
  size_t active_unreserved_ = 0;  // Active slots not on a reserved path
  struct Lingering {
    int fd;
    std::chrono::steady_clock::time_point until;
  };
  std::vector<Lingering> lingering_;  // accept-loop thread only
};

}  // namespace sluice::server
