// The Engram row cache (model/deepseek41/engram_cache.h): bounded, least recently used out, one
// share per table; engram_gather with it returns the same values while reading only the rows it
// lacks; and the engine's logits are bit-identical with no cache, a cache of 3 rows (evicting
// all the time) and a large one, on a prompt whose text repeats.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/deepseek41/engram.h"
#include "model/deepseek41/engram_cache.h"
#include "model/deepseek41/forward.h"
#include "model/model.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> row_of(uint8_t v) { return std::vector<uint8_t>(5, v); }

TEST(EngramRowCache, KeepsTheMostRecentRowsOfEachTable) {
  EngramRowCache c(3, 2, 5);
  for (uint8_t r = 1; r <= 3; ++r) c.insert(0, r, row_of(r).data());
  c.insert(1, 1, row_of(9).data());
  ASSERT_NE(c.find(0, 1), nullptr);  // 1 is now the most recent of table 0; 2 the least
  c.insert(0, 4, row_of(4).data());
  EXPECT_EQ(c.find(0, 2), nullptr) << "the least recently used row was not the one evicted";
  for (uint8_t r : {1, 3, 4}) {
    const uint8_t* p = c.find(0, r);
    ASSERT_NE(p, nullptr) << int(r);
    EXPECT_EQ(std::memcmp(p, row_of(r).data(), 5), 0);
  }
  EXPECT_EQ(c.size(0), 3u);
  // Table 1 kept its row through table 0's evictions, and has its own bytes for row 1.
  ASSERT_NE(c.find(1, 1), nullptr);
  EXPECT_EQ(c.find(1, 1)[0], 9);
  EXPECT_EQ(c.size(1), 1u);
  EngramRowCache none(0, 1, 5);
  none.insert(0, 7, row_of(7).data());
  EXPECT_EQ(none.find(0, 7), nullptr);
  EXPECT_GE(engram_cache_bytes(3, 2, 5), 3u * 2 * (5 + 8 + 8));
}

class EngramCacheModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("sluice-engram-cache-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    path_ = (dir_ / "tiny.gguf").string();
    const std::string cmd = std::string(SLUICE_BINARY) + " make-model --preset tiny -o " + path_ + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static fs::path dir_;
  static std::string path_;
};
fs::path EngramCacheModel::dir_;
std::string EngramCacheModel::path_;

TEST_F(EngramCacheModel, GatherTakesCachedRowsAndReadsOnlyTheRest) {
  const std::unique_ptr<Model> m = load_model(path_);
  const ModelConfig& c = m->config;
  ASSERT_FALSE(c.engram_layer_ids.empty());
  const gguf::TensorInfo* t = m->file.find_tensor("blk." + std::to_string(c.engram_layer_ids[0]) + ".engram_embd.weight");
  ASSERT_NE(t, nullptr);
  const uint32_t hd = c.engram_head_dim, rb = c.engram_row_bytes();
  const std::vector<uint64_t> first = {5, 3, 5, 4, 100}, second = {4, 5, 6, 100, 3, 7};
  std::vector<float> plain(second.size() * hd), cached(second.size() * hd), tmp(first.size() * hd);
  EngramRowCache cache(64, 1, rb);
  const EngramReadStats a = engram_gather(m->file, *t, hd, first, tmp.data(), kEngramStagingBytes, &cache, 0);
  EXPECT_EQ(a.hits, 0u);
  EXPECT_EQ(a.bytes, 4u * rb);
  const EngramReadStats b = engram_gather(m->file, *t, hd, second, cached.data(), kEngramStagingBytes, &cache, 0);
  EXPECT_EQ(b.unique, 6u);
  EXPECT_EQ(b.hits, 4u);           // 3 4 5 100
  EXPECT_EQ(b.bytes, 2u * rb);     // 6 7, one coalesced read
  EXPECT_EQ(b.reads, 1u);
  engram_gather(m->file, *t, hd, second, plain.data());
  EXPECT_EQ(std::memcmp(plain.data(), cached.data(), plain.size() * sizeof(float)), 0);
}

TEST_F(EngramCacheModel, LogitsAreBitIdenticalForEveryCacheSize) {
  const std::unique_ptr<Model> m = load_model(path_);
  const ModelConfig& c = m->config;
  std::vector<uint32_t> prompt;  // a phrase three times: its n-grams hash to the same rows
  for (int rep = 0; rep < 3; ++rep)
    for (uint32_t i = 0; i < 9; ++i) prompt.push_back((i * 7919u + 11) % c.vocab_size);
  auto run = [&](uint64_t rows, EngramReadStats& st) {
    EngineOptions eo;
    eo.ctx = 64;
    eo.chunk = 4;
    eo.threads = 2;
    eo.engram_cache_rows = rows;
    const Engine eng(*m, eo);
    SequenceState s = eng.new_sequence();
    std::vector<float> logits(prompt.size() * (size_t)c.vocab_size);
    eng.eval(s, prompt, logits.data());
    std::vector<float> row(c.vocab_size);
    for (uint32_t g = 0; g < 4; ++g) {  // decode repeats the phrase's start
      eng.eval(s, std::span<const uint32_t>(&prompt[g], 1), row.data());
      logits.insert(logits.end(), row.begin(), row.end());
    }
    st = eng.engram_stats();
    return logits;
  };
  EngramReadStats none, small, big;
  const std::vector<float> want = run(0, none), got_small = run(3, small), got_big = run(65536, big);
  EXPECT_EQ(std::memcmp(want.data(), got_small.data(), want.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(want.data(), got_big.data(), want.size() * sizeof(float)), 0);
  EXPECT_EQ(none.hits, 0u);
  EXPECT_GT(big.hits, 0u) << "the repeated phrase never hit the cache";
  EXPECT_LT(big.bytes, none.bytes);
  EXPECT_EQ(big.bytes + big.hits * c.engram_row_bytes(), none.bytes);
  EXPECT_EQ(none.requested, big.requested);
  EXPECT_LE(small.hits, big.hits);
}

}  // namespace
}  // namespace sluice
