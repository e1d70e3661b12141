// Batched decode (issue 13 item 1): N sequences advanced together by Engine::eval_batch give,
// for each sequence, the logits, traces and state that evaluating it alone gives, bit for bit
// (N = 1, 2, 4, 7; resident experts and experts streamed through per-layer and global LRU at
// the smallest admissible cache and at one holding everything), with a first pass that mixes
// prompt chunks of different lengths. A refused batch changes no state. The shared expert reads
// are checked on the store's counters: a layer's union is requested once per step, not once per
// sequence.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/vulkan_backend.h"
#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "model/streamed_experts.h"
#include "runtime/admission.h"
#include "runtime/meminfo.h"
#include "runtime/session.h"
#include "runtime/sampler.h"
#include "storage/expert_store.h"
#include "util/error.h"
#include "test_util.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using storage::EvictionKind;
using storage::StoreOptions;

constexpr uint32_t kSteps = 5;  // decode steps after the prompts

class BatchDecode : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("sluice-batch-decode-" + std::to_string(::getpid()));
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

  // Prompt k: 3 + 2k tokens (different lengths, so the sequences sit at different positions).
  static std::vector<TokenId> prompt(uint32_t k) {
    std::vector<TokenId> p;
    for (uint32_t i = 0; i < 3 + 2 * k; ++i) p.push_back((i * 7919u + 101u * k + 13u) % c().vocab_size);
    return p;
  }

  static EngineOptions options(const ExpertSource* src) {
    EngineOptions eo;
    eo.ctx = 64;
    eo.chunk = 64;
    eo.experts = src;
    eo.threads = 2;
    return eo;
  }

  struct Run {
    std::vector<std::vector<float>> logits;   // [sequence] every row, prompt then decode
    std::vector<std::vector<TokenTrace>> trace;
    std::vector<SequenceState> state;
  };

  // Each sequence alone: its prompt in one eval, then greedy decode one token per eval.
  static Run alone(const ExpertSource* src, uint32_t N) {
    Engine eng(m(), options(src));
    const uint32_t V = c().vocab_size;
    Run r;
    for (uint32_t k = 0; k < N; ++k) {
      SequenceState s = eng.new_sequence();
      const std::vector<TokenId> p = prompt(k);
      std::vector<float> lg(p.size() * V);
      std::vector<TokenTrace> tr;
      eng.eval(s, p, lg.data(), &tr);
      for (uint32_t g = 0; g < kSteps; ++g) {
        const TokenId next = argmax_lowest(std::span<const float>(lg.data() + lg.size() - V, V));
        std::vector<float> row(V);
        eng.eval(s, std::span<const TokenId>(&next, 1), row.data(), &tr);
        lg.insert(lg.end(), row.begin(), row.end());
      }
      r.logits.push_back(std::move(lg));
      r.trace.push_back(std::move(tr));
      r.state.push_back(std::move(s));
    }
    return r;
  }

  // All N together: one eval_batch of every prompt (chunks of different lengths), then one
  // eval_batch per decode step holding each sequence's next token. With `be` (and the model it
  // prepared), on that backend, each decode step's submissions in step_subs.
  static Run together(const ExpertSource* src, uint32_t N, const Model* model = nullptr, const Backend* be = nullptr,
                      std::vector<uint64_t>* step_subs = nullptr) {
    EngineOptions eo = options(src);
    eo.backend = be;
    Engine eng(model ? *model : m(), eo);
    const uint32_t V = c().vocab_size;
    Run r;
    r.logits.resize(N);
    r.trace.resize(N);
    for (uint32_t k = 0; k < N; ++k) r.state.push_back(eng.new_sequence());
    std::vector<std::vector<TokenId>> prompts;
    for (uint32_t k = 0; k < N; ++k) prompts.push_back(prompt(k));
    std::vector<Engine::BatchItem> items;
    size_t total = 0;
    for (uint32_t k = 0; k < N; ++k) {
      items.push_back({&r.state[k], prompts[k], {}, &r.trace[k]});
      total += prompts[k].size();
    }
    std::vector<float> lg(total * V);
    eng.eval_batch(items, lg.data());
    size_t row = 0;
    for (uint32_t k = 0; k < N; ++k) {
      r.logits[k].assign(lg.begin() + (ptrdiff_t)(row * V), lg.begin() + (ptrdiff_t)((row + prompts[k].size()) * V));
      row += prompts[k].size();
    }
    for (uint32_t g = 0; g < kSteps; ++g) {
      std::vector<TokenId> next(N);
      items.clear();
      for (uint32_t k = 0; k < N; ++k) {
        next[k] = argmax_lowest(std::span<const float>(r.logits[k].data() + r.logits[k].size() - V, V));
        items.push_back({&r.state[k], std::span<const TokenId>(&next[k], 1), {}, &r.trace[k]});
      }
      std::vector<float> rows((size_t)N * V);
      const uint64_t s0 = be ? gpu_stats(*be).submissions : 0;
      eng.eval_batch(items, rows.data());
      if (step_subs) step_subs->push_back(gpu_stats(*be).submissions - s0);
      for (uint32_t k = 0; k < N; ++k)
        r.logits[k].insert(r.logits[k].end(), rows.begin() + (ptrdiff_t)(k * V), rows.begin() + (ptrdiff_t)((k + 1) * V));
    }
    return r;
  }

  static void expect_same(const Run& want, const Run& got, uint32_t N) {
    ASSERT_EQ(got.logits.size(), N);
    for (uint32_t k = 0; k < N; ++k) {
      SCOPED_TRACE("sequence " + std::to_string(k));
      ASSERT_EQ(got.logits[k].size(), want.logits[k].size());
      const uint32_t V = c().vocab_size;
      for (size_t row = 0; row * V < want.logits[k].size(); ++row)
        ASSERT_EQ(std::memcmp(got.logits[k].data() + row * V, want.logits[k].data() + row * V, V * sizeof(float)), 0)
            << "logits row " << row << " differ";
      ASSERT_EQ(got.trace[k].size(), want.trace[k].size());
      for (size_t i = 0; i < want.trace[k].size(); ++i) {
        EXPECT_EQ(got.trace[k][i].experts, want.trace[k][i].experts) << "position " << i;
        EXPECT_EQ(got.trace[k][i].expert_weights, want.trace[k][i].expert_weights) << "position " << i;
        EXPECT_EQ(got.trace[k][i].selected_rows, want.trace[k][i].selected_rows) << "position " << i;
        EXPECT_EQ(got.trace[k][i].engram_rows, want.trace[k][i].engram_rows) << "position " << i;
      }
      EXPECT_TRUE(got.state[k] == want.state[k]) << "state differs";
    }
  }


  static fs::path dir_;
  static std::string path_;
  static Model* model_;
};

fs::path BatchDecode::dir_;
std::string BatchDecode::path_;
Model* BatchDecode::model_ = nullptr;

TEST_F(BatchDecode, EachSequenceEqualsItselfAloneWithResidentExperts) {
  const Run want = alone(nullptr, 7);
  for (const uint32_t N : {1u, 2u, 4u, 7u}) {
    SCOPED_TRACE("N " + std::to_string(N));
    Run w = want;
    w.logits.resize(N);
    w.trace.resize(N);
    w.state.resize(N);
    expect_same(w, together(nullptr, N), N);
  }
}

// On the Vulkan backend a batch gives each sequence its CPU logits, traces and state, and a decode
// step of N sequences costs the host-device round trips of one sequence's step: the sequences'
// attentions are one op on the device (Backend::sparse_attentions), so the rotation back and the
// output projection after them stay in the batch.
TEST_F(BatchDecode, OnTheVulkanBackendABatchStepCostsTheRoundTripsOfOneSequence) {
  if (!test::kVulkanBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(GpuOptions{});
  LoadOptions lo;
  lo.backend = gpu.get();
  const std::unique_ptr<Model> gm = load_model(path_, lo);
  const uint32_t N = 3;
  std::vector<uint64_t> one, all;
  (void)together(nullptr, 1, gm.get(), gpu.get(), &one);
  const Run got = together(nullptr, N, gm.get(), gpu.get(), &all);
  expect_same(alone(nullptr, N), got, N);
  ASSERT_EQ(all.size(), one.size());
  for (size_t g = 0; g < all.size(); ++g) EXPECT_EQ(all[g], one[g]) << "decode step " << g;
}

TEST_F(BatchDecode, EachSequenceEqualsItselfAloneThroughTheStore) {
  const uint32_t E = c().n_routed_experts, K = c().num_experts_per_tok, NL = c().num_hidden_layers;
  const uint64_t sb = expert_slot_bytes(m());
  int configs = 0;
  for (const uint32_t N : {1u, 2u, 4u, 7u}) {
    const Run want = alone(nullptr, N);
    for (const EvictionKind policy : {EvictionKind::LruPerLayer, EvictionKind::LruGlobal}) {
      // The smallest admissible cache (top_k experts per layer): a batch's union is larger and
      // streams through it in windows; and one that holds every expert.
      for (const uint32_t slots : {policy == EvictionKind::LruPerLayer ? K * NL : K, E * NL}) {
        SCOPED_TRACE("N " + std::to_string(N) + " policy " + std::string(storage::eviction_name(policy)) + " slots " +
                     std::to_string(slots));
        StoreOptions o;
        o.policy = policy;
        o.cache_bytes = UINT64_MAX;
        o.max_slots = slots;
        o.prefetch_budget_bytes = sb * K;
        std::unique_ptr<storage::ExpertStore> store = open_expert_store(m(), o);
        StreamedExperts src(*store);
        const Run got = together(&src, N);
        src.release();
        expect_same(want, got, N);
        if (slots < E * NL && N > 1) {
          EXPECT_GT(store->stats().total().evictions, 0u) << "the small cache never evicted";
        }
        ++configs;
      }
    }
  }
  EXPECT_EQ(configs, 16);
}

// One decode step of N sequences asks the store for each layer's union once: a layer's requests
// are the distinct experts of the step (at most N * top_k, and fewer when sequences share), not
// N separate top_k sets.
// Logits of some rows only (a decode row, a prompt's last row, a prompt piece with none): each
// row is bit for bit the row the whole pass gives, and states equal those of an All pass. Also
// for a single item, which goes through eval_masked's chunks.
TEST_F(BatchDecode, LastAndNoLogitRowsEqualTheRowsOfAWholePass) {
  Engine eng(m(), options(nullptr));
  const uint32_t V = c().vocab_size;
  using L = Engine::BatchItem::Logits;
  const std::vector<L> modes = {L::Last, L::None, L::All, L::Last, L::None};
  std::vector<SequenceState> a, b;
  std::vector<std::vector<TokenId>> prompts;
  for (uint32_t k = 0; k < modes.size(); ++k) {
    a.push_back(eng.new_sequence());
    b.push_back(eng.new_sequence());
    prompts.push_back(prompt(k));
  }
  std::vector<Engine::BatchItem> all, some;
  size_t total = 0;
  for (uint32_t k = 0; k < modes.size(); ++k) {
    all.push_back({&a[k], prompts[k]});
    some.push_back({&b[k], prompts[k]});
    some.back().logits = modes[k];
    total += prompts[k].size();
  }
  std::vector<float> full(total * V), part(total * V, -1.0f);
  eng.eval_batch(all, full.data());
  eng.eval_batch(some, part.data());
  size_t row = 0, out = 0;
  for (uint32_t k = 0; k < modes.size(); ++k) {
    SCOPED_TRACE("item " + std::to_string(k));
    const size_t n = prompts[k].size();
    std::vector<size_t> rows;
    if (modes[k] == L::All)
      for (size_t i = 0; i < n; ++i) rows.push_back(row + i);
    if (modes[k] == L::Last) rows.push_back(row + n - 1);
    for (const size_t r : rows) {
      ASSERT_EQ(std::memcmp(part.data() + out * V, full.data() + r * V, V * sizeof(float)), 0) << "row " << r;
      ++out;
    }
    row += n;
    EXPECT_TRUE(a[k] == b[k]);
  }
  EXPECT_EQ(part[out * V], -1.0f) << "rows written past the wanted ones";

  // One item of more than a chunk (chunk 64): only the final chunk's last row.
  EngineOptions small = options(nullptr);
  small.chunk = 4;
  Engine e4(m(), small);
  SequenceState s1 = e4.new_sequence(), s2 = e4.new_sequence();
  const std::vector<TokenId> p = prompt(5);  // 13 tokens: chunks 4, 4, 4, 1
  std::vector<float> every(p.size() * V), last(V);
  e4.eval(s1, p, every.data());
  Engine::BatchItem one{&s2, p};
  one.logits = L::Last;
  e4.eval_batch(std::span<const Engine::BatchItem>(&one, 1), last.data());
  EXPECT_EQ(std::memcmp(last.data(), every.data() + (p.size() - 1) * V, V * sizeof(float)), 0);
  EXPECT_TRUE(s1 == s2);
}

TEST_F(BatchDecode, AStepRequestsEachLayersUnionOnce) {
  const uint32_t N = 4, K = c().num_experts_per_tok, NL = c().num_hidden_layers, E = c().n_routed_experts;
  StoreOptions o;
  o.policy = EvictionKind::LruPerLayer;
  o.cache_bytes = UINT64_MAX;
  o.max_slots = E * NL;
  o.prefetch_budget_bytes = 0;
  std::unique_ptr<storage::ExpertStore> store = open_expert_store(m(), o);
  StreamedExperts src(*store);
  EngineOptions eo = options(&src);
  eo.prefetch = false;
  Engine eng(m(), eo);
  std::vector<SequenceState> st;
  std::vector<std::vector<TokenId>> prompts;
  for (uint32_t k = 0; k < N; ++k) {
    st.push_back(eng.new_sequence());
    prompts.push_back(prompt(k));
    eng.eval(st[k], prompts[k], nullptr);
  }
  const storage::StoreStats before = store->stats();
  std::vector<TokenId> next(N);
  std::vector<TokenTrace> tr[N];
  std::vector<Engine::BatchItem> items;
  for (uint32_t k = 0; k < N; ++k) {
    next[k] = prompts[k].back();
    items.push_back({&st[k], std::span<const TokenId>(&next[k], 1), {}, &tr[k]});
  }
  eng.eval_batch(items, nullptr);
  const storage::StoreStats after = store->stats();
  src.release();
  uint64_t shared_layers = 0;
  for (uint32_t L = 0; L < NL; ++L) {
    std::vector<bool> used(E, false);
    uint64_t u = 0;
    for (uint32_t k = 0; k < N; ++k)
      for (uint32_t e : tr[k].at(0).experts[L]) u += !used[e], used[e] = true;
    EXPECT_EQ(after.layers[L].requests - before.layers[L].requests, u) << "layer " << L;
    shared_layers += u < (uint64_t)N * K;
  }
  EXPECT_GT(shared_layers, 0u) << "no layer's sequences shared an expert; the test shows no sharing";
}

TEST_F(BatchDecode, ARefusedBatchChangesNoState) {
  Engine eng(m(), options(nullptr));
  SequenceState a = eng.new_sequence(), b = eng.new_sequence();
  eng.eval(a, prompt(0), nullptr);
  eng.eval(b, prompt(1), nullptr);
  const SequenceState a0 = a, b0 = b;
  const TokenId t = 5, bad = c().vocab_size;
  auto refused = [&](std::vector<Engine::BatchItem> items, const std::string& why) {
    try {
      eng.eval_batch(items, nullptr);
      ADD_FAILURE() << "accepted: " << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    EXPECT_TRUE(a == a0);
    EXPECT_TRUE(b == b0);
  };
  refused({{&a, std::span<const TokenId>(&t, 1)}, {&a, std::span<const TokenId>(&t, 1)}}, "share one sequence state");
  refused({{&a, std::span<const TokenId>(&t, 1)}, {&b, std::span<const TokenId>(&bad, 1)}}, "token id");
  refused({{&a, std::span<const TokenId>(&t, 1)}, {&b, {}}}, "has no tokens");
  const std::vector<TokenId> many(40, t);
  refused({{&a, many}, {&b, many}}, "exceeds the chunk");
  EngineOptions small = options(nullptr);
  small.ctx = 8;
  Engine e8(m(), small);
  SequenceState c8 = e8.new_sequence(), d8 = e8.new_sequence();
  e8.eval(c8, std::vector<TokenId>(6, t), nullptr);
  const SequenceState c80 = c8;
  try {
    e8.eval_batch(std::vector<Engine::BatchItem>{{&d8, std::span<const TokenId>(&t, 1)}, {&c8, std::vector<TokenId>(3, t)}}, nullptr);
    ADD_FAILURE() << "a batch past ctx was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context exceeded by batch item 1"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(c8 == c80);
  EXPECT_EQ(d8.position(), 0u);
}

// --parallel N through the Session: the plan holds N sequence states, the slots are batched in
// one pass with each slot's rows equal to evaluating it alone, and a chunk or a budget too small
// for N is refused with the figure named.
SessionOptions session_options(const std::string& path, uint32_t parallel) {
  SessionOptions so;
  so.model_path = path;
  so.ctx = 64;
  so.chunk = 16;
  so.threads = 2;
  so.budget = BudgetSpec{false, 2ull << 30};
  so.allow_swap = true;  // the test host's swap is not what is tested here
  so.parallel = parallel;
  return so;
}

TEST_F(BatchDecode, SessionSlotsBatchedEqualSlotsInTurn) {
  const uint32_t N = 3, V = c().vocab_size;
  Session batched(session_options(path_, N)), in_turn(session_options(path_, N));
  uint64_t state_line = 0;
  for (const PlanLine& l : batched.plan().mandatory)
    if (l.name == "sequence state") state_line = l.bytes;
  EXPECT_EQ(batched.plan().sequences, N);
  EXPECT_EQ(state_line, N * sequence_state_bytes(c(), batched.ctx()).total());
  std::vector<std::vector<TokenId>> prompts;
  for (uint32_t k = 0; k < N; ++k) prompts.push_back(prompt(k));
  std::vector<std::span<const TokenId>> lists(N);
  for (uint32_t k = 0; k < N; ++k) lists[k] = prompts[k];
  size_t total = 0;
  for (const auto& p : prompts) total += p.size();
  std::vector<float> got(total * V), want(total * V);
  batched.eval_slots(lists, got.data());
  size_t row = 0;
  for (uint32_t k = 0; k < N; ++k) {
    std::vector<std::span<const TokenId>> one(N);
    one[k] = prompts[k];
    in_turn.eval_slots(one, want.data() + row * V);
    row += prompts[k].size();
  }
  ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "prompt rows differ";
  for (uint32_t g = 0; g < 3; ++g) {
    std::vector<TokenId> next(N);
    for (uint32_t k = 0; k < N; ++k) next[k] = (TokenId)(7 * g + 3 * k + 2);
    for (uint32_t k = 0; k < N; ++k) lists[k] = std::span<const TokenId>(&next[k], 1);
    batched.eval_slots(lists, got.data());
    for (uint32_t k = 0; k < N; ++k) {
      std::vector<std::span<const TokenId>> one(N);
      one[k] = lists[k];
      in_turn.eval_slots(one, want.data() + (size_t)k * V);
    }
    ASSERT_EQ(std::memcmp(got.data(), want.data(), (size_t)N * V * sizeof(float)), 0) << "step " << g << " differs";
  }
  for (uint32_t k = 0; k < N; ++k) EXPECT_EQ(batched.slot_position(k), prompts[k].size() + 3);
  batched.reset_slot(2);
  EXPECT_EQ(batched.slot_position(2), 0u);
  EXPECT_THROW(batched.eval_slots(std::vector<std::span<const TokenId>>(N + 1), nullptr), Error);

}

// Slot 0 is the kept sequence: once a batch has moved it, a prompt extending what generate()
// kept is evaluated from position 0 and answered as a fresh session answers it.
TEST_F(BatchDecode, ABatchOnSlotZeroMakesGenerateStartOver) {
  Session s(session_options(path_, 2)), fresh(session_options(path_, 1));
  GenerateRequest req;
  req.prompt = prompt(5);
  req.max_tokens = 3;
  req.ignore_eos = true;
  const GenerateResult first = s.generate(req, {}, {});
  const TokenId t = 9;
  std::vector<std::span<const TokenId>> lists{std::span<const TokenId>(&t, 1), std::span<const TokenId>(&t, 1)};
  s.eval_slots(lists, nullptr);
  GenerateRequest next = req;
  next.prompt.insert(next.prompt.end(), first.tokens.begin(), first.tokens.end());
  next.prompt.push_back(4);
  const GenerateResult a = s.generate(next, {}, {}), b = fresh.generate(next, {}, {});
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.reused_tokens, 0u);
  EXPECT_EQ(a.prompt_evaluated, next.prompt.size());
}

TEST_F(BatchDecode, SessionRefusesAParallelThatDoesNotFit) {
  SessionOptions so = session_options(path_, 4);
  so.chunk = 2;
  try {
    Session s(so);
    ADD_FAILURE() << "a chunk of 2 was accepted for --parallel 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--parallel 4 needs a chunk of at least 4 rows; the plan has 2"), std::string::npos)
        << e.what();
  }
  // A budget that holds one sequence but not 64 of them at ctx 4096: refused, the plan names
  // the sequence state line with its count.
  SessionOptions one = session_options(path_, 1);
  one.ctx = 4096;
  one.checkpoint_budget = 0;
  const Session probe(one);
  const uint64_t planned = probe.plan().mandatory_bytes + probe.plan().bounce_bytes + probe.plan().cache_bytes;
  SessionOptions many = one;
  many.parallel = 64;
  many.chunk = 64;
  many.budget = BudgetSpec{false, planned + (2ull << 20)};
  try {
    Session s(many);
    ADD_FAILURE() << "64 sequences were admitted into a budget sized for one";
  } catch (const Error& e) {
    const std::string want = "sequence state " + format_bytes(64 * sequence_state_bytes(c(), 4096).total());
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what() << "\nwanted: " << want;
  }
}

}  // namespace
}  // namespace sluice
