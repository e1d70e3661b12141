// The `sluice` binary end to end: make-model, inspect, dump-tensor and the error contract
// (exit 0 / 1 with one `sluice: error:` line / 2 for usage errors with a hint).
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/gguf.h"
#include "model/deepseek41/config.h"
#include "model/deepseek41/schema.h"

#include "test_util.h"

namespace fs = std::filesystem;
using sluice::test::CmdResult;
using sluice::test::q;
using sluice::test::run_sluice;
using sluice::test::slurp;
using sluice::test::TempDir;

namespace {

constexpr const char* kTmpPrefix = "sluice_cli_test";

std::string lower(std::string s) {
  for (char& ch : s) ch = (char)std::tolower((unsigned char)ch);
  return s;
}

// A failure is exactly one line on stderr, starting with "sluice: error:".
void expect_one_error_line(const CmdResult& r, const std::string& context) {
  EXPECT_EQ(r.err_lines(), 1u) << context << "\nstderr: " << r.err;
  EXPECT_EQ(r.err.rfind("sluice: error: ", 0), 0u) << context << "\nstderr: " << r.err;
  EXPECT_EQ(r.err.back(), '\n') << context;
}

nlohmann::json inspect_json(const TempDir& dir, const std::string& file) {
  const CmdResult r = run_sluice(dir, "inspect --json " + q(file));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  return nlohmann::json::parse(r.out);
}

std::vector<float> read_f32(const std::string& p) {
  const std::string bytes = slurp(p);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

std::string source_dir() { return std::string(SLUICE_TEST_DATA) + "/../.."; }

}  // namespace

TEST(CliBasics, VersionAndHelp) {
  TempDir dir(kTmpPrefix);
  CmdResult r = run_sluice(dir, "--version");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find(SLUICE_VERSION), std::string::npos) << r.out;
  r = run_sluice(dir, "--help");
  EXPECT_EQ(r.rc, 0);
  for (const char* cmd : {"make-model", "inspect", "dump-tensor"}) EXPECT_NE(r.out.find(cmd), std::string::npos) << cmd;
  r = run_sluice(dir, "inspect --help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("--json"), std::string::npos);
  EXPECT_NE(r.out.find("Exit status"), std::string::npos);
}

TEST(CliBasics, UsageErrorsExitTwoWithAHint) {
  TempDir dir(kTmpPrefix);
  CmdResult r = run_sluice(dir, "");
  EXPECT_EQ(r.rc, 2);
  expect_one_error_line(r, "no command");
  EXPECT_NE(r.err.find("--help"), std::string::npos) << r.err;

  r = run_sluice(dir, "make-model --preset tiny --sprase -o " + q(dir / "x.gguf"));
  EXPECT_EQ(r.rc, 2);
  expect_one_error_line(r, "unknown flag");
  EXPECT_NE(r.err.find("--sprase"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did you mean --sparse"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sluice make-model --help"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "x.gguf"));

  r = run_sluice(dir, "inspect --bogus-flag " + q(dir / "x.gguf"));
  EXPECT_EQ(r.rc, 2);
  expect_one_error_line(r, "unknown flag");
  EXPECT_NE(r.err.find("--help"), std::string::npos) << r.err;

  r = run_sluice(dir, "inspekt x.gguf");
  EXPECT_EQ(r.rc, 2);
  expect_one_error_line(r, "unknown command");
  EXPECT_NE(r.err.find("did you mean inspect"), std::string::npos) << r.err;

  r = run_sluice(dir, "make-model -o " + q(dir / "x.gguf"));
  EXPECT_EQ(r.rc, 2);
  expect_one_error_line(r, "neither --config nor --preset");

  r = run_sluice(dir, "make-model --preset huge -o " + q(dir / "x.gguf"));
  EXPECT_EQ(r.rc, 2);
  expect_one_error_line(r, "bad preset");

  r = run_sluice(dir, "make-model --preset tiny --config a.json -o " + q(dir / "x.gguf"));
  EXPECT_EQ(r.rc, 2);
  expect_one_error_line(r, "both --config and --preset");

  r = run_sluice(dir, "dump-tensor only-a-file");
  EXPECT_EQ(r.rc, 2);
  expect_one_error_line(r, "missing positionals");
}

TEST(CliBasics, MissingFilesExitOneNamingTheFile) {
  TempDir dir(kTmpPrefix);
  const std::string missing = dir / "no-such-model.gguf";
  for (const std::string& args : {"inspect " + q(missing), "inspect --json " + q(missing),
                                  "dump-tensor " + q(missing) + " token_embd.weight " + q(dir / "o.f32"),
                                  "make-model --config " + q(dir / "no-such-config.json") + " -o " + q(dir / "m.gguf"),
                                  "make-model --preset tiny --vocab " + q(missing) + " -o " + q(dir / "m.gguf")}) {
    const CmdResult r = run_sluice(dir, args);
    EXPECT_EQ(r.rc, 1) << args;
    expect_one_error_line(r, args);
    EXPECT_NE(r.err.find("no-such-"), std::string::npos) << args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << args << ": " << r.out;
  }
  EXPECT_FALSE(fs::exists(dir / "m.gguf"));
  EXPECT_FALSE(fs::exists(dir / "o.f32"));
}

TEST(CliMakeModel, PublishedSparseHasThePublishedLayout) {
  TempDir dir(kTmpPrefix);
  const std::string model = dir / "published.gguf";
  CmdResult r = run_sluice(dir, "make-model --preset published --sparse -o " + q(model));
  ASSERT_EQ(r.rc, 0) << r.err;
  struct stat st {};
  ASSERT_EQ(::stat(model.c_str(), &st), 0);
  EXPECT_EQ((uint64_t)st.st_size, 365713686528ull);
  EXPECT_LT((uint64_t)st.st_blocks * 512, 64ull << 20) << "payload should be a hole";

  const nlohmann::json j = inspect_json(dir, model);
  EXPECT_EQ(j["architecture"], "deepseek41");
  EXPECT_EQ(j["tensor_count"], 1046);
  EXPECT_EQ(j["file_bytes"], 365713686528ull);
  EXPECT_EQ(j["data_offset"], 356ull * 16384);
  EXPECT_EQ(j["alignment"], 16384);
  EXPECT_EQ(j["routed_expert_bytes"], 152882380800ull);
  EXPECT_EQ(j["engram_bytes"], 202758032400ull);
  EXPECT_EQ(j["resident_bytes"], 10060841408ull);
  EXPECT_EQ(j["expert_bytes_per_layer"], 9953280);
  EXPECT_EQ(j["expert_gate_bytes"], 3041280);
  EXPECT_EQ(j["expert_up_bytes"], 3041280);
  EXPECT_EQ(j["expert_down_bytes"], 3870720);
  EXPECT_EQ(j["n_layer"], 40);
  EXPECT_EQ(j["n_expert"], 384);
  EXPECT_TRUE(j["errors"].empty()) << j["errors"].dump();
  EXPECT_EQ(j["valid"], true);
  EXPECT_EQ(j["tensors"].size(), 1046u);
  EXPECT_EQ(j["tensors"].back()["name"], "blk.14.engram_embd.weight");
  size_t deepseek_keys = 0;
  for (const auto& kv : j["metadata"])
    deepseek_keys += kv["key"].get<std::string>().rfind("deepseek41.", 0) == 0 ? 1 : 0;
  EXPECT_EQ(deepseek_keys, 53u);

  // The text report of the same file.
  r = run_sluice(dir, "inspect --tensors " + q(model));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("schema deepseek41: OK"), std::string::npos);
  EXPECT_NE(r.out.find("blk.39.ffn_down_exps.weight"), std::string::npos);
  fs::remove(model);
}

TEST(CliMakeModel, TinyGeneratesInspectsAndDumps) {
  TempDir dir(kTmpPrefix);
  const std::string model = dir / "tiny.gguf";
  CmdResult r = run_sluice(dir, "make-model --preset tiny --seed 11 -o " + q(model));
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = inspect_json(dir, model);
  EXPECT_TRUE(j["errors"].empty()) << j["errors"].dump();
  const sluice::ModelConfig c = sluice::tiny_config();
  const auto specs = sluice::deepseek41_tensors(c);
  EXPECT_EQ(j["tensor_count"], specs.size());
  EXPECT_EQ(j["file_bytes"], fs::file_size(model));
  EXPECT_EQ(j["n_layer"], c.num_hidden_layers);
  EXPECT_EQ(j["n_expert"], c.n_routed_experts);

  const sluice::gguf::File f = sluice::gguf::File::open(model);
  struct Case { std::string name; uint64_t values; bool near_one; };
  std::vector<Case> cases = {
      {"token_embd.weight", (uint64_t)c.hidden_size * c.vocab_size, false},
      {"output.weight", (uint64_t)c.hidden_size * c.vocab_size, false},
      {"blk.0.attn_norm.weight", c.hidden_size, true},
      {"blk.3.ffn_gate_exps.weight", (uint64_t)c.hidden_size * c.moe_intermediate_size * c.n_routed_experts, false},
      {"blk.3.ffn_down_exps.weight", (uint64_t)c.hidden_size * c.moe_intermediate_size * c.n_routed_experts, false},
      {"blk.2.hc_attn_fn.weight", (uint64_t)c.hidden_size * c.hc_mult * (2 + c.hc_mult) * c.hc_mult, false},
  };
  // Engram tables decode to engram_head_dim values per row.
  for (size_t e = 0; e < c.engram_layer_ids.size(); ++e)
    cases.push_back({"blk." + std::to_string(c.engram_layer_ids[e]) + ".engram_embd.weight",
                     c.engram_rows(e) * c.engram_head_dim, false});
  for (const Case& k : cases) {
    const auto* t = f.find_tensor(k.name);
    ASSERT_NE(t, nullptr) << k.name;
    const std::string out = dir / "dump.f32";
    r = run_sluice(dir, "dump-tensor " + q(model) + " " + k.name + " " + q(out));
    ASSERT_EQ(r.rc, 0) << k.name << ": " << r.err;
    const uint64_t expect_values = k.name.find("engram_embd") != std::string::npos ? k.values : t->n_elements();
    EXPECT_EQ(fs::file_size(out), expect_values * 4) << k.name;
    if (k.name.find("engram_embd") == std::string::npos) {
      EXPECT_EQ(t->n_elements(), k.values) << k.name;
    }
    const std::vector<float> v = read_f32(out);
    double sum = 0, sq = 0;
    for (float x : v) {
      ASSERT_TRUE(std::isfinite(x)) << k.name;
      sum += x;
      sq += (double)x * x;
    }
    EXPECT_GT(sq, 0.0) << k.name << " is all zeros";
    if (k.near_one) {
      EXPECT_NEAR(sum / (double)v.size(), 1.0, 0.05) << k.name;
    }
    fs::remove(out);
  }

  r = run_sluice(dir, "dump-tensor " + q(model) + " no.such.tensor " + q(dir / "x.f32"));
  EXPECT_EQ(r.rc, 1);
  expect_one_error_line(r, "unknown tensor");
  EXPECT_NE(r.err.find("no.such.tensor"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "x.f32"));
}

TEST(CliMakeModel, SeedDeterminesPayload) {
  TempDir dir(kTmpPrefix);
  const std::string a = dir / "a.gguf", b = dir / "b.gguf", other = dir / "c.gguf";
  ASSERT_EQ(run_sluice(dir, "make-model --preset tiny --seed 5 -o " + q(a)).rc, 0);
  ASSERT_EQ(run_sluice(dir, "make-model --preset tiny --seed 5 -o " + q(b)).rc, 0);
  ASSERT_EQ(run_sluice(dir, "make-model --preset tiny --seed 6 -o " + q(other)).rc, 0);
  const std::string da = slurp(a), db = slurp(b), dc = slurp(other);
  EXPECT_TRUE(da == db) << "same seed must give identical bytes";
  ASSERT_EQ(da.size(), dc.size());
  const uint64_t data = sluice::gguf::File::open(a).data_offset();
  EXPECT_EQ(da.substr(0, data), dc.substr(0, data)) << "the seed is not part of the metadata";
  EXPECT_NE(da.substr(data), dc.substr(data)) << "a different seed must change the payload";
}

TEST(CliMakeModel, VocabularyOptions) {
  TempDir dir(kTmpPrefix);
  // The tiny config has 512 tokens; DeepSeek's vocabulary has 129,280.
  const std::string vocab = std::string(SLUICE_DATA_DIR) + "/deepseek-v3-vocab.gguf";
  CmdResult r = run_sluice(dir, "make-model --preset tiny --vocab " + q(vocab) + " -o " + q(dir / "m.gguf"));
  EXPECT_EQ(r.rc, 1);
  expect_one_error_line(r, "vocab size mismatch");
  EXPECT_NE(r.err.find("129280"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("vocab_size"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "m.gguf"));

  // A config with the published vocab size takes the real vocabulary through --vocab.
  sluice::ModelConfig c = sluice::tiny_config();
  nlohmann::json cfg = sluice::config_to_json(c);
  cfg["vocab_size"] = 129280;
  cfg.erase("engram_token_map");
  cfg.erase("engram_primes");
  cfg.erase("engram_multipliers");
  cfg.erase("engram_num_embeddings");
  std::ofstream(dir / "big-vocab.json") << cfg.dump();
  r = run_sluice(dir, "make-model --config " + q(dir / "big-vocab.json") + " --vocab " + q(vocab) + " --sparse -o " +
                      q(dir / "m.gguf"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const sluice::gguf::File f = sluice::gguf::File::open(dir / "m.gguf");
  const auto& toks = f.get("tokenizer.ggml.tokens");
  ASSERT_EQ(toks.array_size(), 129280u);
  EXPECT_EQ(toks.as[128803], "<｜User｜>");
  EXPECT_EQ(f.get("tokenizer.ggml.merges").array_size(), 127741u);
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "joyai-llm");
  EXPECT_EQ(f.find("tokenizer.chat_template"), nullptr);
}

TEST(CliMakeModel, BadConfigIsOneErrorLine) {
  TempDir dir(kTmpPrefix);
  std::ofstream(dir / "broken.json") << "{ \"hidden_size\": ";
  CmdResult r = run_sluice(dir, "make-model --config " + q(dir / "broken.json") + " -o " + q(dir / "m.gguf"));
  EXPECT_EQ(r.rc, 1);
  expect_one_error_line(r, "broken JSON");
  EXPECT_NE(r.err.find("broken.json"), std::string::npos) << r.err;
  std::ofstream(dir / "bad.json") << "{ \"hidden_size\": 100 }";  // not a multiple of the blocks
  r = run_sluice(dir, "make-model --config " + q(dir / "bad.json") + " -o " + q(dir / "m.gguf"));
  EXPECT_EQ(r.rc, 1);
  expect_one_error_line(r, "invalid config");
  EXPECT_FALSE(fs::exists(dir / "m.gguf"));
}

TEST(CliMakeModel, TinyAltConfigGeneratesAndValidates) {
  TempDir dir(kTmpPrefix);
  const std::string config = source_dir() + "/configs/tiny-alt.json";
  ASSERT_TRUE(fs::exists(config)) << config << " is missing";
  const std::string model = dir / "alt.gguf";
  const CmdResult r = run_sluice(dir, "make-model --config " + q(config) + " --seed 3 -o " + q(model));
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = inspect_json(dir, model);
  EXPECT_TRUE(j["errors"].empty()) << j["errors"].dump();
  EXPECT_EQ(j["architecture"], "deepseek41");
  // Its hyperparameters are what the JSON says.
  std::ifstream in(config);
  const sluice::ModelConfig c = sluice::config_from_json(nlohmann::json::parse(in));
  EXPECT_EQ(j["n_layer"], c.num_hidden_layers);
  EXPECT_EQ(j["n_expert"], c.n_routed_experts);
  EXPECT_EQ(j["tensor_count"], sluice::deepseek41_tensors(c).size());
}

// Reported (the whole report on stdout) and refused (exit 1, the architecture as the error).
TEST(CliInspect, NonDeepseekGgufIsReportedAndRefused) {
  TempDir dir(kTmpPrefix);
  // DeepSeek's vocabulary file is a valid GGUF of another architecture.
  const std::string vocab = std::string(SLUICE_DATA_DIR) + "/deepseek-v3-vocab.gguf";
  CmdResult r = run_sluice(dir, "inspect --json " + q(vocab));
  EXPECT_EQ(r.rc, 1);
  expect_one_error_line(r, "inspect --json");
  EXPECT_NE(r.err.find("architecture deepseek2 is not supported (sluice runs deepseek41)"), std::string::npos) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "deepseek2");
  EXPECT_EQ(j["tensor_count"], 0);
  EXPECT_FALSE(j["errors"].empty());
  EXPECT_EQ(j["valid"], false);
  r = run_sluice(dir, "inspect " + q(vocab));
  EXPECT_EQ(r.rc, 1);
  expect_one_error_line(r, "inspect");
  EXPECT_NE(r.out.find("architecture deepseek2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("problem"), std::string::npos);
  r = run_sluice(dir, "inspect --metadata " + q(vocab));
  EXPECT_EQ(r.rc, 1);
  expect_one_error_line(r, "inspect --metadata");
  EXPECT_NE(r.out.find("tokenizer.ggml.tokens"), std::string::npos);
  EXPECT_NE(r.out.find("length 129280"), std::string::npos);
  EXPECT_NE(r.out.find("problem"), std::string::npos);
}

// Every malformed file of the GGUF corpus fails with exactly one error line and no report;
// valid_* files parse (a report on stdout) but are not deepseek41 files (exit 1, one line).
TEST(CliInspect, MalformedCorpusFailsWithOneErrorLine) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "starts the binary twice per corpus file (two minutes under the sanitizer); "
                  "gguf_malformed_test and the GGUF fuzzer open the same corpus under it";
#endif
  TempDir dir(kTmpPrefix);
  const std::string corpus = std::string(SLUICE_TEST_DATA) + "/gguf_corpus";
  std::ifstream manifest(corpus + "/MANIFEST.txt");
  ASSERT_TRUE(manifest) << corpus << "/MANIFEST.txt is missing";
  std::string line;
  size_t valid = 0, invalid = 0;
  while (std::getline(manifest, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string file, expect;
    fields >> file;
    std::getline(fields >> std::ws, expect);
    const std::string path = corpus + "/" + file;
    ASSERT_TRUE(fs::exists(path)) << path;
    for (const char* mode : {"inspect ", "inspect --json "}) {
      const CmdResult r = run_sluice(dir, mode + q(path));
      if (file.rfind("valid_", 0) == 0) {
        EXPECT_EQ(r.rc, 1) << file << ": " << r.err;
        expect_one_error_line(r, file);
        EXPECT_NE(r.err.find("(sluice runs deepseek41)"), std::string::npos) << file << ": " << r.err;
        EXPECT_FALSE(r.out.empty()) << file << ": the report";
      } else {
        EXPECT_EQ(r.rc, 1) << file;
        expect_one_error_line(r, file);
        EXPECT_NE(lower(r.err).find("error"), std::string::npos) << file;
        if (!expect.empty() && expect != "OK") {
          EXPECT_NE(lower(r.err).find(lower(expect)), std::string::npos) << file << ": " << r.err;
        }
        EXPECT_TRUE(r.out.empty()) << file << ": stdout not empty";
      }
    }
    (file.rfind("valid_", 0) == 0 ? valid : invalid)++;
  }
  EXPECT_GT(valid, 0u);
  EXPECT_GT(invalid, 0u);
}
