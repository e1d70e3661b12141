// The Session's prefix checkpoints (issue 16 item 7): a prompt that shares only a prefix with
// the kept sequence restarts from the newest checkpoint at or before the divergence, reports
// that position as reused, and gives exactly the logits and tokens of a fresh session (here one
// with resident experts, the checkpointed one streams them); checkpoints stay within their
// byte budget; the plan accounts for them. CheckpointSet's dropping rule is checked alone.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "model/deepseek41/forward.h"
#include "model/deepseek41/primitives.h"
#include "runtime/admission.h"
#include "runtime/checkpoint_set.h"
#include "runtime/session.h"
#include "util/error.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

class SessionCheckpoints : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("sluice-session-checkpoint-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    path_ = (dir_ / "tiny.gguf").string();
    const std::string cmd = std::string(SLUICE_BINARY) + " make-model --preset tiny -o " + path_ + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static SessionOptions opts(bool stream = true) {
    SessionOptions so;
    so.model_path = path_;
    so.ctx = 256;
    so.chunk = 8;
    so.threads = 2;
    so.stream_experts = stream;
    so.budget = BudgetSpec{false, 2ull << 30};
    so.allow_swap = true;  // the test host's swap is not what is tested here
    so.checkpoint_interval = 16;
    return so;
  }
  static std::vector<uint32_t> tokens(uint32_t n, uint64_t seed) {
    std::vector<uint32_t> t(n);
    uint64_t x = seed;
    for (uint32_t i = 0; i < n; ++i) {
      x = splitmix64(x);
      t[i] = 3 + (uint32_t)(x % 500);  // never eos (1): generation runs to max_tokens
    }
    return t;
  }
  static fs::path dir_;
  static std::string path_;
};

fs::path SessionCheckpoints::dir_;
std::string SessionCheckpoints::path_;

// Every row of logits an eval produced, by position.
struct Rows {
  std::map<uint32_t, std::vector<float>> by_pos;
  EvalObserver observer(uint32_t V) {
    EvalObserver o;
    o.on_eval = [this, V](uint32_t first, std::span<const uint32_t> toks, const float* logits,
                          const std::vector<TokenTrace>*) {
      for (size_t i = 0; i < toks.size(); ++i)
        by_pos[first + (uint32_t)i].assign(logits + i * V, logits + (i + 1) * V);
    };
    return o;
  }
};

GenerateRequest request(std::vector<uint32_t> prompt, uint32_t max_tokens) {
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

TEST_F(SessionCheckpoints, DivergingPromptRestartsFromTheLastCheckpointBeforeIt) {
  Session s(opts());
  const uint32_t V = s.config().vocab_size;
  const std::vector<uint32_t> a = tokens(60, 1);
  const GenerateResult ra = s.generate(request(a, 4), {}, {});
  EXPECT_EQ(ra.reused_tokens, 0u);
  // Checkpoints at 16, 32, 48 (chunks of 8 pass them) and at the prompt's end, 59 and 60.
  EXPECT_EQ(s.stats().checkpoints, 5u);

  // b shares a's first 37 tokens: the newest checkpoint at or before 37 is 32.
  std::vector<uint32_t> b = tokens(70, 2);
  std::copy(a.begin(), a.begin() + 37, b.begin());
  ASSERT_NE(b[37], a[37]);
  Rows got;
  const EvalObserver obs = got.observer(V);
  GenerateRequest rb = request(b, 6);
  rb.observer = &obs;
  const GenerateResult gb = s.generate(rb, {}, {});
  EXPECT_EQ(gb.reused_tokens, 32u);
  EXPECT_EQ(s.stats().checkpoint_rollbacks, 1u);
  EXPECT_EQ(got.by_pos.begin()->first, 32u) << "evaluation restarted at the checkpoint";

  Session fresh(opts(/*stream=*/false));
  Rows want;
  const EvalObserver wobs = want.observer(V);
  GenerateRequest fb = request(b, 6);
  fb.observer = &wobs;
  const GenerateResult wb = fresh.generate(fb, {}, {});
  EXPECT_EQ(wb.reused_tokens, 0u);
  EXPECT_EQ(gb.tokens, wb.tokens);
  ASSERT_EQ(want.by_pos.rbegin()->first, got.by_pos.rbegin()->first);
  for (const auto& [pos, row] : got.by_pos) {
    ASSERT_TRUE(want.by_pos.count(pos));
    EXPECT_EQ(std::memcmp(row.data(), want.by_pos[pos].data(), row.size() * sizeof(float)), 0)
        << "logits at position " << pos << " differ from a fresh session's";
  }

  // A prompt diverging before the first checkpoint starts over.
  std::vector<uint32_t> c = tokens(30, 3);
  std::copy(b.begin(), b.begin() + 10, c.begin());
  EXPECT_EQ(s.generate(request(c, 2), {}, {}).reused_tokens, 0u);
}

// The checkpoint at a prompt's end carries its logits row: the same prompt again (the kept
// sequence holds prompt + generated tokens) and the prompt followed by other tokens than the
// generated ones both restart there.
TEST_F(SessionCheckpoints, PromptEndCheckpointServesARetryAndAnEditedAnswer) {
  Session s(opts());
  const std::vector<uint32_t> a = tokens(21, 4);
  const GenerateResult first = s.generate(request(a, 5), {}, {});
  ASSERT_EQ(first.tokens.size(), 5u);
  const GenerateResult again = s.generate(request(a, 5), {}, {});
  EXPECT_EQ(again.reused_tokens, 21u);
  EXPECT_EQ(again.tokens, first.tokens);

  std::vector<uint32_t> edited = a;
  edited.insert(edited.end(), {first.tokens[0] == 9 ? 10u : 9u, 11, 12});
  const GenerateResult e = s.generate(request(edited, 4), {}, {});
  EXPECT_EQ(e.reused_tokens, 21u);
  Session fresh(opts(false));
  EXPECT_EQ(fresh.generate(request(edited, 4), {}, {}).tokens, e.tokens);
}

// The next turn of a thinking conversation: the chat format drops the reasoning, so the
// generation prompt's last token (`<think>`) becomes another (`</think>`) and the prompt
// diverges just before its last token. The checkpoint there serves it.
TEST_F(SessionCheckpoints, PromptDivergingAtItsLastTokenRestartsBeforeIt) {
  Session s(opts());
  const std::vector<uint32_t> a = tokens(45, 8);
  s.generate(request(a, 3), {}, {});
  std::vector<uint32_t> next(a.begin(), a.end() - 1);
  next.push_back(a.back() == 9 ? 10u : 9u);
  const std::vector<uint32_t> more = tokens(12, 9);
  next.insert(next.end(), more.begin(), more.end());
  const GenerateResult g = s.generate(request(next, 3), {}, {});
  EXPECT_EQ(g.reused_tokens, 44u);
  Session fresh(opts(false));
  EXPECT_EQ(fresh.generate(request(next, 3), {}, {}).tokens, g.tokens);
}

// Interval checkpoints are also taken while decoding (a prompt may include generated tokens).
TEST_F(SessionCheckpoints, DecodeStepsTakeIntervalCheckpoints) {
  Session s(opts());
  const std::vector<uint32_t> a = tokens(10, 5);
  const GenerateResult g = s.generate(request(a, 12), {}, {});
  ASSERT_EQ(g.decode_steps, 11u);  // history: 21 tokens, passing 16 while decoding
  std::vector<uint32_t> b = a;
  b.insert(b.end(), g.tokens.begin(), g.tokens.begin() + 8);  // 18 tokens of the history
  b.push_back(g.tokens[8] == 9 ? 10u : 9u);
  const GenerateResult gb = s.generate(request(b, 3), {}, {});
  EXPECT_EQ(gb.reused_tokens, 16u);
  Session fresh(opts(false));
  EXPECT_EQ(fresh.generate(request(b, 3), {}, {}).tokens, gb.tokens);
}

TEST_F(SessionCheckpoints, CheckpointsStayWithinTheirBudget) {
  SessionOptions so = opts();
  const ModelConfig cfg = [&] {
    Session probe(so);
    return probe.config();
  }();
  const uint64_t one = checkpoint_bytes(cfg, cfg.sliding_window);
  so.checkpoint_budget = 3 * one + one / 2;  // three interval checkpoints, or fewer with a logits row
  Session s(so);
  EXPECT_EQ(s.stats().checkpoint_budget, so.checkpoint_budget);
  const std::vector<uint32_t> a = tokens(150, 6);
  s.generate(request(a, 2), [&](uint32_t, uint32_t) {
    EXPECT_LE(s.stats().checkpoint_bytes, so.checkpoint_budget);
    return true;
  }, {});
  SessionStats st = s.stats();
  EXPECT_LE(st.checkpoint_bytes, so.checkpoint_budget);
  EXPECT_GT(st.checkpoints, 0u);
  EXPECT_GT(st.checkpoints_dropped, 0u);
  EXPECT_EQ(st.checkpoints_taken, st.checkpoints + st.checkpoints_dropped);

  // Whatever was kept, a diverging prompt restarts at a checkpoint and matches a fresh session.
  std::vector<uint32_t> b = tokens(140, 7);
  std::copy(a.begin(), a.begin() + 130, b.begin());
  const GenerateResult gb = s.generate(request(b, 3), {}, {});
  EXPECT_GT(gb.reused_tokens, 0u);
  EXPECT_LE(gb.reused_tokens, 130u);
  EXPECT_LE(s.stats().checkpoint_bytes, so.checkpoint_budget);
  Session fresh(opts(false));
  EXPECT_EQ(fresh.generate(request(b, 3), {}, {}).tokens, gb.tokens);

  // A budget below one checkpoint keeps none (counted as skipped) and the plan warns.
  so.checkpoint_budget = one / 2;
  Session none(so);
  none.generate(request(a, 1), {}, {});
  EXPECT_EQ(none.stats().checkpoints, 0u);
  EXPECT_EQ(none.stats().checkpoint_bytes, 0u);
  EXPECT_GT(none.stats().checkpoints_skipped, 0u);
  bool warned = false;
  for (const std::string& w : none.plan().warnings) warned |= w.find("checkpoint budget") != std::string::npos;
  EXPECT_TRUE(warned);
}

TEST_F(SessionCheckpoints, PlanAccountsForTheCheckpointBudget) {
  SessionOptions so = opts();
  Session s(so);
  const ModelConfig& cfg = s.config();
  auto line = [](const Plan& p) -> const PlanLine* {
    for (const PlanLine& l : p.mandatory)
      if (l.name == "prefix checkpoints") return &l;
    return nullptr;
  };
  const PlanLine* l = line(s.plan());
  ASSERT_NE(l, nullptr);
  // ctx 256 checkpoints of the tiny model need less than the default budget.
  EXPECT_EQ(largest_checkpoint_bytes(cfg), checkpoint_bytes(cfg, cfg.sliding_window) + cfg.vocab_size * 4ull);
  EXPECT_EQ(l->bytes, std::min<uint64_t>(kDefaultCheckpointBudget, 256 * largest_checkpoint_bytes(cfg)));
  so.checkpoint_budget = 100000;
  Session small(so);
  ASSERT_NE(line(small.plan()), nullptr);
  EXPECT_EQ(line(small.plan())->bytes, 100000u);
  // The runtime overhead is this process's resident set when planning (runtime/store_plan.h),
  // which grew by the first session's model; every other line must be the same.
  auto without_overhead = [](const Plan& p) {
    uint64_t b = p.mandatory_bytes;
    for (const PlanLine& pl : p.mandatory)
      if (pl.name == "runtime overhead") b -= pl.bytes;
    return b;
  };
  EXPECT_EQ(without_overhead(small.plan()), without_overhead(s.plan()) - l->bytes + 100000);
}

SessionCheckpoint fake(uint32_t pos, uint64_t bytes, bool prompt_end = false) {
  SessionCheckpoint c;
  c.seq.pos = pos;
  c.seq.window_kv.assign(bytes / 2, 0);
  c.prompt_end = prompt_end;
  return c;
}

std::vector<uint32_t> positions(const CheckpointSet& s) {
  std::vector<uint32_t> p;
  for (const SessionCheckpoint& c : s.items()) p.push_back(c.pos());
  return p;
}

void add(CheckpointSet& s, uint32_t pos, uint64_t bytes, bool prompt_end = false) {
  if (s.make_room(pos, bytes)) s.add(fake(pos, bytes, prompt_end));
  EXPECT_LE(s.bytes(), s.budget());
}

TEST(CheckpointSet, DropsTheSmallestGapButKeepsTheNewestPromptEnd) {
  CheckpointSet s(400);  // four of 100 bytes
  add(s, 100, 100);
  add(s, 200, 100);
  add(s, 250, 100, /*prompt_end=*/true);
  add(s, 300, 100);
  EXPECT_EQ(positions(s), (std::vector<uint32_t>{100, 200, 250, 300}));
  // Arriving at 400: removing 100 leaves a gap of 200, 200 -> 150, 250 (kept) -, 300 -> 150:
  // the oldest of the smallest goes.
  add(s, 400, 100);
  EXPECT_EQ(positions(s), (std::vector<uint32_t>{100, 250, 300, 400}));
  EXPECT_EQ(s.dropped(), 1u);
  // A bigger one makes room for itself.
  add(s, 500, 200);
  EXPECT_EQ(positions(s), (std::vector<uint32_t>{250, 400, 500}));
  EXPECT_EQ(s.bytes(), 400u);
  // One larger than the whole budget is not taken and drops nothing.
  EXPECT_FALSE(s.make_room(600, 401));
  EXPECT_EQ(s.skipped(), 1u);
  EXPECT_EQ(positions(s), (std::vector<uint32_t>{250, 400, 500}));
  // A checkpoint at the newest position replaces it.
  add(s, 500, 100, true);
  EXPECT_EQ(positions(s), (std::vector<uint32_t>{250, 400, 500}));
  EXPECT_EQ(s.bytes(), 300u);
  // Only the protected prompt end is left to drop: it goes too.
  add(s, 700, 400);
  EXPECT_EQ(positions(s), (std::vector<uint32_t>{700}));
  EXPECT_THROW(s.add(fake(650, 10)), Error);  // not after the newest
}

TEST(CheckpointSet, KeepsBothCheckpointsOfTheNewestPromptEnd) {
  CheckpointSet s(300);
  add(s, 100, 100);
  add(s, 199, 100, true);
  add(s, 200, 100, true);
  add(s, 210, 100);  // 199 leaves the smallest gap, but it is the newest prompt's
  EXPECT_EQ(positions(s), (std::vector<uint32_t>{199, 200, 210}));
  add(s, 300, 100);
  EXPECT_EQ(positions(s), (std::vector<uint32_t>{199, 200, 300}));
}

TEST(CheckpointSet, FindsTheNewestUsableAndDropsThoseAfterARollback) {
  CheckpointSet s(1000);
  add(s, 16, 10);
  add(s, 21, 10, true);
  s.add([] {
    SessionCheckpoint c = fake(32, 10);
    c.logits.assign(2, 0.0f);
    return c;
  }());
  EXPECT_EQ(s.best_for(15, 40), nullptr);
  EXPECT_EQ(s.best_for(20, 40)->pos(), 16u);
  EXPECT_EQ(s.best_for(40, 40)->pos(), 32u);
  EXPECT_EQ(s.best_for(21, 21)->pos(), 16u) << "21 has no logits row: a 21-token prompt cannot start there";
  EXPECT_EQ(s.best_for(32, 32)->pos(), 32u) << "32 has its logits row";
  s.drop_after(21);
  EXPECT_EQ(positions(s), (std::vector<uint32_t>{16, 21}));
  EXPECT_EQ(s.bytes(), 20u);
  s.clear();
  EXPECT_EQ(s.bytes(), 0u);
  EXPECT_TRUE(s.items().empty());
}

}  // namespace
}  // namespace sluice
