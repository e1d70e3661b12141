// `sluice run --dump-tensors DIR [--dump-filter REGEX]` on the tiny preset: every layer's named
// intermediates are in DIR/index.json with files of positions x width f32, the "logits" file is
// what --dump-logits writes for the same run, the files do not depend on the chunk size, the
// filter selects names, and DIR follows the output rules (docs/files.md); and the writer alone
// (cli/tensor_dump.h): strided rows, repeated or skipped positions.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/tensor_dump.h"
#include "format/gguf.h"
#include "model/deepseek41/config.h"
#include "util/error.h"

#include "test_util.h"

namespace fs = std::filesystem;
using sluice::test::CmdResult;
using sluice::test::q;
using sluice::test::run_sluice;
using sluice::test::slurp;
using sluice::test::TempDir;

namespace {

// 20 prompt tokens; --chunk 8 splits them in three chunks (and the session's last-token piece).
const std::string kPrompt = "0,17,33,2,250,4,99,123,7,7,7,300,45,46,47,511,3,18,200,64";
const size_t kPromptLen = 20;

std::vector<uint32_t> parse_ids(const std::string& s) {
  std::istringstream in(s);
  std::vector<uint32_t> v;
  for (uint32_t x; in >> x;) v.push_back(x);
  return v;
}

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> s;
  for (const auto& e : fs::directory_iterator(dir)) s.insert(e.path().filename().string());
  return s;
}

// "l<L>.<what>". Built by append: GCC 12 reports a false -Wrestrict for "l" + to_string(L) + ...
std::string layer_name(uint32_t L, const std::string& what) {
  std::string s = "l";
  s.append(std::to_string(L)).append(".").append(what);
  return s;
}

nlohmann::json index_of(const std::string& dir) { return nlohmann::json::parse(slurp(dir + "/index.json")); }

std::map<std::string, nlohmann::json> tensors_of(const nlohmann::json& index) {
  std::map<std::string, nlohmann::json> m;
  for (const nlohmann::json& t : index.at("tensors")) m[t.at("name").get<std::string>()] = t;
  return m;
}

class DumpTensors : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new TempDir("sluice_dump_tensors");
    model_ = *root_ / "tiny.gguf";
    const CmdResult r = run_sluice(*root_, "make-model --preset tiny --seed 1 -o " + q(model_));
    ASSERT_EQ(r.rc, 0) << r.err;
    cfg_ = sluice::config_from_gguf(sluice::gguf::File::open(model_));
  }
  static void TearDownTestSuite() {
    delete root_;
    root_ = nullptr;
  }
  static CmdResult run(const TempDir& dir, const std::string& args) {
    return run_sluice(dir, "run -m " + q(model_) + " --allow-swap --tokens " + kPrompt + " " + args);
  }
  static TempDir* root_;
  static std::string model_;
  static sluice::ModelConfig cfg_;
};
TempDir* DumpTensors::root_ = nullptr;
std::string DumpTensors::model_;
sluice::ModelConfig DumpTensors::cfg_;

// One error line naming `needle`, nothing on stdout.
void expect_error(const CmdResult& r, int rc, const std::string& needle) {
  EXPECT_EQ(r.rc, rc) << r.err;
  EXPECT_EQ(r.err_lines(), 1u) << r.err;
  EXPECT_EQ(r.err.rfind("sluice: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

}  // namespace

TEST_F(DumpTensors, EveryLayerIsDumpedWithItsSizeAndTheLogitsAreDumpLogitsBitForBit) {
  TempDir dir("sluice_dump_tensors_all");
  const std::string out = dir / "dump", logits = dir / "logits.f32";
  const std::string common = "-n 4 --ignore-eos -t 2 --chunk 8";
  const CmdResult a = run(dir, common + " --dump-tensors " + q(out));
  ASSERT_EQ(a.rc, 0) << a.err;
  const CmdResult b = run(dir, common + " --dump-logits " + q(logits));
  ASSERT_EQ(b.rc, 0) << b.err;
  const std::vector<uint32_t> gen = parse_ids(a.out);
  ASSERT_EQ(gen.size(), 4u);
  EXPECT_EQ(parse_ids(b.out), gen);

  // Every prompt position, then the generated tokens fed back (all but the last).
  const size_t positions = kPromptLen + gen.size() - 1;
  const nlohmann::json index = index_of(out);
  EXPECT_EQ(index.at("positions").get<size_t>(), positions);
  EXPECT_EQ(index.at("prompt_tokens").get<size_t>(), kPromptLen);
  std::string spaced = kPrompt;
  for (char& c : spaced) c = c == ',' ? ' ' : c;
  std::vector<uint32_t> want_tokens = parse_ids(spaced);
  ASSERT_EQ(want_tokens.size(), kPromptLen);
  want_tokens.insert(want_tokens.end(), gen.begin(), gen.end() - 1);
  EXPECT_EQ(index.at("tokens").get<std::vector<uint32_t>>(), want_tokens);
  EXPECT_EQ(index.at("model").get<std::string>(), model_);

  const size_t H = cfg_.hidden_size, flat = (size_t)cfg_.hc_mult * H, V = cfg_.vocab_size;
  std::map<std::string, size_t> want = {{"embd", flat}, {"out_norm", H}, {"logits", V}};
  for (uint32_t L = 0; L < cfg_.num_hidden_layers; ++L) {
    for (const char* t : {"attn_in", "attn_out", "ffn_in", "ffn_out"}) want[layer_name(L, t)] = H;
    for (const char* t : {"hc_attn", "out"}) want[layer_name(L, t)] = flat;
  }
  ASSERT_FALSE(cfg_.engram_layer_ids.empty());
  for (uint32_t L : cfg_.engram_layer_ids) want[layer_name(L, "engram_out")] = flat;

  const std::map<std::string, nlohmann::json> got = tensors_of(index);
  for (const auto& [name, width] : want) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(got.count(name)) << "not in index.json";
    EXPECT_EQ(got.at(name).at("width").get<size_t>(), width);
  }
  std::set<std::string> files = {"index.json"};
  for (const auto& [name, t] : got) {
    SCOPED_TRACE(name);
    EXPECT_EQ(t.at("dtype").get<std::string>(), "f32");
    EXPECT_EQ(t.at("first").get<uint64_t>(), 0u);
    EXPECT_EQ(t.at("count").get<uint64_t>(), positions);
    const std::string file = t.at("file").get<std::string>();
    files.insert(file);
    EXPECT_EQ(fs::file_size(out + "/" + file), positions * t.at("width").get<size_t>() * sizeof(float));
  }
  EXPECT_EQ(names_in(out), files);  // nothing else, no temporary file left
  EXPECT_TRUE(index.at("not_dumped").empty());

  const std::string dumped = slurp(out + "/" + got.at("logits").at("file").get<std::string>());
  ASSERT_EQ(dumped.size(), positions * V * sizeof(float));
  EXPECT_TRUE(dumped == slurp(logits)) << "the logits tensor differs from --dump-logits";
}

// Positions accumulate in order over chunks and eval calls: a run split in chunks of 3 (and one
// thread) writes the same bytes as one in chunks of 8 (the engine's determinism contract).
TEST_F(DumpTensors, FilesDoNotDependOnTheChunkSize) {
  TempDir dir("sluice_dump_tensors_chunks");
  const std::string d8 = dir / "c8", d3 = dir / "c3";
  ASSERT_EQ(run(dir, "-n 3 --ignore-eos -t 2 --chunk 8 --dump-tensors " + q(d8)).rc, 0);
  ASSERT_EQ(run(dir, "-n 3 --ignore-eos -t 1 --chunk 3 --dump-tensors " + q(d3)).rc, 0);
  const std::map<std::string, nlohmann::json> t8 = tensors_of(index_of(d8)), t3 = tensors_of(index_of(d3));
  ASSERT_EQ(t8.size(), t3.size());
  ASSERT_GT(t8.size(), 3u);
  for (const auto& [name, t] : t8) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(t3.count(name));
    const std::string f = t.at("file").get<std::string>();
    const std::string a = slurp(d8 + "/" + f), b = slurp(d3 + "/" + f);
    EXPECT_EQ(a.size(), (kPromptLen + 2) * t.at("width").get<size_t>() * sizeof(float));
    EXPECT_TRUE(a == b) << "differs between --chunk 8 and --chunk 3";
  }
}

TEST_F(DumpTensors, FilterSelectsNamesBySearch) {
  TempDir dir("sluice_dump_tensors_filter");
  const std::string exact = dir / "exact", search = dir / "search";
  CmdResult r = run(dir, "-n 2 --dump-tensors " + q(exact) + " --dump-filter '^l1\\.(attn|ffn)_in$'");
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json index = index_of(exact);
  std::map<std::string, nlohmann::json> got = tensors_of(index);
  EXPECT_EQ(got.size(), 2u);
  EXPECT_TRUE(got.count("l1.attn_in") && got.count("l1.ffn_in"));
  EXPECT_EQ(names_in(exact), (std::set<std::string>{"index.json", "l1.attn_in.f32", "l1.ffn_in.f32"}));
  const std::set<std::string> skipped = index.at("not_dumped").get<std::set<std::string>>();
  EXPECT_TRUE(skipped.count("l0.attn_in") && skipped.count("logits") && skipped.count("embd"));
  EXPECT_FALSE(skipped.count("l1.attn_in"));

  // Unanchored: "attn_in" is found in every layer's name.
  r = run(dir, "-n 2 --dump-tensors " + q(search) + " --dump-filter attn_in");
  ASSERT_EQ(r.rc, 0) << r.err;
  got = tensors_of(index_of(search));
  EXPECT_EQ(got.size(), cfg_.num_hidden_layers);
  for (uint32_t L = 0; L < cfg_.num_hidden_layers; ++L) EXPECT_TRUE(got.count(layer_name(L, "attn_in")));

  // Nothing matched: the run succeeds, says so, and the index lists what could be chosen.
  const std::string none = dir / "none";
  r = run(dir, "-n 1 --dump-tensors " + q(none) + " --dump-filter no-such-tensor");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("matched no tensor"), std::string::npos) << r.err;
  EXPECT_EQ(names_in(none), std::set<std::string>{"index.json"});
  EXPECT_TRUE(index_of(none).at("not_dumped").get<std::set<std::string>>().count("l0.out"));
}

TEST_F(DumpTensors, RefusesWhatItMayNotUse) {
  TempDir dir("sluice_dump_tensors_refuse");
  // A non-empty directory is someone's: refused, left as it was.
  const std::string full = dir / "full";
  fs::create_directory(full);
  std::ofstream(full + "/mine") << "my bytes";
  expect_error(run(dir, "-n 2 --dump-tensors " + q(full)), 1, full);
  expect_error(run(dir, "-n 2 --dump-tensors " + q(full)), 1, "not empty");
  EXPECT_EQ(names_in(full), std::set<std::string>{"mine"});
  // A file, a link to an empty directory: refused with --force too.
  const std::string file = dir / "file", empty = dir / "empty", link = dir / "link";
  std::ofstream(file) << "x";
  fs::create_directory(empty);
  fs::create_directory_symlink(empty, link);
  expect_error(run(dir, "-n 2 --force --dump-tensors " + q(file)), 1, "not a directory");
  expect_error(run(dir, "-n 2 --force --dump-tensors " + q(link)), 1, "symbolic link");
  EXPECT_EQ(slurp(file), "x");
  EXPECT_TRUE(fs::is_empty(empty));
  // An invalid regex is a usage error, and DIR is not created.
  const std::string fresh = dir / "fresh";
  expect_error(run(dir, "-n 2 --dump-tensors " + q(fresh) + " --dump-filter '(l1'"), 2, "--dump-filter");
  EXPECT_FALSE(fs::exists(fresh));
  expect_error(run(dir, "-n 2 --dump-filter l1"), 2, "--dump-filter needs --dump-tensors");
  // --force writes into a non-empty directory and leaves what was there.
  const CmdResult r = run(dir, "-n 2 --force --dump-tensors " + q(full) + " --dump-filter '^embd$'");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(names_in(full), (std::set<std::string>{"mine", "index.json", "embd.f32"}));
  EXPECT_EQ(slurp(full + "/mine"), "my bytes");
  // An empty existing directory is used.
  ASSERT_EQ(run(dir, "-n 2 --dump-tensors " + q(empty) + " --dump-filter '^embd$'").rc, 0);
  EXPECT_EQ(names_in(empty), (std::set<std::string>{"index.json", "embd.f32"}));
}

// A write fails mid-run (RLIMIT_FSIZE): the run fails naming the file, and the directory it
// created is gone again (an existing empty one stays, empty).
TEST_F(DumpTensors, FailedRunLeavesNothing) {
  TempDir dir("sluice_dump_tensors_fail");
  fs::create_directory(dir / "empty");
  const std::vector<std::string> outs = {dir / "fresh", dir / "empty"};
  for (const std::string& out : outs) {
    SCOPED_TRACE(out);
    const std::string err = dir / "err.txt";
    // logits rows are 2 KiB (vocab 512): 50 of them pass 32 blocks of the shell's ulimit.
    const std::string cmd = "trap '' XFSZ; ulimit -f 32; exec " + q(SLUICE_BINARY) + " run -m " + q(model_) +
                            " --allow-swap --tokens " + kPrompt + " -n 50 --ignore-eos -t 1 --dump-tensors " + q(out) +
                            " >/dev/null 2>" + q(err);
    const int st = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(st));
    EXPECT_EQ(WEXITSTATUS(st), 1) << slurp(err);
    EXPECT_NE(slurp(err).find("cannot write " + out + "/"), std::string::npos) << slurp(err);
    fs::remove(err);
  }
  EXPECT_EQ(names_in(dir.path), std::set<std::string>{"empty"});
  EXPECT_TRUE(fs::is_empty(dir / "empty"));
}

// The writer on its own: rows taken at the engine's stride, and a position shown twice, out of
// order or with another width is an error rather than a silently wrong file.
TEST(TensorDumpWriter, WritesStridedRowsInOrderAndRefusesRepeatsAndGaps) {
  TempDir dir("sluice_tensor_dump_writer");
  const std::string out = dir / "d";
  {
    sluice::cli::TensorDump d(out, "^a", sluice::Existing::Refuse);
    EXPECT_TRUE(d.wants("a.x"));
    EXPECT_FALSE(d.wants("b"));
    // Two positions of width 3 at stride 5: only the first 3 floats of each row are the tensor.
    const float rows[10] = {1, 2, 3, -1, -1, 4, 5, 6, -1, -1};
    d.observe("a.x", 7, 2, rows, 3, 5);
    const float next[3] = {7, 8, 9};
    d.observe("a.x", 9, 1, next, 3, 3);
    EXPECT_THROW(d.observe("a.x", 9, 1, next, 3, 3), sluice::Error);   // position 9 again
    EXPECT_THROW(d.observe("a.x", 11, 1, next, 3, 3), sluice::Error);  // position 10 skipped
    EXPECT_THROW(d.observe("a.x", 10, 1, next, 2, 2), sluice::Error);  // another width
    d.observe("a/y", 0, 1, next, 3, 3);                               // a name that is not a file name
    EXPECT_EQ(d.finish(nlohmann::json::object()), 2u);
  }
  const nlohmann::json index = index_of(out);
  const std::map<std::string, nlohmann::json> t = tensors_of(index);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t.at("a.x").at("first").get<uint32_t>(), 7u);
  EXPECT_EQ(t.at("a.x").at("count").get<uint64_t>(), 3u);
  EXPECT_EQ(t.at("a/y").at("file").get<std::string>(), "a_y.f32");
  EXPECT_EQ(index.at("not_dumped").get<std::vector<std::string>>(), std::vector<std::string>{"b"});
  const std::string bytes = slurp(out + "/a.x.f32");
  ASSERT_EQ(bytes.size(), 9 * sizeof(float));
  float got[9];
  std::memcpy(got, bytes.data(), sizeof got);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(got[i], (float)(i + 1)) << i;
  EXPECT_EQ(names_in(out), (std::set<std::string>{"index.json", "a.x.f32", "a_y.f32"}));
}

TEST(TensorDumpWriter, InvalidFilterIsAUsageErrorBeforeTheDirectoryExists) {
  TempDir dir("sluice_tensor_dump_regex");
  EXPECT_THROW(sluice::cli::TensorDump(dir / "d", "[a-", sluice::Existing::Refuse), sluice::cli::UsageError);
  EXPECT_FALSE(fs::exists(dir / "d"));
  // 20,000-deep nesting would overflow the stack of the recursive regex compiler: refused by size.
  const std::string deep = std::string(20000, '(') + "a" + std::string(20000, ')');
  EXPECT_THROW(sluice::cli::TensorDump(dir / "d", deep, sluice::Existing::Refuse), sluice::cli::UsageError);
  EXPECT_FALSE(fs::exists(dir / "d"));
}

// --dump-filter is matched in time linear in the name (an NFA simulation, util/linear_regex.h),
// never by backtracking: nested quantifiers that a backtracking matcher (libstdc++'s std::regex)
// explores for minutes on one 17-byte name answer at once. Each runs in a thread with a generous
// deadline; one left running keeps its own TensorDump alive.
TEST(TensorDumpWriter, APathologicalFilterIsMatchedInLinearTime) {
  TempDir dir("sluice_tensor_dump_redos");
  const std::vector<std::string> patterns = {"(\\w*)*(\\w*)*(\\w*)*z", "(\\w|\\w|\\w)*(\\w|\\w|\\w)*z",
                                             "^(.*)*(.*)*(.*)*(.*)*(.*)*\\.$", "(a|aa)*(a|aa)*(\\w*)*\\.\\d$"};
  for (size_t i = 0; i < patterns.size(); ++i) {
    SCOPED_TRACE(patterns[i]);
    auto d = std::make_shared<sluice::cli::TensorDump>(dir / ("d" + std::to_string(i)), patterns[i],
                                                       sluice::Existing::Refuse);
    auto done = std::make_shared<std::promise<bool>>();
    std::future<bool> answer = done->get_future();
    std::thread([d, done] {
      bool any = false;
      for (const char* name : {"l7.dspark_capture", "l1.engram_out", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.x"})
        any = d->wants(name) || any;
      done->set_value(any);
    }).detach();
    ASSERT_EQ(answer.wait_for(std::chrono::seconds(10)), std::future_status::ready)
        << "the filter ran for more than 10 s on three short names";
    EXPECT_FALSE(answer.get());
  }
}

// What the filter selects is what ECMAScript std::regex_search selects, for the syntax the
// tensor names need: literals, '.', classes and their escapes, anchors, word boundaries, groups,
// alternation, greedy and lazy quantifiers and bounded repeats.
TEST(TensorDumpWriter, TheFilterSelectsWhatAnECMAScriptSearchSelects) {
  TempDir dir("sluice_tensor_dump_semantics");
  const std::vector<std::string> names = {
      "embd",     "l0.attn_in", "l0.attn_out", "l0.hc_attn", "l0.ffn_in", "l0.ffn_out", "l0.out", "l1.engram_out",
      "l3.out",   "l13.out",    "l7.dspark_capture", "out_norm", "logits", "a/b", "l1.attn_in2", "L1.ATTN_IN",
      "x y\tz",   "l1-2",       "",           "ab]c",       "a{b}",      "a.b*c+d?e"};
  const std::vector<std::string> patterns = {
      "attn_in", "^l3\\.out$", "^l1\\.(attn|ffn)_in$", "^l[4-7]\\.(out|dspark_capture)$", "^embd$", "no-such-tensor",
      "l1", ".", "^$", "in$", "^l\\d+\\.out$", "^l[0-9]{2}\\.", "_(in|out)$", "^(?:l2|l3)\\.ffn", "ffn_(gate|up)?out",
      "a+b*", "[^l]", "\\bout\\b", "\\Bn_", "^l1[^0-9]", "x?y?z?", "(attn|ffn)_(in|out)", "l[13579]\\.", "engram.out",
      "^.{4}$", "^.{3,5}$", "^.{10,}$", "[.]", "[\\w.]+_in", "\\s", "^\\S+$", "\\D\\d", "[-_]", "A", "(|l1)\\.out",
      "(a*)*b", "^(l(1|2)\\.)?out", "o.t$", "^l.*_.*$", "t{2}", "[a-c-]", "^l\\d{1,2}?\\.", "a.*?n", "(o|u)+t",
      "\\W", "[\\]]", "\\{b\\}", "\\.b\\*c\\+d\\?e", "^(l0|l1)\\.(a|e)[a-z]+_(in|out)$", "[^\\w.]", "\\t", "i{0}n",
      "(?:ab|a)(?:c|bcd)?", "\\x2e", "[A-Z]", "^[^aeiou]*$", "((((a))))", "\\.$|^e", "c{1,}"};
  for (size_t i = 0; i < patterns.size(); ++i) {
    SCOPED_TRACE(patterns[i]);
    const std::regex want(patterns[i], std::regex::ECMAScript);
    sluice::cli::TensorDump d(dir / ("d" + std::to_string(i)), patterns[i], sluice::Existing::Refuse);
    for (const std::string& n : names) EXPECT_EQ(d.wants(n), std::regex_search(n, want)) << "name '" << n << "'";
  }
}

// Features a linear-time matcher cannot have (back-references, lookaround) and syntax outside
// its subset are refused as usage errors naming the filter, before DIR is created.
TEST(TensorDumpWriter, FilterFeaturesOutsideTheLinearSubsetAreUsageErrors) {
  TempDir dir("sluice_tensor_dump_subset");
  for (const std::string p : {"(a)\\1", "(?=a)b", "(?!a)b", "(?<=a)b", "a{2,1}", "a**", "[z-a]", "a{99999}"}) {
    SCOPED_TRACE(p);
    try {
      sluice::cli::TensorDump d(dir / "d", p, sluice::Existing::Refuse);
      ADD_FAILURE() << "accepted";
    } catch (const sluice::cli::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--dump-filter"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(dir / "d"));
  }
}
