// The forward pass through the SSD expert store (issue 4 acceptance): logits bit-identical to
// resident experts for a cache holding every expert and for the minimum admissible cache, with
// per-layer and global LRU, with and without prefetch, for prefill chunks and decode; read
// faults in the middle of a token leave the sequence unchanged; the Session keeps and reuses
// its sequence exactly.
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu_backend.h"
#include "kernels/numerics.h"
#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "model/streamed_experts.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "storage/expert_store.h"
#include "util/error.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using storage::EvictionKind;
using storage::StoreOptions;

class StoreEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("sluice-store-engine-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    path_ = (dir_ / "tiny.gguf").string();
    const std::string cmd = std::string(SLUICE_BINARY) + " make-model --preset tiny -o " + path_ + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    model_ = load_model(path_).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static const Model& m() { return *model_; }
  static const ModelConfig& c() { return model_->config; }

  static std::vector<uint32_t> prompt() {
    std::vector<uint32_t> p;
    for (uint32_t i = 0; i < 20; ++i) p.push_back((i * 7919u + 11) % c().vocab_size);
    return p;
  }


  // Prompt in chunks of `chunk`, then `gen` greedy decode steps; every row of logits.
  static std::vector<float> run(const ExpertSource* src, uint32_t chunk, bool prefetch, uint32_t gen = 6) {
    EngineOptions eo;
    eo.ctx = 64;
    eo.chunk = chunk;
    eo.experts = src;
    eo.prefetch = prefetch;
    eo.threads = 2;
    Engine eng(m(), eo);
    SequenceState s = eng.new_sequence();
    const uint32_t V = c().vocab_size;
    const std::vector<uint32_t> p = prompt();
    std::vector<float> all(p.size() * (size_t)V);
    eng.eval(s, p, all.data());
    for (uint32_t g = 0; g < gen; ++g) {
      const uint32_t next = argmax_lowest(std::span<const float>(all.data() + all.size() - V, V));
      std::vector<float> row(V);
      eng.eval(s, std::span<const uint32_t>(&next, 1), row.data());
      all.insert(all.end(), row.begin(), row.end());
    }
    return all;
  }

  static fs::path dir_;
  static std::string path_;
  static Model* model_;
};

fs::path StoreEngine::dir_;
std::string StoreEngine::path_;
Model* StoreEngine::model_ = nullptr;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(StoreEngine, LogitsAreBitIdenticalForEveryCacheSizePolicyPrefetchAndChunk) {
  const uint32_t E = c().n_routed_experts, K = c().num_experts_per_tok, NL = c().num_hidden_layers;
  const std::vector<float> want = run(nullptr, 1, false);
  const uint64_t sb = expert_slot_bytes(m());
  int configs = 0;
  for (const uint32_t chunk : {1u, 3u, 5u}) {
    for (const EvictionKind policy : {EvictionKind::LruPerLayer, EvictionKind::LruGlobal}) {
      // The minimum admissible cache holds one layer's worst-case union of a chunk.
      const uint32_t union_max = std::min(chunk * K, E);
      const uint32_t min_slots = policy == EvictionKind::LruPerLayer ? union_max * NL : union_max;
      for (const uint32_t slots : {min_slots, E * NL}) {
        for (const bool prefetch : {false, true}) {
          SCOPED_TRACE("chunk " + std::to_string(chunk) + " policy " + std::string(storage::eviction_name(policy)) +
                       " slots " + std::to_string(slots) + " prefetch " + std::to_string(prefetch));
          StoreOptions o;
          o.policy = policy;
          o.cache_bytes = UINT64_MAX;
          o.max_slots = slots;
          o.prefetch_budget_bytes = prefetch ? sb * union_max : 0;
          std::unique_ptr<storage::ExpertStore> store = open_expert_store(m(), o);
          ASSERT_EQ(store->budget().slots, slots);
          StreamedExperts src(*store);
          const std::vector<float> got = run(&src, chunk, prefetch);
          src.release();
          EXPECT_TRUE(same_bits(want, got));
          const storage::LayerStats t = store->stats().total();
          EXPECT_GT(t.requests, 0u);
          if (prefetch) {
            EXPECT_GT(t.prefetch_issued, 0u) << "hints were ignored";
          } else {
            EXPECT_EQ(t.prefetch_issued, 0u);
          }
          if (slots == min_slots && slots < E * NL) {
            EXPECT_GT(t.evictions, 0u) << "the small cache never evicted";
          }
          if (slots == E * NL) {
            EXPECT_EQ(t.evictions, 0u);
          }
          ++configs;
        }
      }
    }
  }
  EXPECT_EQ(configs, 24);
}

// --route-bias (lossy, opt-in): with a bias far above any score gap, decode picks only experts
// the cache already holds, so once the prompt has left k per layer in it, every decode request
// hits, where exact routing misses. Only the choice moves: each chosen expert's weight is still
// its unbiased score normalized over the chosen ones (checked by re-running the router on the
// traced FFN input). Bias 0, also after being set back, is exact routing, bit for bit.
TEST_F(StoreEngine, RouteBiasFavoursCachedExpertsWithExactWeightsAndZeroIsExact) {
  const uint32_t E = c().n_routed_experts, K = c().num_experts_per_tok, NL = c().num_hidden_layers;
  ASSERT_GE(E, 2 * K) << "the tiny model needs room for a choice";
  const uint32_t V = c().vocab_size;
  // Decode steps of one engine over the prompt; returns (decode hit rate, logits of every step).
  struct Out {
    double hit_rate = 0;
    std::vector<float> logits;
    std::vector<TokenTrace> trace;
  };
  auto decode = [&](float bias, bool set_back) {
    StoreOptions o;
    o.cache_bytes = UINT64_MAX;
    o.max_slots = (E / 2) * NL;  // half of each layer: exact routing has to miss
    o.prefetch_budget_bytes = 0;  // what is held is what is resident: no reads race the routing
    std::unique_ptr<storage::ExpertStore> store = open_expert_store(m(), o);
    StreamedExperts src(*store);
    EngineOptions eo;
    eo.ctx = 64;
    eo.chunk = 4;
    eo.experts = &src;
    eo.prefetch = false;
    eo.threads = 2;
    eo.trace_ffn_inputs = true;
    eo.route_bias = bias;
    Engine eng(m(), eo);
    if (set_back) eng.set_route_bias(0.0f);
    SequenceState s = eng.new_sequence();
    const std::vector<uint32_t> p = prompt();
    std::vector<float> pl(p.size() * (size_t)V);
    eng.eval(s, p, pl.data());
    const storage::LayerStats before = store->stats().total();
    Out r;
    std::vector<float> row(pl.end() - V, pl.end());
    for (int g = 0; g < 10; ++g) {
      const uint32_t next = argmax_lowest(std::span<const float>(row));
      eng.eval(s, std::span<const uint32_t>(&next, 1), row.data(), &r.trace);
      r.logits.insert(r.logits.end(), row.begin(), row.end());
    }
    src.release();
    const storage::LayerStats after = store->stats().total();
    r.hit_rate = (double)(after.hits - before.hits) / (double)(after.requests - before.requests);
    return r;
  };
  const Out exact = decode(0.0f, false), back = decode(1000.0f, true), biased = decode(1000.0f, false);
  EXPECT_TRUE(same_bits(exact.logits, back.logits)) << "route bias set back to 0 is not exact routing";
  EXPECT_LT(exact.hit_rate, 1.0) << "exact routing never missed: the test cannot tell the bias works";
  EXPECT_EQ(biased.hit_rate, 1.0) << "a huge bias still routed to experts the cache did not hold";
  EXPECT_FALSE(same_bits(exact.logits, biased.logits));

  // The weights: the router on the traced input, with the chosen set forced by a bias of its own.
  CpuBackend be(1);
  size_t checked = 0;
  for (const TokenTrace& t : biased.trace)
    for (uint32_t L = 0; L < NL; ++L) {
      const LayerWeights& w = m().layers[L];
      std::vector<float> logits(E);
      be.linear(w.gate_inp, CMat(t.ffn_inputs[L].data(), 1, c().hidden_size, c().hidden_size), Mat{logits.data(), 1, E, E}, false, 0);
      std::vector<float> force = w.exp_bias;
      for (uint32_t e : t.experts[L]) force[e] += 1000.0f;
      const Routing want = route(logits, force, K, c().norm_topk_prob, c().routed_scaling_factor);
      std::vector<std::pair<uint32_t, float>> a, b;
      for (size_t k = 0; k < K; ++k) {
        a.emplace_back(t.experts[L][k], t.expert_weights[L][k]);
        b.emplace_back(want.experts[k], want.weights[k]);
      }
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      for (size_t k = 0; k < K; ++k) {
        ASSERT_EQ(a[k].first, b[k].first);
        EXPECT_NEAR(a[k].second, b[k].second, 1e-6f * std::fabs(b[k].second)) << "layer " << L;
      }
      ++checked;
    }
  EXPECT_EQ(checked, 10u * NL);
}

TEST_F(StoreEngine, ComparisonDetectsADifferentExpert) {
  // The comparison above can fail: an ExpertSource that hands out a neighbour's weights for one
  // expert changes the logits.
  struct Swapped final : ExpertSource {
    const ExpertSource& base;
    uint32_t n;
    Swapped(const ExpertSource& b, uint32_t experts) : base(b), n(experts) {}
    ExpertWeights get(uint32_t layer, uint32_t e) const override { return base.get(layer, e == 0 ? 1 % n : e); }
  };
  const Swapped bad(resident_expert_source(m()), c().n_routed_experts);
  EXPECT_FALSE(same_bits(run(nullptr, 1, false), run(&bad, 1, false)));
}

TEST_F(StoreEngine, ReadFaultDuringATokenNamesTheExpertAndLeavesTheSequenceUnchanged) {
  std::atomic<bool> armed{false};
  std::atomic<int> faults{0};
  StoreOptions o;
  o.policy = EvictionKind::LruGlobal;
  o.cache_bytes = UINT64_MAX;
  o.max_slots = c().num_experts_per_tok;  // every decode step reads
  o.fault_injector = [&](const storage::ReadAttempt& a) {
    if (!armed.load()) return storage::ReadFault::ok();
    ++faults;
    // EIO on every attempt (the store retries one EIO): a hard error.
    (void)a;
    return storage::ReadFault::fail(EIO);
  };
  std::unique_ptr<storage::ExpertStore> store = open_expert_store(m(), o);
  StreamedExperts src(*store);
  EngineOptions eo;
  eo.ctx = 64;
  eo.chunk = 1;
  eo.experts = &src;
  Engine eng(m(), eo);
  SequenceState s = eng.new_sequence();
  const uint32_t V = c().vocab_size;
  const std::vector<uint32_t> p = prompt();
  std::vector<float> logits(p.size() * (size_t)V);
  eng.eval(s, p, logits.data());
  const SequenceState before = s;
  const uint32_t next = 5;
  armed = true;
  std::string err;
  try {
    eng.eval(s, std::span<const uint32_t>(&next, 1), logits.data());
  } catch (const Error& e) {
    err = e.what();
  }
  armed = false;
  ASSERT_FALSE(err.empty()) << "the injected fault was not reported";
  EXPECT_GT(faults.load(), 0);
  EXPECT_NE(err.find("_exps.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("expert"), std::string::npos) << err;
  EXPECT_NE(err.find("offset"), std::string::npos) << err;
  EXPECT_EQ(s.position(), before.position());
  // The next request works and gives what an undisturbed run gives.
  std::vector<float> after(V), clean(V);
  eng.eval(s, std::span<const uint32_t>(&next, 1), after.data());
  {
    EngineOptions ro;
    ro.ctx = 64;
    ro.chunk = 1;
    Engine ref(m(), ro);
    SequenceState r = ref.new_sequence();
    ref.eval(r, p, nullptr);
    ref.eval(r, std::span<const uint32_t>(&next, 1), clean.data());
  }
  EXPECT_TRUE(same_bits(after, clean));
  src.release();
}

SessionOptions session_opts(const std::string& path, bool stream) {
  SessionOptions so;
  so.model_path = path;
  so.ctx = 96;
  so.threads = 2;
  so.stream_experts = stream;
  so.budget = BudgetSpec{false, 2ull << 30};
  so.allow_swap = true;  // the test host's swap is not what is tested here
  return so;
}

TEST_F(StoreEngine, SessionStreamsLikeResidentAndReusesItsSequence) {
  GenerateRequest r;
  r.prompt = prompt();
  r.max_tokens = 8;
  r.ignore_eos = true;
  Session resident(session_opts(path_, false));
  Session streamed(session_opts(path_, true));
  EXPECT_FALSE(resident.stats().streaming);
  EXPECT_TRUE(streamed.stats().streaming);
  const GenerateResult a = resident.generate(r, {}, {});
  const GenerateResult b = streamed.generate(r, {}, {});
  ASSERT_EQ(a.tokens.size(), 8u);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(b.reused_tokens, 0u);
  EXPECT_GT(streamed.stats().store.total().requests, 0u);

  // The next prompt extends what was evaluated (prompt + fed-back tokens): only the rest is new,
  // and the continuation equals a fresh session's.
  GenerateRequest r2 = r;
  r2.prompt.insert(r2.prompt.end(), b.tokens.begin(), b.tokens.end());
  r2.prompt.push_back(7);
  r2.max_tokens = 4;
  const GenerateResult c2 = streamed.generate(r2, {}, {});
  EXPECT_EQ(c2.reused_tokens, r.prompt.size() + b.decode_steps);
  Session fresh(session_opts(path_, true));
  const GenerateResult d2 = fresh.generate(r2, {}, {});
  EXPECT_EQ(d2.reused_tokens, 0u);
  EXPECT_EQ(c2.tokens, d2.tokens);

  // A prompt that does not extend it starts over.
  GenerateRequest r3 = r;
  r3.prompt[0] = (r3.prompt[0] + 1) % c().vocab_size;
  EXPECT_EQ(streamed.generate(r3, {}, {}).reused_tokens, 0u);

  // Cancelling from the token callback stops at once and keeps the session usable.
  int seen = 0;
  const GenerateResult e = streamed.generate(r, {}, [&](uint32_t) { return ++seen < 3; });
  EXPECT_EQ(e.finish, Finish::Cancelled);
  EXPECT_EQ(e.tokens.size(), 3u);
  EXPECT_EQ(streamed.generate(r, {}, {}).tokens, a.tokens);

  // Bad requests are refused before anything is evaluated.
  GenerateRequest bad = r;
  bad.prompt = {c().vocab_size};
  EXPECT_THROW(streamed.generate(bad, {}, {}), Error);
  bad.prompt.assign(200, 1);
  EXPECT_THROW(streamed.generate(bad, {}, {}), Error);
  bad.prompt.clear();
  EXPECT_THROW(streamed.generate(bad, {}, {}), Error);
}

TEST_F(StoreEngine, SessionRefusesABudgetTooSmallWithTheBreakdown) {
  SessionOptions so = session_opts(path_, true);
  // Below the tiny model's resident weights (4.6 MiB) plus this process's own resident set.
  so.budget = BudgetSpec{false, 8ull << 20};
  try {
    Session s(so);
    FAIL() << "an 8 MiB budget was admitted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("budget"), std::string::npos) << msg;
    EXPECT_NE(msg.find("resident weights"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// Prefill chunks before the last skip the output head; a prefill cancelled midway leaves a
// sequence without a last row of logits, and the next request (equal to it, or extending it)
// still gives what a fresh session gives.
TEST_F(StoreEngine, CancelledPrefillIsReusedOrRestartedExactly) {
  SessionOptions so = session_opts(path_, true);
  so.chunk = 4;
  GenerateRequest r;
  r.prompt = prompt();
  r.max_tokens = 5;
  r.ignore_eos = true;
  GenerateRequest head = r;
  head.prompt.resize(8);

  Session fresh(so);
  const std::vector<uint32_t> want_full = fresh.generate(r, {}, {}).tokens;
  Session fresh_head(so);
  const std::vector<uint32_t> want_head = fresh_head.generate(head, {}, {}).tokens;
  ASSERT_EQ(want_full.size(), 5u);

  Session s(so);
  // Stop after the second chunk: 8 prompt tokens evaluated, no logits row computed.
  const GenerateResult c = s.generate(r, [](uint32_t done, uint32_t) { return done < 8; }, {});
  EXPECT_EQ(c.finish, Finish::Cancelled);
  EXPECT_EQ(c.prompt_evaluated, 8u);
  EXPECT_TRUE(c.tokens.empty());
  // The same 8 tokens: the row is missing, so the session starts over (nothing reused).
  const GenerateResult h = s.generate(head, {}, {});
  EXPECT_EQ(h.reused_tokens, 0u);
  EXPECT_EQ(h.tokens, want_head);
  // Cancel again at 8, then the whole prompt extends the 8 evaluated tokens.
  s.reset();
  s.generate(r, [](uint32_t done, uint32_t) { return done < 8; }, {});
  const GenerateResult f = s.generate(r, {}, {});
  EXPECT_EQ(f.reused_tokens, 8u);
  EXPECT_EQ(f.tokens, want_full);
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// Issue 11 item 3: a prefill chunk whose union is far larger than a layer's share of the cache
// (a whole long prompt in one chunk, through the smallest admissible cache: top_k experts per
// layer) streams its experts in windows. Same bits as resident experts, and the store's counters
// show each needed expert requested once per layer and loaded at most once.
TEST_F(StoreEngine, LongChunkStreamsItsExpertsOnceThroughTheSmallestCache) {
#if defined(__SANITIZE_ADDRESS__)
  const uint32_t n = 128;  // the sanitizer pass only needs the logic, not the length
#else
  const uint32_t n = 1024;
#endif
  const uint32_t K = c().num_experts_per_tok, NL = c().num_hidden_layers, V = c().vocab_size;
  std::vector<uint32_t> p;
  for (uint32_t i = 0; i < n; ++i) p.push_back((i * 7919u + 17) % V);
  auto eval = [&](const ExpertSource* src, std::vector<TokenTrace>* trace, bool prefetch) {
    EngineOptions eo;
    eo.prefetch = prefetch;
    eo.ctx = n + 1;
    eo.chunk = n;
    eo.experts = src;
    eo.threads = 2;
    Engine eng(m(), eo);
    SequenceState s = eng.new_sequence();
    std::vector<float> last(V);
    eng.eval(s, std::span<const uint32_t>(p.data(), n - 1), nullptr, trace);
    eng.eval(s, std::span<const uint32_t>(p.data() + n - 1, 1), last.data());
    return last;
  };
  std::vector<TokenTrace> trace;
  const std::vector<float> want = eval(nullptr, &trace, false);
  // The distinct experts each layer's chunk routes to.
  std::vector<std::vector<bool>> used(NL, std::vector<bool>(c().n_routed_experts, false));
  for (const TokenTrace& t : trace)
    for (uint32_t L = 0; L < NL; ++L)
      for (uint32_t e : t.experts[L]) used[L][e] = true;
  const uint64_t sb = expert_slot_bytes(m());
  for (const auto& [policy, prefetch] : {std::pair{EvictionKind::LruPerLayer, true}, std::pair{EvictionKind::LruGlobal, false}}) {
      SCOPED_TRACE(std::string(storage::eviction_name(policy)) + " prefetch " + std::to_string(prefetch));
      StoreOptions o;
      o.policy = policy;
      o.cache_bytes = UINT64_MAX;
      o.max_slots = policy == EvictionKind::LruPerLayer ? K * NL : K;
      o.prefetch_budget_bytes = prefetch ? sb * K : 0;
      std::unique_ptr<storage::ExpertStore> store = open_expert_store(m(), o);
      ASSERT_EQ(store->max_union_experts(), K);
      StreamedExperts src(*store);
      const std::vector<float> got = eval(&src, nullptr, prefetch);
      src.release();
      EXPECT_EQ(std::memcmp(got.data(), want.data(), V * sizeof(float)), 0) << "logits differ";
      const storage::StoreStats st = store->stats();
      uint64_t unions = 0;
      for (uint32_t L = 0; L < NL; ++L) {
        uint64_t u = 0;
        for (bool b : used[L]) u += b;
        unions += u;
        ASSERT_GT(u, (uint64_t)K) << "layer " << L << ": the chunk's union fits the cache; the test needs more";
        const storage::LayerStats& ls = st.layers[L];
        // The prompt's chunk requests each of its experts once, plus the last token's top_k.
        EXPECT_LE(ls.requests, u + K) << "layer " << L;
        EXPECT_GE(ls.requests, u) << "layer " << L;
        // Loaded at most once for the chunk: demand loads and used prefetches together are at
        // most the union (+ the last token's, which may have been evicted since).
        EXPECT_LE(ls.misses - ls.joined + ls.prefetch_used, u + K) << "layer " << L;
      }
      EXPECT_GT(st.total().evictions, 0u);
      EXPECT_GE(st.total().requests, unions);
    }
}

}  // namespace
}  // namespace sluice
