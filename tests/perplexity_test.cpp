// `sluice perplexity` on the tiny preset (random weights): the figures against an independent
// computation from `run --dump-logits`, their bits across threads and prefill chunks, the
// --stride rule, and the errors (exit 2 for usage, 1 for the rest, FIFOs refused without blocking).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cmd_perplexity.h"
#include "format/gguf.h"
#include "model/deepseek41/config.h"

#include "test_util.h"

namespace fs = std::filesystem;
using sluice::test::CmdResult;
using sluice::test::q;
using sluice::test::run_sluice;
using sluice::test::slurp;
using sluice::test::spawn_sluice;

namespace {

// Words drawn by a fixed LCG: the same text on every run, not one repeated phrase.
std::string some_text(size_t words) {
  static const char* kWords[] = {"the", "river", "runs", "under", "a", "stone", "bridge", "while", "seven",
                                 "quiet", "boats", "wait", "for", "morning", "light", "and", "rain"};
  uint64_t x = 12345;
  std::string s;
  for (size_t i = 0; i < words; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    s += kWords[(x >> 33) % (sizeof kWords / sizeof *kWords)];
    s += i % 11 == 10 ? ".\n" : " ";
  }
  return s;
}

class PerplexityCli : public ::testing::Test {
 protected:
  static fs::path root_;
  static std::string model_;
  static sluice::ModelConfig cfg_;

  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("sluice_perplexity_test_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    model_ = (root_ / "tiny.gguf").string();
    const std::string cmd = q(SLUICE_BINARY) + " make-model --preset tiny -o " + q(model_) + " --seed 1 >/dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    cfg_ = sluice::config_from_gguf(sluice::gguf::File::open(model_));
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  void SetUp() override {
    dir_ = root_ / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write_text(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }

  // --allow-swap: the verdict must not depend on whether the test machine has swap.
  CmdResult ppl(const std::string& args) const {
    return run_sluice(dir_, "perplexity -m " + q(model_) + " --allow-swap " + args);
  }
  nlohmann::json ppl_json(const std::string& args) const {
    const CmdResult r = ppl(args + " --json");
    EXPECT_EQ(r.rc, 0) << args << "\nstderr: " << r.err;
    EXPECT_EQ(r.err_lines(), 1u) << r.err;
    EXPECT_NE(r.err.find("tok/s"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("peak RSS"), std::string::npos) << r.err;
    return r.rc == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
  }
  // The file's tokens as `sluice tokenize` makes them (BOS first, as run -f does).
  std::vector<uint32_t> tokens_of(const std::string& file) const {
    const CmdResult r = run_sluice(dir_, "tokenize -m " + q(model_) + " --ids --no-special < " + q(file));
    EXPECT_EQ(r.rc, 0) << r.err;
    std::istringstream in(r.out);
    std::vector<uint32_t> v;
    for (uint32_t x; in >> x;) v.push_back(x);
    return v;
  }
  void expect_error(const std::string& args, int rc, const std::string& needle) const {
    const CmdResult r = ppl(args);
    EXPECT_EQ(r.rc, rc) << args << "\nstderr: " << r.err;
    EXPECT_EQ(r.err_lines(), 1u) << args << "\nstderr: " << r.err;
    EXPECT_EQ(r.err.rfind("sluice: error: ", 0), 0u) << args << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\nstderr: " << r.err;
    EXPECT_TRUE(r.out.empty()) << args << "\nstdout: " << r.out;
  }

  // The scored NLLs of one window computed here from `run --dump-logits` of its tokens: a
  // log-softmax of our own in long double over the dumped f32 rows.
  std::vector<long double> window_nll(const std::vector<uint32_t>& tokens, size_t start, uint32_t n_ctx,
                                      uint32_t first) const {
    std::vector<uint32_t> w(tokens.begin() + (ptrdiff_t)start, tokens.begin() + (ptrdiff_t)(start + n_ctx));
    w[0] = cfg_.bos_token_id;
    std::string ids;
    for (size_t i = 0; i < w.size(); ++i) ids += (i ? "," : "") + std::to_string(w[i]);
    const std::string out = path("logits_" + std::to_string(start) + ".f32");
    const CmdResult r = run_sluice(dir_, "run -m " + q(model_) + " --allow-swap --tokens " + ids +
                                             " -n 0 --force --dump-logits " + q(out));
    EXPECT_EQ(r.rc, 0) << r.err;
    const std::string bytes = slurp(out);
    const size_t V = cfg_.vocab_size;
    EXPECT_EQ(bytes.size(), (size_t)n_ctx * V * 4);
    std::vector<float> rows(bytes.size() / 4);
    std::memcpy(rows.data(), bytes.data(), rows.size() * 4);
    std::vector<long double> nll;
    for (uint32_t i = first; i + 1 < n_ctx && rows.size() == (size_t)n_ctx * V; ++i) {
      const float* row = rows.data() + (size_t)i * V;
      long double mx = row[0], sum = 0;
      for (size_t v = 0; v < V; ++v) mx = std::max<long double>(mx, row[v]);
      for (size_t v = 0; v < V; ++v) sum += std::exp((long double)row[v] - mx);
      nll.push_back(mx + std::log(sum) - (long double)row[w[i + 1]]);
    }
    return nll;
  }

  fs::path dir_;
};

fs::path PerplexityCli::root_;
std::string PerplexityCli::model_;
sluice::ModelConfig PerplexityCli::cfg_;

// The figures computed here from the NLLs: mean, exp(mean) and llama.cpp's standard error.
struct Expected {
  long double mean, ppl, se;
};
Expected expected(const std::vector<long double>& nll) {
  long double sum = 0, sq = 0;
  for (const long double x : nll) sum += x;
  const long double m = sum / nll.size();
  for (const long double x : nll) sq += (x - m) * (x - m);
  const long double p = std::exp(m);
  return {m, p, p * std::sqrt(sq / nll.size() / (nll.size() - 1))};
}

// perplexity --json against the same figures computed in the test from `run --dump-logits` of
// each window's tokens (the windows, BOS replacement and scored positions by the documented
// rule, written out here again), disjoint and strided. Both read the engine's logits, which
// are bit-identical however the prompt is chunked, so only the arithmetic differs (ours in long
// double, its own order): relative 1e-9 is far above that rounding and far below what a wrong
// row, target or window changes.
TEST_F(PerplexityCli, MatchesAnIndependentComputationFromDumpedLogits) {
  const std::string file = write_text("text.txt", some_text(15));
  const std::vector<uint32_t> tokens = tokens_of(file);
  ASSERT_GE(tokens.size(), 3u * 16);
  ASSERT_LE(tokens.size(), 6u * 16) << "keep the test short: a run per window";
  ASSERT_EQ(tokens[0], cfg_.bos_token_id);
  struct Case {
    uint32_t n_ctx, stride;
  };
  for (const Case c : {Case{16, 0}, Case{16, 7}}) {
    SCOPED_TRACE("n_ctx " + std::to_string(c.n_ctx) + " stride " + std::to_string(c.stride));
    std::vector<long double> nll;
    size_t windows = 0;
    const size_t step = c.stride ? c.stride : c.n_ctx;
    for (size_t start = 0; start + c.n_ctx <= tokens.size(); start += step, ++windows) {
      const uint32_t first = c.stride && start ? c.n_ctx - 1 - c.stride : c.n_ctx / 2;
      for (const long double x : window_nll(tokens, start, c.n_ctx, first)) nll.push_back(x);
    }
    ASSERT_GE(windows, 2u);
    const Expected want = expected(nll);

    std::string args = "-f " + q(file) + " -c " + std::to_string(c.n_ctx);
    if (c.stride) args += " --stride " + std::to_string(c.stride);
    const nlohmann::json j = ppl_json(args);
    ASSERT_TRUE(j.is_object());
    EXPECT_EQ(j["file_tokens"].get<size_t>(), tokens.size());
    EXPECT_EQ(j["chunks"].get<size_t>(), windows);
    EXPECT_EQ(j["tokens_scored"].get<size_t>(), nll.size());
    EXPECT_EQ(j["n_ctx"].get<uint32_t>(), c.n_ctx);
    EXPECT_EQ(j["stride"].get<uint32_t>(), c.stride);
    EXPECT_TRUE(j["complete"].get<bool>());
    EXPECT_NEAR(j["nll_mean"].get<double>(), (double)want.mean, 1e-9 * (double)want.mean);
    EXPECT_NEAR(j["ppl"].get<double>(), (double)want.ppl, 1e-9 * (double)want.ppl);
    EXPECT_NEAR(j["stderr"].get<double>(), (double)want.se, 1e-9 * (double)want.se);
  }
}

// The figures (every JSON field but the timing) and the printed report are the same bits for
// any thread count and prefill chunk: the engine's logits are, and the NLLs are summed in
// position order.
TEST_F(PerplexityCli, SameBitsForAnyThreadsAndChunk) {
  const std::string args = "-f " + q(write_text("text.txt", some_text(25))) + " -c 16";
  std::string ref;
  for (const char* extra : {"-t 1", "-t 2", "--chunk 1", "--chunk 5", ""}) {
    SCOPED_TRACE(extra);
    nlohmann::json j = ppl_json(args + " " + extra);
    ASSERT_TRUE(j.is_object());
    EXPECT_GT(j["tok_per_s"].get<double>(), 0.0);
    j.erase("tok_per_s");  // a measurement, not a result
    if (ref.empty()) ref = j.dump();
    EXPECT_EQ(j.dump(), ref);
  }
  const CmdResult a = ppl(args + " -t 1 --chunk 1"), b = ppl(args + " -t 2 --chunk 7");
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out.find("[1]"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("\nFinal estimate: PPL = "), std::string::npos) << a.out;
  EXPECT_NE(a.out.find(" +/- "), std::string::npos) << a.out;
}

// The windows and scored tokens --stride gives, against the rule in the help and
// docs/perplexity.md: W = floor((T - n_ctx) / S) + 1 windows, n_ctx - 1 - n_ctx/2 + (W - 1) S
// tokens scored (disjoint windows: floor(T / n_ctx), n_ctx - 1 - n_ctx/2 each); --chunks N
// keeps the first N windows.
TEST_F(PerplexityCli, StrideAndChunksScoreTheDocumentedTokens) {
  const std::string file = write_text("text.txt", some_text(12));
  const uint64_t T = tokens_of(file).size();
  ASSERT_GE(T, 32u);
  struct Case {
    uint32_t n_ctx, stride;
    uint64_t chunks;
  };
  for (const Case c : {Case{16, 0, 0}, Case{12, 0, 0}, Case{6, 1, 0}, Case{16, 5, 0}, Case{16, 8, 0}, Case{9, 4, 0},
                       Case{12, 0, 2}, Case{16, 5, 3}, Case{16, 5, 1000}}) {
    SCOPED_TRACE("n_ctx " + std::to_string(c.n_ctx) + " stride " + std::to_string(c.stride) + " chunks " +
                 std::to_string(c.chunks));
    const uint64_t half = c.n_ctx - 1 - c.n_ctx / 2;
    const uint64_t all = c.stride ? (T - c.n_ctx) / c.stride + 1 : T / c.n_ctx;
    const uint64_t windows = c.chunks ? std::min(all, c.chunks) : all;
    const uint64_t scored = c.stride ? half + (windows - 1) * c.stride : windows * half;
    std::string args = "-f " + q(file) + " -c " + std::to_string(c.n_ctx);
    if (c.stride) args += " --stride " + std::to_string(c.stride);
    if (c.chunks) args += " --chunks " + std::to_string(c.chunks);
    const nlohmann::json j = ppl_json(args);
    ASSERT_TRUE(j.is_object());
    EXPECT_EQ(j["file_tokens"].get<uint64_t>(), T);
    EXPECT_EQ(j["chunks"].get<uint64_t>(), windows);
    EXPECT_EQ(j["tokens_scored"].get<uint64_t>(), scored);
  }
}

// The same rule on the window list itself, for many sizes: each token from n_ctx/2 + 1 on (up
// to the end of the last window) is scored exactly once, in order, never the prediction at a
// window's BOS.
TEST(PerplexityWindows, ScoredTokensFollowEachOtherOnce) {
  for (uint32_t n_ctx : {4u, 5u, 8u, 9u, 16u, 33u})
    for (uint32_t stride = 0; stride <= n_ctx / 2; ++stride)
      for (uint64_t T = 0; T < 100; ++T) {
        SCOPED_TRACE(std::to_string(n_ctx) + " " + std::to_string(stride) + " " + std::to_string(T));
        const auto w = sluice::cli::perplexity_windows(T, n_ctx, stride);
        if (T < n_ctx) {
          EXPECT_TRUE(w.empty());
          continue;
        }
        ASSERT_FALSE(w.empty());
        uint64_t next = n_ctx / 2 + 1;  // the first scored token
        for (size_t k = 0; k < w.size(); ++k) {
          EXPECT_GE(w[k].first, 1u);
          EXPECT_LE(w[k].start + n_ctx, T);
          if (stride == 0) {
            EXPECT_EQ(w[k].start, k * n_ctx);
            EXPECT_EQ(w[k].first, n_ctx / 2);
            continue;
          }
          EXPECT_EQ(w[k].start, k * stride);
          for (uint32_t i = w[k].first; i + 1 < n_ctx; ++i) EXPECT_EQ(w[k].start + i + 1, next++);
        }
        if (stride) {
          EXPECT_EQ(next, w.back().start + n_ctx);  // up to the end of the last window
          EXPECT_GT(w.back().start + stride + n_ctx, T);  // and no other window fits
        } else {
          EXPECT_EQ(w.size(), T / n_ctx);
        }
      }
}

// Bad input: exit 1 and one line naming the path or the figures; bad flags: exit 2. A FIFO or
// directory as -f is refused from what it is, before anything is read (a FIFO with no writer
// must not block the command).
TEST_F(PerplexityCli, RefusesBadInputClearly) {
  const std::string text = write_text("text.txt", some_text(30));
  expect_error("-f " + q(path("absent.txt")), 1, "cannot open " + path("absent.txt") + ": No such file");
  expect_error("-f " + q(dir_.string()), 1, dir_.string() + " is a directory, not a regular file");
  const std::string short_file = write_text("short.txt", "the river runs");
  const size_t n = tokens_of(short_file).size();
  expect_error("-f " + q(short_file) + " -c 64", 1,
               short_file + ": " + std::to_string(n) + " tokens, fewer than one window of 64 (-c 64)");
  expect_error("-f " + q(text) + " -c 1", 2, "must be at least 4");
  expect_error("-f " + q(text) + " -c 3", 2, "must be at least 4");
  const uint64_t max_pos = cfg_.max_position_embeddings;
  expect_error("-f " + q(text) + " -c " + std::to_string(max_pos + 1), 2,
               "exceeds the model's max_position_embeddings " + std::to_string(max_pos));
  expect_error("-f " + q(text) + " -c 16 --stride 9", 2,
               "--stride 9 is larger than half the window (-c 16: at most 8)");
  expect_error("-f " + q(text) + " --stride 0", 2, "--stride must be at least 1");
  expect_error("", 2, "--file is required");

  // The FIFO: the command runs without a shell and must end by itself.
  const std::string fifo = path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const std::string out = path("out.txt"), err = path("err.txt");
  const pid_t pid = spawn_sluice({"perplexity", "-m", model_, "--allow-swap", "-f", fifo}, out, err);
  ASSERT_GT(pid, 0);
  int st = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (::waitpid(pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      FAIL() << "perplexity -f FIFO blocked";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 1);
  EXPECT_NE(slurp(err).find(fifo + " is a FIFO, not a regular file"), std::string::npos) << slurp(err);
  EXPECT_TRUE(slurp(out).empty());
}

}  // namespace
