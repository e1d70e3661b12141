#include "runtime/model_identity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "runtime/state_dir_trust.h"
#include "util/error.h"
#include "util/unique_fd.h"

namespace sluice {
namespace {

// What names one version of a file: "dev ino size mtime_ns ctime_ns".
std::string version_key(const struct stat& st) {
  auto ns = [](const struct timespec& t) { return std::to_string((int64_t)t.tv_sec * 1'000'000'000 + t.tv_nsec); };
  return std::to_string((uint64_t)st.st_dev) + " " + std::to_string((uint64_t)st.st_ino) + " " +
         std::to_string((uint64_t)st.st_size) + " " + ns(st.st_mtim) + " " + ns(st.st_ctim);
}

// The cache's lines ("<version key> <digest hex>"), oldest first; empty when the directory is
// not this user's alone or the file is not a regular file of ours.
std::vector<std::string> read_cache(const std::string& dir) {
  struct stat st {};
  if (dir.empty() || ::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || untrusted_dir_problem(st)) return {};
  const std::string path = dir + "/model-identity";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return {};
  UniqueFd guard(fd);
  if (::fstat(fd, &st) != 0 || !trusted_state_file(st) || st.st_size > (1 << 20)) return {};
  std::string text((size_t)st.st_size, '\0');
  if (::pread(fd, text.data(), text.size(), 0) != (ssize_t)text.size()) return {};
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Adds a line (dropping older entries of the same file and the oldest past the limit), through
// a temporary file and a rename. Failures are ignored: the cache only saves time.
void write_cache(const std::string& dir, std::vector<std::string> lines, const std::string& line) {
  if (dir.empty()) return;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    // Made with its parents (the usual ~/.cache may not exist yet), this user's only.
    std::string at;
    for (size_t i = 0; i <= dir.size(); ++i)
      if (i == dir.size() || (dir[i] == '/' && i > 0)) {
        at = dir.substr(0, i);
        ::mkdir(at.c_str(), 0700);
      }
    if (::stat(dir.c_str(), &st) != 0) return;
  }
  if (!S_ISDIR(st.st_mode) || untrusted_dir_problem(st)) return;
  lines.push_back(line);
  if (lines.size() > kIdentityCacheEntries) lines.erase(lines.begin(), lines.end() - (std::ptrdiff_t)kIdentityCacheEntries);
  const std::string path = dir + "/model-identity", tmp = path + "." + std::to_string(::getpid()) + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  std::string text;
  for (const std::string& l : lines) text += l + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == (ssize_t)text.size();
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) ::unlink(tmp.c_str());
}

}  // namespace

std::string identity_cache_dir() {
  if (const char* d = std::getenv("SLUICE_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x == '/') return std::string(x) + "/sluice";
  if (const char* h = std::getenv("HOME"); h && *h == '/') return std::string(h) + "/.cache/sluice";
  return "";
}

Digest128 model_content_digest(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  UniqueFd guard(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file");
  Hasher h(0x6d6f64656c696432ull);  // "modelid2"
  const uint64_t size = (uint64_t)st.st_size;
  h.update(&size, sizeof size);
  std::vector<uint8_t> buf(4u << 20);
  for (uint64_t off = 0; off < size;) {
    const ssize_t r = ::pread(fd, buf.data(), std::min<uint64_t>(buf.size(), size - off), (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw Error(path + ": cannot read: " + (r < 0 ? std::string(std::strerror(errno)) : "unexpected end"));
    h.update(buf.data(), (size_t)r);
    off += (uint64_t)r;
  }
  return h.digest();
}

Digest128 model_file_identity(const std::string& path, float route_bias) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw Error(path + ": cannot stat: " + std::strerror(errno));
  const std::string key = version_key(st), dir = identity_cache_dir();
  std::vector<std::string> lines = read_cache(dir);
  Digest128 content{};
  bool cached = false;
  std::vector<std::string> others;
  for (const std::string& l : lines) {
    const size_t sp = l.rfind(' ');
    if (sp != std::string::npos && l.compare(0, sp, key) == 0 && parse_digest_hex(l.substr(sp + 1), &content)) cached = true;
    else if (sp != std::string::npos && l.compare(0, sp, key) != 0) others.push_back(l);
  }
  if (!cached) {
    content = model_content_digest(path);
    struct stat after {};
    // Written while hashed: the digest is of no one version, so it is not cached.
    if (::stat(path.c_str(), &after) == 0 && version_key(after) == key)
      write_cache(dir, std::move(others), key + " " + digest_hex(content).data());
  }
  Hasher h(0x6964656e74697479ull);  // "identity"
  h.update(content.data(), content.size());
  uint32_t bias_bits;
  std::memcpy(&bias_bits, &route_bias, sizeof bias_bits);
  h.update(&bias_bits, sizeof bias_bits);
  return h.digest();
}

}  // namespace sluice
