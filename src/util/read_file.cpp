#include "util/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/error.h"

namespace sluice {
namespace {

std::string too_big(const std::string& name, uint64_t limit, const std::string& why) {
  return name + ": more than " + std::to_string(limit) + " bytes (" + why + ")";
}

}  // namespace

std::string read_fd_bounded(int fd, const std::string& name, uint64_t limit, const std::string& why) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error("cannot read " + name + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw Error("cannot read " + name + ": " + std::strerror(EISDIR));
  // A regular file says its size: refuse before reading a byte. (Others are read up to the limit.)
  if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > limit)
    throw Error(name + ": " + std::to_string((uint64_t)st.st_size) + " bytes, more than the limit of " +
                std::to_string(limit) + " bytes (" + why + ")");
  std::string out;
  if (S_ISREG(st.st_mode)) out.reserve((size_t)st.st_size);
  char buf[65536];
  for (;;) {
    // One byte past the limit is enough to know it is exceeded.
    const uint64_t left = limit - out.size();
    const size_t want = left >= sizeof buf ? sizeof buf : (size_t)left + 1;
    const ssize_t n = ::read(fd, buf, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot read " + name + ": " + std::strerror(errno));
    }
    if (n == 0) break;
    out.append(buf, (size_t)n);
    if (out.size() > limit) throw Error(too_big(name, limit, why));
  }
  return out;
}

std::string read_file_bounded(const std::string& path, uint64_t limit, const std::string& why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open " + path + ": " + std::strerror(errno));
  try {
    std::string s = read_fd_bounded(fd, path, limit, why);
    ::close(fd);
    return s;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

std::string read_regular_file_bounded(const std::string& path, uint64_t limit, const std::string& why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error("cannot open " + path + ": " + std::strerror(errno));
  try {
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw Error("cannot read " + path + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) {
      const char* what = S_ISDIR(st.st_mode)    ? "a directory"
                         : S_ISFIFO(st.st_mode) ? "a FIFO"
                         : S_ISCHR(st.st_mode)  ? "a character device"
                         : S_ISBLK(st.st_mode)  ? "a block device"
                         : S_ISSOCK(st.st_mode) ? "a socket"
                                                : "of an unknown type";
      throw Error(path + " is " + what + ", not a regular file");
    }
    std::string s = read_fd_bounded(fd, path, limit, why);  // O_NONBLOCK changes nothing for a regular file
    ::close(fd);
    return s;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

LineRead read_line_bounded(std::istream& in, std::string& line, size_t limit) {
  line.clear();
  std::streambuf* sb = in.rdbuf();
  bool any = false, too_long = false;
  for (;;) {
    const int c = sb->sbumpc();
    if (c == std::char_traits<char>::eof()) {
      in.setstate(std::ios::eofbit);
      if (!any) return LineRead::End;
      break;
    }
    any = true;
    if (c == '\n') break;
    if (line.size() < limit) line += (char)c;
    else too_long = true;
  }
  if (too_long) line.clear();
  return too_long ? LineRead::TooLong : LineRead::Line;
}

}  // namespace sluice
