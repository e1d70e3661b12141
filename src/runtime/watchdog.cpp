#include "runtime/watchdog.h"

#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "runtime/group_guardian.h"
#include "runtime/meminfo.h"
#include "util/error.h"
#include "util/file_size_limit.h"

extern char** environ;

namespace sluice {

namespace {

using Clock = std::chrono::steady_clock;

const int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

std::string signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGPIPE: return "SIGPIPE";
    default: {
      const char* abbrev = ::sigabbrev_np(sig);
      return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
    }
  }
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string rate_str(double bytes_per_s) { return format_bytes((uint64_t)std::max(0.0, bytes_per_s)) + "/s"; }

// The environment for the command: ours, with extra "NAME=value" entries replacing same-named ones.
std::vector<std::string> command_env(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const std::string& x : extra) replaced = replaced || x.substr(0, x.find('=')) == name;
    if (!replaced) env.push_back(kv);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// Process state the watchdog changes and puts back when it returns.
class SignalState {
 public:
  SignalState() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGCHLD);
    for (int s : kForwarded) sigaddset(&set_, s);
    pthread_sigmask(SIG_BLOCK, &set_, &old_mask_);
    // SIGCHLD ignored would make the kernel reap the command before we can read its status.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGCHLD, &dfl, &old_chld_);
    // Orphaned members of the group become our children, so we can reap all of them.
    prctl(PR_GET_CHILD_SUBREAPER, &old_subreaper_);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
  }
  ~SignalState() {
    prctl(PR_SET_CHILD_SUBREAPER, old_subreaper_);
    sigaction(SIGCHLD, &old_chld_, nullptr);
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  SignalState(const SignalState&) = delete;
  SignalState& operator=(const SignalState&) = delete;

  const sigset_t& waited() const { return set_; }
  const sigset_t& old_mask() const { return old_mask_; }
  const struct sigaction& old_chld() const { return old_chld_; }

 private:
  sigset_t set_{}, old_mask_{};
  struct sigaction old_chld_ {};
  int old_subreaper_ = 0;
};

// Gives the controlling terminal's foreground to the command's group when we hold it, so an
// interactive command can read the terminal and gets Ctrl-C directly; takes it back at the end.
class TerminalHandoff {
 public:
  static bool should() { return ::isatty(STDIN_FILENO) && ::tcgetpgrp(STDIN_FILENO) == ::getpgrp(); }
  explicit TerminalHandoff(bool active) : active_(active) {}
  ~TerminalHandoff() {
    if (!active_) return;
    sigset_t ttou, old;
    sigemptyset(&ttou);
    sigaddset(&ttou, SIGTTOU);
    pthread_sigmask(SIG_BLOCK, &ttou, &old);  // we are in the background now
    ::tcsetpgrp(STDIN_FILENO, ::getpgrp());
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  TerminalHandoff(const TerminalHandoff&) = delete;
  TerminalHandoff& operator=(const TerminalHandoff&) = delete;

 private:
  bool active_;
};

// After the main process exited (still a zombie, so the group id cannot be reused): members it
// left behind are killed. Returns how many.
int kill_leftovers(pid_t pgid, const std::function<void(const std::string&)>& say) {
  const GroupMemory g = process_group_memory(pgid);
  if (g.processes == 0) return 0;
  ::kill(-pgid, SIGKILL);
  say("killed " + std::to_string(g.processes) + " process(es) the command left in group " + std::to_string(pgid));
  return g.processes;
}

// Reaps what is left of the group once the main process is reaped: as subreaper we inherit the
// orphans. Bounded, since a member that is not (yet) our child cannot be waited for.
void reap_others(pid_t pgid) {
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (Clock::now() < deadline) {
    int st = 0;
    const pid_t r = ::waitpid(-pgid, &st, WNOHANG);
    if (r > 0 || (r < 0 && errno == EINTR)) continue;
    if (r < 0 && process_group_memory(pgid).processes == 0) return;  // nothing alive, nothing to reap
    const timespec ts{0, 5 * 1000 * 1000};
    ::nanosleep(&ts, nullptr);
  }
}

}  // namespace

void check_watchdog_options(const WatchdogOptions& o) {
  if (!o.soft && !o.hard && !o.host_soft && !o.host_hard)
    throw Error("watchdog: no limit given (set --soft, --hard, --host-soft or --host-hard)");
  if (o.soft && o.hard && o.soft >= o.hard)
    throw Error("watchdog: --soft " + format_bytes(o.soft) + " must be below --hard " + format_bytes(o.hard));
  if (o.host_soft && o.host_hard && o.host_soft >= o.host_hard)
    throw Error("watchdog: --host-soft " + format_bytes(o.host_soft) + " must be below --host-hard " +
                format_bytes(o.host_hard));
  if (o.interval_ms == 0) throw Error("watchdog: --interval-ms must be at least 1");
}

namespace {

using Say = std::function<void(const std::string&)>;

// What the command's child needs, built before fork: the child makes only async-signal-safe calls.
struct ChildSetup {
  std::vector<char*> argv, env;
  bool give_tty = false;
  pid_t watchdog = 0;
  int exec_fd = -1;  // write end: errno when exec fails
  int go_fd = -1;    // read end: one byte once the guardian runs; end of file: the watchdog died
};

[[noreturn]] void run_child(const ChildSetup& cs, const SignalState& sig) {
  // The command must not outlive the watchdog, even one killed with SIGKILL (which no handler
  // sees): the kernel kills the child when its parent dies (its own children: the guardian).
  // The parent may already have died between fork and prctl; then the child has been reparented
  // and must not start at all.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != cs.watchdog) ::_exit(127);
  ::setpgid(0, 0);
  if (cs.give_tty) {
    sigset_t ttou;
    sigemptyset(&ttou);
    sigaddset(&ttou, SIGTTOU);
    pthread_sigmask(SIG_BLOCK, &ttou, nullptr);
    ::tcsetpgrp(STDIN_FILENO, ::getpid());
  }
  // Nothing runs before the guardian watches the group, so no process of it can escape.
  char go = 0;
  ssize_t r;
  do r = ::read(cs.go_fd, &go, 1);
  while (r < 0 && errno == EINTR);
  if (r != 1) ::_exit(127);
  ::sigaction(SIGCHLD, &sig.old_chld(), nullptr);
  pthread_sigmask(SIG_SETMASK, &sig.old_mask(), nullptr);
  restore_file_size_signal();  // sluice ignores SIGXFSZ; the command gets what we were given
  ::execvpe(cs.argv[0], cs.argv.data(), cs.env.data());
  const int err = errno;
  (void)!::write(cs.exec_fd, &err, sizeof err);
  ::_exit(127);
}

struct Started {
  pid_t pid = -1;
  int exec_err = 0;  // nonzero: the command could not be run (it has exited)
};

// Forks the command into a process group of its own, starts the guardian of that group, lets
// the command exec, and waits for the exec. Throws Error when a pipe or fork fails (nothing is
// left running then).
Started start_command(ChildSetup& cs, const SignalState& sig, std::optional<GroupGuardian>& guardian) {
  int exec_pipe[2], go_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) throw Error(std::string("watchdog: pipe: ") + std::strerror(errno));
  if (::pipe2(go_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(exec_pipe[0]);
    ::close(exec_pipe[1]);
    throw Error(std::string("watchdog: pipe: ") + std::strerror(err));
  }
  std::fflush(nullptr);
  cs.watchdog = ::getpid();
  cs.exec_fd = exec_pipe[1];
  cs.go_fd = go_pipe[0];
  Started s;
  s.pid = ::fork();
  if (s.pid == 0) {
    ::close(exec_pipe[0]);
    ::close(go_pipe[1]);
    run_child(cs, sig);
  }
  const int fork_err = errno;
  ::close(exec_pipe[1]);
  ::close(go_pipe[0]);
  if (s.pid < 0) {
    ::close(exec_pipe[0]);
    ::close(go_pipe[1]);
    throw Error(std::string("watchdog: fork: ") + std::strerror(fork_err));
  }
  ::setpgid(s.pid, s.pid);  // also here, so the group exists whichever side runs first
  try {
    guardian.emplace(s.pid);
  } catch (...) {
    ::close(exec_pipe[0]);
    ::close(go_pipe[1]);  // the child reads end of file and exits
    int st = 0;
    while (::waitpid(s.pid, &st, 0) < 0 && errno == EINTR) {}
    throw;
  }
  const char go = 1;
  (void)!::write(go_pipe[1], &go, 1);
  ::close(go_pipe[1]);
  ssize_t got;
  do got = ::read(exec_pipe[0], &s.exec_err, sizeof s.exec_err);
  while (got < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  if (got != (ssize_t)sizeof s.exec_err) s.exec_err = 0;
  return s;
}

// The soft and hard limits, sampled: the group's RSS (and host use when asked), with the
// growth rate since the last sample and the look-ahead of twice the sampling gap (the gap grows
// when the box is loaded and we are scheduled late).
class Sampler {
 public:
  Sampler(const WatchdogOptions& o, pid_t pgid, WatchdogReport& rep, const Say& say)
      : o_(o), pgid_(pgid), rep_(rep), say_(say), interval_s_(o.interval_ms / 1000.0) {}

  void sample() {
    const Clock::time_point now = Clock::now();
    const GroupMemory g = process_group_memory(pgid_);
    const uint64_t host = o_.host_soft || o_.host_hard ? read_meminfo().used() : 0;
    ++rep_.samples;
    rep_.peak_group_rss = std::max(rep_.peak_group_rss, g.rss);
    rep_.peak_host_used = std::max(rep_.peak_host_used, host);
    const double dt = have_last_ ? seconds(now - last_t_) : 0.0;
    ahead_ = 2.0 * std::max(interval_s_, dt);
    const double rss_rate = dt > 0 && g.rss > last_rss_ ? (double)(g.rss - last_rss_) / dt : 0.0;
    const double host_rate = dt > 0 && host > last_host_ ? (double)(host - last_host_) / dt : 0.0;
    have_last_ = true;
    last_t_ = now;
    last_rss_ = g.rss;
    last_host_ = host;
    if (!rep_.sent_kill) act(now, g.rss, rss_rate, host, host_rate);
  }

 private:
  void act(Clock::time_point now, uint64_t rss, double rss_rate, uint64_t host, double host_rate) {
    const double rss_proj = (double)rss + rss_rate * ahead_, host_proj = (double)host + host_rate * ahead_;
    if (o_.hard && rss_proj >= (double)o_.hard) {
      kill_group("hard limit: " + limit_line("group RSS", rss, rss_rate, rss_proj, o_.hard));
    } else if (o_.host_hard && host_proj >= (double)o_.host_hard) {
      kill_group("host hard limit: " + limit_line("host use", host, host_rate, host_proj, o_.host_hard));
    } else if (!rep_.sent_term && ((o_.soft && rss >= o_.soft) || (o_.host_soft && host >= o_.host_soft))) {
      ::kill(-pgid_, SIGTERM);
      rep_.sent_term = true;
      term_t_ = now;
      const std::string why = o_.soft && rss >= o_.soft
                                  ? "soft limit: group RSS " + format_bytes(rss) + " >= " + format_bytes(o_.soft)
                                  : "host soft limit: host use " + format_bytes(host) + " >= " + format_bytes(o_.host_soft);
      say_(why + ": sent SIGTERM to process group " + std::to_string(pgid_));
    } else if (rep_.sent_term && o_.kill_after_ms && now - term_t_ >= std::chrono::milliseconds(o_.kill_after_ms)) {
      kill_group("still running " + std::to_string(o_.kill_after_ms) + " ms after SIGTERM");
    }
  }
  void kill_group(const std::string& why) {
    ::kill(-pgid_, SIGKILL);
    rep_.sent_kill = true;
    rep_.kill_reason = why;
    say_(why + ": sent SIGKILL to process group " + std::to_string(pgid_));
  }
  std::string limit_line(const char* what, uint64_t v, double rate, double proj, uint64_t lim) const {
    std::string s = std::string(what) + " " + format_bytes(v);
    if (v >= lim) return s + " >= " + format_bytes(lim);
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.0f ms", ahead_ * 1000);
    return s + " growing " + rate_str(rate) + " would pass " + format_bytes(lim) + " within " + ms + " (projected " +
           format_bytes((uint64_t)proj) + ")";
  }

  const WatchdogOptions& o_;
  const pid_t pgid_;
  WatchdogReport& rep_;
  const Say& say_;
  const double interval_s_;
  double ahead_ = 0;
  bool have_last_ = false;
  Clock::time_point last_t_{}, term_t_{};
  uint64_t last_rss_ = 0, last_host_ = 0;
};

// The exit status as a shell reports it, and a line when the watchdog acted or someone else
// ended the command (the exit status alone does not tell).
void finish_report(WatchdogReport& rep, int st, const struct rusage& ru, const Say& say) {
  rep.child_maxrss = (uint64_t)ru.ru_maxrss * 1024;
  if (WIFEXITED(st)) {
    rep.exited = true;
    rep.status = WEXITSTATUS(st);
    rep.exit_code = rep.status;
  } else if (WIFSIGNALED(st)) {
    rep.signal = WTERMSIG(st);
    rep.exit_code = 128 + rep.signal;
  }
  // A signal the watchdog did not send: someone else (or the kernel: SIGSEGV, the OOM killer's
  // SIGKILL) ended the command.
  const bool ours = rep.signal != 0 && ((rep.sent_kill && rep.signal == SIGKILL) ||
                                        (rep.sent_term && rep.signal == SIGTERM) ||
                                        std::find(rep.forwarded.begin(), rep.forwarded.end(), rep.signal) !=
                                            rep.forwarded.end());
  if (rep.signal != 0 && !ours) {
    say("child killed by signal " + std::to_string(rep.signal) + " (" + signal_name(rep.signal) +
        "), not by the watchdog; exit status " + std::to_string(rep.exit_code));
  } else if (rep.sent_term || rep.sent_kill || !rep.forwarded.empty()) {
    const std::string how = rep.exited ? "exited with status " + std::to_string(rep.status)
                                       : "was ended by " + signal_name(rep.signal);
    const std::string cause = rep.sent_kill ? rep.kill_reason.substr(0, rep.kill_reason.find(':'))
                              : rep.sent_term ? "after SIGTERM at the soft limit"
                                              : "after a forwarded signal";
    say("command " + how + " (" + cause + "); exit status " + std::to_string(rep.exit_code) + "; peak group RSS " +
        format_bytes(rep.peak_group_rss) + " sampled, " + format_bytes(rep.child_maxrss) + " by the kernel (main process)");
  }
}

}  // namespace

WatchdogReport watch_command(const std::vector<std::string>& argv, const WatchdogOptions& o, const Say& log) {
  check_watchdog_options(o);
  if (argv.empty() || argv[0].empty()) throw Error("watchdog: no command given");
  const Say say = [&](const std::string& s) {
    if (log) log(s);
    else std::fprintf(stderr, "sluice watchdog: %s\n", s.c_str());
  };
  const std::vector<std::string> env = command_env(o.extra_env);
  ChildSetup cs;
  for (const std::string& a : argv) cs.argv.push_back(const_cast<char*>(a.c_str()));
  cs.argv.push_back(nullptr);
  for (const std::string& e : env) cs.env.push_back(const_cast<char*>(e.c_str()));
  cs.env.push_back(nullptr);
  cs.give_tty = TerminalHandoff::should();

  WatchdogReport rep;
  SignalState sig;
  std::optional<GroupGuardian> guardian;
  const Started started = start_command(cs, sig, guardian);
  const pid_t pid = started.pid, pgid = pid;
  rep.pgid = pgid;
  rep.guardian = guardian->pid();
  TerminalHandoff tty(cs.give_tty);
  if (started.exec_err) {
    guardian->release();
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    rep.exit_code = 127;
    rep.exited = true;
    rep.status = 127;
    say("cannot run '" + argv[0] + "': " + std::strerror(started.exec_err));
    return rep;
  }
  rep.started = true;

  Sampler sampler(o, pgid, rep, say);
  const timespec wait_ts{(time_t)(o.interval_ms / 1000), (long)(o.interval_ms % 1000) * 1000000L};
  try {
    for (;;) {
      // Has the main process exited? WNOWAIT keeps it a zombie, so its pid (the group id)
      // cannot be reused before the leftovers are killed.
      siginfo_t si{};
      if (::waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid) break;
      sampler.sample();
      siginfo_t info{};
      const int s = ::sigtimedwait(&sig.waited(), &info, &wait_ts);
      if (s > 0 && s != SIGCHLD) {
        ::kill(-pgid, s);
        rep.forwarded.push_back(s);
        say("forwarded " + signal_name(s) + " to process group " + std::to_string(pgid));
      }
    }
  } catch (...) {
    // A command we can no longer watch must not outlive the watchdog.
    ::kill(-pgid, SIGKILL);
    guardian->release();
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    reap_others(pgid);
    throw;
  }

  kill_leftovers(pgid, say);
  guardian->release();  // the group is dealt with, and its id still reserved by the zombie
  int st = 0;
  struct rusage ru {};
  while (::wait4(pid, &st, 0, &ru) < 0 && errno == EINTR) {}
  reap_others(pgid);
  finish_report(rep, st, ru, say);
  return rep;
}

std::pair<uint64_t, uint64_t> parse_watchdog_spec(std::string_view spec) {
  const size_t colon = spec.find(':');
  if (colon == std::string_view::npos || spec.find(':', colon + 1) != std::string_view::npos)
    throw Error("--watchdog: '" + std::string(spec) + "' is not SOFT:HARD (e.g. 100GiB:110GiB)");
  const uint64_t soft = parse_bytes(spec.substr(0, colon), "--watchdog soft limit");
  const uint64_t hard = parse_bytes(spec.substr(colon + 1), "--watchdog hard limit");
  if (soft == 0 || soft >= hard)
    throw Error("--watchdog: the soft limit " + format_bytes(soft) + " must be above 0 and below the hard limit " +
                format_bytes(hard));
  return {soft, hard};
}

bool under_watchdog() {
  const char* v = std::getenv(kUnderWatchdogEnv);
  return v && *v && std::string(v) != "0";
}

std::vector<std::string> strip_watchdog_flag(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  bool options = true;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (i > 0 && options) {
      if (a == "--") options = false;
      else if (a == "--watchdog") {
        ++i;  // and its value
        continue;
      } else if (a.rfind("--watchdog=", 0) == 0) {
        continue;
      }
    }
    out.push_back(a);
  }
  return out;
}

int run_under_watchdog(const std::vector<std::string>& argv, uint64_t soft, uint64_t hard) {
  if (argv.empty()) throw Error("watchdog: empty argv");
  std::vector<std::string> cmd = strip_watchdog_flag(argv);
  char exe[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) throw Error(std::string("watchdog: cannot resolve /proc/self/exe: ") + std::strerror(errno));
  cmd[0] = std::string(exe, (size_t)n);
  WatchdogOptions o;
  o.soft = soft;
  o.hard = hard;
  o.extra_env.push_back(std::string(kUnderWatchdogEnv) + "=1");
  return watch_command(cmd, o).exit_code;
}

}  // namespace sluice
