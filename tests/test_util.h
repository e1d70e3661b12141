// Helpers for tests that work in a temporary directory or run the `sluice` binary.
// They live in one place because each test file used to carry its own copy, and the copies
// drifted apart (one quoted paths differently, one cleaned up its capture files, one did not).
#pragma once

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

namespace sluice::test {

// True when this build has the Vulkan backend (the Vulkan tests then expect a device).
inline constexpr bool kVulkanBuilt = SLUICE_TEST_VULKAN_EXPECTED;

// A fresh directory for one test, removed when it goes out of scope. The name carries the pid
// and the running test's name so parallel test processes and successive tests never share one.
struct TempDir {
  std::filesystem::path path;

  explicit TempDir(const std::string& prefix) {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    // A parameterized test's name has a '/' (Name/0): as a path that would be a directory inside
    // one this object never removes.
    std::string name = info ? info->name() : "no_test";
    std::replace(name.begin(), name.end(), '/', '_');
    path = std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()) + "_" + name);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  // Owning a directory on disk: a copy would remove it twice.
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// An environment variable set for a scope (the processes it starts inherit it), then put back
// as it was, unset where it was unset.
struct ScopedEnv {
  std::string name, old;
  bool had = false;
  ScopedEnv(const std::string& n, const std::string& value) : name(n) {
    if (const char* v = std::getenv(n.c_str())) {
      had = true;
      old = v;
    }
    ::setenv(n.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had)
      ::setenv(name.c_str(), old.c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

// The whole file as bytes; empty when it cannot be read.
inline std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Single-quotes s for /bin/sh. A quote inside s closes the quoting, adds an escaped quote and
// reopens it ('\''), so any path survives the shell unchanged.
inline std::string q(const std::string& s) {
  std::string r = "'";
  for (const char c : s) {
    if (c == '\'')
      r += "'\\''";
    else
      r += c;
  }
  return r + "'";
}

struct CmdResult {
  int rc = -1;  // exit code, or -1 when the process did not exit normally (killed by a signal)
  std::string out, err;
  size_t err_lines() const { return (size_t)std::count(err.begin(), err.end(), '\n'); }
};

// Runs `sluice ARGS` (ARGS already shell-quoted where needed) with stdout and stderr captured to
// files in dir. The capture files are removed afterwards so dir holds only what the command wrote.
inline CmdResult run_sluice(const std::filesystem::path& dir, const std::string& args) {
  const std::string out = (dir / "stdout.txt").string(), err = (dir / "stderr.txt").string();
  const std::string cmd = q(SLUICE_BINARY) + " " + args + " >" + q(out) + " 2>" + q(err);
  const int st = std::system(cmd.c_str());
  CmdResult r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  std::error_code ec;
  std::filesystem::remove(out, ec);
  std::filesystem::remove(err, ec);
  return r;
}

inline CmdResult run_sluice(const TempDir& dir, const std::string& args) { return run_sluice(dir.path, args); }

// Starts `sluice ARGS...` (no shell) with stdout and stderr redirected to the files out and err,
// and returns its pid (-1 when a file cannot be opened), for tests that signal or kill it while
// it runs; the caller waits for it.
inline pid_t spawn_sluice(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  std::vector<std::string> all = {SLUICE_BINARY};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  // O_CLOEXEC: only the child's stdout and stderr (dup2 clears the flag) outlive the exec.
  const int fo = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int fe = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fo < 0 || fe < 0) {
    if (fo >= 0) ::close(fo);
    if (fe >= 0) ::close(fe);
    return -1;
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fo, 1);
    ::dup2(fe, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fo);
  ::close(fe);
  return pid;
}

}  // namespace sluice::test
