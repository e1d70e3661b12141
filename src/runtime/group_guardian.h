// The watchdog's guardian (runtime/watchdog.h): a tiny process that kills the command's whole
// process group when the watchdog is gone, however it ended, SIGKILL included (no handler sees
// that). PR_SET_PDEATHSIG reaches only the watchdog's own child; the processes that child started
// (a shell's background job, a server's helpers) would run on unbounded.
//
// The guardian blocks reading a socket whose only other end the watchdog holds. A byte means
// "stand down" (the watchdog has dealt with the group itself): it exits. End of file means the
// watchdog died (the kernel closes a dead process's descriptors): it sends SIGKILL to the group
// and exits. It is in a process group of its own, ignores the signals a terminal or a `kill` of
// the watchdog's group sends, and holds no descriptor but its end of the socket (stdio goes to
// /dev/null), so it keeps no pipe or file of its parent open.
#pragma once
#include <sys/types.h>

namespace sluice {

class GroupGuardian {
 public:
  // Forks the guardian of process group pgid. Throws Error when the pipe or the fork fails.
  explicit GroupGuardian(pid_t pgid);
  ~GroupGuardian() { release(); }
  GroupGuardian(const GroupGuardian&) = delete;
  GroupGuardian& operator=(const GroupGuardian&) = delete;

  // Stands the guardian down and reaps it (it kills nothing then). Call while the group's id
  // is still reserved (before its leader is reaped). Idempotent.
  void release() noexcept;
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;  // the watchdog's end of the socket pair
};

}  // namespace sluice
