// Prefix checkpoints (issue 16 item 7): Engine::checkpoint + Engine::rollback give, bit for bit,
// the state and logits of a cold prefill of the same tokens, wherever the prompts diverge
// (inside the first window, at and beyond it, at a ratio-2 group boundary and inside a group),
// on the tiny preset and on configs/tiny-alt.json (window 5, Engram order 3). The checkpoint's
// bytes are what checkpoint_bytes() computes from the shapes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "model/deepseek41/primitives.h"
#include "util/error.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

// Generated once per process with `sluice make-model`.
const Model& model_for(const std::string& which) {
  static std::map<std::string, std::unique_ptr<Model>> cache;
  if (auto it = cache.find(which); it != cache.end()) return *it->second;
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / ("sluice-checkpoint-test-" + std::to_string(::getpid()));
    fs::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(fs::temp_directory_path() / ("sluice-checkpoint-test-" + std::to_string(::getpid())), ec);
    });
    return d;
  }();
  const std::string out = (dir / (which + ".gguf")).string();
  std::string cmd = std::string(SLUICE_BINARY) + " make-model ";
  cmd += which == "tiny" ? std::string("--preset tiny")
                         : "--config " + std::string(SLUICE_TEST_DATA) + "/../../configs/" + which + ".json";
  cmd += " -o " + out + " > /dev/null";
  if (std::system(cmd.c_str()) != 0) throw Error("make-model failed: " + cmd);
  return *cache.emplace(which, load_model(out)).first->second;
}

std::vector<uint32_t> tokens(const ModelConfig& c, uint32_t n, uint64_t seed) {
  std::vector<uint32_t> t(n);
  uint64_t x = seed;
  for (uint32_t i = 0; i < n; ++i) {
    x = splitmix64(x);
    t[i] = (uint32_t)(x % c.vocab_size);
  }
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class PrefixCheckpoint : public ::testing::TestWithParam<std::string> {
 protected:
  const Model& m() { return model_for(GetParam()); }
  const ModelConfig& c() { return model_config(m()); }
  EngineOptions opts() {
    EngineOptions o;
    o.ctx = 256;
    o.chunk = 16;
    o.threads = 2;
    return o;
  }
  // Divergence points: inside the first window (inside a ratio-2 group and at its boundary),
  // at the window, one window and a bit beyond (both parities), and far beyond (the indexer
  // then selects among more rows than index_topk).
  std::vector<uint32_t> positions() {
    const uint32_t W = c().sliding_window;
    return {3, 4, W, 2 * W + 2, 2 * W + 3, far(), far() + 1};
  }
  uint32_t far() { return GetParam() == "tiny" ? 60 : 30; }  // tiny-alt is ~3x slower per token
  uint32_t len() { return far() + 12; }
};

TEST_P(PrefixCheckpoint, RollbackThenPrefillEqualsAColdPrefill) {
  Engine e(m(), opts());
  const uint32_t V = c().vocab_size, n = len();
  const std::vector<uint32_t> a = tokens(c(), n, 7);
  for (const uint32_t p : positions()) {
    SCOPED_TRACE("diverging at " + std::to_string(p));
    // b shares a's first p tokens.
    std::vector<uint32_t> b = tokens(c(), n, 1000 + p);
    std::copy(a.begin(), a.begin() + p, b.begin());
    ASSERT_NE(a[p], b[p]);

    // The kept sequence: a, evaluated past p, with a checkpoint taken at p on the way.
    SequenceState s = e.new_sequence();
    e.eval(s, std::span<const uint32_t>(a.data(), p), nullptr);
    const SequenceCheckpoint ck = e.checkpoint(s);
    EXPECT_EQ(ck.pos, p);
    EXPECT_EQ(ck.bytes(), checkpoint_bytes(c(), p));
    e.eval(s, std::span<const uint32_t>(a.data() + p, n - p), nullptr);

    // Cold prefills of b's first p tokens and of all of b.
    SequenceState cold_p = e.new_sequence();
    e.eval(cold_p, std::span<const uint32_t>(b.data(), p), nullptr);
    SequenceState cold = e.new_sequence();
    std::vector<float> cold_logits((size_t)n * V);
    e.eval(cold, b, cold_logits.data());

    e.rollback(s, ck);
    EXPECT_TRUE(s == cold_p) << "the rolled-back state differs from a cold prefill of the same tokens";
    std::vector<float> got((size_t)(n - p) * V);
    e.eval(s, std::span<const uint32_t>(b.data() + p, n - p), got.data());
    const std::vector<float> want(cold_logits.begin() + (size_t)p * V, cold_logits.end());
    EXPECT_TRUE(same_bits(got, want)) << "logits after the rollback differ from a cold prefill";
    EXPECT_TRUE(s == cold);
  }
}

// A checkpoint stays usable after the sequence rolled back to a later one and grew differently
// (it still holds the checkpoint's tokens), and one taken on a decode step works like one taken
// on a prefill chunk.
TEST_P(PrefixCheckpoint, EarlierCheckpointSurvivesALaterRollback) {
  Engine e(m(), opts());
  const uint32_t V = c().vocab_size, n = len(), q = c().sliding_window + 1, p = far();
  const std::vector<uint32_t> a = tokens(c(), n, 11);
  SequenceState s = e.new_sequence();
  e.eval(s, std::span<const uint32_t>(a.data(), q - 1), nullptr);
  e.eval(s, std::span<const uint32_t>(a.data() + q - 1, 1), nullptr);  // a decode step
  const SequenceCheckpoint at_q = e.checkpoint(s);
  e.eval(s, std::span<const uint32_t>(a.data() + q, p - q), nullptr);
  const SequenceCheckpoint at_p = e.checkpoint(s);
  e.eval(s, std::span<const uint32_t>(a.data() + p, n - p), nullptr);

  std::vector<uint32_t> b = tokens(c(), n, 12);
  std::copy(a.begin(), a.begin() + p, b.begin());
  e.rollback(s, at_p);
  e.eval(s, std::span<const uint32_t>(b.data() + p, n - p), nullptr);
  std::vector<uint32_t> d = tokens(c(), n, 13);
  std::copy(a.begin(), a.begin() + q, d.begin());
  e.rollback(s, at_q);
  std::vector<float> got((size_t)(n - q) * V);
  e.eval(s, std::span<const uint32_t>(d.data() + q, n - q), got.data());

  SequenceState cold = e.new_sequence();
  std::vector<float> cold_logits((size_t)n * V);
  e.eval(cold, d, cold_logits.data());
  EXPECT_TRUE(same_bits(got, std::vector<float>(cold_logits.begin() + (size_t)q * V, cold_logits.end())));
  EXPECT_TRUE(s == cold);
}

TEST_P(PrefixCheckpoint, RefusesACheckpointBeyondTheSequenceOrOfAnotherModel) {
  Engine e(m(), opts());
  const std::vector<uint32_t> a = tokens(c(), 20, 5);
  SequenceState s = e.new_sequence();
  e.eval(s, a, nullptr);
  const SequenceCheckpoint ck = e.checkpoint(s);
  SequenceState shorter = e.new_sequence();
  e.eval(shorter, std::span<const uint32_t>(a.data(), 10), nullptr);
  const SequenceState before = shorter;
  EXPECT_THROW(e.rollback(shorter, ck), Error);
  EXPECT_TRUE(shorter == before);
  SequenceCheckpoint bad = ck;
  bad.window_kv.pop_back();
  EXPECT_THROW(e.rollback(s, bad), Error);
  bad = ck;
  bad.carry_k.clear();
  EXPECT_THROW(e.rollback(s, bad), Error);
  // Rolling back to the position it is at changes nothing.
  const SequenceState at = s;
  e.rollback(s, ck);
  EXPECT_TRUE(s == at);
}

// A snapshot restores any state of the engine, whatever it held (the shared prefix cache starts
// one slot from another's prompt): restored into a state that evaluated other tokens further,
// it equals a cold prefill of the snapshot's tokens, and continues as one.
TEST_P(PrefixCheckpoint, SnapshotRestoredIntoAnotherStateEqualsAColdPrefill) {
  Engine e(m(), opts());
  const uint32_t V = c().vocab_size, n = len();
  const std::vector<uint32_t> a = tokens(c(), n, 21);
  const std::vector<uint32_t> other = tokens(c(), n + 7, 22);
  for (const uint32_t p : positions()) {
    SCOPED_TRACE("snapshot at " + std::to_string(p));
    SequenceState s = e.new_sequence();
    e.eval(s, std::span<const uint32_t>(a.data(), p), nullptr);
    const SequenceSnapshot snap = e.snapshot(s);
    EXPECT_EQ(snap.pos(), p);
    EXPECT_EQ(snap.bytes(), snapshot_bytes(c(), p));
    EXPECT_GT(snap.bytes(), checkpoint_bytes(c(), p));

    SequenceState t = e.new_sequence();  // dirty: other tokens, further than p
    e.eval(t, other, nullptr);
    e.restore(t, snap);
    EXPECT_TRUE(t == s) << "the restored state differs from the one the snapshot was taken of";

    std::vector<uint32_t> b = tokens(c(), n, 2000 + p);
    std::copy(a.begin(), a.begin() + p, b.begin());
    SequenceState cold = e.new_sequence();
    std::vector<float> cold_logits((size_t)n * V);
    e.eval(cold, b, cold_logits.data());
    std::vector<float> got((size_t)(n - p) * V);
    e.eval(t, std::span<const uint32_t>(b.data() + p, n - p), got.data());
    EXPECT_TRUE(same_bits(got, std::vector<float>(cold_logits.begin() + (size_t)p * V, cold_logits.end())))
        << "logits after the restore differ from a cold prefill";
    EXPECT_TRUE(t == cold);
  }
}

TEST_P(PrefixCheckpoint, RefusesASnapshotOfAnotherShapeOrBeyondTheContext) {
  Engine e(m(), opts());
  const std::vector<uint32_t> a = tokens(c(), 40, 5);
  SequenceState s = e.new_sequence();
  e.eval(s, a, nullptr);
  const SequenceSnapshot snap = e.snapshot(s);
  SequenceState t = e.new_sequence();
  e.eval(t, std::span<const uint32_t>(a.data(), 9), nullptr);
  const SequenceState before = t;
  SequenceSnapshot bad = snap;
  bad.kv.back().pop_back();
  EXPECT_THROW(e.restore(t, bad), Error);
  bad = snap;
  bad.index_k.clear();
  EXPECT_THROW(e.restore(t, bad), Error);
  bad = snap;
  bad.ck.engram_tail.push_back(1);
  EXPECT_THROW(e.restore(t, bad), Error);
  EngineOptions small = opts();
  small.ctx = 32;
  Engine e32(m(), small);
  SequenceState u = e32.new_sequence();
  const SequenceState u_before = u;
  EXPECT_THROW(e32.restore(u, snap), Error);  // 40 positions in a context of 32
  EXPECT_TRUE(u == u_before);
  EXPECT_TRUE(t == before);
  e.restore(t, snap);  // the real one, into the shorter state
  EXPECT_TRUE(t == s);
}

TEST_P(PrefixCheckpoint, BytesFollowTheShapes) {
  const ModelConfig& cfg = c();
  const std::vector<LayerRole> roles = layer_roles(cfg);
  uint64_t carry = 0;
  for (uint32_t L : cfg.kv_source_layer_ids) carry += 2ull * (roles[L].ratio - 1) * cfg.head_dim * 4;
  const uint64_t tail = (cfg.engram_max_ngram_size - 1) * 8ull;
  const uint64_t row = (uint64_t)cfg.num_hidden_layers * cfg.head_dim * 2;
  EXPECT_EQ(checkpoint_bytes(cfg, 0), carry + tail);
  EXPECT_EQ(checkpoint_bytes(cfg, 2), 2 * row + carry + tail);
  EXPECT_EQ(checkpoint_bytes(cfg, cfg.sliding_window), cfg.sliding_window * row + carry + tail);
  EXPECT_EQ(checkpoint_bytes(cfg, 1000), cfg.sliding_window * row + carry + tail);
}

INSTANTIATE_TEST_SUITE_P(Models, PrefixCheckpoint, ::testing::Values("tiny", "tiny-alt"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           return i.param == "tiny" ? std::string("tiny") : std::string("tiny_alt");
                         });

}  // namespace
}  // namespace sluice
