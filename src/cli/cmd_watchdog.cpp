// `sluice watchdog --soft BYTES --hard BYTES [--interval-ms N] -- COMMAND...`
#include "cli/cmd_watchdog.h"

#include "cli/commands.h"
#include "runtime/meminfo.h"
#include "runtime/watchdog.h"
#include "util/error.h"

namespace sluice::cli {

CLI::App* setup_watchdog(CLI::App& app, WatchdogCommandOptions& o) {
  CLI::App* sub = app.add_subcommand(
      "watchdog", "Run a command in its own process group and enforce memory limits on it");
  sub->footer(
      "--soft/--hard compare with the group's RSS (sum over every process of the command's process\n"
      "group). --host-soft/--host-hard compare with host-wide use, MemTotal - MemAvailable (off by\n"
      "default: on a shared box that is not ours). Soft: SIGTERM to the group, once. Hard: SIGKILL to\n"
      "the group, fired ahead when growth would pass the limit before the next samples. SIGINT,\n"
      "SIGTERM, SIGHUP and SIGQUIT are forwarded to the group. One stderr line per action.\n"
      "Exit status: the command's (its code, or 128 + signal: 137 SIGKILL, 143 SIGTERM); 127 if it\n"
      "could not be started; 2 on a usage error.");
  sub->add_option("--soft", o.soft, "group RSS that triggers SIGTERM (e.g. 100GiB)");
  sub->add_option("--hard", o.hard, "group RSS that triggers SIGKILL");
  sub->add_option("--host-soft", o.host_soft, "host use (MemTotal - MemAvailable) that triggers SIGTERM");
  sub->add_option("--host-hard", o.host_hard, "host use that triggers SIGKILL");
  sub->add_option("--interval-ms", o.interval_ms, "sampling interval")->capture_default_str();
  sub->add_option("--kill-after-ms", o.kill_after_ms, "SIGKILL this long after the soft SIGTERM (default: only at hard)");
  sub->add_option("command", o.command, "the command and its arguments (after --)")->required();
  return sub;
}

int run_watchdog(const WatchdogCommandOptions& o) {
  WatchdogOptions w;
  try {
    auto size = [](const std::string& s, const char* name) { return s.empty() ? 0 : parse_bytes(s, name); };
    w.soft = size(o.soft, "--soft");
    w.hard = size(o.hard, "--hard");
    w.host_soft = size(o.host_soft, "--host-soft");
    w.host_hard = size(o.host_hard, "--host-hard");
    w.interval_ms = o.interval_ms;
    w.kill_after_ms = o.kill_after_ms;
    check_watchdog_options(w);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  return watch_command(o.command, w).exit_code;
}

}  // namespace sluice::cli
