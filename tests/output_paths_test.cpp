// Every output path of the sluice command follows util/output_file.h: make-model -o, dump-tensor
// OUT, run --dump-logits OUT (+ OUT.json) and run --trace DIR. Pre-existing files, symbolic links
// and FIFOs are left exactly as they were; a run that fails or is killed mid-way leaves no
// partial file under the name asked for. (FIFOs are made in the test's own directory: tests
// never touch real device nodes.)
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "format/gguf.h"

#include "test_util.h"

namespace fs = std::filesystem;
using sluice::test::CmdResult;
using sluice::test::q;
using sluice::test::run_sluice;
using sluice::test::slurp;
using sluice::test::spawn_sluice;
using sluice::test::TempDir;

namespace {

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(dir)) s.insert(e.path().filename().string());
  return s;
}

// One error line naming the path, exit 1, nothing on stdout.
void expect_refused(const CmdResult& r, const std::string& path, const std::string& why) {
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(r.err_lines(), 1u) << r.err;
  EXPECT_EQ(r.err.rfind("sluice: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(why), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// A pre-existing file, a symbolic link to someone else's file, and a FIFO, in dir.
struct Hazards {
  std::string file, link, victim, fifo;
  explicit Hazards(const TempDir& dir) : file(dir / "existing"), link(dir / "link"), victim(dir / "victim"), fifo(dir / "fifo") {
    std::ofstream(file) << "pre-existing bytes";
    std::ofstream(victim) << "someone else's bytes";
    fs::create_symlink(victim, link);
    EXPECT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    // Held open for reading, so a regression that opens the FIFO to write fails the test
    // instead of blocking it forever.
    fifo_reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    EXPECT_GE(fifo_reader, 0);
  }
  ~Hazards() {
    if (fifo_reader >= 0) ::close(fifo_reader);
  }
  Hazards(const Hazards&) = delete;
  Hazards& operator=(const Hazards&) = delete;
  int fifo_reader = -1;
  void expect_untouched() const {
    EXPECT_EQ(slurp(file), "pre-existing bytes");
    EXPECT_TRUE(fs::is_symlink(link));
    EXPECT_EQ(fs::read_symlink(link), victim);
    EXPECT_EQ(slurp(victim), "someone else's bytes");
    EXPECT_TRUE(fs::is_fifo(fifo));
  }
  std::set<std::string> names() const { return {"existing", "link", "victim", "fifo"}; }
};

class OutputPaths : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new TempDir("sluice_output_paths");
    model_ = *root_ / "tiny.gguf";
    const CmdResult r = run_sluice(*root_, "make-model --preset tiny --seed 1 -o " + q(model_));
    ASSERT_EQ(r.rc, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete root_;
    root_ = nullptr;
  }
  CmdResult run(const TempDir& dir, const std::string& args) const {
    return run_sluice(dir, "run -m " + q(model_) + " --allow-swap --tokens 0,17,33,2 -t 1 " + args);
  }
  static TempDir* root_;
  static std::string model_;
};
TempDir* OutputPaths::root_ = nullptr;
std::string OutputPaths::model_;

}  // namespace

TEST_F(OutputPaths, MakeModelNeverReplacesWhatItDidNotCreate) {
  TempDir dir("sluice_out_make");
  const Hazards h(dir);
  for (const char* force : {"", " --force"}) {
    SCOPED_TRACE(force);
    expect_refused(run_sluice(dir, "make-model --preset tiny -o " + q(h.link) + force), h.link, "symbolic link");
    expect_refused(run_sluice(dir, "make-model --preset tiny -o " + q(h.fifo) + force), h.fifo, "FIFO");
    expect_refused(run_sluice(dir, "make-model --preset tiny -o " + q(dir.path.string()) + force), dir.path.string(),
                   "directory");
  }
  expect_refused(run_sluice(dir, "make-model --preset tiny -o " + q(h.file)), h.file, "already exists");
  h.expect_untouched();
  EXPECT_EQ(names_in(dir.path), h.names()) << "a temporary file was left behind";
  // --force replaces a regular file, with a complete model.
  const CmdResult r = run_sluice(dir, "make-model --preset tiny --seed 1 --force -o " + q(h.file));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(slurp(h.file), slurp(model_));
  EXPECT_NO_THROW(sluice::gguf::File::open(h.file));
  EXPECT_EQ(names_in(dir.path), h.names());
}

TEST_F(OutputPaths, DumpTensorNeverReplacesWhatItDidNotCreate) {
  TempDir dir("sluice_out_dump");
  const Hazards h(dir);
  const std::string args = "dump-tensor " + q(model_) + " blk.0.attn_norm.weight ";
  for (const char* force : {"", " --force"}) {
    SCOPED_TRACE(force);
    expect_refused(run_sluice(dir, args + q(h.link) + force), h.link, "symbolic link");
    expect_refused(run_sluice(dir, args + q(h.fifo) + force), h.fifo, "FIFO");
  }
  expect_refused(run_sluice(dir, args + q(h.file)), h.file, "already exists");
  h.expect_untouched();
  const CmdResult r = run_sluice(dir, args + q(h.file) + " --force");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(slurp(h.file).size(), 256u * sizeof(float));  // tiny: hidden_size 256
  EXPECT_EQ(names_in(dir.path), h.names());
}

TEST_F(OutputPaths, RunDumpLogitsAndTraceRefuseWhatTheyDidNotCreate) {
  TempDir dir("sluice_out_run");
  const Hazards h(dir);
  for (const char* force : {"", " --force"}) {
    SCOPED_TRACE(force);
    expect_refused(run(dir, "-n 2 --dump-logits " + q(h.link) + force), h.link, "symbolic link");
    expect_refused(run(dir, "-n 2 --dump-logits " + q(h.fifo) + force), h.fifo, "FIFO");
    // OUT.json follows the same rule as OUT.
    fs::create_symlink(h.victim, h.file + "2.json");
    expect_refused(run(dir, "-n 2 --dump-logits " + q(h.file + "2") + force), h.file + "2.json", "symbolic link");
    fs::remove(h.file + "2.json");
    // --trace DIR: a link (even to a directory), a FIFO, a file are refused.
    expect_refused(run(dir, "-n 2 --trace " + q(h.link) + force), h.link, "symbolic link");
    expect_refused(run(dir, "-n 2 --trace " + q(h.fifo) + force), h.fifo, "FIFO");
    expect_refused(run(dir, "-n 2 --trace " + q(h.file) + force), h.file, "not a directory");
  }
  expect_refused(run(dir, "-n 2 --dump-logits " + q(h.file)), h.file, "already exists");
  // A non-empty trace directory is someone's: refused without --force.
  expect_refused(run(dir, "-n 2 --trace " + q(dir.path.string())), dir.path.string(), "not empty");
  h.expect_untouched();
  EXPECT_EQ(names_in(dir.path), h.names());

  // --force: the regular file is replaced by a complete dump; the trace goes into the directory.
  const CmdResult r = run(dir, "-n 2 --force --dump-logits " + q(h.file) + " --trace " + q(dir.path.string()));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(slurp(h.file).size(), 5u * 512 * sizeof(float));  // 4 prompt rows + 1 fed back, vocab 512
  EXPECT_FALSE(slurp(h.file + ".json").empty());
  const std::string trace = slurp(dir / "trace.jsonl");
  EXPECT_EQ(std::count(trace.begin(), trace.end(), '\n'), 5) << trace;
  std::set<std::string> want = h.names();
  want.insert({"existing.json", "trace.jsonl"});
  EXPECT_EQ(names_in(dir.path), want);
  // A fresh trace directory is created; an existing empty one is used.
  fs::create_directory(dir / "empty");
  ASSERT_EQ(run(dir, "-n 2 --trace " + q(dir / "empty")).rc, 0);
  ASSERT_EQ(run(dir, "-n 2 --trace " + q(dir / "fresh")).rc, 0);
  EXPECT_EQ(names_in(dir / "empty"), std::set<std::string>{"trace.jsonl"});
  EXPECT_EQ(names_in(dir / "fresh"), std::set<std::string>{"trace.jsonl"});
}

// The dump file hits RLIMIT_FSIZE (EFBIG) after some rows: the run fails, and the file that was
// at OUT before, replaced only on success, is still there byte for byte.
TEST_F(OutputPaths, RunFailingMidWayLeavesThePreexistingDumpByteIdentical) {
  TempDir dir("sluice_out_fail");
  const std::string dump = dir / "logits.f32", err = dir / "err.txt";
  const std::string old(100000, 'x');
  std::ofstream(dump) << old;
  std::ofstream(dump + ".json") << "{\"old\": true}";
  // 32 blocks (16 or 32 KiB whichever the shell counts) < 53 rows of 2 KiB. SIGXFSZ is ignored so
  // the write fails with EFBIG instead of killing the process.
  const std::string cmd = "trap '' XFSZ; ulimit -f 32; exec " + q(SLUICE_BINARY) + " run -m " + q(model_) +
                          " --allow-swap --tokens 0,17,33,2 -n 50 --ignore-eos -t 1 --force --dump-logits " + q(dump) +
                          " >/dev/null 2>" + q(err);
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 1) << slurp(err);
  const std::string e = slurp(err);
  EXPECT_NE(e.find("cannot write " + dump), std::string::npos) << e;
  EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 1) << e;
  EXPECT_TRUE(slurp(dump) == old) << "the pre-existing file changed";
  EXPECT_EQ(slurp(dump + ".json"), "{\"old\": true}");
  EXPECT_EQ(names_in(dir.path), (std::set<std::string>{"logits.f32", "logits.f32.json", "err.txt"}));
}

// kill -9 mid-run: nothing at OUT, OUT.json or DIR/trace.jsonl (a pre-existing OUT stays as it
// was); at most the temporary files, which are named as such.
TEST_F(OutputPaths, RunKilledMidWayLeavesNoPartialFile) {
  TempDir dir("sluice_out_kill");
  const std::string fresh = dir / "fresh.f32", kept = dir / "kept.f32", tdir = dir / "trace";
  const std::string out = dir / "out.txt", err = dir / "err.txt";
  std::ofstream(kept) << "kept bytes";
  for (const std::string& dump : {fresh, kept}) {
    SCOPED_TRACE(dump);
    fs::remove_all(tdir);
    const pid_t pid = spawn_sluice({"run", "-m", model_, "--allow-swap", "--tokens", "0,17,33,2", "-n", "4000", "--ignore-eos",
                             "-t", "1", "--force", "--dump-logits", dump, "--trace", tdir},
                            out, err);
    ASSERT_GT(pid, 0);
    const auto t0 = std::chrono::steady_clock::now();
    while (slurp(out).size() < 16 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_GE(slurp(out).size(), 16u) << "generation did not start: " << slurp(err);
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(st));
    EXPECT_FALSE(fs::exists(fresh)) << "a partial dump is under the name asked for";
    EXPECT_EQ(slurp(kept), "kept bytes");
    EXPECT_FALSE(fs::exists(dump + ".json"));
    EXPECT_FALSE(fs::exists(tdir + "/trace.jsonl")) << "a partial trace is under the name asked for";
    for (const auto& e : fs::recursive_directory_iterator(dir.path)) {
      const std::string n = e.path().filename().string();
      if (e.is_directory() || n == "kept.f32" || n == "out.txt" || n == "err.txt") continue;
      EXPECT_NE(n.find(".sluice-"), std::string::npos) << n;
      EXPECT_EQ(n.substr(n.size() - 4), ".tmp") << n;
    }
  }
}

// Under a file size limit (ulimit -f) a write past it fails with EFBIG, and the kernel also sends
// SIGXFSZ, whose default action kills the process before any cleanup runs. sluice ignores
// SIGXFSZ, so make-model fails with one error line naming the cause, and its temporary file is
// removed (docs/files.md). The limit is far below the tiny model's size.
TEST(OutputFileSizeLimit, MakeModelFailsCleanlyAndLeavesNoTemporaryFile) {
  TempDir dir("sluice_out_fsize");
  const std::string out = dir / "m.gguf", err = dir / "err.txt";
  const std::string cmd = "ulimit -f 64; exec " + q(SLUICE_BINARY) + " make-model --preset tiny -o " + q(out) +
                          " >/dev/null 2>" + q(err);
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st)) << "killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  EXPECT_EQ(WEXITSTATUS(st), 1);
  const std::string e = slurp(err);
  EXPECT_EQ(e.rfind("sluice: error: cannot write " + out + ": File too large", 0), 0u) << e;
  EXPECT_NE(e.find("ulimit -f"), std::string::npos) << e;
  EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 1) << e;
  EXPECT_EQ(names_in(dir.path), std::set<std::string>{"err.txt"}) << "the temporary file stayed";
}

// Standard output redirected to a file that reaches the limit: the command does not die of
// SIGXFSZ, nor exit 0 with its output cut short; it fails naming the cause.
TEST(OutputFileSizeLimit, StandardOutputCutShortIsAnError) {
  TempDir dir("sluice_out_fsize_stdout");
  const std::string model = dir / "m.gguf", out = dir / "out.txt", err = dir / "err.txt";
  ASSERT_EQ(run_sluice(dir, "make-model --preset tiny -o " + q(model)).rc, 0);
  // inspect --tensors prints far more than the 512 or 1024 bytes of one block.
  const std::string cmd = "ulimit -f 1; exec " + q(SLUICE_BINARY) + " inspect " + q(model) + " --tensors >" + q(out) +
                          " 2>" + q(err);
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st)) << "killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  EXPECT_EQ(WEXITSTATUS(st), 1);
  EXPECT_EQ(slurp(err).rfind("sluice: error: cannot write standard output: File too large (the file size limit", 0), 0u)
      << slurp(err);
}
