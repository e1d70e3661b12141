// Hostile model files on every command: a GGUF of another architecture is named as such, and
// `inspect` applies (and exits on) the checks `run` makes before loading. Error paths name the
// file once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/gguf.h"

#include "test_util.h"

using sluice::test::CmdResult;
using sluice::test::q;
using sluice::test::run_sluice;
using sluice::test::TempDir;
namespace gguf = sluice::gguf;

namespace {

constexpr const char* kTmp = "sluice_model_checks_test";

void expect_one_error_line(const CmdResult& r, const std::string& context) {
  EXPECT_EQ(r.err_lines(), 1u) << context << "\nstderr: " << r.err;
  EXPECT_EQ(r.err.rfind("sluice: error: ", 0), 0u) << context << "\nstderr: " << r.err;
}

// src's metadata (edited) and tensor records, payload left as holes: enough for every check
// that reads only the header, which is all these tests need.
void rewrite(const std::string& src, const std::string& dst, const std::function<void(std::vector<gguf::KV>&)>& edit) {
  const gguf::File f = gguf::File::open(src);
  std::vector<gguf::KV> kvs = f.kvs();
  edit(kvs);
  gguf::Writer w(f.alignment());
  for (auto& kv : kvs) w.add(kv.key, kv.value);
  for (const auto& t : f.tensors())
    w.add_tensor(t.name, std::vector<uint64_t>(t.ne.begin(), t.ne.begin() + t.n_dims), t.type);
  w.write(dst, {}, /*sparse=*/true);
}

gguf::Value& key(std::vector<gguf::KV>& kvs, const std::string& k) {
  for (auto& kv : kvs)
    if (kv.key == k) return kv.value;
  throw std::runtime_error("no key " + k);
}

struct Models {
  TempDir dir{kTmp};
  std::string tiny = dir / "tiny.gguf";
  Models() {
    const CmdResult r = run_sluice(dir, "make-model --preset tiny -o " + q(tiny));
    EXPECT_EQ(r.rc, 0) << r.err;
  }
};

// The commands that take a model, with FILE where its path goes.
const std::vector<std::string> kModelCommands = {
    "inspect FILE", "inspect --json FILE", "run -m FILE -p hi -n 1", "run -m FILE --tokens 1 -n 1",
    "chat -m FILE", "serve -m FILE --port 0", "plan -m FILE", "tokenize -m FILE --text hi"};

std::string with_file(std::string cmd, const std::string& file) {
  return cmd.replace(cmd.find("FILE"), 4, q(file));
}

}  // namespace

TEST(CliModelChecks, OtherArchitectureIsNamedByEveryCommand) {
  Models m;
  const std::string llama = m.dir / "llama.gguf";
  rewrite(m.tiny, llama, [](auto& kvs) { key(kvs, "general.architecture").s = "llama"; });
  for (const std::string& cmd : kModelCommands) {
    const CmdResult r = run_sluice(m.dir, with_file(cmd, llama) + " </dev/null");
    EXPECT_EQ(r.rc, 1) << cmd << ": " << r.err;
    expect_one_error_line(r, cmd);
    EXPECT_NE(r.err.find("llama.gguf: architecture llama is not supported (sluice runs deepseek41)"), std::string::npos)
        << cmd << ": " << r.err;
    // serve refuses before it listens
    EXPECT_EQ(r.err.find("listening"), std::string::npos) << cmd << ": " << r.err;
  }
  // The human report shows the problem without escaped quotes.
  const CmdResult r = run_sluice(m.dir, "inspect " + q(llama));
  EXPECT_NE(r.out.find("architecture llama is not supported"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\\\""), std::string::npos) << r.out;
}

// Files run refuses at load (the tokenizer does not build, or does not fit the model) are
// refused by inspect too, with the same first problem, after the report.
TEST(CliModelChecks, InspectFailsWhereRunFails) {
  Models m;
  struct Case {
    std::string name, expect;
    std::function<void(std::vector<gguf::KV>&)> edit;
  };
  const std::vector<Case> cases = {
      {"type_count.gguf", "entries for",
       [](auto& kvs) { key(kvs, "tokenizer.ggml.token_type").ai.pop_back(); }},
      {"few_tokens.gguf", "vocabulary lacks the byte token",
       [](auto& kvs) {
         auto& tokens = key(kvs, "tokenizer.ggml.tokens").as;
         auto& types = key(kvs, "tokenizer.ggml.token_type").ai;
         tokens.resize(40);
         types.resize(40);
       }},
      {"big_vocab.gguf", "the tokenizer has",
       [](auto& kvs) {
         key(kvs, "tokenizer.ggml.tokens").as.push_back("one-token-too-many");
         key(kvs, "tokenizer.ggml.token_type").ai.push_back(1);
       }},
  };
  for (const Case& c : cases) {
    const std::string file = m.dir / c.name;
    rewrite(m.tiny, file, c.edit);
    const CmdResult run = run_sluice(m.dir, "run -m " + q(file) + " --tokens 1 -n 1 --allow-swap");
    EXPECT_EQ(run.rc, 1) << c.name << ": " << run.err;
    for (const char* mode : {"inspect ", "inspect --json "}) {
      const CmdResult r = run_sluice(m.dir, mode + q(file));
      EXPECT_EQ(r.rc, 1) << mode << c.name << ": " << r.err;
      expect_one_error_line(r, c.name);
      EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.name << ": " << r.err;
      EXPECT_FALSE(r.out.empty()) << c.name << ": the report still goes to stdout";
      // The first problem inspect names is the one run stops at.
      const std::string first = r.err.substr(std::min(r.err.size(), std::string("sluice: error: ").size()), 60);
      EXPECT_NE(run.err.find(first), std::string::npos) << c.name << "\ninspect: " << r.err << "run: " << run.err;
    }
    const CmdResult j = run_sluice(m.dir, "inspect --json " + q(file));
    EXPECT_EQ(nlohmann::json::parse(j.out)["valid"], false) << c.name;
  }
}

TEST(CliModelChecks, InspectPrintsTheTensorTableOnlyWithTensors) {
  Models m;
  CmdResult r = run_sluice(m.dir, "inspect " + q(m.tiny));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.find("blk.0.ffn_gate_exps.weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--tensors"), std::string::npos) << "the report says how to get the table";
  EXPECT_NE(r.out.find("schema deepseek41: OK"), std::string::npos);
  r = run_sluice(m.dir, "inspect --tensors " + q(m.tiny));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("blk.0.ffn_gate_exps.weight"), std::string::npos);
  r = run_sluice(m.dir, "inspect --json " + q(m.tiny));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_GT(nlohmann::json::parse(r.out)["tensors"].size(), 100u);
}

// The default report is a summary that fits a screen: the model's shape, size, type mix and the
// checks; every metadata key only with --metadata.
TEST(CliModelChecks, InspectSummarisesAndListsTheMetadataOnlyWithMetadata) {
  Models m;
  CmdResult r = run_sluice(m.dir, "inspect " + q(m.tiny));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.find("deepseek41.hidden_size"), std::string::npos) << r.out;
  for (const char* line : {"architecture deepseek41", "shape        ", "parameters   ", "types        ", "Q8_0: ",
                           "routed experts", "schema deepseek41: OK", "--metadata"})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  EXPECT_LE(std::count(r.out.begin(), r.out.end(), '\n'), 24) << r.out;
  const nlohmann::json j = nlohmann::json::parse(run_sluice(m.dir, "inspect --json " + q(m.tiny)).out);
  uint64_t params = 0;
  for (const auto& t : j["tensors"]) {
    uint64_t n = 1;
    for (const auto& d : t["ne"]) n *= d.get<uint64_t>();
    params += n;
  }
  char expect[64];
  std::snprintf(expect, sizeof expect, "parameters   %.3gM", (double)params / 1e6);
  EXPECT_NE(r.out.find(expect), std::string::npos) << expect << "\n" << r.out;
  const std::string shape = "shape        " + std::to_string(j["n_layer"].get<int>()) + " layers";
  EXPECT_NE(r.out.find(shape), std::string::npos) << shape << "\n" << r.out;

  r = run_sluice(m.dir, "inspect --metadata " + q(m.tiny));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("deepseek41.hidden_size"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("metadata ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("schema deepseek41: OK"), std::string::npos);
}

// Errors about a file name it once ("X: X: ..." was printed when two layers each added it).
TEST(CliModelChecks, ErrorsNameTheFileOnce) {
  Models m;
  const std::string broken = m.dir / "broken.gguf";
  rewrite(m.tiny, broken, [](auto& kvs) { key(kvs, "tokenizer.ggml.model").s = "llama"; });
  const std::string missing = m.dir / "missing.gguf";
  for (const std::string& file : {broken, missing, m.dir.path.string()}) {
    for (const std::string& cmd : kModelCommands) {
      // plan reads the header for the memory plan only; a broken tokenizer is a warning there.
      if (file == broken && cmd.rfind("plan", 0) == 0) continue;
      const std::string args = with_file(cmd, file);
      const CmdResult r = run_sluice(m.dir, args + " </dev/null");
      EXPECT_EQ(r.rc, 1) << args << ": " << r.err;
      expect_one_error_line(r, args);
      const size_t first = r.err.find(file);
      ASSERT_NE(first, std::string::npos) << args << ": " << r.err;
      EXPECT_EQ(r.err.find(file, first + file.size()), std::string::npos) << args << ": " << r.err;
    }
  }
}
