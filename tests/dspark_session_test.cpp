// DSpark through the Session (issue 15 items 4-5): speculative decoding while one request runs
// is exactly plain decoding (greedy: token for token), with the drafter's own drafts and with
// forced ones. (Apart from dspark_test.cpp: synth/generate.h has a GenerateResult of its own.)
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "model/deepseek41/config.h"
#include "runtime/session.h"
#include "server/metrics.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

class DsparkSession : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("sluice-dspark-session-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    model_path_ = (dir_ / "tiny.gguf").string();
    support_path_ = (dir_ / "tiny-dspark.gguf").string();
    const std::string cmd = std::string(SLUICE_BINARY) + " make-model --preset tiny -o " + model_path_ +
                            " --dspark-out " + support_path_ + " --seed 3 > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static uint32_t vocab() { return tiny_config().vocab_size; }
  static inline fs::path dir_;
  static inline std::string model_path_, support_path_;
};

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

SessionOptions spec_options(const std::string& model, const std::string& support, bool streamed) {
  SessionOptions so;
  so.model_path = model;
  so.ctx = 96;
  so.chunk = 16;
  so.threads = 2;
  so.budget = BudgetSpec{false, 2ull << 30};
  so.allow_swap = true;
  so.stream_experts = streamed;
  if (streamed) so.max_cache_experts = 96;  // 12 of 16 per layer: verify passes (of 3 rows at most) read experts
  so.dspark_path = support;
  so.dspark_conf = 0.0f;  // random weights: the gate would stop every block
  so.dspark_guard = false;
  return so;
}

GenerateRequest greedy_request(uint32_t k, uint32_t vocab, uint32_t max_tokens) {
  GenerateRequest r;
  for (uint32_t i = 0; i < 4 + 7 * k; ++i) r.prompt.push_back((i * 7919u + 101u * k + 13u) % vocab);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

// spec 6.5 test (1): greedy speculation is token for token plain greedy decoding, resident and
// through a small expert cache, also for a second turn that extends the first (the kept state
// after speculation is the plain one).
TEST_F(DsparkSession, GreedySpeculationEqualsPlainDecoding) {
  for (const bool streamed : {false, true}) {
    SessionOptions plain_o = spec_options(model_path_, "", streamed);
    Session plain(plain_o), spec(spec_options(model_path_, support_path_, streamed));
    for (uint32_t k = 0; k < 2; ++k) {
      GenerateRequest r = greedy_request(k, vocab(), 24);
      const GenerateResult a = plain.generate(r, {}, {}), b = spec.generate(r, {}, {});
      EXPECT_EQ(a.tokens, b.tokens) << "streamed " << streamed << " prompt " << k;
      EXPECT_GT(b.spec_cycles, 0u);
      // The next turn extends this one: prompt + generated + 3 more tokens.
      r.prompt.insert(r.prompt.end(), a.tokens.begin(), a.tokens.end());
      for (TokenId t : {5u, 6u, 7u}) r.prompt.push_back(t);
      r.max_tokens = 8;
      const GenerateResult a2 = plain.generate(r, {}, {}), b2 = spec.generate(r, {}, {});
      EXPECT_EQ(a2.tokens, b2.tokens);
      EXPECT_EQ(b2.reused_tokens, a2.reused_tokens);  // the speculative state was kept like the plain one
    }
    const SessionStats st = spec.stats();
    EXPECT_TRUE(st.dspark);
    EXPECT_GT(st.spec_drafts, 0u);
  }
}

// Forced drafts (spec 6.5, [COLIBRI]): the target's own tokens are all accepted; with the last
// draft of each block corrupted, all but that one; the output is plain greedy decoding's.
TEST_F(DsparkSession, ForcedDraftsAreAcceptedExactlyAsFarAsTheyAgree) {
  const GenerateRequest r = greedy_request(1, vocab(), 40);
  Session plain(spec_options(model_path_, "", false));
  const GenerateResult ref = plain.generate(r, {}, {});
  const uint32_t P = (uint32_t)r.prompt.size(), V = vocab();
  for (const bool corrupt : {false, true}) {
    SessionOptions so = spec_options(model_path_, support_path_, false);
    so.draft_hook = [&](uint32_t pos, TokenId, std::vector<TokenId>& d) {
      // The anchor at pos is generated token pos - P; the drafts are the ones after it.
      for (size_t j = 0; j < d.size(); ++j) {
        const size_t g = pos - P + 1 + j;
        d[j] = g < ref.tokens.size() ? ref.tokens[g] : 0;
      }
      if (corrupt) d.back() = (d.back() + 1) % V;
    };
    Session spec(so);
    const GenerateResult b = spec.generate(r, {}, {});
    EXPECT_EQ(b.tokens, ref.tokens) << "corrupt " << corrupt;
    ASSERT_GT(b.spec_cycles, 0u);
    if (!corrupt) {
      EXPECT_EQ(b.drafts_accepted, b.drafts_proposed);
    } else {
      EXPECT_LT(b.drafts_accepted, b.drafts_proposed);
      EXPECT_GE(b.drafts_accepted + b.spec_cycles, b.drafts_proposed);  // only the corrupted last ones fail
    }
    // Every cycle emits its accepted drafts and one more: far fewer target passes than tokens.
    if (!corrupt) {
      EXPECT_LT(b.spec_cycles * 3, (uint32_t)ref.tokens.size());
    }
  }
}

}  // namespace
}  // namespace sluice

#include <cmath>
#include <map>
#include <span>

#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "runtime/speculative.h"

namespace sluice {
namespace {

// The 99.9% point of chi-square with df degrees of freedom (Wilson-Hilferty).
double chi2_999(double df) {
  const double z = 3.090, a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// spec 6.5 test (3): at temperature 1, top-p 0.95 (and top-k 6: the tiny model's random logits
// are flat, so the truncation keeps the test's bins few and well filled) the token the first speculative cycle emits
// (the second generated token) has the plain sampler's distribution: its exact marginal
// sum_t1 p(t1) p(t2 | t1), enumerated with an Engine, against the counts of seeded speculative
// runs (chi-square, rare tokens pooled). Drafts are forced to each anchor's most likely next
// token, so the cycles accept often and the accepted and the corrected paths both carry mass.
TEST_F(DsparkSession, SampledSpeculationHasThePlainDistribution) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "thousands of seeded runs: checked in the optimized build";
#endif
  const std::vector<TokenId> prompt = {11, 250, 3, 97, 480};
  SamplerOptions so;
  so.temp = 1.0f;
  so.top_p = 0.95f;
  so.top_k = 6;  // concentrated enough that the runs see every likely token many times
  // Exact: p(t1) after the prompt, p(t2 | t1) for every t1 it can draw.
  std::map<TokenId, double> expected;
  std::map<TokenId, TokenId> likeliest;  // t1 -> argmax of p(t2 | t1)
  {
    const std::unique_ptr<Model> m = load_model(model_path_);
    EngineOptions eo;
    eo.ctx = 16;
    eo.chunk = 8;
    eo.threads = 1;  // tiny ops: a pool would only add wake-ups
    Engine e(*m, eo);
    const uint32_t V = m->config.vocab_size;
    SequenceState s = e.new_sequence();
    std::vector<float> lg(prompt.size() * V), row(V);
    e.eval(s, prompt, lg.data());
    const SequenceCheckpoint ck = e.checkpoint(s);
    const std::vector<TokenProb> p1 = sampling_distribution(std::span<const float>(lg.data() + (prompt.size() - 1) * V, V), so);
    for (const TokenProb& a : p1) {
      e.rollback(s, ck);
      e.eval(s, std::span<const TokenId>(&a.id, 1), row.data());
      const std::vector<TokenProb> p2 = sampling_distribution(row, so);
      likeliest[a.id] = p2.front().id;
      for (const TokenProb& b : p2) expected[b.id] += a.p * b.p;
    }
  }
  SessionOptions o;
  o.model_path = model_path_;
  o.ctx = 16;
  o.chunk = 8;
  o.threads = 1;
  o.budget = BudgetSpec{false, 2ull << 30};
  o.allow_swap = true;
  o.stream_experts = false;
  o.dspark_path = support_path_;
  o.dspark_conf = 0.0f;
  o.dspark_guard = false;
  o.draft_max = 2;
  o.draft_hook = [&](uint32_t, TokenId anchor, std::vector<TokenId>& d) { d[0] = likeliest.at(anchor); };
  Session sess(o);
  const int N = 10000;
  std::map<TokenId, int> got;
  uint64_t cycles = 0, accepted = 0;
  for (int i = 0; i < N; ++i) {
    GenerateRequest r;
    r.prompt = prompt;
    r.max_tokens = 4;  // t1 plain, then one cycle of 2 drafts emits t2 (and more)
    r.ignore_eos = true;
    r.sampling = so;
    r.sampling.seed = 7000 + (uint64_t)i;
    const GenerateResult res = sess.generate(r, {}, {});
    ASSERT_GE(res.tokens.size(), 2u);
    got[res.tokens[1]]++;
    cycles += res.spec_cycles;
    accepted += res.drafts_accepted;
  }
  ASSERT_GE(cycles, (uint64_t)N);  // every run verified
  // Pool the tokens expected fewer than 5 times.
  double x2 = 0, pooled_e = 0, pooled_o = 0;
  int bins = 0;
  for (auto [id, p] : expected) {
    const double e = p * N, ob = got.count(id) ? got[id] : 0;
    if (e < 5) {
      pooled_e += e, pooled_o += ob;
      continue;
    }
    x2 += (ob - e) * (ob - e) / e;
    ++bins;
  }
  if (pooled_e > 0) x2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e, ++bins;
  for (auto [id, n] : got) EXPECT_TRUE(expected.count(id)) << "token " << id << " has probability 0";
  std::printf("[dspark] %d sampled runs: chi-square %.1f over %d bins (99.9%% point %.1f); drafts accepted %llu of %llu\n",
              N, x2, bins, chi2_999(bins - 1), (unsigned long long)accepted, (unsigned long long)cycles * 2);
  EXPECT_LT(x2, chi2_999(bins - 1));
  EXPECT_GT(accepted, (uint64_t)N / 20);  // the accepted path carries mass too
}

}  // namespace
}  // namespace sluice

#include "model/deepseek41/dspark_forward.h"

namespace sluice {
namespace {

// What a request's observer saw: every shown row (position, token, logits bits, routed experts)
// and every drafter block.
struct Seen {
  std::vector<uint32_t> pos;
  std::vector<TokenId> tokens;
  std::vector<float> logits;
  std::vector<std::vector<std::vector<uint32_t>>> experts;
  std::vector<DraftBlock> blocks;
  std::vector<std::pair<uint32_t, uint32_t>> verdicts;  // (verified, accepted) per block
};

EvalObserver observe(Seen& seen, uint32_t V) {
  EvalObserver obs;
  obs.want_trace = true;
  obs.on_eval = [&seen, V](uint32_t first, std::span<const TokenId> toks, const float* logits,
                           const std::vector<TokenTrace>* tr) {
    for (size_t i = 0; i < toks.size(); ++i) {
      seen.pos.push_back(first + (uint32_t)i);
      seen.tokens.push_back(toks[i]);
      seen.experts.push_back((*tr)[i].experts);
    }
    seen.logits.insert(seen.logits.end(), logits, logits + toks.size() * V);
  };
  obs.on_draft = [&seen](const DraftBlock& b, uint32_t verified, uint32_t accepted) {
    seen.blocks.push_back(b);
    seen.verdicts.emplace_back(verified, accepted);
  };
  return obs;
}

// issue 15 item 6: an observed request (run --dump-logits / --trace) is still decoded
// speculatively, and it is shown exactly the rows plain decoding shows (the kept rows of each
// verify pass, bit for bit, with their routing); each block it is shown says what the verify
// pass made of it.
TEST_F(DsparkSession, AnObservedRequestSeesThePlainRowsAndEveryBlock) {
  const uint32_t V = vocab();
  GenerateRequest r = greedy_request(2, V, 20);
  Seen plain_seen, spec_seen;
  const EvalObserver plain_obs = observe(plain_seen, V), spec_obs = observe(spec_seen, V);
  Session plain(spec_options(model_path_, "", false)), spec(spec_options(model_path_, support_path_, false));
  r.observer = &plain_obs;
  const GenerateResult a = plain.generate(r, {}, {});
  r.observer = &spec_obs;
  const GenerateResult b = spec.generate(r, {}, {});
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_GT(b.spec_cycles, 0u);
  EXPECT_EQ(spec_seen.pos, plain_seen.pos);
  EXPECT_EQ(spec_seen.tokens, plain_seen.tokens);
  EXPECT_EQ(spec_seen.experts, plain_seen.experts);
  ASSERT_EQ(spec_seen.logits.size(), plain_seen.logits.size());
  EXPECT_EQ(std::memcmp(spec_seen.logits.data(), plain_seen.logits.data(), plain_seen.logits.size() * sizeof(float)), 0);
  EXPECT_TRUE(plain_seen.blocks.empty());
  uint32_t cycles = 0, verified = 0, accepted = 0;
  for (size_t i = 0; i < spec_seen.blocks.size(); ++i) {
    const auto [k, acc] = spec_seen.verdicts[i];
    EXPECT_LE(acc, k);
    cycles += k > 0, verified += k, accepted += acc;
  }
  EXPECT_EQ(cycles, b.spec_cycles);
  EXPECT_EQ(verified, b.drafts_proposed);
  EXPECT_EQ(accepted, b.drafts_accepted);
}

// issue 15 item 6, the audit mode: decoding is plain greedy decoding, and a block is proposed
// after every committed position, prompt included, anchored on the sequence's own next token;
// each block equals, bit for bit, the one the speculative session proposes at the same position
// (rings committed one by one vs in chunks and verify passes), and its drafts are its rows' argmax.
TEST_F(DsparkSession, AuditModeDraftsAtEveryCommittedPosition) {
  const uint32_t V = vocab();
  GenerateRequest r = greedy_request(1, V, 12);
  Seen audit_seen, spec_seen;
  const EvalObserver audit_obs = observe(audit_seen, V), spec_obs = observe(spec_seen, V);
  SessionOptions ao = spec_options(model_path_, support_path_, false);
  ao.draft_audit = true;
  Session audit(ao), spec(spec_options(model_path_, support_path_, false)), plain(spec_options(model_path_, "", false));
  const GenerateResult ref = plain.generate(r, {}, {});
  r.observer = &audit_obs;
  const GenerateResult a = audit.generate(r, {}, {});
  r.observer = &spec_obs;
  const GenerateResult b = spec.generate(r, {}, {});
  EXPECT_EQ(a.tokens, ref.tokens);
  EXPECT_EQ(a.spec_cycles, 0u);
  std::vector<TokenId> seq = r.prompt;
  seq.insert(seq.end(), ref.tokens.begin(), ref.tokens.end());
  ASSERT_EQ(audit_seen.blocks.size(), seq.size() - 1);
  for (size_t c = 0; c < audit_seen.blocks.size(); ++c) {
    const DraftBlock& blk = audit_seen.blocks[c];
    ASSERT_EQ(blk.c, c);
    EXPECT_EQ(blk.anchor, seq[c + 1]) << c;
    EXPECT_EQ(audit_seen.verdicts[c], std::make_pair(0u, 0u));
    for (size_t j = 0; j < blk.drafts.size(); ++j) {
      const float* row = blk.logits.data() + j * V;
      EXPECT_EQ(blk.drafts[j], (TokenId)(std::max_element(row, row + V) - row)) << c << " " << j;
    }
  }
  ASSERT_FALSE(spec_seen.blocks.empty());
  for (const DraftBlock& sb : spec_seen.blocks) {
    ASSERT_LT(sb.c, audit_seen.blocks.size());
    const DraftBlock& ab = audit_seen.blocks[sb.c];
    EXPECT_EQ(sb.anchor, ab.anchor) << sb.c;
    EXPECT_EQ(sb.drafts, ab.drafts) << sb.c;
    EXPECT_EQ(sb.experts, ab.experts) << sb.c;
    EXPECT_EQ(std::memcmp(sb.logits.data(), ab.logits.data(), sb.logits.size() * sizeof(float)), 0) << sb.c;
    EXPECT_EQ(std::memcmp(sb.confidence.data(), ab.confidence.data(), sb.confidence.size() * sizeof(float)), 0) << sb.c;
  }
  EXPECT_EQ(b.tokens, ref.tokens);
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// issue 15 item 5: a verify pass is capped so that its rows' worst-case expert union is leased
// at once (the plan says how deep); a cache too small for two drafts means plain decoding.
TEST_F(DsparkSession, TheExpertCacheCapsTheVerifyDepth) {
  const GenerateRequest r = greedy_request(1, vocab(), 24);
  Session plain(spec_options(model_path_, "", true));
  const GenerateResult ref = plain.generate(r, {}, {});
  EXPECT_FALSE(plain.plan().dspark);
  // tiny: 8 layers, top-4 of 16 experts; lru-per-layer shares of 12, 16 and 5 experts.
  for (const auto& [slots, depth] : {std::pair{96u, 2u}, std::pair{128u, 5u}, std::pair{40u, 0u}}) {
    SessionOptions so = spec_options(model_path_, support_path_, true);
    so.max_cache_experts = slots;
    Session spec(so);
    EXPECT_EQ(spec.plan().dspark_verify_max, depth) << slots;
    const std::string text = format_plan(spec.plan());
    EXPECT_NE(text.find("a verify pass checks at most " + std::to_string(depth) + " drafts"), std::string::npos) << text;
    const GenerateResult b = spec.generate(r, {}, {});
    EXPECT_EQ(b.tokens, ref.tokens) << slots;
    EXPECT_LE(b.drafts_proposed, depth * b.spec_cycles) << slots;
    if (depth >= 2) {
      EXPECT_GT(b.spec_cycles, 0u) << slots;
      EXPECT_GT(b.drafts_proposed, (depth - 1) * b.spec_cycles) << slots;  // the cap, not less, was used
    } else {
      EXPECT_EQ(b.spec_cycles, 0u) << slots;
    }
  }
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// issue 15 item 2: with --dspark-experts stream the drafter's routed experts are read from the
// support file through a store of their own in the same budget; speculation is still plain
// greedy decoding token for token. By default (a roomy budget) they are resident.
TEST_F(DsparkSession, StreamedDrafterExpertsKeepSpeculationExact) {
  const GenerateRequest r = greedy_request(2, vocab(), 20);
  Session plain(spec_options(model_path_, "", true));
  const GenerateResult ref = plain.generate(r, {}, {});
  for (const DsparkExperts mode : {DsparkExperts::Auto, DsparkExperts::Streamed}) {
    SessionOptions so = spec_options(model_path_, support_path_, true);
    so.dspark_experts = mode;
    Session spec(so);
    const bool streamed = mode == DsparkExperts::Streamed;
    EXPECT_EQ(spec.plan().dspark_streamed, streamed);
    const std::string text = format_plan(spec.plan());
    EXPECT_NE(text.find(streamed ? "the drafter's routed experts are streamed" : "the drafter's routed experts are resident"),
              std::string::npos) << text;
    const GenerateResult b = spec.generate(r, {}, {});
    EXPECT_EQ(b.tokens, ref.tokens) << streamed;
    EXPECT_GT(b.spec_cycles, 0u);
    const SessionStats st = spec.stats();
    if (streamed) {
      EXPECT_EQ(st.dspark_store.slots, spec.plan().dspark_cache_slots);
      EXPECT_GT(st.dspark_store.total().requests, 0u);
      EXPECT_GT(st.dspark_store.total().bytes_demand, 0u);
    } else {
      EXPECT_EQ(st.dspark_store.slots, 0u);
    }
    // /metrics shows the drafter store's figures (zero when its experts are resident).
    server::MetricsInput in;
    in.loaded = true;
    in.session = st;
    const std::string metrics = server::render_metrics(in);
    const uint64_t read = st.dspark_store.total().bytes_demand + st.dspark_store.total().bytes_prefetch;
    EXPECT_NE(metrics.find("\nsluice_dspark_expert_slots " + std::to_string(st.dspark_store.slots) + "\n"), std::string::npos)
        << metrics;
    EXPECT_NE(metrics.find("\nsluice_dspark_expert_read_bytes_total " + std::to_string(read) + "\n"), std::string::npos)
        << metrics;
  }
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// A state restored from the prefix cache brings the drafter's rings with it (as a checkpoint
// rollback does), so drafting resumes at once: in audit mode the blocks after the restored
// prefix are, bit for bit, those of a session that evaluated the whole prompt itself. Without
// the rings the restored slot would wait a window of new positions and report none.
TEST_F(DsparkSession, APrefixCacheHitRestoresTheDrafterRings) {
  const uint32_t V = vocab();
  GenerateRequest first = greedy_request(2, V, 3), other = greedy_request(0, V, 2);
  GenerateRequest again = first;
  for (TokenId t : {9u, 10u, 11u}) again.prompt.push_back(t);
  again.max_tokens = 4;
  SessionOptions o = spec_options(model_path_, support_path_, false);
  o.draft_audit = true;
  SessionOptions cached = o;
  cached.cache_ram = 64ull << 20;
  cached.checkpoint_budget = 0;  // the slot's own checkpoints would serve the prompt instead
  Session warm(cached), fresh(o);
  warm.generate(first, {}, {});
  warm.generate(other, {}, {});  // the slot now holds another sequence: `again` comes from the cache
  Seen warm_seen, fresh_seen;
  const EvalObserver warm_obs = observe(warm_seen, V), fresh_obs = observe(fresh_seen, V);
  again.observer = &warm_obs;
  const GenerateResult a = warm.generate(again, {}, {});
  again.observer = &fresh_obs;
  const GenerateResult b = fresh.generate(again, {}, {});
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.reused_tokens, first.prompt.size());  // the prefix cache's entry at first's prompt end
  EXPECT_EQ(warm.stats().prefix_hits, 1u);
  // warm reports the blocks after each position it commits itself (the first after the
  // restored ones); fresh all of them.
  ASSERT_FALSE(warm_seen.blocks.empty());
  ASSERT_EQ(fresh_seen.blocks.size(), again.prompt.size() + a.tokens.size() - 1);
  for (const DraftBlock& wb : warm_seen.blocks) {
    ASSERT_GE(wb.c, a.reused_tokens);
    const DraftBlock& fb = fresh_seen.blocks[wb.c];
    ASSERT_EQ(fb.c, wb.c);
    EXPECT_EQ(wb.anchor, fb.anchor) << wb.c;
    EXPECT_EQ(wb.drafts, fb.drafts) << wb.c;
    EXPECT_EQ(std::memcmp(wb.logits.data(), fb.logits.data(), wb.logits.size() * sizeof(float)), 0) << wb.c;
  }
  EXPECT_EQ(warm_seen.blocks.size(), fresh_seen.blocks.size() - a.reused_tokens);
}

}  // namespace
}  // namespace sluice
