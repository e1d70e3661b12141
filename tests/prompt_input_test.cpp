// Hostile prompt inputs: `run -f` reads at most what a prompt fitting the context can be
// (text/prompt_limit.h) and refuses a directory; `chat` skips a line longer than that without
// keeping it; `tokenize` stops reading stdin at 64 MiB. Errors name the path and the limit.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "format/gguf.h"
#include "text/prompt_limit.h"
#include "text/tokenizer.h"
#include "util/error.h"
#include "util/read_file.h"

#include "test_util.h"

namespace fs = std::filesystem;
using sluice::test::CmdResult;
using sluice::test::q;
using sluice::test::run_sluice;
using sluice::test::slurp;
using sluice::test::TempDir;

namespace {

class PromptInput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new TempDir("sluice_prompt_input");
    model_ = *root_ / "tiny.gguf";
    const CmdResult r = run_sluice(*root_, "make-model --preset tiny --seed 1 -o " + q(model_));
    ASSERT_EQ(r.rc, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete root_;
    root_ = nullptr;
  }
  static uint64_t limit_for(uint64_t tokens) {
    const auto tok = sluice::text::Tokenizer::from_gguf(sluice::gguf::File::open(model_));
    return sluice::text::prompt_byte_limit(tok, tokens);
  }
  static TempDir* root_;
  static std::string model_;
};
TempDir* PromptInput::root_ = nullptr;
std::string PromptInput::model_;

void expect_one_error(const CmdResult& r, const std::string& needle1, const std::string& needle2) {
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(r.err_lines(), 1u) << r.err;
  EXPECT_EQ(r.err.rfind("sluice: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(needle1), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(needle2), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

}  // namespace

TEST_F(PromptInput, RunPromptFileThatIsADirectoryIsAnError) {
  TempDir dir("sluice_prompt_dir");
  const CmdResult r = run_sluice(dir, "run -m " + q(model_) + " --allow-swap -n 2 -f " + q(dir.path.string()));
  expect_one_error(r, dir.path.string(), "Is a directory");
}

TEST_F(PromptInput, RunPromptFileLargerThanTheContextCanHoldIsRefusedNamingTheLimit) {
  TempDir dir("sluice_prompt_big");
  const std::string big = dir / "big.txt";
  std::ofstream(big) << std::string(1 << 20, 'a');
  // -c 64 -n 4: 60 prompt positions.
  const uint64_t limit = limit_for(60);
  ASSERT_LT(limit, 1u << 20);
  CmdResult r = run_sluice(dir, "run -m " + q(model_) + " --allow-swap -c 64 -n 4 -f " + q(big));
  expect_one_error(r, big, "more than the limit of " + std::to_string(limit) + " bytes");
  EXPECT_NE(r.err.find("60 tokens"), std::string::npos) << r.err;
  // Exactly at the limit is read (and then judged by its token count, as any prompt).
  std::ofstream(big, std::ios::trunc) << std::string(limit, 'a');
  r = run_sluice(dir, "run -m " + q(model_) + " --allow-swap -c 64 -n 4 -f " + q(big));
  EXPECT_EQ(r.err.find("more than"), std::string::npos) << r.err;
  // A stream with no size (a FIFO) is cut off at the limit instead of being read to its end.
  const std::string fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string cmd = "head -c 4000000 /dev/zero >" + q(fifo) + " & " + q(SLUICE_BINARY) + " run -m " + q(model_) +
                          " --allow-swap -c 64 -n 4 -f " + q(fifo) + " >/dev/null 2>" + q(dir / "err.txt") + "; wait";
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st));
  const std::string err = slurp(dir / "err.txt");
  EXPECT_NE(err.find(fifo + ": more than " + std::to_string(limit) + " bytes"), std::string::npos) << err;
}

TEST_F(PromptInput, ChatSkipsALineLongerThanTheContextCanHold) {
  TempDir dir("sluice_prompt_chat");
  const std::string in = dir / "in.txt";
  std::ofstream(in) << std::string(1 << 20, 'a') << "\nhi\n";
  const CmdResult r = run_sluice(dir, "chat -m " + q(model_) + " --allow-swap -c 64 -n 2 <" + q(in));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("more than " + std::to_string(limit_for(64)) + " bytes"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("skipped"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("prompt tokens"), std::string::npos) << "the next line is answered: " << r.err;
}

TEST_F(PromptInput, TokenizeRefusesAnOversizedStdinWithoutReadingIt) {
  TempDir dir("sluice_prompt_tok");
  // 1 GiB of file hole: refused from its size alone, instantly and without memory.
  const std::string huge = dir / "huge.txt";
  {
    const int fd = ::open(huge.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 1ll << 30), 0);
    ::close(fd);
  }
  const CmdResult r = run_sluice(dir, "tokenize -m " + q(model_) + " --ids <" + q(huge));
  expect_one_error(r, "standard input", "more than the limit of " + std::to_string(64u << 20) + " bytes");
  EXPECT_EQ(run_sluice(dir, "tokenize -m " + q(model_) + " --ids </dev/null").rc, 0);
}

TEST(ReadBounded, LimitsErrorsAndLines) {
  TempDir dir("sluice_read_bounded");
  const std::string f = dir / "f.txt";
  std::ofstream(f) << "0123456789";
  EXPECT_EQ(sluice::read_file_bounded(f, 10, "why"), "0123456789");
  EXPECT_EQ(sluice::read_file_bounded(f, UINT64_MAX, "why"), "0123456789");
  EXPECT_THROW(sluice::read_file_bounded(f, 9, "why"), sluice::Error);
  try {
    sluice::read_file_bounded(dir / "missing", 10, "why");
    ADD_FAILURE() << "no error";
  } catch (const sluice::Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot open " + (dir / "missing") + ": No such file or directory");
  }
  std::istringstream in("short\n" + std::string(100, 'x') + "\nlast");
  std::string line;
  EXPECT_EQ(sluice::read_line_bounded(in, line, 10), sluice::LineRead::Line);
  EXPECT_EQ(line, "short");
  EXPECT_EQ(sluice::read_line_bounded(in, line, 10), sluice::LineRead::TooLong);
  EXPECT_EQ(line, "");
  EXPECT_EQ(sluice::read_line_bounded(in, line, 10), sluice::LineRead::Line);
  EXPECT_EQ(line, "last");
  EXPECT_EQ(sluice::read_line_bounded(in, line, 10), sluice::LineRead::End);
}
