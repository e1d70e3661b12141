#include "cli/open_browser.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

extern char** environ;

namespace sluice::cli {

std::string open_in_browser(const std::string& url) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  // The opener's own chatter (and a browser's, which it may start in the foreground) stays out
  // of the server's log and off its terminal.
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  std::string prog = "xdg-open", arg = url;
  std::vector<char*> argv = {prog.data(), arg.data(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, "xdg-open", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0)
    return rc == ENOENT ? "no xdg-open on PATH (a machine without a desktop)" : "xdg-open: " + std::string(std::strerror(rc));
  std::thread([pid] {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }).detach();
  return "";
}

}  // namespace sluice::cli
