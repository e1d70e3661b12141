// The memory watchdog (src/runtime/watchdog.*) and `sluice watchdog`.
//
// The commands it watches are this test binary re-executed with SLUICE_WATCHDOG_TEST_HOG set:
// a static initializer then runs the requested behaviour (grow steadily, wait for signals, leave
// a process behind, ...) and exits before gtest's main, so no external tool is needed.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "runtime/meminfo.h"
#include "runtime/watchdog.h"
#include "util/error.h"

#include "test_util.h"

extern char** environ;

namespace fs = std::filesystem;
using namespace sluice;
using sluice::test::slurp;
using sluice::test::TempDir;

namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr const char* kHogEnv = "SLUICE_WATCHDOG_TEST_HOG";
constexpr const char* kFileEnv = "SLUICE_WATCHDOG_TEST_FILE";

// ---- the child side (runs before main in a re-executed test binary) -----------------------

volatile sig_atomic_t g_term = 0;

void sleep_ms(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR && !g_term) {}
}

void write_file(const char* path, const std::string& text) {
  if (!path) return;
  const std::string tmp = std::string(path) + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  (void)!::write(fd, text.data(), text.size());
  ::close(fd);
  ::rename(tmp.c_str(), path);  // readers never see a partial file
}

// Grows by 2 MiB of touched anonymous memory every 10 ms; stops growing at 512 MiB (so a broken
// watchdog cannot take the machine down) and gives up after 20 s.
int grow(bool honour_term) {
  if (honour_term) ::signal(SIGTERM, [](int) { g_term = 1; });
  else ::signal(SIGTERM, SIG_IGN);
  const size_t step = 2 * MiB;
  size_t total = 0;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(20)) {
    if (g_term) return 42;
    if (total < 512 * MiB) {
      void* p = ::mmap(nullptr, step, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return 98;
      std::memset(p, 0x5a, step);
      total += step;
    }
    sleep_ms(10);
  }
  return 99;
}

int hog_main(const std::string& mode) {
  const char* file = std::getenv(kFileEnv);
  if (mode == "grow-ignore") return grow(false);
  if (mode == "grow-honour") return grow(true);
  if (mode.rfind("exit:", 0) == 0) {
    std::vector<char> v(1 * MiB, 1);  // a little memory, well below any limit
    return std::atoi(mode.c_str() + 5) + (v[12345] - 1);
  }
  if (mode == "wait") {  // exits with a code naming the signal it got
    ::signal(SIGINT, [](int) { ::_exit(21); });
    ::signal(SIGTERM, [](int) { ::_exit(22); });
    ::signal(SIGHUP, [](int) { ::_exit(23); });
    write_file(file, "ready");
    sleep_ms(20000);
    return 99;
  }
  if (mode == "pid-wait") {  // writes its pid, then sleeps (until killed)
    write_file(file, std::to_string(::getpid()));
    sleep_ms(20000);
    return 99;
  }
  if (mode == "leftover") {  // leaves a sleeping child in the group and exits
    const pid_t c = ::fork();
    if (c == 0) {
      ::signal(SIGTERM, SIG_IGN);
      sleep_ms(30000);
      ::_exit(0);
    }
    write_file(file, std::to_string(c));
    return 5;
  }
  if (mode == "report") {  // writes its command line and SLUICE_UNDER_WATCHDOG
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), {});
    const char* uw = std::getenv(kUnderWatchdogEnv);
    write_file(file, std::string(uw ? uw : "(unset)") + "\n" + cmdline);
    return 9;
  }
  return 97;
}

const int g_hog_ran = [] {
  if (const char* mode = std::getenv(kHogEnv)) ::_exit(hog_main(mode));
  return 0;
}();

// ---- the test side -----------------------------------------------------------------------

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, (size_t)n) : std::string();
}

constexpr const char* kTmpPrefix = "sluice_watchdog_test";

// Polls for a file for up to 15 s (a loaded machine can be slow to start a process).
bool wait_for_file(const std::string& p) {
  for (int i = 0; i < 1500; ++i) {
    if (fs::exists(p)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

struct Spawned {
  pid_t pid = -1;
  std::string err_path;
};

// `sluice ARGS...` with extra environment entries, stderr to a file, stdout discarded.
Spawned spawn_sluice(const TempDir& dir, const std::vector<std::string>& args, const std::vector<std::string>& env_add) {
  Spawned s;
  s.err_path = dir / "stderr.txt";
  std::vector<std::string> argv = {SLUICE_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.push_back(*e);
  env.insert(env.end(), env_add.begin(), env_add.end());
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : env) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, s.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int rc = posix_spawn(&s.pid, SLUICE_BINARY, &fa, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) s.pid = -1;
  return s;
}

struct Finished {
  int status = 0;
  uint64_t maxrss = 0;  // kernel peak RSS of the process and the children it reaped
};

// wait4 with a 60 s safety net: a hung child is killed so the test fails instead of hanging.
Finished finish(pid_t pid) {
  Finished f;
  struct rusage ru {};
  for (int i = 0; i < 6000; ++i) {
    const pid_t r = ::wait4(pid, &f.status, WNOHANG, &ru);
    if (r == pid) {
      f.maxrss = (uint64_t)ru.ru_maxrss * 1024;
      return f;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::wait4(pid, &f.status, 0, &ru);
  ADD_FAILURE() << "process " << pid << " did not finish in 60 s";
  return f;
}

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

size_t find_line(const std::vector<std::string>& lines, const std::string& a, const std::string& b) {
  for (size_t i = 0; i < lines.size(); ++i)
    if (lines[i].find(a) != std::string::npos && lines[i].find(b) != std::string::npos) return i;
  return SIZE_MAX;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find('\n', start);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Limits for the growing child, above what the test binary holds when it starts (a few MiB
// optimized, over 100 MiB under AddressSanitizer, and growing with the suite): measured in this
// process as its static initialisation reaches this file, as the child's does before it grows.
// It grows ~200 MiB/s, reaching soft in well under a second and hard about half a second later.
const uint64_t kStartRss = read_self_status().rss;
const uint64_t kSoft = kStartRss + 96 * MiB, kHard = kStartRss + 224 * MiB;
std::string mib_text(uint64_t bytes) { return std::to_string(bytes / MiB) + "MiB"; }

// Linux carries a process's peak RSS across fork + exec (exec folds the old address space's
// high-water mark into the new program's ru_maxrss), so the kernel's figure for a child is at
// least this test process's own peak at the fork. When every test runs in one process (not
// under ctest, which runs each alone) earlier tests may have grown it past the limits; then the
// kernel figure says nothing about the child and only the watchdog's sampled peaks are checked.
bool kernel_peak_is_the_childs() { return read_self_status().hwm < kSoft / 2; }

// After watch_command returns, the group's guardian was stood down and reaped (a zombie would
// still answer kill 0).
void expect_guardian_gone(const WatchdogReport& r) {
  EXPECT_GT(r.guardian, 0);
  EXPECT_NE(r.guardian, r.pgid);
  errno = 0;
  EXPECT_EQ(::kill(r.guardian, 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

WatchdogOptions grow_limits(const std::string& mode) {
  WatchdogOptions o;
  o.soft = kSoft;
  o.hard = kHard;
  o.interval_ms = 20;
  o.extra_env = {std::string(kHogEnv) + "=" + mode};
  return o;
}

}  // namespace

TEST(WatchdogOptionsTest, ValidatesAndParses) {
  WatchdogOptions o;
  EXPECT_THROW(check_watchdog_options(o), Error);  // no limit
  o.soft = 2 * MiB;
  o.hard = 1 * MiB;
  EXPECT_THROW(check_watchdog_options(o), Error);
  o.hard = 4 * MiB;
  EXPECT_NO_THROW(check_watchdog_options(o));
  o.interval_ms = 0;
  EXPECT_THROW(check_watchdog_options(o), Error);
  o = {};
  o.host_hard = 1 * MiB;  // host-only limits are allowed
  EXPECT_NO_THROW(check_watchdog_options(o));
  EXPECT_THROW(watch_command({}, grow_limits("x")), Error);

  const auto [soft, hard] = parse_watchdog_spec("100GiB:110GiB");
  EXPECT_EQ(soft, 100ull << 30);
  EXPECT_EQ(hard, 110ull << 30);
  for (const char* bad : {"100GiB", "1G:2G:3G", "2G:1G", "1G:1G", ":1G", "0:1G", "x:y"})
    EXPECT_THROW(parse_watchdog_spec(bad), Error) << bad;

  const std::vector<std::string> argv = {"sluice", "run", "--watchdog", "1G:2G", "-m", "f", "--watchdog=3G:4G",
                                         "--",     "--watchdog", "x"};
  const std::vector<std::string> want = {"sluice", "run", "-m", "f", "--", "--watchdog", "x"};
  EXPECT_EQ(strip_watchdog_flag(argv), want);
}

TEST(Watchdog, RunawayChildGetsSigtermThenSigkillBeforeHard) {
  std::vector<std::string> log;
  const WatchdogReport r =
      watch_command({self_exe()}, grow_limits("grow-ignore"), [&](const std::string& s) { log.push_back(s); });
  EXPECT_TRUE(r.started);
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_FALSE(r.exited);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_TRUE(r.sent_term);
  EXPECT_TRUE(r.sent_kill);
  EXPECT_NE(r.kill_reason.find("hard limit"), std::string::npos) << r.kill_reason;
  expect_guardian_gone(r);
  // The kernel's own peak RSS of the child: killed before it reached the hard limit.
  EXPECT_GT(r.child_maxrss, kSoft);
  if (kernel_peak_is_the_childs()) {
    EXPECT_LT(r.child_maxrss, kHard);
  }
  EXPECT_LT(r.peak_group_rss, kHard);
  EXPECT_GE(r.peak_group_rss, kSoft);
  const size_t term = find_line(log, "soft limit", "SIGTERM"), kill = find_line(log, "hard limit", "SIGKILL");
  ASSERT_NE(term, SIZE_MAX) << ::testing::PrintToString(log);
  ASSERT_NE(kill, SIZE_MAX) << ::testing::PrintToString(log);
  EXPECT_LT(term, kill);
  EXPECT_NE(find_line(log, "exit status 137", "peak group RSS"), SIZE_MAX) << ::testing::PrintToString(log);
}

TEST(Watchdog, ChildHonouringSigtermExitsWithItsOwnStatus) {
  std::vector<std::string> log;
  const WatchdogReport r =
      watch_command({self_exe()}, grow_limits("grow-honour"), [&](const std::string& s) { log.push_back(s); });
  EXPECT_EQ(r.exit_code, 42);
  EXPECT_TRUE(r.exited);
  EXPECT_TRUE(r.sent_term);
  EXPECT_FALSE(r.sent_kill);
  if (kernel_peak_is_the_childs()) {
    EXPECT_LT(r.child_maxrss, kHard);
  }
  EXPECT_LT(r.peak_group_rss, kHard);
  EXPECT_NE(find_line(log, "soft limit", "SIGTERM"), SIZE_MAX) << ::testing::PrintToString(log);
  EXPECT_EQ(find_line(log, "SIGKILL", ""), SIZE_MAX) << ::testing::PrintToString(log);
}

TEST(Watchdog, KillAfterEscalatesWhenSigtermIsIgnored) {
  WatchdogOptions o = grow_limits("grow-ignore");
  o.hard = 4ull << 30;  // never reached: the child stops growing at 512 MiB
  o.kill_after_ms = 150;
  std::vector<std::string> log;
  const WatchdogReport r = watch_command({self_exe()}, o, [&](const std::string& s) { log.push_back(s); });
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_TRUE(r.sent_term);
  EXPECT_TRUE(r.sent_kill);
  EXPECT_NE(r.kill_reason.find("150 ms after SIGTERM"), std::string::npos) << r.kill_reason;
  EXPECT_LT(find_line(log, "soft limit", "SIGTERM"), find_line(log, "after SIGTERM", "SIGKILL"))
      << ::testing::PrintToString(log);
}

TEST(Watchdog, HostWideThresholdsAreASecondTrigger) {
  // Host use (MemTotal - MemAvailable) is always above 1 byte: both thresholds fire at once.
  WatchdogOptions o;
  o.host_soft = 1;
  o.host_hard = 2;
  o.interval_ms = 10;
  o.extra_env = {std::string(kHogEnv) + "=grow-honour"};
  std::vector<std::string> log;
  WatchdogReport r = watch_command({self_exe()}, o, [&](const std::string& s) { log.push_back(s); });
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_NE(r.kill_reason.find("host hard limit"), std::string::npos) << r.kill_reason;
  EXPECT_GT(r.peak_host_used, 0u);
  // Soft only: SIGTERM, which the child honours with its own status.
  o.host_hard = 0;
  log.clear();
  r = watch_command({self_exe()}, o, [&](const std::string& s) { log.push_back(s); });
  EXPECT_TRUE(r.sent_term);
  EXPECT_FALSE(r.sent_kill);
  // The SIGTERM may land before the child installed its handler (then it dies of it).
  EXPECT_TRUE(r.exit_code == 42 || r.exit_code == 128 + SIGTERM) << r.exit_code;
  EXPECT_NE(find_line(log, "host soft limit", "SIGTERM"), SIZE_MAX) << ::testing::PrintToString(log);
}

TEST(Watchdog, WellBehavedChildKeepsItsStatusSilently) {
  std::vector<std::string> log;
  auto logger = [&](const std::string& s) { log.push_back(s); };
  WatchdogReport r = watch_command({self_exe()}, grow_limits("exit:7"), logger);
  EXPECT_EQ(r.exit_code, 7);
  expect_guardian_gone(r);
  EXPECT_TRUE(r.exited);
  EXPECT_FALSE(r.sent_term);
  EXPECT_FALSE(r.sent_kill);
  EXPECT_TRUE(log.empty()) << ::testing::PrintToString(log);

  WatchdogOptions o;
  o.soft = 1ull << 30;
  o.hard = 2ull << 30;
  o.interval_ms = 10;
  r = watch_command({"sh", "-c", "exit 3"}, o, logger);  // PATH lookup
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_TRUE(log.empty()) << ::testing::PrintToString(log);
  // A signal the watchdog did not send is the one thing said about a command it left alone.
  r = watch_command({"sh", "-c", "kill -USR1 $$"}, o, logger);
  EXPECT_EQ(r.exit_code, 128 + SIGUSR1);
  EXPECT_FALSE(r.exited);
  EXPECT_EQ(log, std::vector<std::string>{"child killed by signal 10 (SIGUSR1), not by the watchdog; exit status 138"});
  log.clear();

  r = watch_command({"/no/such/program"}, o, logger);
  EXPECT_FALSE(r.started);
  expect_guardian_gone(r);
  EXPECT_EQ(r.exit_code, 127);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("cannot run '/no/such/program'"), std::string::npos) << log[0];
}

TEST(Watchdog, KillsWhatTheCommandLeftInItsGroup) {
  TempDir dir(kTmpPrefix);
  const std::string file = dir / "grandchild.pid";
  // High limits: a forked child counts its shared pages again in the group sum (RSS, not PSS),
  // and a sanitizer build starts at tens of MiB.
  WatchdogOptions o;
  o.soft = 1ull << 30;
  o.hard = 2ull << 30;
  o.interval_ms = 20;
  o.extra_env = {std::string(kHogEnv) + "=leftover", std::string(kFileEnv) + "=" + file};
  std::vector<std::string> log;
  const WatchdogReport r = watch_command({self_exe()}, o, [&](const std::string& s) { log.push_back(s); });
  EXPECT_EQ(r.exit_code, 5);
  expect_guardian_gone(r);
  ASSERT_TRUE(fs::exists(file));
  const pid_t grandchild = (pid_t)std::stol(slurp(file));
  ASSERT_GT(grandchild, 0);
  // Killed and reaped (a zombie would still answer kill 0).
  EXPECT_EQ(::kill(grandchild, 0), -1);
  EXPECT_EQ(errno, ESRCH);
  EXPECT_NE(find_line(log, "killed 1 process", "left in group"), SIZE_MAX) << ::testing::PrintToString(log);
}

TEST(Watchdog, RunUnderWatchdogReexecutesWithoutTheFlag) {
  TempDir dir(kTmpPrefix);
  const std::string file = dir / "report.txt";
  ASSERT_EQ(::setenv(kHogEnv, "report", 1), 0);
  ASSERT_EQ(::setenv(kFileEnv, file.c_str(), 1), 0);
  ASSERT_EQ(::unsetenv(kUnderWatchdogEnv), 0);
  EXPECT_FALSE(under_watchdog());
  const int rc = run_under_watchdog({"whatever", "--watchdog", "1G:2G", "--x", "--watchdog=1G:2G", "y"}, 1ull << 30,
                                    2ull << 30);
  ::unsetenv(kHogEnv);
  ::unsetenv(kFileEnv);
  EXPECT_EQ(rc, 9);
  const std::string report = slurp(file);
  const std::string want_cmdline = self_exe() + std::string("\0--x\0y\0", 7);
  EXPECT_EQ(report, "1\n" + want_cmdline);
  ASSERT_EQ(::setenv(kUnderWatchdogEnv, "1", 1), 0);
  EXPECT_TRUE(under_watchdog());
  ::unsetenv(kUnderWatchdogEnv);
}

TEST(WatchdogCli, RunawayIsKilledBeforeHardWithOneLinePerAction) {
  TempDir dir(kTmpPrefix);
  const Spawned s = spawn_sluice(dir, {"watchdog", "--soft", mib_text(kSoft), "--hard", mib_text(kHard), "--interval-ms", "20", "--",
                                       self_exe()},
                                 {std::string(kHogEnv) + "=grow-ignore"});
  ASSERT_GT(s.pid, 0);
  const Finished f = finish(s.pid);
  const std::string err = slurp(s.err_path);
  EXPECT_EQ(exit_code(f.status), 137) << err;
  // The kernel's peak over the watchdog and everything it reaped (the child): below hard.
  if (kernel_peak_is_the_childs()) {
    EXPECT_LT(f.maxrss, kHard) << err;
  }
  EXPECT_GT(f.maxrss, kSoft) << err;
  const std::vector<std::string> lines = split_lines(err);
  const size_t term = find_line(lines, "soft limit", "SIGTERM"), kill = find_line(lines, "hard limit", "SIGKILL");
  ASSERT_NE(term, SIZE_MAX) << err;
  ASSERT_NE(kill, SIZE_MAX) << err;
  EXPECT_LT(term, kill);
  EXPECT_EQ(lines.size(), 3u) << err;  // SIGTERM, SIGKILL, the summary
  for (const std::string& l : lines) EXPECT_EQ(l.rfind("sluice watchdog: ", 0), 0u) << l;
  EXPECT_NE(lines.back().find("exit status 137"), std::string::npos) << err;
}

TEST(WatchdogCli, WellBehavedCommandKeepsItsStatusAndArguments) {
  TempDir dir(kTmpPrefix);
  // Options of the command after -- belong to it, not to sluice.
  const Spawned s = spawn_sluice(dir, {"watchdog", "--soft", "1G", "--hard", "2G", "--", "sh", "-c", "exit 4"}, {});
  ASSERT_GT(s.pid, 0);
  const Finished f = finish(s.pid);
  EXPECT_EQ(exit_code(f.status), 4) << slurp(s.err_path);
  EXPECT_EQ(slurp(s.err_path), "");
}

TEST(WatchdogCli, ForwardsSignalsToTheGroup) {
  for (const auto& [sig, code, name] : {std::tuple{SIGINT, 21, "SIGINT"}, std::tuple{SIGTERM, 22, "SIGTERM"},
                                        std::tuple{SIGHUP, 23, "SIGHUP"}}) {
    TempDir dir(kTmpPrefix);
    const std::string ready = dir / "ready";
    const Spawned s = spawn_sluice(dir, {"watchdog", "--soft", "1G", "--hard", "2G", "--", self_exe()},
                                   {std::string(kHogEnv) + "=wait", std::string(kFileEnv) + "=" + ready});
    ASSERT_GT(s.pid, 0);
    ASSERT_TRUE(wait_for_file(ready)) << name;
    ASSERT_EQ(::kill(s.pid, sig), 0);
    const Finished f = finish(s.pid);
    const std::string err = slurp(s.err_path);
    EXPECT_EQ(exit_code(f.status), code) << name << ": " << err;
    EXPECT_NE(err.find(std::string("forwarded ") + name + " to process group"), std::string::npos) << err;
  }
}

TEST(WatchdogCli, UsageErrors) {
  TempDir dir(kTmpPrefix);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"watchdog", "--soft", "2G", "--hard", "1G", "--", "true"},
        std::vector<std::string>{"watchdog", "--", "true"},
        std::vector<std::string>{"watchdog", "--soft", "1G", "--hard", "2G"},
        std::vector<std::string>{"watchdog", "--soft", "lots", "--hard", "2G", "--", "true"}}) {
    const Spawned s = spawn_sluice(dir, args, {});
    ASSERT_GT(s.pid, 0);
    const Finished f = finish(s.pid);
    const std::string err = slurp(s.err_path);
    EXPECT_EQ(exit_code(f.status), 2) << ::testing::PrintToString(args) << err;
    EXPECT_EQ(err.rfind("sluice: error: ", 0), 0u) << err;
  }
  const Spawned s = spawn_sluice(dir, {"watchdog", "--hard", "2G", "--", "/no/such/program"}, {});
  const Finished f = finish(s.pid);
  EXPECT_EQ(exit_code(f.status), 127);
  EXPECT_NE(slurp(s.err_path).find("cannot run '/no/such/program'"), std::string::npos);
}

// kill -9 the watchdog: no handler runs, yet its command dies too (PR_SET_PDEATHSIG). This test
// process becomes a subreaper for the duration, so the orphaned command is reparented to it and
// its death can be waited for (and a surviving command cleaned up).
TEST(WatchdogCli, KilledWatchdogTakesItsCommandAlong) {
  TempDir dir(kTmpPrefix);
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const std::string pidfile = dir / "pid";
  const Spawned s = spawn_sluice(dir, {"watchdog", "--soft", "1G", "--hard", "2G", "--", self_exe()},
                                 {std::string(kHogEnv) + "=pid-wait", std::string(kFileEnv) + "=" + pidfile});
  ASSERT_GT(s.pid, 0);
  ASSERT_TRUE(wait_for_file(pidfile));
  const pid_t child = (pid_t)std::stol(slurp(pidfile));
  ASSERT_GT(child, 0);
  ASSERT_EQ(::kill(s.pid, SIGKILL), 0);
  EXPECT_EQ(exit_code(finish(s.pid).status), 137);
  int st = 0;
  pid_t r = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while ((r = ::waitpid(child, &st, WNOHANG)) == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (r == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &st, 0);
    ADD_FAILURE() << "the command (pid " << child << ") outlived its killed watchdog by 5 s";
  } else {
    ASSERT_EQ(r, child);
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << st;
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

// kill -9 the watchdog of a shell that started a background job: PR_SET_PDEATHSIG reaches only
// the shell, but the job in the command's process group must die too, within a few seconds.
// This test process is a subreaper meanwhile, so the orphaned job becomes its child and its
// death can be waited for (and a surviving job killed).
TEST(WatchdogCli, KilledWatchdogTakesTheCommandsWholeGroupAlong) {
  TempDir dir(kTmpPrefix);
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const std::string pidfile = dir / "pid";
  const Spawned s = spawn_sluice(
      dir, {"watchdog", "--soft", "1G", "--hard", "2G", "--", "sh", "-c", std::string("sleep 300 & echo $! > '").append(pidfile).append("'; wait")},
      {});
  ASSERT_GT(s.pid, 0);
  std::string text;
  for (int i = 0; i < 1500 && (text = slurp(pidfile)).find('\n') == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const pid_t job = (pid_t)std::atol(text.c_str());
  ASSERT_GT(job, 0) << text;
  ASSERT_EQ(::kill(s.pid, SIGKILL), 0);
  EXPECT_EQ(exit_code(finish(s.pid).status), 137);
  // The job is first the shell's child, then (the shell gone) ours: ECHILD until then.
  int st = 0;
  pid_t r = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while ((r = ::waitpid(job, &st, WNOHANG)) != job && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (r != job) {
    ::kill(job, SIGKILL);
    ::waitpid(job, &st, 0);
    ADD_FAILURE() << "the background job (pid " << job << ") outlived its killed watchdog by 5 s";
  } else {
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << st;
  }
  while (::waitpid(-1, &st, WNOHANG) > 0) {}  // the shell, reparented to us too
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

// The command killed by someone else: the watchdog says so, naming the signal.
TEST(WatchdogCli, CommandKilledBySomeoneElseIsSaidSo) {
  TempDir dir(kTmpPrefix);
  const std::string pidfile = dir / "pid";
  const Spawned s = spawn_sluice(dir, {"watchdog", "--soft", "1G", "--hard", "2G", "--", self_exe()},
                                 {std::string(kHogEnv) + "=pid-wait", std::string(kFileEnv) + "=" + pidfile});
  ASSERT_GT(s.pid, 0);
  ASSERT_TRUE(wait_for_file(pidfile));
  ASSERT_EQ(::kill((pid_t)std::stol(slurp(pidfile)), SIGKILL), 0);
  const Finished f = finish(s.pid);
  const std::string err = slurp(s.err_path);
  EXPECT_EQ(exit_code(f.status), 137) << err;
  EXPECT_NE(err.find("sluice watchdog: child killed by signal 9 (SIGKILL), not by the watchdog"), std::string::npos)
      << err;
  EXPECT_EQ(split_lines(err).size(), 1u) << err;
}
