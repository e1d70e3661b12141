// States on disk (issue 13 item 4; runtime/state_file.h, runtime/state_disk.h). The file format
// alone: a round trip is exact, and every flipped byte, every cut and an appended byte are
// refused. The store under a Session: a state written by one process is found by the next one
// (the rows it then evaluates equal a cold run's bit for bit); a damaged file is reported once,
// deleted and recomputed; files of another model or build are neither used nor touched; the
// budget holds, and one directory has one owner.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "runtime/request_boundaries.h"
#include "runtime/session.h"
#include "runtime/state_disk.h"
#include "runtime/state_file.h"
#include "util/error.h"

#include "test_util.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
void spit(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), (std::streamsize)b.size());
}

// --- the file format ---------------------------------------------------------------------

StateShape small_shape() {
  StateShape s;
  s.layers = 2, s.window = 4, s.head_dim = 8, s.ctx = 64, s.vocab = 5, s.engram_tail = 3;
  s.sources = {{1, 6, 3}, {2, 6, 3}, {4, 6, 3}};
  return s;
}

SequenceSnapshot random_snapshot(const StateShape& s, uint32_t pos, std::mt19937& rng) {
  SequenceSnapshot snap;
  snap.ck.pos = pos;
  snap.ck.window_kv.resize((size_t)s.layers * std::min(pos, s.window) * s.head_dim);
  for (uint16_t& v : snap.ck.window_kv) v = (uint16_t)rng();
  for (const StateShape::Source& src : s.sources) {
    std::vector<float> ck((src.ratio - 1) * s.head_dim), cs(ck.size());
    for (float& v : ck) v = (float)rng() / 7.0f;
    for (float& v : cs) v = -(float)rng();
    snap.ck.carry_k.push_back(ck);
    snap.ck.carry_s.push_back(cs);
    std::vector<uint8_t> kv((pos / src.ratio) * src.kv_row_bytes), ik((pos / src.ratio) * src.index_row_bytes);
    for (uint8_t& v : kv) v = (uint8_t)rng();
    for (uint8_t& v : ik) v = (uint8_t)rng();
    snap.kv.push_back(kv);
    snap.index_k.push_back(ik);
  }
  for (uint32_t i = 0; i < s.engram_tail; ++i) snap.ck.engram_tail.push_back((int64_t)rng() - 7);
  return snap;
}

const SipKey kKey = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

StateCheck read_file(const fs::path& p, const StateShape& s, const Digest128& id, LoadedState* out,
                     const SipKey& key = kKey) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw Error("cannot open " + p.string());
  const StateCheck c = read_state_file(fd, s, id, key, out);
  ::close(fd);
  return c;
}

TEST(StateFile, RoundTripsAndEveryFlippedByteOrCutIsRefused) {
  test::TempDir dir("sluice-state-format");
  const StateShape shape = small_shape();
  std::mt19937 rng(7);
  Digest128 id{};
  for (uint8_t& b : id) b = (uint8_t)rng();
  for (const uint32_t pos : {1u, 3u, 9u}) {
    SCOPED_TRACE("pos " + std::to_string(pos));
    const SequenceSnapshot snap = random_snapshot(shape, pos, rng);
    std::vector<TokenId> tokens;
    for (uint32_t i = 0; i < pos; ++i) tokens.push_back((TokenId)(rng() % 1000));
    const std::vector<float> logits = pos == 3 ? std::vector<float>{} : std::vector<float>{1, -2, 3.5f, 0, -0.0f};
    const fs::path p = dir.path / "a.sstate";
    fs::remove(p);
    {
      const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
      ASSERT_GE(fd, 0);
      write_state_file(fd, p.string(), shape, id, kKey, tokens, snap, logits);
      ::close(fd);
    }
    const std::vector<uint8_t> good = slurp(p);
    ASSERT_EQ(good.size(), state_file_bytes(shape, pos, !logits.empty()));
    LoadedState back;
    const StateCheck ok = read_file(p, shape, id, &back);
    ASSERT_TRUE(ok) << ok.why;
    EXPECT_EQ(back.snap, snap);
    EXPECT_EQ(back.tokens, tokens);
    ASSERT_EQ(back.logits.size(), logits.size());
    if (!logits.empty()) {
      EXPECT_EQ(std::memcmp(back.logits.data(), logits.data(), logits.size() * sizeof(float)), 0);
    }

    Digest128 other = id;
    other[3] ^= 1;
    EXPECT_EQ(read_file(p, shape, other, &back).reject, StateReject::OtherModel);
    StateShape wide = shape;
    wide.sources[0].kv_row_bytes += 1;
    EXPECT_EQ(read_file(p, wide, id, &back).reject, StateReject::BadShape);
    // Whole and well formed, but signed with another server's key: not read.
    SipKey other_key = kKey;
    other_key[15] ^= 0x80;
    EXPECT_EQ(read_file(p, shape, id, &back, other_key).reject, StateReject::Checksum);

    for (size_t i = 0; i < good.size(); ++i) {
      std::vector<uint8_t> bad = good;
      bad[i] ^= (uint8_t)(1u << (i % 8));
      spit(p, bad);
      LoadedState out;
      const StateCheck c = read_file(p, shape, id, &out);
      ASSERT_FALSE(c) << "a flipped bit at byte " << i << " of " << good.size() << " was not noticed";
      EXPECT_TRUE(out.tokens.empty());
    }
    for (size_t n = 0; n < good.size(); ++n) {
      spit(p, std::vector<uint8_t>(good.begin(), good.begin() + (std::ptrdiff_t)n));
      LoadedState out;
      ASSERT_FALSE(read_file(p, shape, id, &out)) << "a file cut to " << n << " bytes was read";
    }
    std::vector<uint8_t> longer = good;
    longer.push_back(0);
    spit(p, longer);
    LoadedState out;
    EXPECT_EQ(read_file(p, shape, id, &out).reject, StateReject::Truncated);
  }
}

// A signed file whose logits row is not finite would fail every request that loads it (the
// sampler refuses a NaN): it is refused when read, so the prompt is recomputed instead.
TEST(StateFile, ANonFiniteLogitsRowIsRefused) {
  test::TempDir dir("sluice-state-nan");
  const StateShape shape = small_shape();
  std::mt19937 rng(3);
  const Digest128 id{};
  const SequenceSnapshot snap = random_snapshot(shape, 4, rng);
  const std::vector<TokenId> tokens = {5, 6, 7, 8};
  for (const float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    const fs::path p = dir.path / "n.sstate";
    fs::remove(p);
    const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    write_state_file(fd, p.string(), shape, id, kKey, tokens, snap, std::vector<float>{1, 2, bad, 4, 5});
    ::close(fd);
    LoadedState out;
    EXPECT_EQ(read_file(p, shape, id, &out).reject, StateReject::Values) << bad;
  }
}

// SipHash-2-4-128 against the reference vectors (key 00..0f, message 00..len-1), fed whole and
// in pieces.
TEST(StateFile, SipHashMatchesTheReferenceVectors) {
  SipKey k;
  for (uint8_t i = 0; i < 16; ++i) k[i] = i;
  const char* want[6] = {"a3817f04ba25a8e66df67214c7550293", "da87c1d86b99af44347659119b22fc45",
                         "8177228da4a45dc7fca38bdef60affe4", "9c70b60c5267a94e5f33b6b02985ed51",
                         "f88164c12d9c8faf7d0f6e7c7bcd5579", "1368875980776f8854527a07690e9627"};
  uint8_t msg[64];
  for (uint8_t i = 0; i < 64; ++i) msg[i] = i;
  for (size_t len = 0; len < 6; ++len) {
    SipHash128 h(k);
    h.update(msg, len);
    EXPECT_STREQ(digest_hex(h.digest()).data(), want[len]) << len;
  }
  SipHash128 whole(k), parts(k);
  whole.update(msg, 63);
  for (size_t at = 0, step = 1; at < 63; at += step, step = step % 5 + 1) parts.update(msg + at, std::min<size_t>(step, 63 - at));
  EXPECT_EQ(parts.digest(), whole.digest());
}

TEST(StateFile, KeysFollowTheTokensAndTheModel) {
  std::vector<TokenId> t;
  for (uint32_t i = 0; i < 300; ++i) t.push_back((i * 7919u) % 5003u);
  Digest128 id{};
  id[0] = 9;
  const std::vector<uint32_t> lengths = {0, 1, 2, 7, 8, 9, 150, 299, 300};
  const std::vector<Digest128> keys = state_keys_at(id, t, lengths);
  for (size_t i = 0; i < lengths.size(); ++i) {
    EXPECT_EQ(keys[i], state_key(id, std::span<const TokenId>(t).first(lengths[i]))) << lengths[i];
    if (i) {
      EXPECT_NE(keys[i], keys[i - 1]);
    }
  }
  Digest128 id2 = id;
  id2[15] = 1;
  EXPECT_NE(state_key(id, t), state_key(id2, t));
  std::vector<TokenId> u = t;
  u[150] ^= 1;
  EXPECT_NE(state_key(id, t), state_key(id, u));
  // A byte stream hashes the same however it is split into updates.
  std::vector<uint8_t> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = (uint8_t)(i * 31 + 7);
  Hasher whole;
  whole.update(bytes.data(), bytes.size());
  for (const size_t cut : {0u, 1u, 3u, 8u, 13u, 999u}) {
    Hasher parts;
    parts.update(bytes.data(), cut);
    parts.update(bytes.data() + cut, 5 < bytes.size() - cut ? 5 : bytes.size() - cut);
    parts.update(bytes.data() + std::min(bytes.size(), cut + 5), bytes.size() - std::min(bytes.size(), cut + 5));
    EXPECT_EQ(parts.digest(), whole.digest()) << cut;
  }
}

// --- the store under a Session -----------------------------------------------------------

class StateDiskSession : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("sluice-state-disk-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    for (const int seed : {0, 1}) {
      const std::string p = (dir_ / ("tiny" + std::to_string(seed) + ".gguf")).string();
      const std::string cmd = std::string(SLUICE_BINARY) + " make-model --preset tiny --seed " + std::to_string(seed) +
                              " -o " + p + " > /dev/null";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void SetUp() override {
    states_ = dir_ / ("states-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(states_);
  }

  SessionOptions options(int seed = 0, uint64_t disk_budget = 64ull << 20) {
    SessionOptions so;
    so.model_path = (dir_ / ("tiny" + std::to_string(seed) + ".gguf")).string();
    so.ctx = 256;
    so.chunk = 16;
    so.threads = 2;
    so.budget = BudgetSpec{false, 2ull << 30};
    so.allow_swap = true;
    so.stream_experts = false;
    if (disk_budget) {
      so.kv_disk_dir = states_.string();
      so.kv_disk_budget = disk_budget;
    }
    so.log = [this](const std::string& line) { log_.push_back(line); };
    return so;
  }

  static GenerateRequest request(size_t n, uint32_t salt, uint32_t max_tokens = 4) {
    GenerateRequest r;
    for (uint32_t i = 0; i < n; ++i) r.prompt.push_back((i * 7919u + 101u * salt + 13u) % 500u + 3u);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    return r;
  }

  // Every row generate() evaluates, in order.
  struct Rows {
    std::vector<float> logits;
    std::vector<uint32_t> positions;
  };
  static GenerateResult run(Session& s, const GenerateRequest& r, Rows* rows) {
    EvalObserver o;
    const uint32_t V = s.config().vocab_size;
    o.on_eval = [rows, V](uint32_t first, std::span<const TokenId> toks, const float* logits,
                          const std::vector<TokenTrace>*) {
      if (!rows || !logits) return;
      for (size_t i = 0; i < toks.size(); ++i) rows->positions.push_back(first + (uint32_t)i);
      rows->logits.insert(rows->logits.end(), logits, logits + toks.size() * V);
    };
    GenerateRequest q = r;
    q.observer = &o;
    return s.generate(q, {}, {});
  }
  // rows equal the tail of cold's rows (the positions a restore skipped are cold's only).
  static void expect_tail_equal(const Rows& warm, const Rows& cold, uint32_t V) {
    ASSERT_LE(warm.positions.size(), cold.positions.size());
    const size_t skip = cold.positions.size() - warm.positions.size();
    EXPECT_EQ(warm.positions, std::vector<uint32_t>(cold.positions.begin() + (std::ptrdiff_t)skip, cold.positions.end()));
    ASSERT_FALSE(warm.logits.empty());
    EXPECT_EQ(std::memcmp(warm.logits.data(), cold.logits.data() + skip * V, warm.logits.size() * sizeof(float)), 0)
        << "rows after the restore differ from a cold run";
  }
  std::vector<fs::path> state_files() const {
    std::vector<fs::path> out;
    if (!fs::exists(states_)) return out;
    for (const auto& e : fs::directory_iterator(states_))
      if (e.path().extension() == ".sstate") out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
  }

  static fs::path dir_;
  fs::path states_;
  std::vector<std::string> log_;
};
fs::path StateDiskSession::dir_;

TEST_F(StateDiskSession, AStateWrittenBeforeARestartIsFoundAgainAndEqualsAColdRun) {
  const GenerateRequest a = request(50, 1);
  GenerateRequest longer = request(50, 1);
  for (uint32_t i = 0; i < 23; ++i) longer.prompt.push_back(400 + i);
  GenerateResult ra;
  {
    Session s(options());
    ra = run(s, a, nullptr);
    EXPECT_EQ(ra.reused_tokens, 0u);
  }  // the writes finish before the session is gone
  ASSERT_EQ(state_files().size(), 2u) << "the prompt end (and the position before it) were not written";
  Session cold(options(0, 0));
  const uint32_t V = cold.config().vocab_size;
  Rows cold_rows, warm_rows;
  const GenerateResult rc = run(cold, longer, &cold_rows);
  {
    Session s(options());
    const GenerateResult r = run(s, longer, &warm_rows);
    EXPECT_EQ(r.reused_tokens, a.prompt.size()) << "the restarted session did not find the state on disk";
    EXPECT_EQ(r.tokens, rc.tokens);
    expect_tail_equal(warm_rows, cold_rows, V);
    const SessionStats st = s.stats();
    EXPECT_TRUE(st.state_disk);
    EXPECT_EQ(st.disk_hits, 1u);
    EXPECT_EQ(st.disk_hit_tokens, a.prompt.size());
    EXPECT_LE(st.disk_bytes, st.disk_budget);
    bool planned = false;
    for (const PlanLine& l : s.plan().mandatory) planned |= l.name == "state disk buffers" && l.bytes > 0;
    EXPECT_TRUE(planned) << "the plan does not account the write queue";
  }
  // The same prompt again after another restart: its prompt-end state with the logits row, so
  // nothing is evaluated and the tokens are the first run's.
  Session s(options());
  Rows rows;
  const GenerateResult r = run(s, a, &rows);
  EXPECT_EQ(r.reused_tokens, a.prompt.size());
  EXPECT_EQ(r.tokens, ra.tokens);
  EXPECT_EQ(rows.positions.size(), a.max_tokens - 1) << "the prompt was evaluated again";
  EXPECT_TRUE(log_.empty()) << log_.front();
}

TEST_F(StateDiskSession, ADamagedFileIsReportedOnceDeletedAndRecomputed) {
  const GenerateRequest a = request(40, 2);
  { Session s(options()); run(s, a, nullptr); }
  std::vector<fs::path> files = state_files();
  ASSERT_EQ(files.size(), 2u);
  // One file with a flipped payload byte (found when read), one cut short (found when listed).
  std::vector<uint8_t> b = slurp(files[0]);
  b[b.size() / 2] ^= 0x10;
  spit(files[0], b);
  fs::resize_file(files[1], fs::file_size(files[1]) - 100);

  Session cold(options(0, 0));
  Rows cold_rows, rows;
  const GenerateResult rc = run(cold, a, &cold_rows);
  Session s(options());
  EXPECT_EQ(log_.size(), 1u) << "the truncated file was not reported when the directory was read";
  const GenerateResult r = run(s, a, &rows);
  EXPECT_EQ(r.reused_tokens, 0u) << "a damaged state was used";
  EXPECT_EQ(r.tokens, rc.tokens);
  expect_tail_equal(rows, cold_rows, cold.config().vocab_size);
  ASSERT_EQ(log_.size(), 2u);
  EXPECT_NE(log_[0].find("truncated"), std::string::npos) << log_[0];
  EXPECT_NE(log_[1].find("signature"), std::string::npos) << log_[1];
  EXPECT_EQ(s.stats().disk_rejected, 2u);
  // Recomputed and written again; the next request finds them and nothing more is reported.
  run(s, request(45, 9), nullptr);
  const GenerateResult r2 = run(s, a, nullptr);
  EXPECT_EQ(r2.reused_tokens, a.prompt.size()) << "the recomputed state was not written again";
  EXPECT_EQ(r2.tokens, rc.tokens);
  EXPECT_EQ(log_.size(), 2u);
}

// The longest state held is damaged: the next shorter one (the prompt less its last token) is used.
TEST_F(StateDiskSession, WhenTheLongestStateIsDamagedTheNextShorterOneIsUsed) {
  const GenerateRequest a = request(40, 4);
  { Session s(options()); run(s, a, nullptr); }
  std::vector<fs::path> files = state_files();
  ASSERT_EQ(files.size(), 2u);
  const fs::path longest = fs::file_size(files[0]) > fs::file_size(files[1]) ? files[0] : files[1];
  std::vector<uint8_t> b = slurp(longest);
  b[b.size() - 7] ^= 1;  // in the logits row
  spit(longest, b);
  GenerateRequest more = a;
  more.prompt.push_back(77);
  Session cold(options(0, 0));
  Rows cold_rows, rows;
  const GenerateResult rc = run(cold, more, &cold_rows);
  {
    Session s(options());
    const GenerateResult r = run(s, more, &rows);
    EXPECT_EQ(r.reused_tokens, a.prompt.size() - 1);
    EXPECT_EQ(r.tokens, rc.tokens);
    expect_tail_equal(rows, cold_rows, cold.config().vocab_size);
    EXPECT_EQ(s.stats().disk_rejected, 1u);
  }
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_NE(log_[0].find("signature"), std::string::npos) << log_[0];
  // Deleted, recomputed (this prompt ends past it) and written again.
  ASSERT_TRUE(fs::exists(longest));
  EXPECT_NE(slurp(longest), b);
}

TEST_F(StateDiskSession, StatesOfAnotherModelOrBuildAreNeitherUsedNorTouched) {
  const GenerateRequest a = request(40, 3);
  { Session s(options(0)); run(s, a, nullptr); }
  std::vector<fs::path> files = state_files();
  ASSERT_EQ(files.size(), 2u);
  // Another model with the same header and other weights (seed 1): its states are not these.
  Session cold(options(1, 0));
  const GenerateResult rc = run(cold, a, nullptr);
  {
    Session s(options(1));
    const GenerateResult r = run(s, a, nullptr);
    EXPECT_EQ(r.reused_tokens, 0u) << "a state of another model was used";
    EXPECT_EQ(r.tokens, rc.tokens);
    EXPECT_EQ(s.stats().disk_ignored, 2u);
  }
  EXPECT_EQ(state_files().size(), 4u) << "the other model's files were removed";
  // Another build: the first model's files with another version in the header are left alone.
  std::vector<std::vector<uint8_t>> before;
  for (const fs::path& f : files) {
    std::vector<uint8_t> b = slurp(f);
    b[16] = 'X';
    spit(f, b);
    before.push_back(b);
  }
  Session s(options(0));
  const GenerateResult r = run(s, a, nullptr);
  EXPECT_EQ(r.reused_tokens, 0u) << "a state of another build was used";
  const SessionStats st = s.stats();
  EXPECT_EQ(st.disk_ignored, 4u);  // 2 of the other model, 2 of the other build
  for (size_t i = 0; i < files.size(); ++i) EXPECT_EQ(slurp(files[i]), before[i]) << files[i];
  bool said = false;
  for (const std::string& l : log_) said |= l.find("another sluice build") != std::string::npos;
  EXPECT_TRUE(said) << "the ignored files were not mentioned";
}

TEST_F(StateDiskSession, TheBudgetHoldsAndEvictsTheLeastRecentlyUsed) {
  // Room for about three of these states: each prompt adds two.
  const uint64_t one = state_file_bytes(state_shape(Session(options(0, 0)).config(), 256), 60, true);
  {
    // The writer thread still works after generate() returns: wait for it before counting, and
    // end the session (joining the writer) before the directory is removed under it.
    Session s(options(0, 3 * one));
    for (uint32_t k = 0; k < 5; ++k) run(s, request(60, 10 + k), nullptr);
    s.flush_state_disk();
    const SessionStats st = s.stats();
    EXPECT_LE(st.disk_bytes, 3 * one);
    EXPECT_GT(st.disk_evicted, 0u);
    uint64_t on_disk = 0;
    for (const fs::path& f : state_files()) on_disk += fs::file_size(f);
    EXPECT_LE(on_disk, 3 * one);
    EXPECT_EQ(on_disk, st.disk_bytes);
  }
  // Least recently used across restarts (each session reads the order from the files' mtimes):
  // a0 written, b1 written (a0's earlier state evicted), a0 used, c2 written: b1's states go.
  fs::remove_all(states_);
  const GenerateRequest a0 = request(60, 20), b1 = request(60, 21), c2 = request(60, 22);
  for (const GenerateRequest* r : {&a0, &b1, &a0, &c2}) {
    Session t(options(0, 3 * one));
    run(t, *r, nullptr);
  }
  {
    Session t(options(0, 3 * one));
    EXPECT_EQ(run(t, a0, nullptr).reused_tokens, a0.prompt.size()) << "the state used last was evicted";
    EXPECT_EQ(run(t, b1, nullptr).reused_tokens, 0u) << "the least recently used state was kept";
  }
  // A budget below one state writes nothing and says so.
  fs::remove_all(states_);
  Session small(options(0, one / 2));
  run(small, request(60, 1), nullptr);
  small.flush_state_disk();
  EXPECT_EQ(small.stats().disk_written, 0u);
  EXPECT_GE(small.stats().disk_skipped, 1u);
}

// The LRU order across restarts lives in the files' mtimes. The kernel stamps writes with a clock
// that ticks every few milliseconds, so states written or used within one tick would tie and a
// restart could evict the one used last: each write and hit gets its own, later stamp.
TEST_F(StateDiskSession, EachWriteAndHitGetsItsOwnLaterMtime) {
  auto mtime = [](const fs::path& f) {
    struct stat st {};
    EXPECT_EQ(::stat(f.c_str(), &st), 0) << f;
    return (int64_t)st.st_mtim.tv_sec * 1'000'000'000 + st.st_mtim.tv_nsec;
  };
  auto by_size = [&] {  // the state before the prompt's last token, then the prompt end's
    std::vector<fs::path> f = state_files();
    std::sort(f.begin(), f.end(), [](const fs::path& x, const fs::path& y) { return fs::file_size(x) < fs::file_size(y); });
    return f;
  };
  const GenerateRequest a = request(60, 30);
  for (int round = 0; round < 5; ++round) {
    fs::remove_all(states_);
    { Session s(options()); run(s, a, nullptr); }
    const std::vector<fs::path> f = by_size();
    ASSERT_EQ(f.size(), 2u);
    EXPECT_LT(mtime(f[0]), mtime(f[1])) << "two writes share a stamp (round " << round << ")";
  }
  // A hit stamps the file it read later than everything before it.
  const std::vector<fs::path> f = by_size();
  { Session s(options()); ASSERT_EQ(run(s, a, nullptr).reused_tokens, a.prompt.size()); }
  EXPECT_GT(mtime(f[1]), mtime(f[0]));
  // Where the file system keeps coarser times than that, the shorter prefix counts as the older:
  // with room for one, the prompt end's state stays.
  const timespec same[2] = {{1'700'000'000, 0}, {1'700'000'000, 0}};
  for (const fs::path& x : f) ASSERT_EQ(::utimensat(AT_FDCWD, x.c_str(), same, 0), 0);
  Session s(options(0, fs::file_size(f[1])));
  EXPECT_EQ(s.stats().disk_evicted, 1u);
  EXPECT_EQ(run(s, a, nullptr).reused_tokens, a.prompt.size()) << "the shorter state was kept";
}

TEST_F(StateDiskSession, OneDirectoryHasOneOwner) {
  Session s(options());
  try {
    Session t(options());
    FAIL() << "a second session opened a state directory in use";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in use by another sluice"), std::string::npos) << e.what();
  }
  // A path that is a file is refused by name, and nothing is created at it.
  const fs::path f = dir_ / "not-a-dir";
  { std::ofstream(f) << "x"; }
  SessionOptions o = options();
  o.kv_disk_dir = f.string();
  try {
    Session t(o);
    FAIL() << "a file was taken as the state directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a directory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(f), std::vector<uint8_t>{'x'});
}

// Issue 53 finding 6: a directory another user owns or others can write could hold forged
// states, so it is refused at start, naming why; a file in it that others could have written
// is not read (and not deleted: the server did not make it).
TEST_F(StateDiskSession, ADirectoryOrFileOthersCanWriteIsNotTrusted) {
  fs::create_directories(states_);
  ::chmod(states_.c_str(), 0777);
  try {
    Session t(options());
    FAIL() << "a world-writable state directory was used";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("others can write to it (mode 0777"), std::string::npos) << e.what();
  }
  ::chmod(states_.c_str(), 0700);
  const GenerateRequest a = request(40, 5);
  { Session s(options()); run(s, a, nullptr); }
  const std::vector<fs::path> files = state_files();
  ASSERT_EQ(files.size(), 2u);
  for (const fs::path& f : files) ::chmod(f.c_str(), 0666);
  Session s(options());
  EXPECT_EQ(s.stats().disk_ignored, 2u);
  const GenerateResult r = run(s, a, nullptr);
  EXPECT_EQ(r.reused_tokens, 0u) << "a state others could have written was used";
  for (const fs::path& f : files) EXPECT_TRUE(fs::exists(f)) << f;
}

// A state file copied from another server's directory (valid, but signed with that server's
// key) is not used: it could say anything.
TEST_F(StateDiskSession, AFileSignedByAnotherServerIsNotUsed) {
  const GenerateRequest a = request(40, 6);
  const fs::path theirs = states_.string() + "-theirs";
  fs::remove_all(theirs);
  {
    SessionOptions o = options();
    o.kv_disk_dir = theirs.string();
    Session s(o);
    run(s, a, nullptr);
  }
  fs::create_directories(states_);
  { Session s(options()); }  // makes this directory's own key
  for (const auto& e : fs::directory_iterator(theirs))
    if (e.path().extension() == ".sstate") fs::copy_file(e.path(), states_ / e.path().filename());
  fs::remove_all(theirs);
  ASSERT_EQ(state_files().size(), 2u);
  Session cold(options(0, 0));
  const GenerateResult rc = run(cold, a, nullptr);
  Session s(options());
  const GenerateResult r = run(s, a, nullptr);
  EXPECT_EQ(r.reused_tokens, 0u) << "a state signed with another key was used";
  EXPECT_EQ(r.tokens, rc.tokens);
  bool said = false;
  for (const std::string& l : log_) said |= l.find("signature does not verify") != std::string::npos;
  EXPECT_TRUE(said) << "the forged file was not reported";
}

// Issue 53 finding 5: a FIFO put in place of an indexed state file must not block the request
// (open without O_NONBLOCK would wait for a writer forever); the prompt is computed instead.
TEST_F(StateDiskSession, AFifoInPlaceOfAStateFileDoesNotBlock) {
  const GenerateRequest a = request(40, 7);
  { Session s(options()); run(s, a, nullptr); }
  Session cold(options(0, 0));
  const GenerateResult rc = run(cold, a, nullptr);
  Session s(options());  // indexes both files
  std::vector<std::string> fifos;
  for (const fs::path& f : state_files()) {
    fs::remove(f);
    ASSERT_EQ(::mkfifo(f.c_str(), 0600), 0);
    fifos.push_back(f.string());
  }
  auto done = std::async(std::launch::async, [&] { return run(s, a, nullptr); });
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    // Unblock the reader (each FIFO in turn, as a shorter state is tried next) so the test ends.
    while (done.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready)
      for (const std::string& f : fifos) {
        const int fd = ::open(f.c_str(), O_WRONLY | O_NONBLOCK);
        if (fd >= 0) ::close(fd);
      }
    FAIL() << "the request blocked on a FIFO in the state directory";
  }
  const GenerateResult r = done.get();
  EXPECT_EQ(r.reused_tokens, 0u);
  EXPECT_EQ(r.tokens, rc.tokens);
  for (const std::string& f : fifos) EXPECT_TRUE(fs::exists(f)) << "a FIFO the server did not make was removed";
}

// Issue 53 finding 2: a request with a boundary at every token (a 13 KB request of 1,000 markers
// wrote 1,002 state files and prefilled in 1-token pieces) is held to kMaxBoundaries boundaries,
// kMinBoundaryGap apart: at most that many + 2 state files, and its answer unchanged.
TEST_F(StateDiskSession, BoundariesPerRequestAreBounded) {
  GenerateRequest a = request(200, 8);
  for (uint32_t b = 1; b < 200; ++b) a.checkpoint_at.push_back(b);
  Session cold(options(0, 0));
  const GenerateResult rc = run(cold, request(200, 8), nullptr);
  {
    Session s(options());
    const GenerateResult r = run(s, a, nullptr);
    EXPECT_EQ(r.tokens, rc.tokens);
  }
  EXPECT_LE(state_files().size(), kMaxBoundaries + 2u);
  EXPECT_GE(state_files().size(), 3u) << "the boundaries kept were not written";
}

TEST(RequestBoundaries, KeepTheFirstAndTheLastApart) {
  std::vector<uint32_t> every;
  for (uint32_t b = 1; b < 1000; ++b) every.push_back(b);
  const std::vector<uint32_t> kept = bound_boundaries(every);
  ASSERT_EQ(kept.size(), kMaxBoundaries);
  EXPECT_EQ(kept.front(), 1u);
  EXPECT_EQ(kept.back(), 999u);
  for (size_t i = 1; i < kept.size(); ++i) EXPECT_GE(kept[i] - kept[i - 1], kMinBoundaryGap) << i;
  EXPECT_EQ(bound_boundaries({5, 40}), (std::vector<uint32_t>{5, 40}));
  EXPECT_EQ(bound_boundaries({5, 9, 40, 41}), (std::vector<uint32_t>{5, 41}));
  EXPECT_TRUE(bound_boundaries({}).empty());
}

// A dead writer's temporary (".<32 hex>.<pid>.tmp") is removed when the directory is opened, but
// only when it is what a writer leaves: empty, or starting with a state file's magic. A file of
// that name with anything else in it, or a link, is left alone.
TEST_F(StateDiskSession, OnlyADeadWritersOwnTemporariesAreRemoved) {
  fs::create_directories(states_);
  const std::string hex(32, 'a'), dead = ".999999999.tmp";  // above any pid_max: no such process
  const fs::path empty = states_ / ("." + hex + dead), ours = states_ / ("." + std::string(32, 'b') + dead);
  const fs::path other = states_ / ("." + std::string(32, 'c') + dead), link = states_ / ("." + std::string(32, 'd') + dead);
  const fs::path target = dir_ / "link-target";
  { std::ofstream(empty.string()); }
  { std::ofstream(ours.string()) << std::string(kStateMagic, sizeof kStateMagic) << "partial"; }
  { std::ofstream(other.string()) << "somebody's notes"; }
  { std::ofstream(target.string()) << "kept"; }
  fs::create_symlink(target, link);
  { Session s(options()); }
  EXPECT_FALSE(fs::exists(empty));
  EXPECT_FALSE(fs::exists(ours));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(slurp(target), (std::vector<uint8_t>{'k', 'e', 'p', 't'}));
}

}  // namespace
}  // namespace sluice
