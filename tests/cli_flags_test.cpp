// Flag parsing shared by the commands: -c/--ctx-size (one spelling, one meaning of 0, one range,
// checked at startup), the usage-error contract (exit 2, one line, the flag's real name, no
// "did you mean -h?" for a negative number) and the unknown-option message.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"

using sluice::test::CmdResult;
using sluice::test::q;
using sluice::test::run_sluice;
using sluice::test::TempDir;

namespace {

constexpr const char* kTmp = "sluice_cli_flags_test";

struct Tiny {
  TempDir dir{kTmp};
  std::string model = dir / "tiny.gguf";  // max_position_embeddings 4096
  Tiny() {
    const CmdResult r = run_sluice(dir, "make-model --preset tiny -o " + q(model));
    EXPECT_EQ(r.rc, 0) << r.err;
  }
};

void expect_usage_error(const CmdResult& r, const std::string& args, const std::string& text) {
  EXPECT_EQ(r.rc, 2) << args << "\nstderr: " << r.err;
  EXPECT_EQ(r.err_lines(), 1u) << args << "\nstderr: " << r.err;
  EXPECT_EQ(r.err.rfind("sluice: error: ", 0), 0u) << args << "\nstderr: " << r.err;
  EXPECT_NE(r.err.find(text), std::string::npos) << args << "\nstderr: " << r.err;
  EXPECT_EQ(r.err.find("listening"), std::string::npos) << args << ": refused before serving";
  EXPECT_EQ(r.err.find("did you mean -h"), std::string::npos) << args << "\nstderr: " << r.err;
}

}  // namespace

// Every command that takes a context refuses the same impossible values the same way, at
// startup (chat before the first message, serve before it listens), naming -c/--ctx-size.
TEST(CliFlags, ContextIsParsedAndBoundedTheSameEverywhere) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "88 starts of the binary: checked in the optimized build";
#endif
  Tiny t;
  const std::string m = q(t.model);
  const std::vector<std::string> commands = {"run -m " + m + " --tokens 1 -n 1", "chat -m " + m,
                                             "serve -m " + m + " --port 0", "plan -m " + m};
  struct Bad {
    std::string value, text;
  };
  const std::vector<Bad> bad = {
      {"-1", "must not be negative"},
      {"99999999999999999999", "out of range"},
      {"123456789012345678901234", "out of range"},
      {"1", "must be at least 2"},
      {"12abc", "not a whole number"},
      {"5000", "exceeds the model's max_position_embeddings 4096"},
      {"5k", "exceeds the model's max_position_embeddings 4096"},  // 5,120
      {"k", "needs a number before its suffix"},
      {"4096k", "exceeds the model's max_position_embeddings 4096"},
      {"5000000M", "out of range"},
      {"32kb", "not a whole number"},
  };
  for (const std::string& cmd : commands) {
    for (const Bad& b : bad) {
      for (const char* flag : {"-c", "--ctx-size"}) {
        const std::string args = cmd + " " + flag + " " + b.value + " </dev/null";
        const CmdResult r = run_sluice(t.dir, args);
        expect_usage_error(r, args, b.text);
        EXPECT_NE(r.err.find("--ctx-size"), std::string::npos) << args << ": " << r.err;
        EXPECT_EQ(r.err.find("18446744073709551615"), std::string::npos) << args << ": " << r.err;
      }
    }
  }
  // plan keeps its --ctx spelling; 0 means the default there as in run, chat and serve.
  for (const char* args : {"--ctx 0", "-c 0", "--ctx-size 0", ""}) {
    const CmdResult r = run_sluice(t.dir, "plan -m " + m + " --allow-swap " + args);
    EXPECT_EQ(r.rc, 0) << args << ": " << r.err;
    EXPECT_NE(r.out.find("ctx 4,096"), std::string::npos) << args << ": " << r.out;
  }
  CmdResult r = run_sluice(t.dir, "plan -m " + m + " --allow-swap --ctx 512");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("ctx 512"), std::string::npos) << r.out;
  // k and M are binary multiples: 4k = 4,096 (the model's maximum), 2K = 2,048.
  const std::vector<std::pair<std::string, std::string>> suffixed = {
      {"-c 4k", "ctx 4,096"}, {"--ctx-size 2K", "ctx 2,048"}, {"--ctx 1k", "ctx 1,024"}};
  for (const auto& [args, want] : suffixed) {
    r = run_sluice(t.dir, "plan -m " + m + " --allow-swap " + args);
    EXPECT_EQ(r.rc, 0) << args << ": " << r.err;
    EXPECT_NE(r.out.find(want), std::string::npos) << args << ": " << r.out;
  }
  r = run_sluice(t.dir, "run -m " + m + " --tokens 1 -n 1 -c 1k --allow-swap");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("ctx 1024,"), std::string::npos) << r.err;
  r = run_sluice(t.dir, "run -m " + m + " --tokens 1 -n 1 -c 0 --allow-swap");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("ctx 2,"), std::string::npos) << "run's default is prompt + n: " << r.err;
  // chat: the chat format itself needs more than 2 positions; said at startup.
  r = run_sluice(t.dir, "chat -m " + m + " -c 3 --allow-swap </dev/null");
  expect_usage_error(r, "chat -c 3", "too small for chat");
}

// Usage errors exit 2 with one line whatever checks them (CLI11, a command, main's --watchdog).
TEST(CliFlags, UsageErrorsExitTwoEverywhere) {
  Tiny t;
  const std::string m = q(t.model);
  struct Case {
    std::string args, text;
  };
  const std::vector<Case> cases = {
      {"run -m " + m + " --tokens 1 -n 1 --watchdog nonsense", "--watchdog"},
      {"run -m " + m + " --tokens 1 -n 1 --watchdog 2GiB:1GiB", "--watchdog"},
      {"serve -m " + m + " --port 0 --max-body lots", "--max-body"},
      {"run -m " + m + " --tokens 1 -n 1 --io-depth x", "--io-depth"},
      {"run -m " + m + " --tokens 1 -n 1 -t -3", "-t"},
      {"plan -m " + m + " --mem-budget lots", "--mem-budget"},
      {"run -m " + m + " --tokens 1 -n 1 --checkpoint-budget lots", "--checkpoint-budget"},
      {"serve -m " + m + " --port 0 --checkpoint-every -1", "--checkpoint-every"},
      {"plan -m " + m + " --checkpoint-budget 1XB", "--checkpoint-budget"},
      {"watchdog --soft x --hard 1G -- true", "--soft"},
      {"run -m " + m + " --tokens 1 -n -5", "-n"},
  };
  for (const Case& c : cases) expect_usage_error(run_sluice(t.dir, c.args + " </dev/null"), c.args, c.text);
}

// "unknown option --tempp (did you mean --temp? ...)", not CLI11's "not expected: 1 --tempp".
TEST(CliFlags, UnknownOptionReadsAsOneSentence) {
  Tiny t;
  const std::string args = "run -m " + q(t.model) + " --tokens 1 -n 1 --tempp 1";
  CmdResult r = run_sluice(t.dir, args);
  expect_usage_error(r, args, "unknown option --tempp (did you mean --temp? run 'sluice run --help'");
  EXPECT_EQ(r.err.find("not expected"), std::string::npos) << r.err;
  r = run_sluice(t.dir, "inspekt x.gguf");
  expect_usage_error(r, "inspekt", "unknown command inspekt (did you mean inspect?");
}

namespace {

// A /proc/meminfo field in bytes (0 when absent).
uint64_t meminfo_bytes(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  uint64_t kb = 0;
  std::string unit;
  while (in >> name >> kb) {
    std::getline(in, unit);
    if (name == field + ":") return kb * 1024;
  }
  return 0;
}

}  // namespace

// A budget above the machine is refused by the commands that would run under it, unless
// --mem-budget-override; above MemAvailable it is always a warning on stderr; plan only warns.
TEST(CliFlags, MemBudgetAboveTheMachineIsRefusedOrWarned) {
  Tiny t;
  const uint64_t total = meminfo_bytes("MemTotal"), swap = meminfo_bytes("SwapTotal");
  ASSERT_GT(total, 0u);
  const std::string beyond = std::to_string((total + swap) / 1024 + (1ull << 20)) + "KiB";  // 1 GiB more
  const std::string m = q(t.model);
  for (const std::string& cmd : {"run -m " + m + " --tokens 1 -n 1", "chat -m " + m, "serve -m " + m + " --port 0"}) {
    const std::string args = cmd + " --allow-swap --mem-budget " + beyond + " </dev/null";
    expect_usage_error(run_sluice(t.dir, args), args, "is more than this machine has (MemTotal");
    const CmdResult r = run_sluice(t.dir, args);
    EXPECT_NE(r.err.find("--mem-budget-override"), std::string::npos) << r.err;
  }
  CmdResult r = run_sluice(t.dir, "run -m " + m + " --tokens 1 -n 1 --allow-swap --mem-budget-override --mem-budget " + beyond);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err.rfind("sluice: warning: --mem-budget", 0), 0u) << r.err;
  EXPECT_EQ(r.err_lines(), 2u) << "one warning, then the summary: " << r.err;
  r = run_sluice(t.dir, "plan -m " + m + " --allow-swap --mem-budget " + beyond);
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err.rfind("sluice: warning: --mem-budget", 0), 0u) << r.err;
  // Between MemAvailable and MemTotal: a warning on every command, the plan printed or not.
  const uint64_t avail = meminfo_bytes("MemAvailable");
  if (avail + (256ull << 20) < total) {
    const std::string above_avail = std::to_string((avail + (total - avail) / 2) / 1024) + "KiB";
    r = run_sluice(t.dir, "run -m " + m + " --tokens 1 -n 1 --allow-swap --mem-budget " + above_avail);
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.err.find("sluice: warning: --mem-budget"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("MemAvailable"), std::string::npos) << r.err;
  }
}
