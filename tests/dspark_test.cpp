// DSpark (issue 15): the support GGUF's schema, generator and checks; the target capture; the
// drafter's forward pass; the exact acceptance rule of speculative sampling.
#include <unistd.h>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu_backend.h"
#include "kernels/fp.h"
#include "model/deepseek41/dspark_forward.h"
#include "model/deepseek41/dspark_model.h"
#include "model/deepseek41/dspark_schema.h"
#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "model/streamed_experts.h"
#include "runtime/speculative.h"
#include "storage/expert_store.h"
#include "synth/generate.h"
#include "util/error.h"

#include "test_util.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

bool has_error(const DsparkReport& r, const std::string& part) {
  for (const std::string& e : r.errors)
    if (e.find(part) != std::string::npos) return true;
  return false;
}

std::string errors_text(const DsparkReport& r) {
  std::string s;
  for (const std::string& e : r.errors) s += e + "\n";
  return s;
}

TEST(DsparkSchema, PublishedDefaultsAndSizesAreTheSpecs) {
  ModelConfig c = published_config();
  finalize(c);
  const DsparkConfig d = dspark_defaults(c);
  EXPECT_EQ(d, DsparkConfig{});  // 3 stages, block 5, noise 128799, [37,38,39], rank 256, 128 top-3
  const std::vector<TensorSpec> t = dspark_tensors(d, c);
  EXPECT_EQ(t.size(), 78u);  // 24 per stage + 6
  uint64_t bytes = 0;
  for (const TensorSpec& s : t) bytes += s.nbytes();
  EXPECT_EQ(bytes, 4506293720ull);  // spec 6.2's computed data size
  for (size_t i = 1; i < t.size(); ++i) EXPECT_LT(t[i - 1].name, t[i].name);  // sorted by name
  EXPECT_TRUE(dspark_problems(d, c).empty());
}

TEST(DsparkSchema, ProblemsNameTheField) {
  const ModelConfig c = tiny_config();
  DsparkConfig d = dspark_defaults(c);
  EXPECT_TRUE(dspark_problems(d, c).empty());
  DsparkConfig bad = d;
  bad.noise_token = c.vocab_size;
  ASSERT_FALSE(dspark_problems(bad, c).empty());
  EXPECT_NE(dspark_problems(bad, c)[0].find("dspark.noise_token_id"), std::string::npos);
  bad = d;
  bad.target_layers = {2, 9};
  ASSERT_FALSE(dspark_problems(bad, c).empty());
  EXPECT_NE(dspark_problems(bad, c)[0].find("dspark.target_layer_ids: layer 9"), std::string::npos);
  bad = d;
  bad.expert_used = d.expert_count + 1;
  ASSERT_FALSE(dspark_problems(bad, c).empty());
  EXPECT_NE(dspark_problems(bad, c)[0].find("dspark.expert_used_count"), std::string::npos);
}

class Dspark : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("sluice-dspark-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    model_path_ = (dir_ / "tiny.gguf").string();
    support_path_ = (dir_ / "tiny-dspark.gguf").string();
    const std::string cmd = std::string(SLUICE_BINARY) + " make-model --preset tiny -o " + model_path_ +
                            " --dspark-out " + support_path_ + " --seed 3 > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    model_ = load_model(model_path_).release();
    dspark_ = load_dspark(support_path_, *model_).release();
  }
  static void TearDownTestSuite() {
    delete dspark_;
    delete model_;
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static const Model& m() { return *model_; }
  static const ModelConfig& c() { return model_->config; }
  static std::vector<TokenId> prompt(uint32_t n, uint32_t salt = 0) {
    std::vector<TokenId> p;
    for (uint32_t i = 0; i < n; ++i) p.push_back((i * 7919u + 13u + salt * 101u) % c().vocab_size);
    return p;
  }
  static inline fs::path dir_;
  static inline std::string model_path_, support_path_;
  static inline Model* model_ = nullptr;
  static inline DsparkModel* dspark_ = nullptr;
};

TEST_F(Dspark, GeneratedSupportFileValidatesAgainstItsModel) {
  const gguf::File f = gguf::File::open(support_path_);
  EXPECT_TRUE(is_dspark_architecture(f));
  const DsparkReport r = validate_dspark(f, &c());
  EXPECT_TRUE(r.ok()) << errors_text(r);
  EXPECT_EQ(r.config, dspark_defaults(c()));
  EXPECT_EQ(f.tensors().size(), 78u);
  EXPECT_GT(r.routed_expert_bytes, 0u);
  // Alone (no target) only what the file itself says is checked: still fine.
  EXPECT_TRUE(validate_dspark(f, nullptr).ok());
}

TEST_F(Dspark, AMismatchedSupportFileIsRefusedNamingTheTensor) {
  // A support file made for another model (tiny-alt: 10 layers, other widths) against tiny.
  ModelConfig alt = tiny_config();
  alt.hidden_size = 512;
  alt.num_hidden_layers = 10;
  alt.compress_ratios.resize(10, 1);
  finalize(alt);
  const std::string p = (dir_ / "alt-dspark.gguf").string();
  GenerateOptions g;
  g.sparse = true;
  generate_dspark(dspark_defaults(alt), alt, p, g);
  const DsparkReport r = validate_dspark(gguf::File::open(p), &c());
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(has_error(r, "mtp.0.attn_norm.weight: shape [512], the model needs [256]")) << errors_text(r);
  EXPECT_TRUE(has_error(r, "dspark.target_layer_ids: layer 9 is not below the model's 8 layers")) << errors_text(r);
  try {
    load_dspark(p, m());
    FAIL() << "a mismatched support file was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not a DSpark support file for this model"), std::string::npos) << e.what();
  }
  // The main model is not a support file.
  const DsparkReport r2 = validate_dspark(gguf::File::open(model_path_), &c());
  EXPECT_TRUE(has_error(r2, "general.architecture: deepseek41 is not a DSpark support file")) << errors_text(r2);
}

TEST_F(Dspark, MissingKeysAndAliasesOfOtherConverters) {
  const gguf::File f = gguf::File::open(support_path_);
  auto rewrite = [&](const std::string& out, const std::function<void(std::vector<gguf::KV>&)>& edit) {
    std::vector<gguf::KV> kvs = f.kvs();
    edit(kvs);
    gguf::Writer w(f.alignment());
    for (auto& kv : kvs) w.add(kv.key, kv.value);
    for (const auto& t : f.tensors()) w.add_tensor(t.name, std::vector<uint64_t>(t.ne.begin(), t.ne.begin() + t.n_dims), t.type);
    w.write(out, {}, /*sparse=*/true);
  };
  const std::string a = (dir_ / "alias.gguf").string(), b = (dir_ / "missing.gguf").string();
  // deepseek41-dspark + dspark.n_expert / n_expert_used, and no expert count at all: accepted.
  rewrite(a, [](std::vector<gguf::KV>& kvs) {
    for (gguf::KV& kv : kvs) {
      if (kv.key == "general.architecture") kv.value = gguf::Value::str("deepseek41-dspark");
      if (kv.key == "dspark.expert_used_count") kv.key = "dspark.n_expert_used";
    }
    std::erase_if(kvs, [](const gguf::KV& kv) { return kv.key == "dspark.expert_count"; });
  });
  const DsparkReport ra = validate_dspark(gguf::File::open(a), &c());
  EXPECT_TRUE(ra.ok()) << errors_text(ra);
  EXPECT_EQ(ra.config.expert_count, dspark_defaults(c()).expert_count);  // from ffn_gate_inp
  rewrite(b, [](std::vector<gguf::KV>& kvs) {
    std::erase_if(kvs, [](const gguf::KV& kv) { return kv.key == "dspark.block_size"; });
  });
  EXPECT_TRUE(has_error(validate_dspark(gguf::File::open(b), &c()), "dspark.block_size: missing"));
}

// spec 6.3 step 1: the capture of layer l is bf16 of the plain mean of the hc streams entering
// it, i.e. of layer l-1's output streams; capturing changes nothing else.
class StreamsSeen final : public TensorObserver {
 public:
  bool wants(std::string_view name) const override {
    return name.ends_with(".out") || name.ends_with(".engram_out") || name == "embd";
  }
  void observe(std::string_view name, uint32_t, uint32_t n, const float* data, size_t width, size_t stride) override {
    std::vector<float>& v = seen[std::string(name)];
    for (uint32_t i = 0; i < n; ++i) v.insert(v.end(), data + i * stride, data + i * stride + width);
  }
  std::map<std::string, std::vector<float>> seen;
};

TEST_F(Dspark, TheCaptureIsTheMeanOfTheStreamsEnteringEachTargetLayer) {
  const std::vector<uint32_t> layers = {0, 3, 7};
  StreamsSeen obs;
  EngineOptions eo;
  eo.ctx = 64;
  eo.chunk = 8;
  eo.capture_layers = layers;
  eo.observer = &obs;
  Engine e(m(), eo);
  EngineOptions plain_o = eo;
  plain_o.capture_layers.clear();
  plain_o.observer = nullptr;
  Engine plain(m(), plain_o);
  const std::vector<TokenId> p = prompt(13);  // two chunks
  const size_t H = c().hidden_size, hc = c().hc_mult, V = c().vocab_size;
  std::vector<float> hidden(p.size() * layers.size() * H, -1.0f), lg(p.size() * V), lg2(p.size() * V);
  SequenceState s = e.new_sequence(), s2 = plain.new_sequence();
  Engine::BatchItem it;
  it.state = &s;
  it.tokens = p;
  it.hidden = hidden.data();
  e.eval_batch(std::span<const Engine::BatchItem>(&it, 1), lg.data());
  plain.eval(s2, p, lg2.data());
  EXPECT_EQ(std::memcmp(lg.data(), lg2.data(), lg.size() * sizeof(float)), 0);
  EXPECT_TRUE(s == s2);
  for (size_t k = 0; k < layers.size(); ++k) {
    const std::vector<float>& X = obs.seen.at(layers[k] == 0 ? "embd" : "l" + std::to_string(layers[k] - 1) + ".out");
    ASSERT_EQ(X.size(), p.size() * hc * H);
    for (size_t i = 0; i < p.size(); ++i)
      for (size_t d = 0; d < H; ++d) {
        float sum = 0.0f;
        for (size_t h = 0; h < hc; ++h) sum += X[(i * hc + h) * H + d];
        const float want = round_bf16(sum / (float)hc);
        const float got = hidden[(i * layers.size() + k) * H + d];
        ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << "layer " << layers[k] << " token " << i << " dim " << d;
      }
  }
  EXPECT_EQ(e.footprint().scratch.capture, (uint64_t)eo.chunk * layers.size() * H * sizeof(float));
}

// spec 6.3 step 1, "after any Engram": at a target layer with an Engram (tiny: layers 1 and 4)
// the capture is the mean of the streams after that layer's Engram, the ones its attention mixes
// (l<L>.engram_out), not of the streams the layer before handed over.
TEST_F(Dspark, AtAnEngramLayerTheCaptureIsTakenAfterTheEngram) {
  ASSERT_EQ(c().engram_layer_ids, (std::vector<uint32_t>{1, 4}));
  const std::vector<uint32_t> layers = {1, 2, 4};
  StreamsSeen obs;
  EngineOptions eo;
  eo.ctx = 64;
  eo.chunk = 8;
  eo.capture_layers = layers;
  eo.observer = &obs;
  Engine e(m(), eo);
  const std::vector<TokenId> p = prompt(11, 5);
  const size_t H = c().hidden_size, hc = c().hc_mult, n = p.size();
  std::vector<float> hidden(n * layers.size() * H, -1.0f);
  SequenceState s = e.new_sequence();
  Engine::BatchItem it;
  it.state = &s;
  it.tokens = p;
  it.hidden = hidden.data();
  it.logits = Engine::BatchItem::Logits::None;
  e.eval_batch(std::span<const Engine::BatchItem>(&it, 1), nullptr);
  auto mean_of = [&](const std::vector<float>& X, size_t i, size_t d) {
    float sum = 0.0f;
    for (size_t h = 0; h < hc; ++h) sum += X[(i * hc + h) * H + d];
    return round_bf16(sum / (float)hc);
  };
  for (size_t k = 0; k < layers.size(); ++k) {
    const uint32_t L = layers[k];
    const bool engram = L != 2;
    const std::string before_name = std::string("l").append(std::to_string(L - 1)).append(".out");
    const std::string engram_name = std::string("l").append(std::to_string(L)).append(".engram_out");
    const std::vector<float>& X = obs.seen.at(engram ? engram_name : before_name);
    const std::vector<float>& before = obs.seen.at(before_name);
    ASSERT_EQ(X.size(), n * hc * H);
    size_t differs_from_before = 0;
    for (size_t i = 0; i < n; ++i)
      for (size_t d = 0; d < H; ++d) {
        const float want = mean_of(X, i, d), got = hidden[(i * layers.size() + k) * H + d];
        ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << "layer " << L << " token " << i << " dim " << d;
        differs_from_before += got != mean_of(before, i, d);
      }
    if (engram) {
      EXPECT_GT(differs_from_before, 0u) << "the Engram of layer " << L << " changed nothing";
    }
  }
}

// The captured rows of a prompt, from an engine capturing the drafter's target layers.
std::vector<float> capture_rows(const Model& m, const Drafter& dr, const std::vector<TokenId>& p, int threads) {
  EngineOptions eo;
  eo.ctx = 64;
  eo.chunk = 16;
  eo.threads = threads;
  eo.capture_layers = dr.config().target_layers;
  Engine e(m, eo);
  SequenceState s = e.new_sequence();
  std::vector<float> hidden(p.size() * dr.capture_width());
  Engine::BatchItem it;
  it.state = &s;
  it.tokens = p;
  it.hidden = hidden.data();
  it.logits = Engine::BatchItem::Logits::None;
  e.eval_batch(std::span<const Engine::BatchItem>(&it, 1), nullptr);
  return hidden;
}

bool same_block(const DraftBlock& a, const DraftBlock& b) {
  return a.c == b.c && a.anchor == b.anchor && a.drafts == b.drafts && a.experts == b.experts &&
         a.logits.size() == b.logits.size() &&
         std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)) == 0 &&
         std::memcmp(a.confidence.data(), b.confidence.data(), a.confidence.size() * sizeof(float)) == 0;
}

TEST_F(Dspark, TheDrafterProposesABlockThatDependsOnlyOnTheCommittedPositions) {
  CpuBackend be1(1), be2(2);
  const Drafter d1(m(), *dspark_, be1), d2(m(), *dspark_, be2);
  const DsparkConfig& dc = d1.config();
  const std::vector<TokenId> p = prompt(21);  // more than the window of 8: the rings wrap
  const std::vector<float> h = capture_rows(m(), d1, p, 1);
  EXPECT_EQ(h, capture_rows(m(), d1, p, 2));

  DraftState whole = d1.new_state();
  d1.commit(whole, h.data(), (uint32_t)p.size());
  EXPECT_EQ(whole.committed, p.size());
  // Committed in pieces (prefill chunk, then one position at a time) the rings are the same.
  DraftState pieces = d2.new_state();
  d2.commit(pieces, h.data(), 12);
  for (uint32_t i = 12; i < p.size(); ++i) d2.commit(pieces, h.data() + i * d2.capture_width(), 1);
  EXPECT_TRUE(whole == pieces);

  const DraftBlock b = d1.propose(whole, 77);
  EXPECT_EQ(b.c, p.size() - 1);
  ASSERT_EQ(b.drafts.size(), dc.block_size);
  ASSERT_EQ(b.logits.size(), (size_t)dc.block_size * c().vocab_size);
  ASSERT_EQ(b.experts.size(), dc.stages);
  for (uint32_t j = 0; j < dc.block_size; ++j) {
    EXPECT_LT(b.drafts[j], c().vocab_size);
    EXPECT_TRUE(std::isfinite(b.confidence[j]));
    const float* l = b.logits.data() + (size_t)j * c().vocab_size;
    for (uint32_t v = 0; v < c().vocab_size; ++v) ASSERT_TRUE(std::isfinite(l[v]));
    EXPECT_EQ(b.drafts[j], argmax_lowest(std::span<const float>(l, c().vocab_size)));
    for (uint32_t s = 0; s < dc.stages; ++s) EXPECT_EQ(b.experts[s][j].size(), dc.expert_used);
  }
  EXPECT_TRUE(same_block(b, d2.propose(pieces, 77)));  // 1 vs 2 threads, whole vs pieces
  // The anchor matters; so do the rings (a block after one more position differs).
  EXPECT_FALSE(same_block(b, d1.propose(whole, 78)));
  DraftState shorter = d1.new_state();
  d1.commit(shorter, h.data(), (uint32_t)p.size() - 1);
  EXPECT_FALSE(same_block(b, d1.propose(shorter, 77)));
  EXPECT_THROW(d1.propose(d1.new_state(), 77), Error);  // nothing committed
}

// spec 6.1-6.2: other converters write the Markov and confidence heads as float tensors (F16,
// F32), whose rows take any width, so a Markov rank that is not a multiple of 32 is a valid
// support file there; only a block type needs whole blocks (the generator's Q8_0 heads: it
// refuses such a rank, naming it).
TEST_F(Dspark, AMarkovRankThatIsNotAMultipleOf32IsAcceptedWithFloatHeads) {
  DsparkConfig d = dspark_defaults(c());
  d.markov_rank = 40;
  std::vector<TensorSpec> specs = dspark_tensors(d, c());
  for (TensorSpec& t : specs) {
    if (t.name.find("markov_head") != std::string::npos) t.type = GgmlType::F16;
    if (t.name.find("confidence_head") != std::string::npos) t.type = GgmlType::F32;
  }
  gguf::Writer w(kDeepseek41Alignment);
  for (gguf::KV& kv : dspark_metadata(d, c())) w.add(std::move(kv.key), std::move(kv.value));
  std::map<std::string, const TensorSpec*> by_name;
  for (const TensorSpec& t : specs) {
    w.add_tensor(t.name, t.ne, t.type);
    by_name[t.name] = &t;
  }
  const std::string path = (dir_ / "rank40-dspark.gguf").string();
  w.write(path, [&](const gguf::TensorInfo& info, const gguf::Writer::Sink& sink) {
    const TensorSpec& t = *by_name.at(info.name);
    std::vector<uint8_t> buf(tensor_rows(t) * tensor_row_bytes(t));
    generate_rows(c(), t, 11, 0, tensor_rows(t), buf.data());
    sink(buf.data(), buf.size());
  });
  const DsparkReport r = validate_dspark(gguf::File::open(path), &c());
  EXPECT_TRUE(r.ok()) << errors_text(r);
  EXPECT_EQ(r.config.markov_rank, 40u);
  std::unique_ptr<DsparkModel> dm = load_dspark(path, m());
  CpuBackend be1(1), be2(2);
  const Drafter d1(m(), *dm, be1), d2(m(), *dm, be2);
  const std::vector<TokenId> p = prompt(9, 2);
  const std::vector<float> h = capture_rows(m(), d1, p, 1);
  DraftState s1 = d1.new_state(), s2 = d2.new_state();
  d1.commit(s1, h.data(), (uint32_t)p.size());
  d2.commit(s2, h.data(), (uint32_t)p.size());
  const DraftBlock b = d1.propose(s1, 77);
  ASSERT_EQ(b.drafts.size(), d.block_size);
  for (uint32_t j = 0; j < d.block_size; ++j) {
    EXPECT_TRUE(std::isfinite(b.confidence[j]));
    const float* l = b.logits.data() + (size_t)j * c().vocab_size;
    for (uint32_t v = 0; v < c().vocab_size; ++v) ASSERT_TRUE(std::isfinite(l[v]));
    EXPECT_EQ(b.drafts[j], argmax_lowest(std::span<const float>(l, c().vocab_size)));
  }
  EXPECT_TRUE(same_block(b, d2.propose(s2, 77)));
  // The generator writes Q8_0 heads (32-value blocks): there the rank must be a multiple of 32.
  GenerateOptions g;
  g.sparse = true;
  try {
    generate_dspark(d, c(), (dir_ / "rank40-q8.gguf").string(), g);
    ADD_FAILURE() << "the generator wrote Q8_0 heads of rank 40";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dspark.markov_rank: 40"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Q8_0"), std::string::npos) << e.what();
  }
}

// issue 15 item 2: the drafter's routed experts streamed from the support file through a store
// of their own give the resident drafter's blocks bit for bit: with the planned cache (one
// proposal's worst case per stage, leased at once) and with one so small that a stage's union
// streams through it in windows.
TEST_F(Dspark, AStreamedDrafterProposesTheResidentDraftersBlocks) {
  CpuBackend be(2);
  const Drafter resident(m(), *dspark_, be);
  LoadOptions lo;
  lo.resident_experts = false;
  const std::unique_ptr<DsparkModel> lean = load_dspark(support_path_, m(), lo);
  EXPECT_FALSE(lean->resident_experts);
  EXPECT_LT(lean->loaded_bytes, dspark_->loaded_bytes);
  EXPECT_THROW(Drafter(m(), *lean, be), Error);  // no experts and no store
  const DsparkConfig& dc = lean->config;
  ASSERT_EQ(dspark_stream_slots(dc), dc.stages * std::min(dc.block_size * dc.expert_used, dc.expert_count));

  const std::unique_ptr<storage::ExpertStore> planned = open_dspark_expert_store(*lean, {});
  EXPECT_EQ(planned->budget().slots, dspark_stream_slots(dc));
  storage::StoreOptions tight = dspark_store_options(dc, {});
  tight.max_slots = 2 * dc.stages;  // a share of 2 per stage: a block's union streams in windows of 1
  storage::ExpertStore small(lean->file, dspark_expert_geometry(lean->file, dc), tight);
  const StreamedExperts from_planned(*planned), from_small(small);
  const Drafter d1(m(), *lean, be, &from_planned), d2(m(), *lean, be, &from_small);

  const std::vector<TokenId> p = prompt(19, 4);
  const std::vector<float> h = capture_rows(m(), resident, p, 2);
  DraftState st = resident.new_state();
  for (uint32_t n : {5u, 1u, 13u}) {  // blocks after three different committed prefixes
    resident.commit(st, h.data() + (size_t)st.committed * resident.capture_width(), n);
    for (TokenId anchor : {3u, 41u}) {
      const DraftBlock want = resident.propose(st, anchor);
      EXPECT_TRUE(same_block(want, d1.propose(st, anchor))) << st.committed << " " << anchor;
      EXPECT_TRUE(same_block(want, d2.propose(st, anchor))) << st.committed << " " << anchor;
    }
  }
  from_planned.release();
  from_small.release();
  // Both stores read the experts from the support file; the small one had to read them again.
  const storage::LayerStats a = planned->stats().total(), b = small.stats().total();
  EXPECT_GT(a.bytes_demand, 0u);
  EXPECT_GT(a.hits, 0u);
  EXPECT_GT(b.bytes_demand, a.bytes_demand);
}

// A read error in the drafter's store is an Error naming the tensor, and leaves nothing behind:
// the next proposal reads again and gives the resident drafter's block bit for bit.
TEST_F(Dspark, AReadErrorInTheDrafterStoreIsReportedAndTheNextProposalReadsAgain) {
  CpuBackend be(1);
  const Drafter resident(m(), *dspark_, be);
  LoadOptions lo;
  lo.resident_experts = false;
  const std::unique_ptr<DsparkModel> lean = load_dspark(support_path_, m(), lo);
  std::atomic<bool> fail{true};
  storage::StoreOptions o = dspark_store_options(lean->config, {});
  o.fault_injector = [&fail](const storage::ReadAttempt&) {
    return fail ? storage::ReadFault::fail(EIO) : storage::ReadFault::ok();
  };
  storage::ExpertStore store(lean->file, dspark_expert_geometry(lean->file, lean->config), o);
  const StreamedExperts streamed(store);
  const Drafter d(m(), *lean, be, &streamed);
  const std::vector<TokenId> p = prompt(11, 2);
  const std::vector<float> h = capture_rows(m(), resident, p, 1);
  DraftState st = resident.new_state();
  resident.commit(st, h.data(), (uint32_t)p.size());
  try {
    (void)d.propose(st, 5);
    ADD_FAILURE() << "a failing read was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mtp.0.ffn_"), std::string::npos) << e.what();
  }
  fail = false;
  EXPECT_TRUE(same_block(resident.propose(st, 5), d.propose(st, 5)));
  streamed.release();
}

// --- exact acceptance (spec 6.5), synthetic distributions ------------------------------------

std::vector<TokenProb> dist(std::initializer_list<std::pair<TokenId, double>> l) {
  std::vector<TokenProb> d;
  for (auto [id, p] : l) d.push_back({id, p});
  return d;
}

// Pearson chi-square of observed counts against expected probabilities (those > 0).
double chi_square(const std::map<TokenId, double>& expected, const std::map<TokenId, int>& got, int n) {
  double x2 = 0;
  for (auto [id, p] : expected) {
    const double e = p * n, o = got.count(id) ? got.at(id) : 0;
    x2 += (o - e) * (o - e) / e;
  }
  for (auto [id, o] : got) EXPECT_TRUE(expected.count(id)) << "token " << id << " drawn with probability 0";
  return x2;
}

TEST(Speculative, AcceptanceRateAndResidualFollowTheTargetDistribution) {
  // p_0 = {5: 0.5, 7: 0.3, 9: 0.2}; the point-mass draft is 7: accepted with probability 0.3; a
  // rejection draws from {5: 0.5, 9: 0.2} renormalised; after acceptance the bonus comes from p_1.
  const std::vector<std::vector<TokenProb>> p = {dist({{5, 0.5}, {7, 0.3}, {9, 0.2}}), dist({{1, 0.6}, {2, 0.4}})};
  const TokenId drafts[] = {7};
  std::mt19937_64 rng(11);
  const int n = 40000;
  int accepted = 0;
  std::map<TokenId, int> correction, bonus, first;
  for (int i = 0; i < n; ++i) {
    const Verdict v = verify_point_mass(p, drafts, rng);
    first[v.accepted ? 7 : v.next]++;
    if (v.accepted) {
      ++accepted;
      bonus[v.next]++;
    } else {
      correction[v.next]++;
    }
  }
  // 3 sigma of a binomial(40000, 0.3) is 275.
  EXPECT_NEAR(accepted, 0.3 * n, 275);
  // chi-square 99.9% points: 10.83 (1 degree of freedom), 13.82 (2).
  EXPECT_LT(chi_square({{5, 0.5 / 0.7}, {9, 0.2 / 0.7}}, correction, n - accepted), 10.83);
  EXPECT_LT(chi_square({{1, 0.6}, {2, 0.4}}, bonus, accepted), 10.83);
  // What matters: the first emitted token is distributed as p_0 itself.
  EXPECT_LT(chi_square({{5, 0.5}, {7, 0.3}, {9, 0.2}}, first, n), 13.82);
}

TEST(Speculative, TwoDraftsEmitTheTargetsJointDistribution) {
  // Rows 0..2; drafts 4 then 6. The first two emitted tokens (t1, t2) must be distributed as
  // p_0(t1) * p_1(t2) when t1 = 4 (row 1 is p given t1 = 4); other t1 end the step.
  const std::vector<std::vector<TokenProb>> p = {dist({{4, 0.6}, {5, 0.4}}), dist({{6, 0.25}, {8, 0.75}}),
                                                 dist({{1, 1.0}})};
  const TokenId drafts[] = {4, 6};
  std::mt19937_64 rng(5);
  const int n = 40000;
  std::map<TokenId, int> pair;  // 10 * t1 + t2, t2 = 0 when t1 ends the step
  for (int i = 0; i < n; ++i) {
    const Verdict v = verify_point_mass(p, drafts, rng);
    const TokenId t1 = v.accepted >= 1 ? 4 : v.next;
    const TokenId t2 = v.accepted >= 2 ? 6 : v.accepted == 1 ? v.next : 0;
    pair[10 * t1 + t2]++;
    if (v.accepted == 2) {
      EXPECT_EQ(v.next, 1u);
    }
  }
  EXPECT_LT(chi_square({{46, 0.6 * 0.25}, {48, 0.6 * 0.75}, {50, 0.4}}, pair, n), 13.82);
}

TEST(Speculative, GreedyIsTheArgmaxAndDrawsNothing) {
  const std::vector<float> row0 = {0.1f, 2.0f, 2.0f, -1.0f}, row1 = {3.0f, 0.0f, 0.0f, 0.0f};
  SamplerOptions greedy;
  const std::vector<std::vector<TokenProb>> p = {sampling_distribution(row0, greedy), sampling_distribution(row1, greedy)};
  EXPECT_EQ(p[0].size(), 1u);
  EXPECT_EQ(p[0][0].id, 1u);  // tie to the lowest id
  std::mt19937_64 rng(1), untouched(1);
  const TokenId right[] = {1}, wrong[] = {2};
  Verdict v = verify_point_mass(p, right, rng);
  EXPECT_EQ(v.accepted, 1u);
  EXPECT_EQ(v.next, 0u);
  v = verify_point_mass(p, wrong, rng);
  EXPECT_EQ(v.accepted, 0u);
  EXPECT_EQ(v.next, 1u);
  EXPECT_EQ(rng(), untouched());  // no randomness consumed
  EXPECT_THROW(verify_point_mass(std::span(p).first(1), right, rng), Error);
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

TEST(DsparkCli, MakeModelWritesASupportFileThatInspectChecksAgainstItsModel) {
  test::TempDir dir("sluice_dspark_cli");
  const std::string t = dir / "t.gguf", d = dir / "d.gguf", p = dir / "p.gguf";
  test::CmdResult r = test::run_sluice(dir, "make-model --preset tiny -o " + test::q(t) + " --dspark-out " + test::q(d));
  ASSERT_EQ(r.rc, 0) << r.err;
  r = test::run_sluice(dir, "inspect " + test::q(d) + " --target " + test::q(t));
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("3 stages, blocks of 5 rows"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("check        OK against"), std::string::npos) << r.out;
  r = test::run_sluice(dir, "inspect --json " + test::q(t) + " --dspark " + test::q(d));
  EXPECT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["dspark"]["target_layer_ids"], nlohmann::json::array({5, 6, 7}));
  EXPECT_TRUE(j["valid"].get<bool>());
  // The published drafter's support file (sparse) against the tiny model: refused, naming a tensor.
  r = test::run_sluice(dir, "make-model --preset published --sparse --dspark-out " + test::q(p));
  ASSERT_EQ(r.rc, 0) << r.err;
  r = test::run_sluice(dir, "inspect " + test::q(t) + " --dspark " + test::q(p));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("mtp.0.attn_kv.weight: shape [5120, 512], the model needs [256, 64]"), std::string::npos) << r.err;
  // Neither output: a usage error; an existing output is not replaced without --force.
  EXPECT_EQ(test::run_sluice(dir, "make-model --preset tiny").rc, 2);
  r = test::run_sluice(dir, "make-model --preset tiny --dspark-out " + test::q(d));
  EXPECT_NE(r.rc, 0);
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// spec 6.4: row i of a verify pass equals a single-token decode at its position, and cutting
// the pass back to any prefix leaves the state a plain decode of that prefix reaches, bit for
// bit; decoding on from there gives the plain decode's logits. Prompt lengths put the pass
// across the window's wrap and on both parities of the ratio-2 groups.
TEST_F(Dspark, AVerifyPassEqualsDecodeAndACutLeavesNoTraceOfTheRejectedRows) {
  EngineOptions eo;
  eo.ctx = 64;
  eo.chunk = 8;
  eo.threads = 2;
  eo.capture_layers = dspark_defaults(c()).target_layers;
  Engine e(m(), eo);
  const size_t V = c().vocab_size, cw = eo.capture_layers.size() * c().hidden_size;
  const std::vector<TokenId> pass = {17, 301, 5, 88, 412, 9};
  for (uint32_t p0 : {3u, 6u, 7u, 8u, 11u, 14u}) {
    const std::vector<TokenId> pr = prompt(p0, p0);
    // Plain: the prompt, then the pass's tokens one at a time (logits, captures, every state).
    SequenceState s = e.new_sequence();
    e.eval(s, pr, nullptr);
    std::vector<SequenceState> plain = {s};
    std::vector<float> lg(pass.size() * V), hid(pass.size() * cw);
    for (size_t i = 0; i < pass.size(); ++i) {
      Engine::BatchItem it;
      it.state = &s;
      it.tokens = std::span<const TokenId>(&pass[i], 1);
      it.hidden = hid.data() + i * cw;
      e.eval_batch(std::span<const Engine::BatchItem>(&it, 1), lg.data() + i * V);
      plain.push_back(s);
    }
    for (uint32_t n = 0; n <= pass.size(); ++n) {
      SequenceState v = e.new_sequence();
      e.eval(v, pr, nullptr);
      std::vector<float> vlg(pass.size() * V), vhid(pass.size() * cw);
      VerifyRecord rec;
      e.eval_verify(v, pass, vlg.data(), vhid.data(), rec);
      ASSERT_EQ(std::memcmp(vlg.data(), lg.data(), lg.size() * sizeof(float)), 0) << "p0 " << p0;
      ASSERT_EQ(std::memcmp(vhid.data(), hid.data(), hid.size() * sizeof(float)), 0) << "p0 " << p0;
      e.keep_verified(v, rec, n);
      ASSERT_TRUE(v == plain[n]) << "p0 " << p0 << " kept " << n;
      // Decoding on: the plain decode's next logits.
      if (n < pass.size()) {
        SequenceState w = plain[n];
        std::vector<float> a(V), b(V);
        e.eval(w, std::span<const TokenId>(&pass[n], 1), a.data());
        e.eval(v, std::span<const TokenId>(&pass[n], 1), b.data());
        ASSERT_EQ(std::memcmp(a.data(), b.data(), V * sizeof(float)), 0);
      }
    }
  }
  // Refusals leave the state alone.
  SequenceState s = e.new_sequence();
  VerifyRecord rec;
  e.eval_verify(s, pass, nullptr, nullptr, rec);
  const SequenceState keep = s;
  EXPECT_THROW(e.keep_verified(s, rec, 7), Error);
  EXPECT_TRUE(s == keep);
  e.eval(s, std::span<const TokenId>(&pass[0], 1), nullptr);
  EXPECT_THROW(e.keep_verified(s, rec, 2), Error);  // not where the pass left it
  const std::vector<TokenId> nine(9, 3);
  EXPECT_THROW(e.eval_verify(s, nine, nullptr, nullptr, rec), Error);  // beyond the chunk of 8
}

}  // namespace
}  // namespace sluice

#include "reference_forward.h"

namespace sluice {
namespace {

double rel_l2(const float* a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// The drafter against the independent reference drafter (tests/reference_forward.h, mimic
// mode), both fed the engine's captured rows position by position. Ring entries are compared
// bit for bit and the reference's resynced to the engine's (as forward_reference_test does), so
// one rounding flip does not propagate; each block's drafts, routed experts, logits and
// confidence are compared. Engine and reference differ only in accumulation order, so a block
// is "clean" (everything equal, logits within 1e-5) unless a value sat within ~1e-6 of a BF16 or
// FP8 rounding midpoint.
TEST_F(Dspark, TheDrafterMatchesTheReferenceDrafter) {
  CpuBackend be(2);
  const Drafter dr(m(), *dspark_, be);
  reference::Options ro;
  ro.mimic = true;
  reference::Forward rf(model_path_, ro);
  reference::Drafter rd(rf, support_path_);
  ASSERT_EQ(rd.target_layers(), dr.config().target_layers);
  const uint32_t n = 24, hd = c().head_dim, W = c().sliding_window;
  const std::vector<TokenId> p = prompt(n, 5);
  const std::vector<float> h = capture_rows(m(), dr, p, 2);
  DraftState st = dr.new_state();
  size_t entries = 0, entry_mismatch = 0, blocks = 0, clean = 0, same_choices = 0;
  double worst_rel = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const float* row = h.data() + (size_t)i * dr.capture_width();
    dr.commit(st, row, 1);
    rd.commit(std::vector<double>(row, row + dr.capture_width()));
    for (uint32_t s = 0; s < dr.config().stages; ++s) {
      std::vector<double>* mine = rd.entry(s, i);
      ASSERT_NE(mine, nullptr);
      const uint16_t* eng = st.rings.data() + ((size_t)s * W + i % W) * hd;
      for (uint32_t k = 0; k < hd; ++k) {
        const double e = bf16_to_f32(eng[k]);
        entry_mismatch += (*mine)[k] != e;
        (*mine)[k] = e;
      }
      entries += hd;
    }
    const TokenId anchor = (i * 31u + 7u) % c().vocab_size;
    const DraftBlock eb = dr.propose(st, anchor);
    const reference::DraftResult rb = rd.propose(anchor);
    ++blocks;
    const bool choices = eb.drafts == rb.drafts && eb.experts == rb.experts;
    double rel = 0, conf = 0;
    for (uint32_t j = 0; j < dr.config().block_size; ++j) {
      rel = std::max(rel, rel_l2(eb.logits.data() + (size_t)j * c().vocab_size, rb.logits[j]));
      conf = std::max(conf, (double)std::fabs(eb.confidence[j] - rb.confidence[j]) / (1.0 + std::fabs(rb.confidence[j])));
    }
    same_choices += choices;
    clean += choices && rel < 1e-5 && conf < 1e-5;
    if (choices) worst_rel = std::max(worst_rel, rel);
  }
  std::printf("[numerics] dspark drafter vs reference (mimic): %zu blocks, %zu clean, %zu with equal choices "
              "(worst logits rel L2 %.3g); ring entries: %zu of %zu values differ\n",
              blocks, clean, same_choices, worst_rel, entry_mismatch, entries);
  EXPECT_GE(clean * 2, blocks);                // measured: see the line above
  EXPECT_LE(entry_mismatch * 100, entries);    // flips only: at most 1% of the values
  EXPECT_LE(worst_rel, 0.15);                  // where choices agree: quantization error at most
}

}  // namespace
}  // namespace sluice


namespace sluice {
namespace {

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t nl = text.find('\n', i);
    out.push_back(nlohmann::json::parse(text.substr(i, nl - i)));
    i = nl == std::string::npos ? text.size() : nl + 1;
  }
  return out;
}

// issue 15 item 6 from the command line: speculation leaves --dump-logits and trace.jsonl byte
// for byte what plain decoding writes; --trace adds drafts.jsonl; --draft-audit drafts after every
// committed position and --dump-draft-logits holds each block's rows, whose argmax are the drafts.
TEST(DsparkCli, RunTracesAndDumpsTheDrafterBlocks) {
  test::TempDir dir("sluice_dspark_run");
  const std::string t = dir / "t.gguf", d = dir / "d.gguf";
  test::CmdResult r = test::run_sluice(dir, "make-model --preset tiny -o " + test::q(t) + " --dspark-out " + test::q(d));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string base = "run -m " + test::q(t) + " --tokens 3,17,29,101,7,64,5 -n 10 --ignore-eos -t 1 ";
  const std::string spec = "--dspark " + test::q(d) + " --dspark-conf 0 --no-dspark-guard ";
  r = test::run_sluice(dir, base + "--dump-logits " + test::q(dir / "plain.f32") + " --trace " + test::q(dir / "plain"));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string plain_ids = r.out;
  r = test::run_sluice(dir, base + spec + "--dump-logits " + test::q(dir / "spec.f32") + " --trace " + test::q(dir / "spec"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, plain_ids);
  EXPECT_NE(r.err.find("drafts accepted"), std::string::npos) << r.err;  // the summary's acceptance statistics
  EXPECT_EQ(test::slurp(dir / "spec.f32"), test::slurp(dir / "plain.f32"));
  EXPECT_EQ(test::slurp(dir / "spec.f32.json"), test::slurp(dir / "plain.f32.json"));
  EXPECT_EQ(test::slurp(dir / "spec/trace.jsonl"), test::slurp(dir / "plain/trace.jsonl"));
  EXPECT_FALSE(std::filesystem::exists(dir / "plain/drafts.jsonl"));
  const std::vector<nlohmann::json> spec_blocks = json_lines(test::slurp(dir / "spec/drafts.jsonl"));
  ASSERT_FALSE(spec_blocks.empty());
  uint32_t verified = 0;
  for (const nlohmann::json& b : spec_blocks) verified += b["verified"].get<uint32_t>();
  EXPECT_GT(verified, 0u);

  r = test::run_sluice(dir, base + spec + "--draft-audit --trace " + test::q(dir / "audit") + " --dump-draft-logits " +
                                test::q(dir / "drafts.f32"));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, plain_ids);
  const std::vector<nlohmann::json> blocks = json_lines(test::slurp(dir / "audit/drafts.jsonl"));
  const uint32_t P = 7, G = 10, B = 5, V = tiny_config().vocab_size;
  ASSERT_EQ(blocks.size(), P + G - 1);
  const std::string rows = test::slurp(dir / "drafts.f32");
  ASSERT_EQ(rows.size(), (size_t)blocks.size() * B * V * sizeof(float));
  const nlohmann::json index = nlohmann::json::parse(test::slurp(dir / "drafts.f32.json"));
  EXPECT_EQ(index["vocab"], V);
  EXPECT_EQ(index["block"], B);
  ASSERT_EQ(index["blocks"].size(), blocks.size());
  for (size_t c = 0; c < blocks.size(); ++c) {
    const nlohmann::json& b = blocks[c];
    EXPECT_EQ(b["c"], c);
    EXPECT_EQ(b["drafts"].size(), B);
    EXPECT_EQ(b["confidence"].size(), B);
    EXPECT_EQ(b["experts"].size(), 3u);  // stages
    EXPECT_EQ(b["verified"], 0u);
    EXPECT_EQ(index["blocks"][c]["c"], c);
    EXPECT_EQ(index["blocks"][c]["drafts"], b["drafts"]);
    EXPECT_EQ(index["blocks"][c]["row"], c * B);
    for (uint32_t j = 0; j < B; ++j) {
      std::vector<float> row(V);
      std::memcpy(row.data(), rows.data() + ((c * B + j) * V) * sizeof(float), V * sizeof(float));
      EXPECT_EQ(b["drafts"][j], std::max_element(row.begin(), row.end()) - row.begin()) << c << " " << j;
    }
  }
  // The speculative run's blocks are the audit's at the same positions.
  for (const nlohmann::json& sb : spec_blocks) {
    const nlohmann::json& ab = blocks.at(sb["c"].get<size_t>());
    EXPECT_EQ(sb["anchor"], ab["anchor"]);
    EXPECT_EQ(sb["drafts"], ab["drafts"]);
    EXPECT_EQ(sb["confidence"], ab["confidence"]);
  }
  // The captured rows are named tensor dumps: l<L>.dspark_capture for each target layer, one row
  // per evaluated position, the mean of the 4 streams l<L-1>.out hands to layer L (BF16).
  r = test::run_sluice(dir, base + spec + "--dump-tensors " + test::q(dir / "tensors") +
                                " --dump-filter '^l[4-7]\\.(out|dspark_capture)$'");
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json tindex = nlohmann::json::parse(test::slurp(dir / "tensors/index.json"));
  const uint32_t H = tiny_config().hidden_size, hc = tiny_config().hc_mult;
  for (uint32_t L : {5u, 6u, 7u}) {
    const std::string cap = test::slurp(dir / ("tensors/l" + std::to_string(L) + ".dspark_capture.f32"));
    const std::string in = test::slurp(dir / ("tensors/l" + std::to_string(L - 1) + ".out.f32"));
    ASSERT_EQ(cap.size(), (size_t)(P + G - 1) * H * sizeof(float)) << L;
    ASSERT_EQ(in.size(), cap.size() * hc) << L;
    std::vector<float> c(cap.size() / 4), x(in.size() / 4);
    std::memcpy(c.data(), cap.data(), cap.size());
    std::memcpy(x.data(), in.data(), in.size());
    for (size_t p = 0; p < P + G - 1; ++p)
      for (uint32_t i = 0; i < H; ++i) {
        float m = 0;  // spec 6.3 step 1: the f32 sum of the streams over 4, rounded to BF16
        for (uint32_t k = 0; k < hc; ++k) m += x[(p * hc + k) * H + i];
        ASSERT_EQ(c[p * H + i], round_bf16(m / (float)hc)) << L << " " << p << " " << i;
      }
  }
  EXPECT_NE(tindex.dump().find("l5.dspark_capture"), std::string::npos);
  // plan --dspark: the drafter's line and the verify depth the expert cache allows (12 of a
  // layer's 16 experts: 3 rows of top-4), as run plans it.
  r = test::run_sluice(dir, "plan -m " + test::q(t) + " --dspark " + test::q(d) + " --cache-experts 96");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("DSpark drafter"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("a verify pass checks at most 2 drafts"), std::string::npos) << r.out;
  r = test::run_sluice(dir, "plan --json -m " + test::q(t) + " --dspark " + test::q(d));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["dspark_verify_max"], 5);
  EXPECT_EQ(nlohmann::json::parse(r.out)["dspark_experts"], "resident");
  r = test::run_sluice(dir, "plan --json -m " + test::q(t) + " --dspark " + test::q(d) + " --dspark-experts stream");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["dspark_experts"], "streamed");
  EXPECT_EQ(nlohmann::json::parse(r.out)["dspark_cache_slots"], 45);  // 3 stages x min(5 x 3, 16)
  // run streams them too, and its summary says what their store read.
  r = test::run_sluice(dir, base + "--dspark " + test::q(d) + " --dspark-experts stream --dspark-conf 0");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("drafter experts streamed: 45 slots"), std::string::npos) << r.err;
  r = test::run_sluice(dir, "plan -m " + test::q(t) + " --dspark " + test::q(t));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("not a DSpark support file"), std::string::npos) << r.err;
  // A support file that is not one: refused before loading, the error naming it (not the model).
  const std::string other = dir / "other.gguf";
  ASSERT_EQ(test::run_sluice(dir, "make-model --preset tiny --seed 9 -o " + test::q(other)).rc, 0);
  r = test::run_sluice(dir, base + "--dspark " + test::q(other));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("sluice: error: " + other + ": general.architecture"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(t), std::string::npos) << r.err;
  // Two outputs on one path are refused before anything is written (the logits over the draft
  // rows, or one's index over the other's).
  const std::string same = dir / "same.f32";
  r = test::run_sluice(dir, base + "--dspark " + test::q(d) + " --dump-logits " + test::q(same) + " --dump-draft-logits " +
                                test::q(same));
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("--dump-logits and --dump-draft-logits are the same path"), std::string::npos) << r.err;
  r = test::run_sluice(dir, base + "--dspark " + test::q(d) + " --dump-logits " + test::q(same + ".json") +
                                " --dump-draft-logits " + test::q(same));
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find("the same path"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(same));
  EXPECT_FALSE(fs::exists(same + ".json"));
  // Without a drafter these flags are usage errors.
  EXPECT_EQ(test::run_sluice(dir, base + "--draft-audit").rc, 2);
  EXPECT_EQ(test::run_sluice(dir, base + "--dump-draft-logits " + test::q(dir / "x.f32")).rc, 2);
}

}  // namespace
}  // namespace sluice
