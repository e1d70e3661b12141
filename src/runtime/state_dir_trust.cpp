#include "runtime/state_dir_trust.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "util/error.h"
#include "util/unique_fd.h"

namespace sluice {
namespace {

std::string mode_text(mode_t m) {
  char b[8];
  std::snprintf(b, sizeof b, "%04o", (unsigned)(m & 07777));
  return b;
}

SipKey make_key(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw Error(path + ": cannot create the state directory's key: " + std::strerror(errno));
  UniqueFd guard(fd);
  SipKey k;
  for (size_t got = 0; got < k.size();) {
    const ssize_t r = ::getrandom(k.data() + got, k.size() - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw Error(path + ": no random bytes for the key: " + std::strerror(errno));
    got += (size_t)r;
  }
  if (::write(fd, k.data(), k.size()) != (ssize_t)k.size() || ::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(path.c_str());
    throw Error(path + ": cannot write the state directory's key: " + why);
  }
  return k;
}

}  // namespace

std::optional<std::string> untrusted_dir_problem(const struct stat& st) {
  if (st.st_uid != ::geteuid())
    return "owned by uid " + std::to_string(st.st_uid) + ", not this user (uid " + std::to_string(::geteuid()) + ")";
  if (st.st_mode & 022)
    return "others can write to it (mode " + mode_text(st.st_mode) + "; chmod go-w it, or use a directory of your own)";
  return std::nullopt;
}

bool trusted_state_file(const struct stat& st) {
  return S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 022) == 0;
}

SipKey state_dir_key(const std::string& dir) {
  const std::string path = dir + "/.key";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return make_key(path);
    throw Error(path + ": cannot open the state directory's key: " + std::strerror(errno));
  }
  UniqueFd guard(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0 || st.st_size != 16)
    throw Error(path + ": not this server's key (a regular file of 16 bytes, owned by this user, mode 0600; it is " +
                (S_ISREG(st.st_mode) ? std::to_string(st.st_size) + " bytes, uid " + std::to_string(st.st_uid) +
                                           ", mode " + mode_text(st.st_mode)
                                     : std::string("not a regular file")) +
                "); remove it to make a new one, which drops the states signed with it");
  SipKey k;
  if (::pread(fd, k.data(), k.size(), 0) != (ssize_t)k.size())
    throw Error(path + ": cannot read the state directory's key: " + std::strerror(errno));
  return k;
}

}  // namespace sluice
