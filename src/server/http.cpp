// HTTP/1.1 transport: request parsing with fixed limits, response writing, connection threads.
#include "server/http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace sluice::server {

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return "";
}

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

bool Connection::peer_gone() {
  if (broken_) return true;
  pollfd p{fd_, (short)(POLLIN | POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    // Readable but not hung up: either a pipelined request (peer still there) or EOF.
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return false;
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

void send_stream_head(Connection& c, int status, std::string_view content_type) {
  c.keep_alive = false;  // the body ends when the connection closes
  c.responded = true;
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + status_text(status) + "\r\n";
  head += "Content-Type: " + std::string(content_type) + "\r\n";
  head += "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\nServer: sluice\r\nConnection: close\r\n\r\n";
  c.write(head);
}

namespace {

std::string json_error(int status, const std::string& message) {
  nlohmann::json j = {{"error",
                       {{"message", message},
                        {"type", status == 503 ? "unavailable_error" : "invalid_request_error"},
                        {"code", status}}}};
  return j.dump();
}


std::string lower(std::string s) {
  for (char& ch : s) ch = (char)std::tolower((unsigned char)ch);
  return s;
}

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return std::string(s);
}

// Reads more bytes into buf. false on EOF, timeout or error.
bool read_more(int fd, std::string& buf) {
  char tmp[16 * 1024];
  while (true) {
    const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buf.append(tmp, (size_t)n);
    return true;
  }
}

void set_timeouts(int fd, int seconds) {
  timeval tv{seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  // A client that stops reading a stream makes writes fail after this long, which cancels its
  // generation instead of blocking the handler forever.
  timeval wtv{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &wtv, sizeof wtv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

HttpServer::HttpServer(HttpLimits limits, Handler handler, std::function<void(int)> on_reject)
    : limits_(limits), handler_(std::move(handler)), on_reject_(std::move(on_reject)) {
  if (::pipe(wake_) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
}

HttpServer::~HttpServer() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
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

void HttpServer::serve() {
  while (!stopping_) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (stopping_ || (p[1].revents & POLLIN)) break;
    if (!(p[0].revents & POLLIN)) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    set_timeouts(fd, limits_.idle_timeout_s);
    std::unique_lock lk(mu_);
    if (open_.size() >= limits_.max_connections) {
      lk.unlock();
      Connection c(fd);
      c.keep_alive = false;
      if (on_reject_) on_reject_(503);
      send_response(c, 503, "application/json", json_error(503, "too many open connections"),
                    {"Retry-After: 1"});
      ::close(fd);
      continue;
    }
    open_.insert(fd);
    lk.unlock();
    std::thread([this, fd] { run_connection(fd); }).detach();
  }
  std::unique_lock lk(mu_);
  for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
  cv_.wait(lk, [&] { return open_.empty(); });
}

void HttpServer::stop() {
  stopping_ = true;
  const char b = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_[1], &b, 1);
  std::lock_guard lk(mu_);
  for (int fd : open_) ::shutdown(fd, SHUT_RDWR);
}

void HttpServer::reject(Connection& c, int status, const std::string& message) {
  if (on_reject_) on_reject_(status);
  c.keep_alive = false;
  send_response(c, status, "application/json", json_error(status, message));
}

void HttpServer::run_connection(int fd) {
  Connection conn(fd);
  std::string buf;
  while (!stopping_ && !conn.broken()) {
    // Header block.
    size_t end;
    while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
      if (buf.size() > limits_.max_header_bytes) {
        reject(conn, 431, "request headers larger than " +
                                             std::to_string(limits_.max_header_bytes) + " bytes");
        goto done;
      }
      if (!read_more(fd, buf)) goto done;
    }
    if (end > limits_.max_header_bytes) {
      reject(conn, 431, "request headers too large");
      goto done;
    }
    {
      HttpRequest req;
      const std::string_view head(buf.data(), end);
      const size_t line_end = head.find("\r\n");
      const std::string_view line = head.substr(0, line_end);
      const size_t s1 = line.find(' '), s2 = line.rfind(' ');
      if (s1 == std::string_view::npos || s2 == s1) {
        reject(conn, 400, "malformed request line");
        goto done;
      }
      req.method = std::string(line.substr(0, s1));
      req.target = std::string(line.substr(s1 + 1, s2 - s1 - 1));
      const std::string_view version = line.substr(s2 + 1);
      if (version != "HTTP/1.1" && version != "HTTP/1.0") {
        reject(conn, 505, "only HTTP/1.0 and HTTP/1.1 are supported");
        goto done;
      }
      const size_t q = req.target.find('?');
      req.path = req.target.substr(0, q);
      if (q != std::string::npos) req.query = req.target.substr(q + 1);
      size_t pos = line_end == std::string_view::npos ? head.size() : line_end + 2;
      while (pos < head.size()) {
        size_t e = head.find("\r\n", pos);
        if (e == std::string_view::npos) e = head.size();
        const std::string_view h = head.substr(pos, e - pos);
        const size_t colon = h.find(':');
        if (colon == std::string_view::npos || colon == 0) {
          reject(conn, 400, "malformed header line");
          goto done;
        }
        req.headers.emplace_back(lower(std::string(h.substr(0, colon))), trim(h.substr(colon + 1)));
        pos = e + 2;
      }
      const std::string connection = lower(req.header("connection"));
      conn.keep_alive = version == "HTTP/1.1" ? connection != "close" : connection == "keep-alive";
      if (!req.header("transfer-encoding").empty()) {
        reject(conn, 411, "chunked request bodies are not supported; send Content-Length");
        goto done;
      }
      size_t length = 0;
      const std::string cl = req.header("content-length");
      if (!cl.empty()) {
        if (cl.size() > 18 || !std::all_of(cl.begin(), cl.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
          reject(conn, 400, "malformed Content-Length");
          goto done;
        }
        length = std::stoull(cl);
      }
      if (length > limits_.max_body_bytes) {
        reject(conn, 413, "request body of " + std::to_string(length) + " bytes exceeds the limit of " +
                                             std::to_string(limits_.max_body_bytes) + " bytes (--max-body)");
        goto done;
      }
      buf.erase(0, end + 4);
      if (length > buf.size() && lower(req.header("expect")) == "100-continue")
        conn.write("HTTP/1.1 100 Continue\r\n\r\n");
      while (buf.size() < length)
        if (!read_more(fd, buf)) goto done;
      req.body = buf.substr(0, length);
      buf.erase(0, length);
      conn.responded = false;
      handler_(req, conn);
      if (!conn.keep_alive) break;
    }
  }
done:
  ::shutdown(fd, SHUT_WR);
  // Drain what the client still sends (an unread body after a 413) for up to a second before
  // close: closing with unread data sends a reset that can destroy the response before it is read.
  {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    size_t drained = 0;
    while (std::chrono::steady_clock::now() < deadline && drained < 4 * limits_.max_body_bytes + (1u << 20)) {
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
