// Logits recorded from the engine before the backend refactor (issue 10), compared bit for bit.
// A refactor of how the forward pass runs must not change one bit of what it computes: the
// tiny and tiny-alt models are generated, a 40-token prompt is prefilled in one eval() call and
// 32 further tokens are decoded one by one, with resident and with streamed experts, and every
// row of logits is compared with tests/data/golden/<config>.f32 (little-endian f32,
// (40 + 32) x vocab). SLUICE_WRITE_GOLDEN=1 rewrites the files; that is only right when the
// numerics are meant to change, and the commit must say why.
#include <unistd.h>

#include <gtest/gtest.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "model/streamed_experts.h"
#include "storage/expert_store.h"
#include "test_util.h"

namespace sluice {
namespace {

static_assert(std::endian::native == std::endian::little, "golden files are little-endian f32");

constexpr uint32_t kPrompt = 40, kDecode = 32;

std::vector<float> run(const Model& m, const ExpertSource* src, int threads) {
  const uint32_t V = m.config.vocab_size;
  EngineOptions eo;
  eo.ctx = 128;
  eo.chunk = 64;
  eo.threads = threads;
  eo.experts = src;
  Engine eng(m, eo);
  SequenceState s = eng.new_sequence();
  std::vector<uint32_t> toks;
  for (uint32_t i = 0; i < kPrompt + kDecode; ++i) toks.push_back((i * 2654435761u + 17u) % V);
  std::vector<float> all((size_t)(kPrompt + kDecode) * V);
  eng.eval(s, std::span<const uint32_t>(toks.data(), kPrompt), all.data());
  for (uint32_t i = kPrompt; i < kPrompt + kDecode; ++i)
    eng.eval(s, std::span<const uint32_t>(&toks[i], 1), all.data() + (size_t)i * V);
  return all;
}

// Index of the first float whose bits differ, or -1.
long first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return (long)i;
  return -1;
}

void check(const std::string& config) {
  test::TempDir dir("sluice_golden");
  const std::string gguf = dir / (config + ".gguf");
  const std::string cmd = test::q(SLUICE_BINARY) + " make-model --config " +
                          test::q(std::string(SLUICE_TEST_DATA) + "/../../configs/" + config + ".json") + " -o " +
                          test::q(gguf) + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::unique_ptr<Model> m = load_model(gguf);
  const uint32_t V = m->config.vocab_size;
  const std::string golden = std::string(SLUICE_TEST_DATA) + "/golden/" + config + ".f32";

  const std::vector<float> resident = run(*m, nullptr, 2);
  if (std::getenv("SLUICE_WRITE_GOLDEN")) {
    std::ofstream out(golden, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(resident.data()), (std::streamsize)(resident.size() * sizeof(float)));
    ASSERT_TRUE(out.good()) << golden;
  }
  const std::string bytes = test::slurp(golden);
  ASSERT_EQ(bytes.size(), resident.size() * sizeof(float)) << golden << " is missing or of another shape";
  std::vector<float> want(resident.size());
  std::memcpy(want.data(), bytes.data(), bytes.size());

  const long d = first_difference(want, resident);
  EXPECT_EQ(d, -1) << config << " resident experts: first difference at position " << d / (long)V << " token "
                   << d % (long)V << ": " << (d >= 0 ? resident[(size_t)d] : 0.0f) << " vs recorded "
                   << (d >= 0 ? want[(size_t)d] : 0.0f);

  storage::StoreOptions o;
  o.cache_bytes = UINT64_MAX;
  o.max_slots = m->config.num_hidden_layers * m->config.n_routed_experts;
  std::unique_ptr<storage::ExpertStore> store = open_expert_store(*m, o);
  StreamedExperts src(*store);
  const std::vector<float> streamed = run(*m, &src, 1);
  src.release();
  const long ds = first_difference(want, streamed);
  EXPECT_EQ(ds, -1) << config << " streamed experts: first difference at position " << ds / (long)V;
}

TEST(GoldenLogits, TinyIsBitIdenticalToTheRecordedEngine) { check("tiny"); }
TEST(GoldenLogits, TinyAltIsBitIdenticalToTheRecordedEngine) { check("tiny-alt"); }

}  // namespace
}  // namespace sluice
