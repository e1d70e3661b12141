// Continuous batching in the Session (issue 13 item 2): requests start on slots at different
// steps, prefill in pieces beside the others' decode, finish at different times and free their
// slots for later ones, and every request's logits and tokens are bit for bit what it gives run
// alone with generate() on a fresh session (greedy and seeded sampling; resident experts and
// experts streamed through a small cache). The prefill allowance bounds the prompt tokens a step
// evaluates while others decode; a conversation that comes back finds its slot and reuses it;
// cancelling ends one request and leaves the others running.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "model/deepseek41/forward.h"
#include "runtime/session.h"
#include "util/error.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

class ContinuousBatch : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("sluice-continuous-batch-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    path_ = (dir_ / "tiny.gguf").string();
    const std::string cmd = std::string(SLUICE_BINARY) + " make-model --preset tiny -o " + path_ + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  static SessionOptions options(uint32_t parallel, bool streamed) {
    SessionOptions so;
    so.model_path = path_;
    so.ctx = 128;
    so.chunk = 16;
    so.threads = 2;
    so.budget = BudgetSpec{false, 2ull << 30};
    so.allow_swap = true;  // the test host's swap is not what is tested here
    so.parallel = parallel;
    so.stream_experts = streamed;
    if (streamed) so.max_cache_experts = 40;  // 5 per layer: most steps read experts
    return so;
  }

  // Request k: a prompt of 5 + 9k tokens (several pieces for the later ones), its own length
  // and, for odd k, seeded sampling (any difference in a logit bit can change the draw).
  static GenerateRequest request(uint32_t k, uint32_t vocab) {
    GenerateRequest r;
    for (uint32_t i = 0; i < 5 + 9 * k; ++i) r.prompt.push_back((i * 7919u + 101u * k + 13u) % vocab);
    r.max_tokens = 3 + 2 * k;
    r.ignore_eos = true;
    if (k % 2) {
      r.sampling.temp = 0.9f;
      r.sampling.top_p = 0.95f;
      r.sampling.seed = 1000 + k;
    }
    return r;
  }

  // What one request saw: every logits row evaluated for it (in order) and its result.
  struct Seen {
    std::vector<float> logits;
    std::vector<uint32_t> positions;
    GenerateResult result;
    bool done = false;
    std::vector<uint32_t> prefill_done;  // on_prefill's `done` values
  };
  static EvalObserver observer_for(Seen& seen, uint32_t vocab) {
    EvalObserver o;
    o.on_eval = [&seen, vocab](uint32_t first, std::span<const TokenId> toks, const float* lg, const std::vector<TokenTrace>*) {
      seen.logits.insert(seen.logits.end(), lg, lg + toks.size() * vocab);
      for (size_t i = 0; i < toks.size(); ++i) seen.positions.push_back(first + (uint32_t)i);
    };
    return o;
  }

  static fs::path dir_;
  static std::string path_;
};

fs::path ContinuousBatch::dir_;
std::string ContinuousBatch::path_;

// Requests 0..5 arrive at steps 0, 0, 1, 3, 4, 6 into 3 slots (the later ones wait for a slot),
// with a prefill allowance of 4 tokens per step.
void drive(Session& s, std::vector<GenerateRequest>& reqs, std::vector<ContinuousBatch::Seen>& seen, uint32_t allowance) {
  const std::vector<uint32_t> arrival = {0, 0, 1, 3, 4, 6};
  std::deque<uint32_t> waiting;
  size_t next = 0, finished = 0;
  uint32_t most_busy = 0;
  for (uint32_t step = 0; finished < reqs.size(); ++step) {
    ASSERT_LT(step, 1000u) << "the requests never finished";
    while (next < reqs.size() && arrival[next] <= step) waiting.push_back((uint32_t)next++);
    while (!waiting.empty()) {
      const int slot = s.pick_slot(reqs[waiting.front()].prompt);
      if (slot < 0) break;
      const uint32_t k = waiting.front();
      waiting.pop_front();
      Session::SlotEvents ev;
      ev.on_prefill = [&seen, k](uint32_t done, uint32_t) {
        seen[k].prefill_done.push_back(done);
        return true;
      };
      ev.on_done = [&seen, &finished, k](GenerateResult r) {
        seen[k].result = std::move(r);
        seen[k].done = true;
        ++finished;
      };
      ev.on_failed = [k](const std::string& e) { ADD_FAILURE() << "request " << k << ": " << e; };
      s.start((uint32_t)slot, reqs[k], std::move(ev));
    }
    most_busy = std::max(most_busy, s.busy_slots());
    s.step(allowance);
  }
  EXPECT_EQ(most_busy, 3u) << "the slots never ran together";
}

void expect_each_as_alone(bool streamed, bool observed) {
  SCOPED_TRACE(std::string(streamed ? "streamed" : "resident") + (observed ? ", observed" : ""));
  Session batch(ContinuousBatch::options(3, streamed));
  const uint32_t V = batch.config().vocab_size;
  std::vector<GenerateRequest> reqs;
  std::vector<ContinuousBatch::Seen> seen(6), alone(6);
  std::vector<EvalObserver> obs, obs_alone;
  obs.reserve(6);
  obs_alone.reserve(6);
  for (uint32_t k = 0; k < 6; ++k) {
    reqs.push_back(ContinuousBatch::request(k, V));
    obs.push_back(ContinuousBatch::observer_for(seen[k], V));
    obs_alone.push_back(ContinuousBatch::observer_for(alone[k], V));
  }
  std::vector<GenerateRequest> batched = reqs;
  if (observed)
    for (uint32_t k = 0; k < 6; ++k) batched[k].observer = &obs[k];
  drive(batch, batched, seen, 4);
  for (uint32_t k = 0; k < 6; ++k) {
    SCOPED_TRACE("request " + std::to_string(k));
    Session fresh(ContinuousBatch::options(1, streamed));
    GenerateRequest r = reqs[k];
    r.observer = &obs_alone[k];
    alone[k].result = fresh.generate(r, {}, {});
    ASSERT_TRUE(seen[k].done);
    EXPECT_EQ(seen[k].result.tokens, alone[k].result.tokens);
    EXPECT_EQ(seen[k].result.finish, Finish::Length);
    EXPECT_EQ(seen[k].result.prompt_evaluated, r.prompt.size());
    EXPECT_EQ(seen[k].result.decode_steps, alone[k].result.decode_steps);
    if (!observed) continue;
    // Every position's row, in order, bit for bit.
    ASSERT_EQ(seen[k].positions, alone[k].positions);
    ASSERT_EQ(seen[k].logits.size(), alone[k].logits.size());
    for (size_t row = 0; row < seen[k].positions.size(); ++row)
      ASSERT_EQ(std::memcmp(seen[k].logits.data() + row * V, alone[k].logits.data() + row * V, V * sizeof(float)), 0)
          << "position " << seen[k].positions[row];
  }
}

TEST_F(ContinuousBatch, EachRequestEqualsItselfAloneResident) {
  expect_each_as_alone(false, true);
  expect_each_as_alone(false, false);
}

TEST_F(ContinuousBatch, EachRequestEqualsItselfAloneStreamed) {
  expect_each_as_alone(true, true);
  expect_each_as_alone(true, false);
}

// While another slot decodes, a step evaluates at most `allowance` prompt tokens of a waiting
// prompt; with no one decoding a prompt goes in pieces of up to the chunk.
TEST_F(ContinuousBatch, APrefillBesideDecodeIsCutToTheAllowance) {
  Session s(options(2, false));
  const uint32_t V = s.config().vocab_size;
  GenerateRequest a = request(0, V), b = request(4, V);  // b: 41 prompt tokens
  a.max_tokens = 100;
  std::vector<uint32_t> a_done, b_done;
  uint32_t a_tokens = 0;
  bool b_finished = false;
  Session::SlotEvents ea, eb;
  ea.on_prefill = [&](uint32_t d, uint32_t) { a_done.push_back(d); return true; };
  ea.on_token = [&](TokenId) { ++a_tokens; return true; };
  eb.on_prefill = [&](uint32_t d, uint32_t) { b_done.push_back(d); return true; };
  eb.on_done = [&](GenerateResult) { b_finished = true; };
  s.start(0, a, ea);
  while (a_tokens == 0) s.step(5);  // a's prompt: 4 tokens, then its last (no one decodes yet)
  ASSERT_EQ(a_done, (std::vector<uint32_t>{0, 4, 5}));
  ASSERT_EQ(a_tokens, 1u);
  s.start(1, b, eb);
  while (!b_finished) {
    const uint32_t before = a_tokens;
    s.step(5);
    EXPECT_EQ(a_tokens, before + 1) << "a decode step was skipped";
  }
  // 0, then pieces of at most 5, stopping before the last token (40) and then 41.
  ASSERT_GE(b_done.size(), 3u);
  EXPECT_EQ(b_done.front(), 0u);
  for (size_t i = 1; i < b_done.size(); ++i) EXPECT_LE(b_done[i] - b_done[i - 1], 5u) << "piece " << i;
  EXPECT_NE(std::find(b_done.begin(), b_done.end(), 40u), b_done.end());
  EXPECT_EQ(b_done.back(), 41u);
  s.cancel(0);
  EXPECT_EQ(s.busy_slots(), 0u);

  // Alone, the same prompt goes in chunk-sized pieces (16, 16, 8, 1).
  b_done.clear();
  b_finished = false;
  s.reset_slot(1);  // else the slot holds the whole prompt and its last row
  s.start(1, request(4, V), eb);
  while (s.busy_slots()) s.step(5);
  EXPECT_EQ(b_done, (std::vector<uint32_t>{0, 16, 32, 40, 41}));
}

// A conversation's next turn goes to the slot holding its sequence and evaluates only its new
// tokens; a busy slot is never picked; cancel ends one request, the other keeps going.
TEST_F(ContinuousBatch, ANextTurnFindsItsSlotAndCancelEndsOneRequest) {
  Session s(options(3, false));
  const uint32_t V = s.config().vocab_size;
  std::vector<std::optional<GenerateResult>> res(3);
  auto events = [&](uint32_t k) {
    Session::SlotEvents ev;
    ev.on_done = [&res, k](GenerateResult r) { res[k] = std::move(r); };
    return ev;
  };
  const GenerateRequest first = request(2, V);
  s.start(2, first, events(0));
  while (s.busy_slots()) s.step(4);
  ASSERT_TRUE(res[0]);
  GenerateRequest turn2 = first;
  turn2.prompt.insert(turn2.prompt.end(), res[0]->tokens.begin(), res[0]->tokens.end());
  turn2.prompt.push_back(3);
  turn2.prompt.push_back(4);
  EXPECT_EQ(s.pick_slot(turn2.prompt), 2);
  s.start(2, turn2, events(1));
  EXPECT_TRUE(s.slot_busy(2));
  EXPECT_NE(s.pick_slot(turn2.prompt), 2) << "a busy slot was picked";
  EXPECT_THROW(s.start(2, turn2, events(2)), Error);
  s.start(0, request(3, V), events(2));
  s.step(4);
  s.cancel(2);
  ASSERT_TRUE(res[1]);
  EXPECT_EQ(res[1]->finish, Finish::Cancelled);
  EXPECT_EQ(res[1]->reused_tokens, first.prompt.size() + res[0]->tokens.size() - 1);
  EXPECT_FALSE(s.slot_busy(2));
  EXPECT_TRUE(s.slot_busy(0));
  while (s.busy_slots()) s.step(4);
  ASSERT_TRUE(res[2]);
  EXPECT_EQ(res[2]->finish, Finish::Length);
  // generate() drives slot 0 alone: refused while another slot runs a request.
  s.start(1, request(1, V), events(2));
  EXPECT_THROW(s.generate(turn2, {}, {}), Error);
  s.cancel(1);
  EXPECT_EQ(s.generate(turn2, {}, {}).finish, Finish::Length);
}

// checkpoint_at: the prefill stops there for a checkpoint, so a second prompt sharing the
// first's start up to it (another conversation with the same system prompt) restarts there,
// and is answered as a fresh session answers it. A position outside the prompt is refused.
TEST_F(ContinuousBatch, ACheckpointAtATurnBoundaryServesTheNextConversation) {
  Session s(options(1, false)), fresh(options(1, false));
  const uint32_t V = s.config().vocab_size;
  GenerateRequest a = request(6, V);  // 59 prompt tokens
  a.checkpoint_at = {37, 3, 37};
  GenerateRequest b = a;
  for (size_t i = 37; i < b.prompt.size(); ++i) b.prompt[i] = (b.prompt[i] + 1) % V;  // differs from 37 on
  b.checkpoint_at.clear();
  s.generate(a, {}, {});
  const GenerateResult got = s.generate(b, {}, {});
  EXPECT_EQ(got.reused_tokens, 37u) << "the second conversation did not restart at the boundary";
  EXPECT_EQ(got.tokens, fresh.generate(b, {}, {}).tokens);
  GenerateRequest bad = a;
  bad.checkpoint_at = {(uint32_t)a.prompt.size()};
  EXPECT_THROW(s.generate(bad, {}, {}), Error);
  bad.checkpoint_at = {0};
  EXPECT_THROW(s.generate(bad, {}, {}), Error);
}

// Runs r on slot k to its end (alone on the session), with an observer of its logits.
GenerateResult run_on(Session& s, uint32_t k, GenerateRequest r, EvalObserver& obs) {
  r.observer = &obs;
  bool done = false;
  GenerateResult out;
  Session::SlotEvents ev;
  ev.on_done = [&](GenerateResult res) {
    out = std::move(res);
    done = true;
  };
  ev.on_failed = [](const std::string& e) { ADD_FAILURE() << e; };
  s.start(k, std::move(r), std::move(ev));
  for (int i = 0; !done && i < 1000; ++i) s.step(0);
  EXPECT_TRUE(done);
  return out;
}

// The shared prefix cache (--cache-ram): a conversation on slot 1 starts from the state slot 0
// reached at the end of a shared system prompt (a turn boundary), and the same prompt sent
// again on slot 1 restores slot 0's prompt-end state with its logits row and evaluates nothing.
// Every row either evaluates equals, bit for bit, a fresh session's cold run.
TEST_F(ContinuousBatch, TheSharedPrefixCacheStartsOneSlotFromAnothersPrompt) {
  SessionOptions so = options(2, true);
  so.cache_ram = 64ull << 20;
  Session s(so);
  Session cold(options(1, true));
  const uint32_t V = s.config().vocab_size, sys = 40;
  GenerateRequest a = request(6, V);  // 59 prompt tokens, seeded sampling
  a.checkpoint_at = {sys};
  GenerateRequest b = a;
  for (size_t i = sys; i < b.prompt.size(); ++i) b.prompt[i] = (b.prompt[i] + 3) % V;
  b.checkpoint_at.clear();

  ContinuousBatch::Seen sa, sb, sa2, cb, ca;
  EvalObserver oa = ContinuousBatch::observer_for(sa, V), ob = ContinuousBatch::observer_for(sb, V),
               oa2 = ContinuousBatch::observer_for(sa2, V), ocb = ContinuousBatch::observer_for(cb, V),
               oca = ContinuousBatch::observer_for(ca, V);
  const GenerateResult ra = run_on(s, 0, a, oa);
  EXPECT_EQ(ra.reused_tokens, 0u);
  const GenerateResult rb = run_on(s, 1, b, ob);
  EXPECT_EQ(rb.reused_tokens, sys) << "slot 1 did not start from slot 0's system prompt";
  const GenerateResult cold_b = run_on(cold, 0, b, ocb);
  EXPECT_EQ(rb.tokens, cold_b.tokens);
  ASSERT_GE(cb.positions.size(), sb.positions.size());
  const size_t skip = cb.positions.size() - sb.positions.size();
  EXPECT_EQ(sb.positions, std::vector<uint32_t>(cb.positions.begin() + (std::ptrdiff_t)skip, cb.positions.end()));
  EXPECT_EQ(std::memcmp(sb.logits.data(), cb.logits.data() + skip * V, sb.logits.size() * sizeof(float)), 0)
      << "rows after the restore differ from a cold run";

  cold.reset();
  const GenerateResult ra2 = run_on(s, 1, a, oa2);  // slot 1 holds b now
  EXPECT_EQ(ra2.reused_tokens, a.prompt.size()) << "the repeated prompt did not restore its prompt-end state";
  EXPECT_EQ(ra2.tokens, ra.tokens);
  EXPECT_EQ(ra2.tokens, run_on(cold, 0, a, oca).tokens);
  const size_t decoded = sa2.positions.size();
  ASSERT_LE(decoded, sa.positions.size());
  EXPECT_EQ(std::memcmp(sa2.logits.data(), sa.logits.data() + (sa.positions.size() - decoded) * V,
                        sa2.logits.size() * sizeof(float)), 0);

  const SessionStats st = s.stats();
  EXPECT_EQ(st.prefix_hits, 2u);
  EXPECT_EQ(st.prefix_hit_tokens, sys + a.prompt.size());
  EXPECT_EQ(st.prefix_lookups, 3u);
  EXPECT_GE(st.prefix_entries, 3u);  // a's boundary and end, b's end
  EXPECT_LE(st.prefix_bytes, st.prefix_budget);
  EXPECT_EQ(st.prefix_budget, so.cache_ram);
  bool planned = false;
  for (const PlanLine& l : s.plan().mandatory) planned |= l.name == "prefix cache" && l.bytes == so.cache_ram;
  EXPECT_TRUE(planned) << "the plan does not account the prefix cache";
}

// A budget below one state keeps nothing (and says so in the stats), and requests run as without.
TEST_F(ContinuousBatch, APrefixCacheTooSmallForOneStateHoldsNothing) {
  SessionOptions so = options(2, false);
  so.cache_ram = 4096;
  Session s(so);
  const uint32_t V = s.config().vocab_size;
  GenerateRequest a = request(2, V);
  ContinuousBatch::Seen sa, sb;
  EvalObserver oa = ContinuousBatch::observer_for(sa, V), ob = ContinuousBatch::observer_for(sb, V);
  const GenerateResult ra = run_on(s, 0, a, oa);
  const GenerateResult rb = run_on(s, 1, a, ob);
  EXPECT_EQ(rb.reused_tokens, 0u);
  EXPECT_EQ(rb.tokens, ra.tokens);
  EXPECT_EQ(s.stats().prefix_entries, 0u);
  EXPECT_EQ(s.stats().prefix_bytes, 0u);
}

}  // namespace
}  // namespace sluice
