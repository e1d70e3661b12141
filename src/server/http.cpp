// HTTP/1.1 transport: request parsing with fixed limits, response writing, connection threads.
#include "server/http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/format_bytes.h"

namespace sluice::server {

const char* status_text(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

bool Connection::write(std::string_view data) {
  while (!broken_ && !data.empty()) {
    const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      broken_ = true;
      break;
    }
    data.remove_prefix((size_t)n);
  }
  return !broken_;
}

// A half-close (shutdown(SHUT_WR) after the request, legal HTTP/1.1) and a closed socket both
// arrive as a FIN; only a write tells them apart. So after a FIN the connection is probed with
// bytes that do not change the answer: a socket closed altogether answers with a reset, which the
// next check sees as POLLHUP/POLLERR (within one poll of the follower, ~200 ms); a half-closed
// client reads on and gets its answer. Before the status line the probe is an interim
// "102 Processing" response (clients must skip 1xx responses they do not expect, RFC 9110 15.2).
bool Connection::peer_gone() {
  if (broken_) return true;
  pollfd p{fd_, (short)(POLLIN | POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;  // a reset, or both directions closed
  bool fin = (p.revents & POLLRDHUP) != 0;
  if (!fin && (p.revents & POLLIN)) {
    // Readable: a pipelined request (peer still there), an end of file, or an error.
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    fin = n == 0;
  }
  if (fin) probe();
  return broken_;
}

void Connection::probe() {
  const auto now = std::chrono::steady_clock::now();
  if (now - probed_ < std::chrono::milliseconds(500)) return;
  probed_ = now;
  if (!responded && !interim_ok) {
    broken_ = true;  // nothing may be sent to an HTTP/1.0 client before its answer: taken as gone
  } else if (!responded) {
    write("HTTP/1.1 102 Processing\r\n\r\n");
  } else if (!stream_probe_.empty()) {
    write(stream_probe_);
  }
}

void send_response(Connection& c, int status, std::string_view content_type, std::string_view body,
                   const std::vector<std::string>& extra_headers) {
  c.responded = true;
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + status_text(status) + "\r\n";
  head += "Content-Type: " + std::string(content_type) + "\r\n";
  head += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  head += "Server: sluice\r\n";
  for (const auto& h : extra_headers) head += h + "\r\n";
  head += c.keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  head += "\r\n";
  if (body.size() < 64 * 1024) {
    head += body;  // one send: small responses leave in one segment
    c.write(head);
  } else {
    c.write(head) && c.write(body);
  }
}

void send_stream_head(Connection& c, int status, std::string_view content_type,
                      const std::vector<std::string>& extra_headers) {
  c.keep_alive = false;  // the body ends when the connection closes
  c.responded = true;
  if (content_type == "text/event-stream") c.set_stream_probe(":\n\n");  // an SSE comment
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + status_text(status) + "\r\n";
  head += "Content-Type: " + std::string(content_type) + "\r\n";
  for (const auto& h : extra_headers) head += h + "\r\n";
  head += "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\nServer: sluice\r\nConnection: close\r\n\r\n";
  c.write(head);
}

namespace {

using Clock = std::chrono::steady_clock;

std::string json_error(int status, const std::string& message) {
  nlohmann::json j = {{"error",
                       {{"message", message},
                        {"type", status == 503 ? "unavailable_error" : "invalid_request_error"},
                        {"code", status}}}};
  return j.dump();
}

void set_socket_options(int fd) {
  // A client that stops reading a stream makes writes fail after this long, which cancels its
  // generation instead of blocking the handler forever. (Reads wait with poll and a deadline.)
  timeval wtv{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &wtv, sizeof wtv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string peer_address(const sockaddr_storage& ss) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &((const sockaddr_in*)&ss)->sin_addr, text, sizeof text);
  } else if (ss.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &((const sockaddr_in6*)&ss)->sin6_addr, text, sizeof text);
  }
  return text;
}

std::string join(const std::vector<std::string>& paths) {
  std::string out;
  for (const std::string& p : paths) out += (out.empty() ? "" : ", ") + p;
  return out.empty() ? "reserved paths" : out;
}

// Reads and discards what the peer still sends; false once it has closed (or failed).
bool discard_input(int fd) {
  char tmp[16 * 1024];
  while (true) {
    const ssize_t n = ::recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

// A connection refused at accept: how long its input is drained before the close, and how many
// such connections may linger at once (beyond: the oldest is closed).
constexpr auto kLinger = std::chrono::seconds(1);
constexpr size_t kMaxLingering = 128;
// A reading connection is dropped for a new one only after it has sent nothing for this long.
constexpr auto kMinQuietToEvict = std::chrono::milliseconds(100);

}  // namespace

const char* refusal_label(Refusal r) {
  switch (r) {
    case Refusal::BadRequest: return "bad_request";
    case Refusal::TooLarge: return "too_large";
    case Refusal::Timeout: return "timeout";
    case Refusal::Connections: return "connections";
    case Refusal::RequestMemory: return "request_memory";
  }
  return "bad_request";
}

HttpServer::HttpServer(HttpLimits limits, Handler handler, std::function<void(int, Refusal)> on_reject)
    : limits_(std::move(limits)), handler_(std::move(handler)), on_reject_(std::move(on_reject)) {
  if (::pipe(wake_) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
}

HttpServer::~HttpServer() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (const Lingering& l : lingering_) ::close(l.fd);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

uint16_t HttpServer::listen(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res);
  if (rc != 0) throw Error("--host " + host + ": " + gai_strerror(rc));
  std::string last = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      listen_fd_ = fd;
      break;
    }
    last = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (listen_fd_ < 0) throw Error("cannot listen on " + host + ":" + port_s + ": " + last);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(listen_fd_, (sockaddr*)&ss, &len);
  if (ss.ss_family == AF_INET6) return ntohs(((sockaddr_in6*)&ss)->sin6_port);
  return ntohs(((sockaddr_in*)&ss)->sin_port);
}

int HttpServer::pick_victim(const std::string* only_client) {
  std::map<std::string, size_t> reading;  // per address: its connections that are not Active
  for (const auto& [fd, s] : open_)
    if (!s.evicted && !s.probation && s.phase != Slot::Phase::Active && s.phase != Slot::Phase::Closing)
      reading[s.client]++;
  const auto now = Clock::now();
  int best = -1;
  std::tuple<size_t, bool, double> best_key{};
  for (const auto& [fd, s] : open_) {
    if (s.evicted || s.probation || s.phase == Slot::Phase::Active || s.phase == Slot::Phase::Closing) continue;
    if (only_client && s.client != *only_client) continue;
    // A connection accepted (or a request begun) a moment ago has had no time to send; dropping it
    // would punish a client for our own scheduling.
    const auto age = now - s.since;
    if (s.phase != Slot::Phase::Idle && age < kMinQuietToEvict) continue;
    // Bytes waiting in the socket: the client did send, its thread has not read yet (two busy
    // cores can delay that past the grace above). Ours is the slowness, not the client's.
    int unread = 0;
    if (::ioctl(fd, FIONREAD, &unread) == 0 && unread > 0) continue;
    // The address holding most reading connections first, then idle keep-alives (nothing is
    // owed to them), then the one that has used the most time for the least of its request.
    const double seconds = std::chrono::duration<double>(age).count();
    const std::tuple<size_t, bool, double> key{reading[s.client], s.phase == Slot::Phase::Idle,
                                               -(double)s.received / std::max(seconds, 1e-3)};
    if (best < 0 || key > best_key) {
      best = fd;
      best_key = key;
    }
  }
  return best;
}

void HttpServer::evict(int fd) {
  open_.at(fd).evicted = true;
  // The thread's pending read returns at once (end of input); it sees the flag and answers.
  ::shutdown(fd, SHUT_RD);
}

void HttpServer::refuse_at_accept(int fd) {
  if (on_reject_) on_reject_(503, Refusal::Connections);
  std::string r = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nServer: sluice\r\n"
                  "Retry-After: 1\r\nConnection: close\r\n";
  const std::string body = json_error(503, "too many open connections (" + std::to_string(limits_.max_connections) +
                                               ", all busy with requests)");
  r += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  // Small enough for an empty socket buffer: one non-blocking send, never stalls the accept loop.
  [[maybe_unused]] const ssize_t n = ::send(fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(fd, SHUT_WR);
  if (lingering_.size() >= kMaxLingering) {
    ::close(lingering_.front().fd);
    lingering_.erase(lingering_.begin());
  }
  lingering_.push_back({fd, Clock::now() + kLinger});
}

void HttpServer::drain_lingering(bool all_expired) {
  const auto now = Clock::now();
  std::erase_if(lingering_, [&](const Lingering& l) {
    if (all_expired || now >= l.until || !discard_input(l.fd)) {
      ::close(l.fd);
      return true;
    }
    return false;
  });
}

void HttpServer::serve() {
  std::vector<pollfd> fds;
  while (!stopping_) {
    fds.assign({{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}});
    int timeout = -1;
    for (const Lingering& l : lingering_) {
      fds.push_back({l.fd, POLLIN, 0});
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(l.until - Clock::now()).count();
      timeout = std::max(0, timeout < 0 ? (int)ms : std::min(timeout, (int)ms));
    }
    if (::poll(fds.data(), fds.size(), timeout) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (stopping_ || (fds[1].revents & POLLIN)) break;
    if (!lingering_.empty()) drain_lingering(false);
    if (!(fds[0].revents & POLLIN)) continue;
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof peer;
    const int fd = ::accept4(listen_fd_, (sockaddr*)&peer, &peer_len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    set_socket_options(fd);
    const std::string client = peer_address(peer);
    std::unique_lock lk(mu_);
    size_t live = 0, client_reading = 0, probation = 0;
    bool client_on_probation = false;
    for (const auto& [f, s] : open_) {
      if (s.evicted || s.phase == Slot::Phase::Closing) continue;
      if (s.probation) {
        ++probation;
        client_on_probation |= s.client == client;
        continue;
      }
      ++live;
      if (s.client == client && s.phase != Slot::Phase::Active) ++client_reading;
    }
    // Evicted connections still hold a thread until their answer is out; bound those too.
    const bool too_many_threads = open_.size() >= 2 * limits_.max_connections;
    // Over its share, an address loses its own quietest connection; with none quiet enough the
    // new one still comes in if the server has room (the share bounds what slow senders hold).
    if (!too_many_threads && client_reading >= limits_.max_reading_per_client) {
      if (const int v = pick_victim(&client); v >= 0) {
        evict(v);
        --live;
      }
    }
    if (!too_many_threads && live >= limits_.max_connections) {
      if (const int v = pick_victim(nullptr); v >= 0) {
        evict(v);
        --live;
      }
    }
    // Every slot holds a connection that is still making progress (a burst of new ones, all
    // younger than the eviction grace): the reserved slots admit a few more, one per address, to
    // read their heads, so /health and /metrics answer during the burst.
    const bool on_probation = !too_many_threads && live >= limits_.max_connections;
    if (too_many_threads ||
        (on_probation && (probation >= limits_.reserved_connections || client_on_probation))) {
      lk.unlock();
      refuse_at_accept(fd);
      continue;
    }
    const auto now = Clock::now();
    open_[fd] = Slot{client, Slot::Phase::Fresh, now, now, false, false, on_probation};
    lk.unlock();
    std::thread([this, fd] { run_connection(fd); }).detach();
  }
  drain_lingering(true);
  std::unique_lock lk(mu_);
  for (const auto& [fd, s] : open_) ::shutdown(fd, SHUT_RDWR);
  cv_.wait(lk, [&] { return open_.empty(); });
}

void HttpServer::stop() {
  stopping_ = true;
  const char b = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_[1], &b, 1);
  std::lock_guard lk(mu_);
  for (const auto& [fd, s] : open_) ::shutdown(fd, SHUT_RDWR);
}

void HttpServer::reject(Connection& c, int status, Refusal why, const std::string& message) {
  if (on_reject_) on_reject_(status, why);
  c.keep_alive = false;
  send_response(c, status, "application/json", json_error(status, message),
                status == 503 ? std::vector<std::string>{"Retry-After: 1"} : std::vector<std::string>{});
}

void HttpServer::set_phase(int fd, Slot::Phase phase) {
  std::lock_guard lk(mu_);
  Slot& s = open_.at(fd);
  if (s.phase == Slot::Phase::Active && !s.reserved) --active_unreserved_;
  s.phase = phase;
  s.since = s.last_progress = Clock::now();
  s.received = 0;
}

bool HttpServer::evicted(int fd) {
  std::lock_guard lk(mu_);
  return open_.at(fd).evicted;
}

HttpServer::Read HttpServer::read_some(int fd, std::string& buf, Clock::time_point deadline, bool* got_lf) {
  char tmp[16 * 1024];
  while (true) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Read::Timeout;
    pollfd p{fd, POLLIN, 0};
    const int pr = ::poll(&p, 1, (int)std::min<long long>(left, 1 << 30));
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) return Read::Timeout;
    const ssize_t n = ::recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return Read::Closed;
    if (got_lf) *got_lf = std::memchr(tmp, '\n', (size_t)n) != nullptr;
    buf.append(tmp, (size_t)n);
    {
      std::lock_guard lk(mu_);
      Slot& s = open_.at(fd);
      s.last_progress = Clock::now();
      s.received += (uint64_t)n;
    }
    return Read::Ok;
  }
}

bool HttpServer::read_request(int fd, Connection& conn, std::string& buf, bool first, HeadParse& hp) {
  using std::chrono::milliseconds;
  // A new connection must deliver its first request within the request timeout from accept; a
  // kept-alive one may wait idle, and its request timeout starts with the request's first byte.
  Clock::time_point deadline =
      Clock::now() + milliseconds(first || !buf.empty() ? limits_.request_timeout_ms : limits_.idle_timeout_ms);
  // The head alone has its own, shorter deadline from the same start.
  Clock::time_point head_deadline =
      first || !buf.empty() ? std::min(deadline, Clock::now() + milliseconds(limits_.header_timeout_ms)) : deadline;
  bool started = first || !buf.empty();
  if (!buf.empty() && !first) set_phase(fd, Slot::Phase::Reading);
  // Why the read ended, answered once: evicted (503 unless idle), timeout (408 unless idle), closed.
  auto ended = [&](Read why) {
    if (evicted(fd)) {
      if (started)
        reject(conn, 503, Refusal::Connections, "connection dropped: the server is at its limit of " +
                              std::to_string(limits_.max_connections) +
                              " connections and this one was the slowest still sending its request");
    } else if (why == Read::Timeout && started && hp.state == HeadParse::State::Incomplete &&
               head_deadline < deadline) {
      reject(conn, 408, Refusal::Timeout, "the request head did not arrive within " + std::to_string(limits_.header_timeout_ms) +
                            " ms (--header-timeout)");
    } else if (why == Read::Timeout && started) {
      reject(conn, 408, Refusal::Timeout, "the request did not arrive within " + std::to_string(limits_.request_timeout_ms) +
                            " ms (--request-timeout)");
    }
    return false;
  };
  HeadScan scan;  // the head's end is searched for once per byte, however it arrives
  hp = buf.empty() ? HeadParse{} : parse_request_head(buf, limits_.max_header_bytes, limits_.max_body_bytes, &scan);
  while (hp.state == HeadParse::State::Incomplete) {
    bool got_lf = false;
    const Read r = read_some(fd, buf, started ? head_deadline : deadline, &got_lf);
    if (r != Read::Ok) return ended(r);
    if (!started) {
      started = true;
      deadline = Clock::now() + milliseconds(limits_.request_timeout_ms);
      head_deadline = std::min(deadline, Clock::now() + milliseconds(limits_.header_timeout_ms));
      set_phase(fd, Slot::Phase::Reading);
      std::lock_guard lk(mu_);
      open_.at(fd).received = buf.size();  // the bytes that began the request
    }
    // The head can only have ended, or become invalid, where a line ended.
    if (got_lf || buf.size() > limits_.max_header_bytes)
      hp = parse_request_head(buf, limits_.max_header_bytes, limits_.max_body_bytes, &scan);
  }
  if (hp.state == HeadParse::State::Failed) {
    reject(conn, hp.status, hp.status == 413 || hp.status == 431 ? Refusal::TooLarge : Refusal::BadRequest, hp.message);
    return false;
  }
  const size_t total = hp.head_bytes + hp.content_length;
  if (limits_.memory && hp.content_length) {
    // The buffer grows to exactly the request (reserved, not doubled); run_connection then moves
    // the body out of it, so the body is held once.
    const RequestMemory::Take t = limits_.memory->take(std::max(total, buf.size()), conn.memory);
    if (t != RequestMemory::Take::Ok) {
      const std::string pool = format_bytes(limits_.memory->capacity());
      const bool busy = t == RequestMemory::Take::Busy;
      reject(conn, busy ? 503 : 413, busy ? Refusal::RequestMemory : Refusal::TooLarge,
             busy
                 ? "the server's request memory (" + pool + ", --request-memory) is held by other requests; retry"
                 : "a body of " + std::to_string(hp.content_length) + " bytes does not fit the server's request memory (" +
                       pool + ", --request-memory)");
      return false;
    }
    buf.reserve(std::max(total, buf.size()));
  }
  if (total > buf.size() && hp.expect_continue) conn.write("HTTP/1.1 100 Continue\r\n\r\n");
  while (buf.size() < total)
    if (const Read r = read_some(fd, buf, deadline, nullptr); r != Read::Ok) return ended(r);
  return true;
}

void HttpServer::run_connection(int fd) {
  Connection conn(fd);
  std::string buf;
  for (bool first = true; !stopping_ && !conn.broken(); first = false) {
    HeadParse hp;
    if (!read_request(fd, conn, buf, first, hp)) break;
    HttpRequest& req = hp.request;
    if (buf.size() == hp.head_bytes + hp.content_length) {
      req.body = std::move(buf);  // no second copy of a large body
      req.body.erase(0, hp.head_bytes);
      buf = std::string();
    } else {
      req.body = buf.substr(hp.head_bytes, hp.content_length);
      buf.erase(0, hp.head_bytes + hp.content_length);
      if (buf.capacity() > 2 * limits_.max_header_bytes) buf.shrink_to_fit();  // an idle connection keeps no body's buffer
    }
    conn.keep_alive = hp.keep_alive;
    conn.interim_ok = hp.http11;
    const bool reserved = std::find(limits_.reserved_paths.begin(), limits_.reserved_paths.end(), req.path) !=
                          limits_.reserved_paths.end();
    bool full = false, was_evicted = false, no_room = false;
    {
      std::lock_guard lk(mu_);
      Slot& s = open_.at(fd);
      // Evicted after its last read: the request is whole, but its slot is gone. A reserved path
      // is answered anyway (it is cheap, and the connection closes after it).
      was_evicted = s.evicted && !reserved;
      if (s.evicted || s.probation) conn.keep_alive = false;
      if (s.probation && !reserved) {
        // Keep it only if a regular slot has come free since the accept.
        size_t live = 0;
        for (const auto& [f, o] : open_)
          if (!o.evicted && !o.probation && o.phase != Slot::Phase::Closing) ++live;
        no_room = live >= limits_.max_connections;
        if (!no_room) s.probation = false;
      }
      full = was_evicted || no_room ||
             (!reserved && active_unreserved_ + limits_.reserved_connections >= limits_.max_connections);
      if (!full) {
        s.phase = Slot::Phase::Active;
        s.reserved = reserved;
        s.since = Clock::now();
        if (!reserved) ++active_unreserved_;
      }
    }
    if (was_evicted) {
      reject(conn, 503, Refusal::Connections, "connection dropped: the server is at its limit of " + std::to_string(limits_.max_connections) +
                            " connections and this one was the slowest still sending its request");
      break;
    }
    if (no_room) {
      reject(conn, 503, Refusal::Connections, "too many open connections (" + std::to_string(limits_.max_connections) +
                            ", all still sending their requests); only " + join(limits_.reserved_paths) +
                            " are answered beyond the limit");
      break;
    }
    if (full) {
      reject(conn, 503, Refusal::Connections, "too many requests in progress (" + std::to_string(active_unreserved_) +
                            " connections busy; " + std::to_string(limits_.reserved_connections) +
                            " are kept for /health and /metrics)");
      break;
    }
    conn.responded = false;
    handler_(req, conn);
    req.body = std::string();
    conn.memory.release();
    set_phase(fd, Slot::Phase::Idle);
    if (!conn.keep_alive) break;
  }
  conn.memory.release();  // a request refused or cut short
  {
    // Answered: from here the connection only drains, so it no longer takes a slot from new ones.
    std::lock_guard lk(mu_);
    Slot& s = open_.at(fd);
    if (s.phase == Slot::Phase::Active && !s.reserved) --active_unreserved_;
    s.phase = Slot::Phase::Closing;
  }
  ::shutdown(fd, SHUT_WR);
  // Drain what the client still sends (an unread body after a 413) for up to a second before
  // close: closing with unread data sends a reset that can destroy the response before it is read.
  {
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    size_t drained = 0;
    while (Clock::now() < deadline && drained < 4 * limits_.max_body_bytes + (1u << 20)) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char tmp[16 * 1024];
      const ssize_t n = ::recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
      if (n <= 0) break;
      drained += (size_t)n;
    }
  }
  std::lock_guard lk(mu_);
  open_.erase(fd);
  ::close(fd);
  cv_.notify_all();
}

}  // namespace sluice::server
