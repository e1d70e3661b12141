#include "runtime/group_guardian.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "util/error.h"

namespace sluice {
namespace {

// The guardian's side: only async-signal-safe calls (the watchdog may have threads).
[[noreturn]] void guard(int read_fd, pid_t pgid) {
  ::setpgid(0, 0);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  for (const int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU, SIGUSR1, SIGUSR2})
    ::sigaction(s, &ignore, nullptr);
  ::prctl(PR_SET_NAME, "sluice-guard");
  // Only the pipe stays open: at descriptor 3, stdio on /dev/null, everything else closed.
  if (read_fd != 3) {
    ::dup2(read_fd, 3);
    ::close(read_fd);
  }
  const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  for (int fd = 0; fd < 3; ++fd) {
    if (null >= 0) ::dup2(null, fd);
    else ::close(fd);
  }
  ::close_range(4, ~0u, 0);
  char b = 0;
  ssize_t r;
  do r = ::read(3, &b, 1);
  while (r < 0 && errno == EINTR);
  if (r != 1) ::kill(-pgid, SIGKILL);  // end of file: the watchdog is gone
  ::_exit(0);
}

}  // namespace

GroupGuardian::GroupGuardian(pid_t pgid) {
  // A socket pair rather than a pipe: the stand-down byte goes with MSG_NOSIGNAL, so a guardian
  // that someone killed costs an EPIPE, not a SIGPIPE that would end the watchdog.
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    throw Error(std::string("watchdog: socketpair: ") + std::strerror(errno));
  pid_ = ::fork();
  if (pid_ == 0) {
    ::close(fds[1]);
    guard(fds[0], pgid);
  }
  const int err = errno;
  ::close(fds[0]);
  if (pid_ < 0) {
    ::close(fds[1]);
    throw Error(std::string("watchdog: fork: ") + std::strerror(err));
  }
  fd_ = fds[1];
}

void GroupGuardian::release() noexcept {
  if (fd_ < 0) return;
  const char stand_down = 1;
  ssize_t w;
  do w = ::send(fd_, &stand_down, 1, MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  ::close(fd_);
  fd_ = -1;
  int st = 0;
  while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {}
}

}  // namespace sluice
