// Issue 4 acceptance: on a generated model whose routed experts are several times the memory
// budget, `sluice run` (prompt + generation, experts streamed through the store) keeps its peak
// RSS within the admitted budget. Peak RSS is read from /proc/PID/status (VmHWM) while the child
// runs and from wait4's rusage when it ends. The same measurement on a run that loads every
// expert shows it does see expert memory, so the bound is not met by accident.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/gguf.h"
#include "runtime/admission.h"
#include "runtime/meminfo.h"

#include "test_util.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using test::slurp;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;  // shadow memory and the quarantine make RSS meaningless
#else
constexpr bool kSanitized = false;
#endif

struct Peak {
  int status = -1;
  uint64_t proc_hwm = 0;     // largest VmHWM seen in /proc/PID/status
  uint64_t rusage_max = 0;   // ru_maxrss at exit
  std::string out, err;
};

// Runs SLUICE_BINARY args..., sampling /proc/PID/status every 2 ms until it exits.
Peak run_measured(const std::vector<std::string>& args, const fs::path& dir) {
  std::vector<std::string> all = {SLUICE_BINARY};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string out = (dir / "out.txt").string(), err = (dir / "err.txt").string();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fo = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int fe = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fo, 1);
    ::dup2(fe, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  Peak p;
  if (pid < 0) return p;
  const std::string status = "/proc/" + std::to_string(pid) + "/status";
  while (true) {
    std::ifstream f(status);
    std::string line;
    while (std::getline(f, line))
      if (line.rfind("VmHWM:", 0) == 0) p.proc_hwm = std::max<uint64_t>(p.proc_hwm, std::stoull(line.substr(6)) * 1024);
    int st = 0;
    struct rusage ru {};
    const pid_t r = ::wait4(pid, &st, WNOHANG, &ru);
    if (r == pid) {
      p.status = st;
      p.rusage_max = (uint64_t)ru.ru_maxrss * 1024;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  p.out = slurp(out);
  p.err = slurp(err);
  return p;
}

// The tiny preset widened to `hidden` x `inter` with `experts` routed experts (top-6), written to
// dir/<name>.gguf; returns its path.
std::string widened_tiny(const fs::path& dir, const std::string& name, int hidden, int inter, int experts) {
  nlohmann::json cfg = nlohmann::json::parse(slurp(std::string(SLUICE_TEST_DATA) + "/../../configs/tiny.json"));
  cfg["hidden_size"] = hidden;
  cfg["moe_intermediate_size"] = inter;
  cfg["n_routed_experts"] = experts;
  cfg["num_experts_per_tok"] = 6;
  const std::string cfg_path = (dir / (name + ".json")).string(), model = (dir / (name + ".gguf")).string();
  std::ofstream(cfg_path) << cfg.dump(1);
  const std::string make = std::string(SLUICE_BINARY) + " make-model --config " + cfg_path + " -o " + model + " >/dev/null";
  if (std::system(make.c_str()) != 0) ADD_FAILURE() << make;
  return model;
}

// 64 prompt ids for --tokens.
std::string prompt_ids() {
  std::string prompt;
  for (int i = 0; i < 64; ++i) {
    if (i) prompt += ',';
    prompt += std::to_string((i * 37 + 5) % 512);
  }
  return prompt;
}

TEST(MemoryBound, PeakRssStaysWithinTheBudgetWhenExpertsAreSeveralTimesIt) {
  if (kSanitized) GTEST_SKIP() << "RSS under AddressSanitizer includes shadow memory; checked in the optimized build";
  const test::TempDir tmp("sluice-memory-bound");
  const fs::path dir = tmp.path;
  // The tiny preset, widened: 8 layers x 160 experts of ~1.3 MB (IQ2_XXS gate/up, Q2_K down).
  const std::string model = widened_tiny(dir, "wide", 1024, 1536, 160);
  ASSERT_FALSE(::testing::Test::HasFailure());

  const uint64_t budget = 400ull << 20;
  const ModelFootprint fp = footprint_from_gguf(gguf::File::open(model));
  ASSERT_GE(fp.routed_expert_bytes, 3 * budget) << "the experts must be several times the budget";

  const std::string prompt = prompt_ids();
  const Peak p = run_measured({"run", "-m", model, "--tokens", prompt, "-n", "32", "--ignore-eos", "--mem-budget",
                               "400MiB", "-t", "2", "--allow-swap"},
                              dir);
  ASSERT_TRUE(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0) << p.err;
  EXPECT_EQ(std::count(p.out.begin(), p.out.end(), ' '), 31) << p.out;  // 32 ids
  EXPECT_NE(p.err.find("expert cache"), std::string::npos) << p.err;
  EXPECT_GT(p.proc_hwm, 0u);
  EXPECT_LE(p.proc_hwm, budget) << "VmHWM " << p.proc_hwm << "\n" << p.err;
  // ru_maxrss also carries this test process's own peak across fork + exec (Linux), so it only
  // speaks for the child while this process is small (always so under ctest); VmHWM, read from
  // the child's /proc, is its own address space's peak either way.
  if (read_self_status().hwm < budget / 2) {
    EXPECT_LE(p.rusage_max, budget) << "ru_maxrss " << p.rusage_max << "\n" << p.err;
  }

  // The same measurement sees expert memory: loading every expert needs more than the budget
  // (and admission refuses that budget for it).
  const Peak all = run_measured({"run", "-m", model, "--tokens", prompt, "-n", "2", "--ignore-eos", "--mem-budget",
                                 "4GiB", "-t", "2", "--allow-swap", "--resident-experts"},
                                dir);
  ASSERT_TRUE(WIFEXITED(all.status) && WEXITSTATUS(all.status) == 0) << all.err;
  EXPECT_GT(all.proc_hwm, fp.routed_expert_bytes);
  const Peak refused = run_measured({"run", "-m", model, "--tokens", prompt, "-n", "2", "--mem-budget", "400MiB",
                                     "--allow-swap", "--resident-experts"},
                                    dir);
  EXPECT_TRUE(WIFEXITED(refused.status) && WEXITSTATUS(refused.status) == 1) << refused.err;
  EXPECT_NE(refused.err.find("memory admission refused"), std::string::npos) << refused.err;
}


// Issue 10: the runtime overhead is measured (the process's resident set when planning plus a
// per-allocation bound) instead of a fixed 256 MiB, so a small budget that fits is admitted. A
// model with 432 MiB of experts under experts/4 + 256 MiB and lru-per-layer: the fixed slack
// left its cache 4 experts per layer (refused: a token needs 6); now it runs, within the budget.
TEST(MemoryBound, TinyBudgetOfAQuarterOfTheExpertsPlus256MiBIsAdmittedAndHeld) {
  if (kSanitized) GTEST_SKIP() << "RSS under AddressSanitizer includes shadow memory; checked in the optimized build";
  const test::TempDir tmp("sluice-tiny-budget");
  const fs::path dir = tmp.path;
  // The tiny preset, widened: 8 layers x 128 experts of 432 KiB (IQ2_XXS gate/up, Q2_K down).
  const std::string model = widened_tiny(dir, "quarter", 512, 1024, 128);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const ModelFootprint fp = footprint_from_gguf(gguf::File::open(model));
  ASSERT_EQ(fp.routed_expert_bytes, 432ull << 20);
  ASSERT_EQ(fp.config.max_position_embeddings, 4096u);
  const uint64_t budget = fp.routed_expert_bytes / 4 + (256ull << 20);
  const std::string budget_arg = std::to_string(budget);

  const std::string prompt = prompt_ids();
  // The model's whole context (run would size a smaller one from the prompt, which needs less).
  const Peak p = run_measured({"run", "-m", model, "--tokens", prompt, "-n", "32", "--ignore-eos", "--mem-budget",
                               budget_arg, "-c", "4096", "-t", "2", "--allow-swap", "--cache-policy", "lru-per-layer"},
                              dir);
  ASSERT_TRUE(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0) << p.err;
  EXPECT_EQ(std::count(p.out.begin(), p.out.end(), ' '), 31) << p.out;
  EXPECT_GT(p.proc_hwm, 0u);
  EXPECT_LE(p.proc_hwm, budget) << "VmHWM " << p.proc_hwm << "\n" << p.err;
  if (read_self_status().hwm < budget / 2) {
    EXPECT_LE(p.rusage_max, budget) << "ru_maxrss " << p.rusage_max << "\n" << p.err;
  }
}

}  // namespace
}  // namespace sluice
