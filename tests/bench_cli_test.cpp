// `sluice bench` on the tiny model: the JSON keys the issue names, figures that agree with each
// other (the roofline is the measured bandwidth over the bytes a token reads; GFLOPS and GB/s
// of one op describe the same time), the bytes per token counted independently from the file's
// tensor records, and usage errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/deepseek41/config.h"
#include "model/deepseek41/engine_footprint.h"
#include "test_util.h"

namespace sluice {
namespace {

using test::CmdResult;
using test::q;
using test::TempDir;

class BenchCli : public ::testing::Test {
 protected:
  static TempDir* dir_;
  static std::string model_;
  static void SetUpTestSuite() {
    dir_ = new TempDir("sluice_bench_cli");
    model_ = dir_->path / "tiny.gguf";
    const std::string cmd = q(SLUICE_BINARY) + " make-model --preset tiny -o " + q(model_) + " --seed 3 >/dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static CmdResult bench(const std::string& args) { return test::run_sluice(*dir_, "bench " + args); }
  static std::vector<nlohmann::json> lines(const std::string& out) {
    std::vector<nlohmann::json> v;
    std::stringstream in(out);
    std::string l;
    while (std::getline(in, l)) v.push_back(nlohmann::json::parse(l));
    return v;
  }
};
TempDir* BenchCli::dir_ = nullptr;
std::string BenchCli::model_;

// Counted here from the tensor records, the way the issue states it: every dense tensor once,
// one embedding row, top_k of each layer's experts, the Engram rows a token looks up.
uint64_t expected_decode_bytes(const std::string& path) {
  const gguf::File f = gguf::File::open(path);
  const ModelConfig c = config_from_gguf(f);
  uint64_t dense = 0, experts = 0;
  for (const auto& t : f.tensors()) {
    const bool engram_table = t.name.find("engram_embd") != std::string::npos;
    const bool routed = t.name.find("_exps.") != std::string::npos;
    if (engram_table) continue;
    if (routed) experts += t.nbytes / t.ne[2] * c.num_experts_per_tok;
    else if (t.name == "token_embd.weight") dense += t.nbytes / t.ne[1];
    else dense += t.nbytes;
  }
  const uint64_t engram = c.engram_layer_ids.size() * (uint64_t)c.engram_columns() * c.engram_row_bytes();
  return dense + experts + engram;
}

TEST_F(BenchCli, ModelRunPrintsTheIssuesKeysAndAConsistentRoofline) {
  const CmdResult r = bench("-m " + q(model_) + " -p 12 -n 3 -r 2 --read-mib 64 --disk-seconds 0.2 --allow-swap --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto js = lines(r.out);
  ASSERT_EQ(js.size(), 1u) << r.out;
  const nlohmann::json& j = js[0];
  for (const char* k : {"prefill_tok_s", "decode_tok_s", "roofline_decode_tok_s", "read_gbps", "weight_bytes_per_token"})
    ASSERT_TRUE(j.contains(k)) << k << " missing: " << r.out;
  EXPECT_GT(j["prefill_tok_s"].get<double>(), 0);
  EXPECT_GT(j["decode_tok_s"].get<double>(), 0);
  EXPECT_LE(j["prefill_tok_s_min"].get<double>(), j["prefill_tok_s"].get<double>());
  EXPECT_GE(j["decode_tok_s_max"].get<double>(), j["decode_tok_s"].get<double>());
  EXPECT_EQ(j["weight_bytes_per_token"].get<uint64_t>(), expected_decode_bytes(model_));
  // Memory-bound (the tiny model's experts stay cached, so no disk bytes per decode token).
  const double mem_roof = j["read_gbps"].get<double>() * 1e9 / j["weight_bytes_per_token"].get<double>();
  if (j["streaming"].get<bool>() && j["disk_bytes_per_token"].get<double>() > 0)
    EXPECT_LE(j["roofline_decode_tok_s"].get<double>(), mem_roof * (1 + 1e-12));
  else
    EXPECT_NEAR(j["roofline_decode_tok_s"].get<double>(), mem_roof, mem_roof * 1e-12);
  EXPECT_NEAR(j["decode_ratio"].get<double>(), j["decode_tok_s"].get<double>() / j["roofline_decode_tok_s"].get<double>(), 1e-12);
  // The per-token split: a stall is part of the token's time, and the overlap ratio is the time
  // over the larger of compute and the disk's share.
  ASSERT_TRUE(j["streaming"].get<bool>());
  const double ms = j["decode_ms_per_token"], stall = j["stall_ms_per_token"], compute = j["compute_ms_per_token"];
  const double io = j["io_ms_per_token"];
  EXPECT_GT(ms, 0);
  EXPECT_GE(stall, 0);
  EXPECT_LE(stall, ms);
  EXPECT_NEAR(compute + stall, ms, ms * 1e-12);
  EXPECT_NEAR(j["overlap_ratio"].get<double>(), ms / std::max(compute, io), 1e-9);
  // Memory against the plan: the session's peak (the read baseline's buffer excluded) within
  // what admission planned, and the state the plan counted.
  EXPECT_GT(j["sequence_state_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(j["peak_rss_bytes"].get<uint64_t>(), 0u);
#if !defined(__SANITIZE_ADDRESS__)  // the sanitizer's shadow memory is not in the plan
  if (j["peak_rss_since_session"].get<bool>()) {
    EXPECT_LE(j["peak_rss_bytes"].get<uint64_t>(), j["planned_bytes"].get<uint64_t>()) << r.out;
  }
#endif
}

// --parallel N: the batched and in-turn figures of N streams, with the plan holding N states;
// expert reads are counted per generated token in both modes.
TEST_F(BenchCli, ParallelReportsBatchedAndInTurn) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "a benchmark run end to end: checked in the optimized build";
#endif
  const CmdResult one = bench("-m " + q(model_) + " -p 6 -n 3 -r 1 --read-mib 64 --disk-seconds 0.2 --allow-swap --json");
  const CmdResult r =
      bench("-m " + q(model_) + " -p 6 -n 3 -r 2 --read-mib 64 --disk-seconds 0.2 --allow-swap --json --parallel 3");
  ASSERT_EQ(one.rc, 0) << one.err;
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j1 = lines(one.out).at(0), j = lines(r.out).at(0);
  EXPECT_EQ(j["parallel"], 3);
  EXPECT_EQ(j["sequence_state_bytes"].get<uint64_t>(), 3 * j1["sequence_state_bytes"].get<uint64_t>());
  EXPECT_GT(j["parallel_batched_tok_s"].get<double>(), 0);
  EXPECT_GT(j["parallel_in_turn_tok_s"].get<double>(), 0);
  EXPECT_LE(j["parallel_batched_tok_s_min"].get<double>(), j["parallel_batched_tok_s"].get<double>());
  EXPECT_NEAR(j["parallel_batched_over_one_stream"].get<double>(),
              j["parallel_batched_tok_s"].get<double>() / j["decode_tok_s"].get<double>(), 1e-9);
  for (const char* k : {"parallel_batched_disk_mb_per_token", "parallel_in_turn_disk_mb_per_token", "parallel_batched_hit_rate"})
    EXPECT_TRUE(j.contains(k)) << k << " missing: " << r.out;
  const CmdResult text = bench("-m " + q(model_) + " -p 6 -n 2 -r 1 --read-mib 64 --disk-seconds 0.2 --allow-swap --parallel 2");
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out.find("parallel 2 streams, 2 tokens each: batched"), std::string::npos) << text.out;
  const CmdResult small = bench("-m " + q(model_) + " -p 6 -n 2 -r 1 --allow-swap --parallel 4 --chunk 2");
  EXPECT_EQ(small.rc, 1);
  EXPECT_NE(small.err.find("--parallel 4 needs a chunk of at least 4 rows"), std::string::npos) << small.err;
}

// The short version of docs/context.md's runs: configs/long-context.json (the published attention
// widths on 8 small layers) at a 1,024-token prompt. The state bench reports is the packed one for
// that context, and the session's peak stays within its plan. The long runs are benchmarks.
TEST_F(BenchCli, LongContextConfigShortRunWithinItsPlan) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "real attention widths: minutes under the sanitizer; checked in the optimized build";
#endif
  const std::string model = dir_->path / "long-context.gguf";
  const std::string config = std::string(SLUICE_TEST_DATA) + "/../../configs/long-context.json";
  ASSERT_EQ(test::run_sluice(*dir_, "make-model --config " + q(config) + " -o " + q(model)).rc, 0);
  const uint32_t p = 1024, n = 2;
  const CmdResult r = bench("-m " + q(model) + " -p " + std::to_string(p) + " -n " + std::to_string(n) +
                            " -r 1 --read-mib 64 --resident-experts --allow-swap --json");
  std::remove(model.c_str());
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = lines(r.out).at(0);
  std::ifstream f(config);
  const ModelConfig c = config_from_json(nlohmann::json::parse(f));
  EXPECT_GT(j["prefill_tok_s"].get<double>(), 0);
  EXPECT_GT(j["decode_tok_s"].get<double>(), 0);
  // bench's context is prompt + generated + 1; packed rows: 288 + 68 B per compressed position.
  const SequenceStateBytes want = sequence_state_bytes(c, p + n + 1);
  EXPECT_EQ(j["sequence_state_bytes"].get<uint64_t>(), want.total());
  EXPECT_EQ(want.compressed_kv, ((p + n + 1) / 2 + (p + n + 1)) * 288ull);
  if (j["peak_rss_since_session"].get<bool>()) {
    EXPECT_LE(j["peak_rss_bytes"].get<uint64_t>(), j["planned_bytes"].get<uint64_t>()) << r.out;
  }
}

TEST_F(BenchCli, TextReportNamesTheRoofline) {
  const CmdResult r = bench("-m " + q(model_) + " -p 8 -n 2 -r 1 --read-mib 64 --disk-seconds 0.2 --allow-swap");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("memory read"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("roofline"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("prefill     8 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("peak RSS"), std::string::npos) << r.out;
}

TEST_F(BenchCli, OpsRunCoversEveryShapeAndTokenCount) {
  const CmdResult r = bench("--ops -m " + q(model_) + " -n 1,3 --type Q8_0 -r 1 --op-seconds 0 --read-mib 64 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto js = lines(r.out);
  ASSERT_GE(js.size(), 4u) << r.out;
  int head = 0;
  for (const auto& j : js) {
    for (const char* k : {"type", "n", "rows", "cols", "threads", "gflops", "gbps"}) ASSERT_TRUE(j.contains(k)) << k;
    EXPECT_EQ(j["type"], "Q8_0");
    const uint64_t n = j["n"], rows = j["rows"], cols = j["cols"];
    EXPECT_TRUE(n == 1 || n == 3) << n;
    if (j["tensor"] == "output.weight") {
      ++head;
      EXPECT_EQ(n, 1u);
    }
    // GFLOPS and GB/s describe one time: flops / weight bytes (Q8_0: 34 bytes per 32).
    const double flops_per_byte = 2.0 * (double)n * (double)rows * (double)cols / ((double)rows * (double)cols / 32 * 34);
    EXPECT_NEAR(j["gflops"].get<double>() / j["gbps"].get<double>(), flops_per_byte, flops_per_byte * 1e-9);
    EXPECT_GT(j["gflops"].get<double>(), 0);
  }
  EXPECT_EQ(head, 1);
}

// --route-bias on a cache of 80 of the tiny model's 128 experts (--cache-experts): exact routing
// first, then biased, in one run. A bias far above any score gap keeps every decode request a
// hit, where exact routing misses; the next-token distributions then differ (KL > 0), and the
// cost figures are consistent.
TEST_F(BenchCli, RouteBiasReportsWhatItBuysAndWhatItCosts) {
  const CmdResult r = bench("-m " + q(model_) + " -p 12 -n 3 -r 1 --read-mib 64 --disk-seconds 0.2 --allow-swap "
                            "--no-prefetch --route-bias 1000 --cache-experts 80 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto js = lines(r.out);
  ASSERT_EQ(js.size(), 1u) << r.out;
  const nlohmann::json& j = js[0];
  for (const char* k : {"route_bias", "exact_decode_tok_s", "exact_hit_rate", "hit_rate", "kl_mean", "kl_max",
                        "top1_agreement", "quality_positions"})
    ASSERT_TRUE(j.contains(k)) << k << " missing: " << r.out;
  ASSERT_TRUE(j["streaming"].get<bool>());
  EXPECT_EQ(j["route_bias"].get<double>(), 1000.0);
  EXPECT_LT(j["exact_hit_rate"].get<double>(), 1.0) << "the cache held every expert: nothing to bias toward";
  EXPECT_EQ(j["hit_rate"].get<double>(), 1.0);
  EXPECT_GT(j["exact_decode_tok_s"].get<double>(), 0);
  // Four prompts of up to ctx - 1 = 15 positions.
  EXPECT_GT(j["quality_positions"].get<uint64_t>(), 4u * 8);
  EXPECT_LE(j["quality_positions"].get<uint64_t>(), 4u * 15);
  EXPECT_GT(j["kl_mean"].get<double>(), 0.0);
  EXPECT_GE(j["kl_max"].get<double>(), j["kl_mean"].get<double>());
  EXPECT_GE(j["top1_agreement"].get<double>(), 0.0);
  EXPECT_LE(j["top1_agreement"].get<double>(), 1.0);
}

TEST_F(BenchCli, UsageErrors) {
  struct Case { std::string args, needle; };
  for (const Case& c : {Case{"-r 1", "give a model"}, Case{"--ops -n 0 --read-mib 64", "token counts"},
                        Case{"--ops --type NOPE --read-mib 64", "no kernels for type 'NOPE'"},
                        Case{"-m " + q(model_) + " -n 1,2", "one token count"},
                        Case{"-m " + q(model_) + " --type Q8_0", "--type needs --ops"},
                        Case{"--ops --read-mib 1", "--read-mib"},
                        Case{"-m " + q(model_) + " --route-bias -1", "--route-bias must be"},
                        Case{"-m " + q(model_) + " --route-bias 1 --resident-experts", "needs streamed experts"}}) {
    const CmdResult r = bench(c.args);
    EXPECT_EQ(r.rc, 2) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << ": " << r.err;
  }
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// bench --dspark: plain decode, then the drafter's own drafts and forced drafts at 0-100% right,
// the same greedy tokens in every mode; every forced-right draft is accepted.
TEST_F(BenchCli, DsparkComparesSpeculationWithPlainDecodeAtControlledAcceptance) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "a benchmark run end to end: checked in the optimized build";
#endif
  const std::string support = (dir_->path / "tiny-dspark.gguf").string();
  ASSERT_EQ(std::system((q(SLUICE_BINARY) + " make-model --preset tiny --dspark-out " + q(support) + " --seed 3 >/dev/null").c_str()), 0);
  const CmdResult r = bench("-m " + q(model_) + " -p 8 -n 16 -r 1 --read-mib 64 --resident-experts --allow-swap -t 1 "
                            "--dspark " + q(support) + " --dspark-conf 0 --no-dspark-guard --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto js = lines(r.out);
  ASSERT_EQ(js.size(), 1u);
  const nlohmann::json& d = js[0]["dspark"];
  ASSERT_EQ(d.size(), 6u);
  EXPECT_EQ(d[0]["mode"], "own drafts");
  EXPECT_EQ(d[1]["forced_rate"].get<double>(), 0.0);
  EXPECT_EQ(d[1]["acceptance"].get<double>(), 0.0);
  EXPECT_EQ(d[5]["forced_rate"].get<double>(), 1.0);
  EXPECT_EQ(d[5]["acceptance"].get<double>(), 1.0);
  EXPECT_GT(d[5]["tokens_per_cycle"].get<double>(), 2.0);
  for (const auto& row : d) EXPECT_GT(row["cycles"].get<uint64_t>(), 0u);
  EXPECT_EQ(bench("-m " + q(model_) + " -p 8 -n 4 --dspark " + q(support)).rc, 2);  // -n below 8
}

}  // namespace
}  // namespace sluice
