// Determinism of the forward pass (src/model/deepseek41/forward.h), bit for bit: whole-prompt prefill ==
// chunks of 1, 3 and 16 tokens == token-by-token decode; 1 vs 2 threads; two runs;
// snapshot/restore; an injected failure leaves the state unchanged and a retry gives the same
// logits. Run on the tiny preset and on configs/tiny-alt.json with a prompt long enough that the
// compressed rows exceed index_topk and candidate blocks are dropped.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "kernels/cpu.h"
#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "model/deepseek41/primitives.h"
#include "util/error.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;


struct Loaded {
  std::string path;
  std::unique_ptr<Model> model;
};

// Generated once per process: `sluice make-model` for each config.
const Loaded& loaded(const std::string& which) {
  static std::map<std::string, Loaded> cache;
  auto it = cache.find(which);
  if (it != cache.end()) return it->second;
  static const fs::path dir = [] {
    const fs::path d = fs::temp_directory_path() / ("sluice-forward-test-" + std::to_string(::getpid()));
    fs::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(fs::temp_directory_path() / ("sluice-forward-test-" + std::to_string(::getpid())), ec);
    });
    return d;
  }();
  const std::string out = (dir / (which + ".gguf")).string();
  std::string cmd = std::string(SLUICE_BINARY) + " make-model ";
  if (which == "tiny") cmd += "--preset tiny";
  else cmd += "--config " + std::string(SLUICE_TEST_DATA) + "/../../configs/" + which + ".json";
  cmd += " -o " + out + " > /dev/null";
  if (std::system(cmd.c_str()) != 0) throw Error("make-model failed: " + cmd);
  Loaded l;
  l.path = out;
  l.model = load_model(out);
  return cache.emplace(which, std::move(l)).first->second;
}

std::vector<uint32_t> prompt(const ModelConfig& c, uint32_t n, uint64_t seed = 7) {
  std::vector<uint32_t> t(n);
  uint64_t x = seed;
  for (uint32_t i = 0; i < n; ++i) {
    x = splitmix64(x);
    t[i] = (uint32_t)(x % c.vocab_size);
  }
  // Some repeats so Engram rows are shared inside a chunk (the reader deduplicates them).
  for (uint32_t i = 40; i < n && i < 60; ++i) t[i] = t[i - 20];
  return t;
}

struct EvalRun {
  std::vector<float> logits;
  std::vector<TokenTrace> trace;
  SequenceState state;
};

// t[0, head) in one eval() call, then the rest one token per call.
EvalRun run_head_then_decode(const Model& m, const EngineOptions& o, const std::vector<uint32_t>& t, uint32_t head) {
  const uint32_t V = model_config(m).vocab_size;
  Engine e(m, o);
  EvalRun r;
  r.state = e.new_sequence();
  r.logits.resize(t.size() * V);
  e.eval(r.state, std::span<const uint32_t>(t.data(), head), r.logits.data(), &r.trace);
  for (size_t p = head; p < t.size(); ++p)
    e.eval(r.state, std::span<const uint32_t>(t.data() + p, 1), r.logits.data() + p * V, &r.trace);
  return r;
}

EvalRun run_chunked(const Model& m, EngineOptions o, const std::vector<uint32_t>& toks, uint32_t call_size) {
  Engine e(m, o);
  EvalRun r;
  r.state = e.new_sequence();
  const uint32_t V = model_config(m).vocab_size;
  r.logits.resize(toks.size() * (size_t)V);
  for (size_t off = 0; off < toks.size(); off += call_size) {
    const size_t n = std::min<size_t>(call_size, toks.size() - off);
    e.eval(r.state, std::span<const uint32_t>(toks.data() + off, n), r.logits.data() + off * V, &r.trace);
  }
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool same_trace(const std::vector<TokenTrace>& a, const std::vector<TokenTrace>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].engram_rows != b[i].engram_rows || a[i].experts != b[i].experts ||
        a[i].selected_rows != b[i].selected_rows)
      return false;
    for (size_t l = 0; l < a[i].expert_weights.size(); ++l)
      if (!same_bits(a[i].expert_weights[l], b[i].expert_weights[l])) return false;
  }
  return true;
}

class ForwardConsistencyModel : public ::testing::TestWithParam<std::string> {
 protected:
  const Model& model() { return *loaded(GetParam()).model; }
  const ModelConfig& cfg() { return model_config(model()); }
  // Long enough that every index-source layer sees more compressed rows than index_topk and
  // the candidate pool drops blocks (checked by PromptReachesSparseRegime). The suite's cost
  // is the kernels': tiny-alt is ~3x slower per token and needs fewer tokens for the regime.
  uint32_t prompt_len() { return GetParam() == "tiny" ? 200 : 80; }
  std::vector<uint32_t> toks() { return prompt(cfg(), prompt_len()); }
  EngineOptions opts(uint32_t chunk = 1024, int threads = 1) {
    EngineOptions o;
    o.ctx = 512;
    o.chunk = chunk;
    o.threads = threads;
    return o;
  }
  // Whole-prompt prefill in one chunk, one thread: the reference every other run must equal.
  const EvalRun& reference() {
    static std::map<std::string, EvalRun> cache;
    auto it = cache.find(GetParam());
    if (it == cache.end())
      it = cache.emplace(GetParam(), run_chunked(model(), opts(1024), toks(), prompt_len())).first;
    return it->second;
  }
};

// The prompt exercises what the tests claim: more compressed rows than index_topk on every
// index-source layer, and candidate consumers restricted to fewer blocks than are visible.
TEST_P(ForwardConsistencyModel, PromptReachesSparseRegime) {
  const ModelConfig& c = cfg();
  const std::vector<LayerRole> roles = layer_roles(c);
  const uint32_t len = prompt_len();
  const EvalRun& r = reference();
  ASSERT_EQ(r.trace.size(), len);
  const TokenTrace& last = r.trace.back();
  bool saw_consumer = false;
  for (uint32_t L = 0; L < c.num_hidden_layers; ++L) {
    if (!roles[L].is_index_source) {
      EXPECT_TRUE(last.selected_rows[L].empty()) << L;
      continue;
    }
    const uint32_t ratio = roles[(size_t)roles[L].kv_source].ratio;
    const uint32_t n_vis = len / ratio;
    ASSERT_GT(n_vis, c.index_topk) << "layer " << L;
    if (!roles[L].is_candidate_consumer) {
      EXPECT_EQ(last.selected_rows[L].size(), c.index_topk) << "layer " << L;
      continue;
    }
    saw_consumer = true;
    const uint32_t n_blocks = (n_vis + c.candidate_block_size - 1) / c.candidate_block_size;
    ASSERT_GT(n_blocks, c.candidate_topk_blocks) << "layer " << L;
    std::set<uint32_t> blocks;
    for (int32_t g : last.selected_rows[L]) blocks.insert((uint32_t)g / c.candidate_block_size);
    EXPECT_LE(blocks.size(), c.candidate_topk_blocks) << "layer " << L;
    EXPECT_GT(last.selected_rows[L].size(), 0u);
    // The newest visible row's block is always in the pool.
    EXPECT_TRUE(blocks.count((n_vis - 1) / c.candidate_block_size)) << "layer " << L;
  }
  EXPECT_TRUE(saw_consumer);
  for (float v : r.logits) ASSERT_TRUE(std::isfinite(v));
  // Experts per layer: num_experts_per_tok distinct ids.
  for (const auto& e : last.experts) {
    EXPECT_EQ(e.size(), c.num_experts_per_tok);
    EXPECT_EQ(std::set<uint32_t>(e.begin(), e.end()).size(), e.size());
  }
}

TEST_P(ForwardConsistencyModel, PrefillEqualsChunksAndDecode) {
  const auto t = toks();
  const EvalRun& whole = reference();
  // {chunk size, tokens per eval() call}: single calls, uneven calls, token-by-token decode.
  const std::pair<uint32_t, uint32_t> cases[] = {{1, 1024}, {3, 37}, {16, 1024}, {64, 1}};
  for (const auto& [chunk, call] : cases) {
    const EvalRun r = run_chunked(model(), opts(chunk), t, call);
    EXPECT_TRUE(same_bits(whole.logits, r.logits)) << "chunk " << chunk << " call " << call;
    EXPECT_TRUE(same_trace(whole.trace, r.trace)) << "chunk " << chunk << " call " << call;
    EXPECT_TRUE(whole.state == r.state) << "chunk " << chunk << " call " << call;
  }
}

// Far into the sequence: past original_max_position_embeddings (YaRN-scaled frequencies at
// angles beyond the original context on the compressed layers, plain RoPE on the window-only
// ones) and with far more compressed rows than the candidate pool holds, a prefill in chunks
// equals decoding token by token, bit for bit, and leaves the same state.
TEST(ForwardConsistencyLong, ChunksEqualDecodePastOriginalContextAndCandidatePool) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "long context: checked in the optimized build";
#endif
  const Model& m = *loaded("tiny").model;
  const ModelConfig& c = model_config(m);
  const uint32_t len = 720, head = 400;  // positions 400 .. 719 compared
  ASSERT_LT(c.rope_scaling.original_max_position_embeddings, head);
  ASSERT_LT(c.candidate_topk_blocks * c.candidate_block_size * 16, head);
  const std::vector<uint32_t> t = prompt(c, len, 11);
  EngineOptions o;
  o.ctx = 1024;
  o.threads = 2;
  o.chunk = 128;
  const EvalRun whole = run_chunked(m, o, t, len);  // one call of 6 chunks
  // The same head, then the rest one token per call; and uneven chunks and calls.
  const EvalRun mixed = run_head_then_decode(m, o, t, head);
  o.chunk = 37;
  const EvalRun uneven = run_chunked(m, o, t, 101);
  for (const EvalRun* r : {(const EvalRun*)&mixed, &uneven}) {
    const char* what = r == &mixed ? "decode" : "chunk 37 call 101";
    EXPECT_TRUE(same_bits(whole.logits, r->logits)) << what;
    EXPECT_TRUE(same_trace(whole.trace, r->trace)) << what;
    EXPECT_TRUE(whole.state == r->state) << what;
  }
  // What the positions exercise: at the end every index layer selects index_topk rows out of
  // many more, and the candidate consumers stay within the pool's blocks.
  const std::vector<LayerRole> roles = layer_roles(c);
  for (uint32_t L = 0; L < c.num_hidden_layers; ++L) {
    if (!roles[L].is_index_source) continue;
    EXPECT_EQ(whole.trace.back().selected_rows[L].size(), c.index_topk) << "layer " << L;
    if (roles[L].is_candidate_consumer) {
      std::set<uint32_t> blocks;
      for (int32_t g : whole.trace.back().selected_rows[L]) blocks.insert((uint32_t)g / c.candidate_block_size);
      EXPECT_LE(blocks.size(), c.candidate_topk_blocks) << "layer " << L;
    }
  }
}

// A 2,048-token chunk (the GEMMs at their widest: every expert sees dozens of tokens, several
// token groups per kernel call) equals 128-token chunks and token-by-token decode of the tail.
TEST(ForwardConsistencyLong, ChunkOf2048EqualsSmallChunksAndDecode) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "long context: checked in the optimized build";
#endif
  const Model& m = *loaded("tiny").model;
  const ModelConfig& c = model_config(m);
  const uint32_t len = 2100, head = 2080;
  const std::vector<uint32_t> t = prompt(c, len, 23);
  EngineOptions o;
  o.ctx = 2304;
  o.threads = 2;
  o.chunk = 2048;
  const EvalRun wide = run_chunked(m, o, t, len);
  o.chunk = 128;
  const EvalRun mixed = run_head_then_decode(m, o, t, head);
  EXPECT_TRUE(same_bits(wide.logits, mixed.logits));
  EXPECT_TRUE(same_trace(wide.trace, mixed.trace));
  EXPECT_TRUE(wide.state == mixed.state);
}

TEST_P(ForwardConsistencyModel, ThreadsAndRunsAgree) {
  const auto t = toks();
  const EvalRun& one = reference();
  const EvalRun two = run_chunked(model(), opts(16, 2), t, 1024);
  const EvalRun again = run_chunked(model(), opts(1024, 1), t, 1024);  // a second engine, same model
  EXPECT_TRUE(same_bits(one.logits, two.logits));
  EXPECT_TRUE(same_trace(one.trace, two.trace));
  EXPECT_TRUE(one.state == two.state);
  EXPECT_TRUE(same_bits(one.logits, again.logits));
  EXPECT_TRUE(one.state == again.state);
  const EvalRun two_decode = run_chunked(model(), opts(16, 2), std::vector<uint32_t>(t.begin(), t.begin() + 20), 1);
  EXPECT_EQ(0, std::memcmp(one.logits.data(), two_decode.logits.data(), two_decode.logits.size() * sizeof(float)));
}

// The integer indexer (VNNI, kernels/index_scores.h) and the float path give the same model:
// an engine built under a lower ISA runs the backend's own cache kernels (FP4 unpack, BF16 dots,
// indexer) at that ISA: AVX2 and scalar have no integer indexer. (The weights' kernels were
// chosen when the model loaded; they have their own SIMD-equals-scalar tests.)
TEST_P(ForwardConsistencyModel, IntegerAndFloatIndexerAgree) {
  const auto t = toks();
  const EvalRun& best = reference();
  const Isa was = active_isa();
  for (Isa isa : {Isa::Avx2, Isa::Scalar}) {
    if (isa >= detect_isa()) continue;
    set_active_isa(isa);
    const EvalRun r = run_chunked(model(), opts(16, 2), t, 1024);
    set_active_isa(was);
    EXPECT_TRUE(same_bits(best.logits, r.logits)) << isa_name(isa);
    EXPECT_TRUE(same_trace(best.trace, r.trace)) << isa_name(isa);
    EXPECT_TRUE(best.state == r.state) << isa_name(isa);
  }
}

TEST_P(ForwardConsistencyModel, SnapshotRestoreContinuesIdentically) {
  const ModelConfig& c = cfg();
  const auto toks = this->toks();
  const EvalRun& whole = reference();
  Engine e(model(), opts(16));
  SequenceState s = e.new_sequence();
  const uint32_t cut = prompt_len() / 2 + 1;  // odd: the ratio-2 carry holds a token
  e.eval(s, std::span<const uint32_t>(toks.data(), cut), nullptr);
  const SequenceState snap = s;  // copy == snapshot
  EXPECT_EQ(sequence_position(snap), cut);
  const std::span<const uint32_t> rest(toks.data() + cut, toks.size() - cut);
  std::vector<float> a(rest.size() * (size_t)c.vocab_size), b(a.size());
  e.eval(s, rest, a.data());
  // Diverge, then restore the snapshot and continue.
  std::vector<uint32_t> other(10, 5);
  SequenceState t = snap;
  e.eval(t, other, nullptr);
  t = snap;
  e.eval(t, rest, b.data());
  EXPECT_TRUE(same_bits(a, b));
  EXPECT_TRUE(s == t);
  const std::vector<float> tail(whole.logits.begin() + (size_t)cut * c.vocab_size, whole.logits.end());
  EXPECT_TRUE(same_bits(a, tail));
  // Reset in place equals a new sequence and reproduces the start.
  SequenceState fresh = s;
  e.reset(fresh);
  EXPECT_TRUE(fresh == e.new_sequence());
  std::vector<float> first(c.vocab_size);
  e.eval(fresh, std::span<const uint32_t>(toks.data(), 1), first.data());
  EXPECT_EQ(0, std::memcmp(first.data(), whole.logits.data(), first.size() * sizeof(float)));
}

TEST_P(ForwardConsistencyModel, InjectedFailureLeavesStateUnchanged) {
  const ModelConfig& c = cfg();
  const auto toks = this->toks();
  const EvalRun& whole = reference();
  // start 5 lies inside the first window (ring rows past it are empty), 37 past it; the failing
  // call's later chunks have committed the earlier ones, which the rollback point undoes.
  for (uint32_t start : {5u, 37u})
  for (uint32_t fail_chunk : {0u, 2u}) {
    const std::span<const uint32_t> next(toks.data() + start, 40);
    Engine good(model(), opts(16));
    SequenceState s = good.new_sequence();
    good.eval(s, std::span<const uint32_t>(toks.data(), start), nullptr);
    const SequenceState before = s;
    EngineOptions bad_opts = opts(16);
    bad_opts.fail_at_layer = (int)c.num_hidden_layers / 2;
    bad_opts.fail_at_chunk = fail_chunk;
    Engine bad(model(), bad_opts);
    std::vector<float> junk(next.size() * (size_t)c.vocab_size);
    std::vector<TokenTrace> tr;
    EXPECT_THROW(bad.eval(s, next, junk.data(), &tr), Error);
    EXPECT_TRUE(s == before) << "start " << start << " fail_chunk " << fail_chunk;
    EXPECT_EQ(sequence_position(s), start);
    EXPECT_EQ(s.engram_tail, before.engram_tail);
    EXPECT_TRUE(tr.empty());
    // Retry (with the failing engine's options but no hook) gives the reference logits.
    std::vector<float> got(next.size() * (size_t)c.vocab_size);
    good.eval(s, next, got.data());
    const std::vector<float> ref(whole.logits.begin() + (size_t)start * c.vocab_size,
                                 whole.logits.begin() + (size_t)(start + next.size()) * c.vocab_size);
    EXPECT_TRUE(same_bits(got, ref)) << "start " << start << " fail_chunk " << fail_chunk;
  }
}

TEST_P(ForwardConsistencyModel, ContextAndTokenErrors) {
  const ModelConfig& c = cfg();
  EngineOptions o = opts(8);
  o.ctx = 20;
  Engine e(model(), o);
  SequenceState s = e.new_sequence();
  const auto toks = prompt(c, 30);
  e.eval(s, std::span<const uint32_t>(toks.data(), 15), nullptr);
  const SequenceState before = s;
  EXPECT_THROW(e.eval(s, std::span<const uint32_t>(toks.data(), 6), nullptr), Error);
  EXPECT_TRUE(s == before);
  std::vector<uint32_t> bad = {1, c.vocab_size};
  EXPECT_THROW(e.eval(s, bad, nullptr), Error);
  EXPECT_TRUE(s == before);
  e.eval(s, std::span<const uint32_t>(toks.data(), 5), nullptr);  // exactly fills ctx
  EXPECT_EQ(sequence_position(s), 20u);
  // The state's own ctx bounds it, whatever engine evaluates it.
  Engine other(model(), opts(8));
  EXPECT_THROW(other.eval(s, std::span<const uint32_t>(toks.data(), 1), nullptr), Error);
}

// Engram ids follow the token history with the metadata primes/multipliers (spec 4.3), and a
// masked position is DEAD: its own ids are all pad and it blocks the lookback of later tokens.
TEST_P(ForwardConsistencyModel, EngramRowsFollowHistory) {
  const ModelConfig& c = cfg();
  const auto toks = prompt(c, 12, 9);
  std::vector<uint8_t> mask(toks.size(), 0);
  mask[5] = 1;
  Engine e(model(), opts(4));
  SequenceState s = e.new_sequence();
  std::vector<TokenTrace> tr;
  e.eval_masked(s, toks, mask, nullptr, &tr);
  ASSERT_EQ(tr.size(), toks.size());
  const uint32_t N = c.engram_max_ngram_size, cols = c.engram_columns();
  const int64_t pad = c.engram_pad_compressed();
  std::vector<int64_t> hist;  // compressed ids, oldest first
  for (size_t i = 0; i < toks.size(); ++i) {
    const int64_t cur = mask[i] ? kEngramDead : (int64_t)c.engram_token_map[toks[i]];
    std::vector<int64_t> ids = {cur};
    for (uint32_t j = 1; j < N; ++j) ids.push_back(hist.size() >= j ? hist[hist.size() - j] : kEngramDead);
    for (size_t ei = 0; ei < c.engram_layer_ids.size(); ++ei) {
      const auto want = engram_hash(ids, pad, std::span(c.engram_primes.data() + ei * cols, cols),
                                    std::span(c.engram_multipliers.data() + ei * N, N), c.engram_n_heads);
      EXPECT_EQ(tr[i].engram_rows[ei], want) << "token " << i << " engram layer " << ei;
    }
    hist.push_back(cur);
  }
  // The masked token's rows are the all-pad rows; the next token's lookback stops at it.
  const std::vector<int64_t> all_pad(N, pad);
  EXPECT_EQ(tr[5].engram_rows[0], engram_hash(all_pad, pad, std::span(c.engram_primes.data(), cols),
                                              std::span(c.engram_multipliers.data(), N), c.engram_n_heads));
  // Masking changes the result (gate 0 and the image routing bias), unmasked equals eval().
  SequenceState s2 = e.new_sequence(), s3 = e.new_sequence();
  std::vector<float> a(toks.size() * (size_t)c.vocab_size), b(a.size());
  e.eval(s2, toks, a.data());
  e.eval_masked(s3, toks, std::vector<uint8_t>(toks.size(), 0), b.data());
  EXPECT_TRUE(same_bits(a, b));
  std::vector<float> m(a.size());
  SequenceState s4 = e.new_sequence();
  e.eval_masked(s4, toks, mask, m.data());
  EXPECT_EQ(0, std::memcmp(a.data(), m.data(), 5 * (size_t)c.vocab_size * sizeof(float)));
  EXPECT_NE(0, std::memcmp(a.data() + 5 * (size_t)c.vocab_size, m.data() + 5 * (size_t)c.vocab_size,
                           (size_t)c.vocab_size * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(ForwardConsistency, ForwardConsistencyModel, ::testing::Values("tiny", "tiny-alt"),
                         [](const auto& info) { return info.param == "tiny" ? std::string("tiny") : std::string("tiny_alt"); });

}  // namespace
}  // namespace sluice
