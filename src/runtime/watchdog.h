// An external memory watchdog: runs a command in its own process group and enforces limits on
// the group's memory from outside it, so it works even when the command is wedged.
//
// What is measured (sampled every interval_ms):
//   group RSS   the sum of VmRSS-equivalent resident pages (/proc/PID/stat field 24) of every
//               live process whose process group is the command's. Compared with soft / hard.
//               This is the primary measure: it is ours alone, and with O_DIRECT into anonymous
//               buffers (sluice's expert store) it is the engine's real footprint. Pages
//               shared between members (a fork's copy-on-write pages, shared libraries) count
//               once per process, so the sum errs high, on the safe side; a member that leaves
//               the group (setsid / setpgid) is no longer counted.
//   host use    MemTotal - MemAvailable from /proc/meminfo. A second trigger with its own
//               thresholds host_soft / host_hard, off by default: on a shared box host-wide use
//               is not ours, and a neighbour's growth should not kill our job unless asked.
// Actions, each logged as one line:
//   soft        group RSS >= soft (or host use >= host_soft): SIGTERM to the whole group, once.
//               sluice run / serve finish the current token and exit cleanly on SIGTERM.
//   hard        SIGKILL to the whole group, then every member is reaped. The hard check looks
//               ahead: it fires when the last sample, plus its growth rate times twice the
//               sampling gap, reaches hard, so a steadily growing group is killed before it
//               crosses the limit (set hard above the planned peak by more than growth rate x
//               2 x interval). host_hard works the same way on host use.
//   kill_after  optional: SIGKILL this long after the soft SIGTERM if the group is still alive.
//   forwarding  SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to the watchdog go to the whole group.
// When the watchdog itself dies, however (kill -9 included), the whole group dies with it: its
// guardian, a small process it forks (runtime/group_guardian.h), sees the watchdog's end of a
// socket close and sends SIGKILL to the group; the command does not exec before the guardian runs.
// When the command itself exits, any members it left in the group are killed and reaped
// (control-group semantics). The exit status is the command's, as a shell reports it: its exit
// code, or 128 + the signal that ended it (137 after SIGKILL, 143 after SIGTERM); 127 when it
// could not be started.
//
// Call from a single-threaded process (e.g. first thing in main): the watchdog blocks the
// signals it waits for in the calling thread only.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sluice {

struct WatchdogOptions {
  uint64_t soft = 0;            // group RSS bytes; 0: off
  uint64_t hard = 0;            // group RSS bytes; 0: off
  uint64_t host_soft = 0;       // MemTotal - MemAvailable bytes; 0: off
  uint64_t host_hard = 0;
  uint32_t interval_ms = 100;
  uint32_t kill_after_ms = 0;   // SIGKILL this long after the soft SIGTERM; 0: only at hard
  std::vector<std::string> extra_env;  // "NAME=value" added to the command's environment
};

struct WatchdogReport {
  int exit_code = 0;            // shell convention (see above)
  bool exited = false;          // the command exited (vs. was killed by a signal)
  int status = 0;               // exit code when exited
  int signal = 0;               // the signal that ended it otherwise
  bool started = false;         // false: exec failed (exit_code 127)
  bool sent_term = false, sent_kill = false;
  std::string kill_reason;      // why SIGKILL was sent ("" if it was not)
  std::vector<int> forwarded;   // signals forwarded to the group, in order
  uint64_t peak_group_rss = 0;  // largest sample
  uint64_t peak_host_used = 0;  // largest sample (only sampled when a host threshold is set)
  uint64_t child_maxrss = 0;    // the kernel's peak RSS of the command's main process (wait4)
  int samples = 0;
  pid_t pgid = 0;
  pid_t guardian = 0;           // the group's guardian (reaped when watch_command returns)
};

// Throws Error for invalid options (no limit set, soft >= hard, empty argv, interval 0).
void check_watchdog_options(const WatchdogOptions& o);

// Runs argv (PATH lookup like execvp) under the watchdog and waits for it. Each action is one
// line passed to `log` (default: "sluice watchdog: ..." on stderr).
WatchdogReport watch_command(const std::vector<std::string>& argv, const WatchdogOptions& o,
                             const std::function<void(const std::string&)>& log = {});

// --watchdog SOFT:HARD (byte sizes, parse_bytes). Throws Error on a malformed spec.
std::pair<uint64_t, uint64_t> parse_watchdog_spec(std::string_view spec);

// Set in the environment of a command started by run_under_watchdog, so the re-executed
// sluice does not start a second watchdog.
constexpr const char* kUnderWatchdogEnv = "SLUICE_UNDER_WATCHDOG";
bool under_watchdog();

// The one-flag wiring for `sluice run` / `serve`: re-executes this binary (/proc/self/exe) with
// argv[1..] minus any "--watchdog X" / "--watchdog=X", under a watchdog with these limits and
// SLUICE_UNDER_WATCHDOG=1, and returns the exit status to exit with. argv is main's full argv.
int run_under_watchdog(const std::vector<std::string>& argv, uint64_t soft, uint64_t hard);
// argv without "--watchdog X" / "--watchdog=X" (what run_under_watchdog re-executes).
std::vector<std::string> strip_watchdog_flag(const std::vector<std::string>& argv);

}  // namespace sluice
