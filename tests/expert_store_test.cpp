// The SSD expert store (src/storage) and its ExpertSource adapter (model/streamed_experts.h):
// bytes equal the file's for every cache size, backend and I/O mode; deterministic LRU orders;
// leases; union limits; prefetch accounting and priorities; fault injection and truncation.
// Expected values are computed here from the GGUF tensor records, never by the store.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "model/streamed_experts.h"
#include "storage/expert_store.h"
#include "storage/policy_replay.h"
#include "util/error.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using storage::eviction_kind;
using storage::eviction_name;
using storage::eviction_names;
using storage::eviction_per_layer;
using storage::EvictionKind;
using storage::EvictionPolicy;
using storage::make_policy;
using storage::replay_policy;
using storage::ReplayResult;
using storage::RoutingTrace;
using storage::ExpertStore;
using storage::Lease;
using storage::ReadAttempt;
using storage::ReadFault;
using storage::StoreOptions;

constexpr uint32_t kLayers = 3, kExperts = 8;
constexpr uint64_t kPage = 4096;
const char* kParts[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};

std::string tensor_name(uint32_t L, int p) { return "blk." + std::to_string(L) + "." + kParts[p]; }

uint8_t pattern(uint32_t tensor_id, uint64_t i) {
  uint64_t x = (uint64_t)tensor_id * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  x *= 0x94D049BB133111EBull;
  return (uint8_t)(x >> 32);
}

fs::path test_dir() {
  static const fs::path d = [] {
    fs::path p = fs::temp_directory_path() / ("sluice-expert-store-" + std::to_string(::getpid()));
    fs::create_directories(p);
    return p;
  }();
  static const struct RemoveAtExit {
    fs::path p;
    ~RemoveAtExit() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } remove_at_exit{d};
  return d;
}

// Three layers of expert tensors with slices that are not page aligned and differ per layer
// (tiny Q8_0 slices that share pages, multi-page F32 and I8 slices), plus unrelated tensors in
// between; the file ends right after the last tensor, so the last windows run past EOF.
std::string make_file(const std::string& name) {
  const std::string path = (test_dir() / name).string();
  gguf::Writer w;
  w.add("general.architecture", gguf::Value::str("test"));
  w.add_tensor("head", {100}, GgmlType::I8);
  for (uint32_t L = 0; L < kLayers; ++L) {
    w.add_tensor("blk." + std::to_string(L) + ".other", {33 + L}, GgmlType::I8);
    w.add_tensor(tensor_name(L, 0), {64u * (1 + L % 2), 3, kExperts}, GgmlType::Q8_0);
    w.add_tensor(tensor_name(L, 1), {300 + 4 * L, 5, kExperts}, GgmlType::F32);
    w.add_tensor(tensor_name(L, 2), {1000 + L, 9, kExperts}, GgmlType::I8);
  }
  std::map<std::string, uint32_t> ids;
  for (size_t i = 0; i < w.tensors().size(); ++i) ids[w.tensors()[i].name] = (uint32_t)i;
  w.write(path, [&](const gguf::TensorInfo& t, const gguf::Writer::Sink& sink) {
    std::vector<uint8_t> b(t.nbytes);
    for (uint64_t i = 0; i < t.nbytes; ++i) b[i] = pattern(ids.at(t.name), i);
    sink(b.data(), b.size());
  });
  return path;
}

const std::string& test_file() {
  static const std::string p = make_file("experts.gguf");
  return p;
}

// Expected bytes of one expert, read plainly from the file.
struct Expected {
  std::vector<uint8_t> part[3];
};
Expected expected(const gguf::File& f, uint32_t L, uint32_t e) {
  Expected x;
  for (int p = 0; p < 3; ++p) {
    const gguf::TensorInfo* t = f.find_tensor(tensor_name(L, p));
    const uint64_t slice = t->nbytes / kExperts;
    x.part[p].resize(slice);
    f.read_bytes(*t, e * slice, x.part[p].data(), slice);
  }
  return x;
}

// Bytes one load transfers: the three 4 KiB-aligned windows, clipped at end of file.
uint64_t load_bytes(const gguf::File& f, uint32_t L, uint32_t e) {
  uint64_t total = 0;
  for (int p = 0; p < 3; ++p) {
    const gguf::TensorInfo* t = f.find_tensor(tensor_name(L, p));
    const uint64_t slice = t->nbytes / kExperts, off = t->file_offset + e * slice;
    const uint64_t b = off / kPage * kPage, end = std::min((off + slice + kPage - 1) / kPage * kPage, f.file_size());
    total += end - b;
  }
  return total;
}

uint64_t slot_bytes_expected(const gguf::File& f) {
  uint64_t total = 0;
  for (int p = 0; p < 3; ++p) {
    uint64_t widest = 0;
    for (uint32_t L = 0; L < kLayers; ++L)
      for (uint32_t e = 0; e < kExperts; ++e) {
        const gguf::TensorInfo* t = f.find_tensor(tensor_name(L, p));
        const uint64_t slice = t->nbytes / kExperts, off = t->file_offset + e * slice;
        widest = std::max(widest, (off + slice + kPage - 1) / kPage * kPage - off / kPage * kPage);
      }
    total += widest;
  }
  return total;
}

::testing::AssertionResult same_expert(const gguf::File& f, const Lease& lease, uint32_t L, uint32_t e) {
  const Expected x = expected(f, L, e);
  const storage::ExpertBytes b = lease.get(L, e);
  const uint8_t* got[3] = {b.gate, b.up, b.down};
  for (int p = 0; p < 3; ++p)
    if (std::memcmp(got[p], x.part[p].data(), x.part[p].size()) != 0)
      return ::testing::AssertionFailure() << "layer " << L << " expert " << e << " part " << p << " differs";
  return ::testing::AssertionSuccess();
}

StoreOptions slots_opts(uint32_t slots, EvictionKind k = EvictionKind::LruGlobal) {
  StoreOptions o;
  o.cache_bytes = 1ull << 30;
  o.max_slots = slots;
  o.policy = k;
  o.queue_depth = 4;
  return o;
}

std::vector<uint32_t> ids(std::initializer_list<uint32_t> l) { return l; }

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

// ---------------------------------------------------------------------------------------------

TEST(ExpertStore, BytesEqualTheFileForEveryBackendAndIoMode) {
  const gguf::File f = gguf::File::open(test_file());
  struct Mode {
    bool force_pread, direct;
  };
  for (Mode mode : {Mode{false, true}, Mode{true, true}, Mode{false, false}, Mode{true, false}}) {
    StoreOptions o = slots_opts(kLayers * kExperts);
    o.force_pread = mode.force_pread;
    o.direct_io = mode.direct;
    o.max_read_bytes = kPage;  // several reads per window
    ExpertStore store(f, kLayers, kExperts, o);
    const storage::StoreStats s = store.stats();
    if (mode.force_pread) {
      EXPECT_EQ(s.backend, "pread");
    } else {
      EXPECT_TRUE(s.backend == "io_uring" || has(s.backend_note, "io_uring unavailable")) << s.backend_note;
    }
    if (mode.direct) {
      EXPECT_TRUE(s.direct_io || has(s.direct_io_note, "O_DIRECT")) << s.direct_io_note;
    } else {
      EXPECT_FALSE(s.direct_io);
    }
    std::vector<uint32_t> all(kExperts);
    std::iota(all.begin(), all.end(), 0);
    for (uint32_t L = 0; L < kLayers; ++L) {
      Lease lease = store.acquire(L, all);
      for (uint32_t e = 0; e < kExperts; ++e) EXPECT_TRUE(same_expert(f, lease, L, e)) << s.backend;
    }
  }
}

TEST(ExpertStore, EveryCacheSizeGivesTheSameBytes) {
  const gguf::File f = gguf::File::open(test_file());
  constexpr uint32_t kUnion = 3;
  // A scripted sequence of unions, revisiting experts so that hits, misses and evictions mix.
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>> seq;
  uint64_t x = 12345;
  for (int i = 0; i < 40; ++i) {
    std::vector<uint32_t> u;
    while (u.size() < kUnion) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const uint32_t e = (uint32_t)(x >> 33) % kExperts;
      if (std::find(u.begin(), u.end(), e) == u.end()) u.push_back(e);
    }
    std::sort(u.begin(), u.end());
    seq.push_back({(uint32_t)i % kLayers, u});
  }
  for (EvictionKind k : {EvictionKind::LruPerLayer, EvictionKind::LruGlobal}) {
    const uint32_t min_slots = k == EvictionKind::LruPerLayer ? kLayers * kUnion : kUnion;
    for (uint32_t slots = min_slots; slots <= kLayers * kExperts; ++slots) {
      ExpertStore store(f, kLayers, kExperts, slots_opts(slots, k));
      EXPECT_GE(store.max_union_experts(), kUnion);
      for (const auto& [L, u] : seq) {
        Lease lease = store.acquire(L, u);
        for (uint32_t e : u) ASSERT_TRUE(same_expert(f, lease, L, e)) << "slots " << slots;
      }
      const auto t = store.stats().total();
      EXPECT_EQ(t.hits + t.misses, t.requests);
      EXPECT_EQ(t.requests, seq.size() * kUnion);
      if (slots == kLayers * kExperts) {
        EXPECT_EQ(t.evictions, 0u);
      }
    }
  }
}

TEST(ExpertStore, LruOrderPerLayerAndGlobal) {
  const gguf::File f = gguf::File::open(test_file());
  auto run = [&](EvictionKind k, uint32_t slots) {
    ExpertStore store(f, kLayers, kExperts, slots_opts(slots, k));
    for (auto [L, e] : std::vector<std::pair<uint32_t, uint32_t>>{{0, 0}, {0, 1}, {0, 2}, {1, 0}, {0, 3}, {0, 2}, {0, 4}})
      store.acquire(L, ids({e}));
    return std::make_pair(store.resident(0), store.resident(1));
  };
  // Global LRU, 4 slots: {0,0},{0,1},{0,2},{1,0} fill it; {0,3} evicts (0,0); {0,2} is touched;
  // {0,4} evicts the least recent of all layers, (0,1).
  auto g = run(EvictionKind::LruGlobal, 4);
  EXPECT_EQ(g.first, ids({2, 3, 4}));
  EXPECT_EQ(g.second, ids({0}));
  // Per-layer LRU, 6 slots over 3 layers (2 each): layer 0 never holds more than 2; {0,2}
  // evicts 0, {0,3} evicts 1, touching 2 makes 3 the victim of {0,4}. Layer 1 is unaffected.
  auto p = run(EvictionKind::LruPerLayer, 6);
  EXPECT_EQ(p.first, ids({2, 4}));
  EXPECT_EQ(p.second, ids({0}));
  // Same sequence, same result: eviction depends only on the access sequence.
  EXPECT_EQ(run(EvictionKind::LruGlobal, 4), g);
  EXPECT_EQ(run(EvictionKind::LruPerLayer, 6), p);
  // A union never evicts its own members: (0,1) is the LRU entry when {0,1} arrives, and it is
  // a hit; the missing 0 evicts the next oldest, (0,2).
  {
    ExpertStore store(f, kLayers, kExperts, slots_opts(4));
    for (uint32_t e : {1, 2, 3, 4}) store.acquire(0, ids({e}));
    store.reset_stats();
    store.acquire(0, ids({0, 1}));
    EXPECT_EQ(store.resident(0), ids({0, 1, 3, 4}));
    EXPECT_EQ(store.stats().total().hits, 1u);
  }
  // Per-layer quotas: 7 slots over 3 layers give layer 0 the extra slot.
  ExpertStore store(f, kLayers, kExperts, slots_opts(7, EvictionKind::LruPerLayer));
  EXPECT_EQ(store.max_union_experts(0), 3u);
  EXPECT_EQ(store.max_union_experts(1), 2u);
  EXPECT_EQ(store.max_union_experts(), 2u);
}

// The frequency-aware policy keeps an expert used often through a burst of cold ones, where LRU
// evicts it: layer 0 has 3 slots (9 over 3 layers); expert 0 is used four times, then 1, 2, 3 once
// each. LRU evicts 0 for 3 (it is the least recent) and misses when 0 comes back; LFU evicts 1 (count
// 1, older than 2) and hits.
TEST(ExpertStore, LfuKeepsAHotExpertThatLruEvicts) {
  const gguf::File f = gguf::File::open(test_file());
  auto run = [&](EvictionKind k) {
    ExpertStore store(f, kLayers, kExperts, slots_opts(9, k));
    for (uint32_t e : {0, 0, 0, 0, 1, 2, 3}) store.acquire(0, ids({e}));
    store.reset_stats();
    store.acquire(0, ids({0}));
    return std::make_pair(store.resident(0), store.stats().total().hits);
  };
  const auto lru = run(EvictionKind::LruPerLayer);
  EXPECT_EQ(lru.first, ids({0, 2, 3}));  // 0 was read again, evicting 1
  EXPECT_EQ(lru.second, 0u);
  const auto lfu = run(EvictionKind::LfuPerLayer);
  EXPECT_EQ(lfu.first, ids({0, 2, 3}));  // 0 never left
  EXPECT_EQ(lfu.second, 1u);
  EXPECT_EQ(run(EvictionKind::LfuPerLayer), lfu);  // deterministic
  // Per-layer shares, as lru-per-layer: 7 slots over 3 layers give layer 0 the extra slot.
  ExpertStore store(f, kLayers, kExperts, slots_opts(7, EvictionKind::LfuPerLayer));
  EXPECT_EQ(store.max_union_experts(0), 3u);
  EXPECT_EQ(store.max_union_experts(1), 2u);
}

// Aging: counts halve every 8 x share accesses of a layer (16 here), so an entry that was hot long
// ago loses to one in use now. Slot 0 is used 40 times (halved at 16 and 32: count 20), then slot 1
// alone: halved again at access 48 (10 against 4), slot 1 reaches 10 at its 14th use and the tie
// goes to the least recent, slot 0. Without aging it would take 40 (tested by breaking it once).
TEST(EvictionPolicy, LfuAgingLetsAStaleHotEntryGo) {
  auto p = make_policy(EvictionKind::LfuPerLayer, 2, 1, 8);
  const auto all = [](uint32_t) { return true; };
  EXPECT_EQ(p->choose(0, true, all), EvictionPolicy::kFree);
  p->inserted(0, 0);
  for (int i = 1; i < 40; ++i) p->touched(0);
  p->inserted(1, 0);
  uint32_t uses = 1;
  while (p->choose(0, false, all) == 1 && uses < 100) {
    p->touched(1);
    ++uses;
  }
  EXPECT_EQ(uses, 14u);
  EXPECT_EQ(p->choose(0, false, all), 0);
  EXPECT_EQ(p->choose(0, false, [](uint32_t s) { return s != 0; }), 1);  // a leased entry is skipped
  EXPECT_EQ(p->choose(0, false, [](uint32_t) { return false; }), EvictionPolicy::kNone);
}

TEST(EvictionPolicy, NamesRoundTrip) {
  for (std::string_view n : eviction_names()) {
    ASSERT_TRUE(eviction_kind(n).has_value()) << n;
    EXPECT_EQ(eviction_name(*eviction_kind(n)), n);
  }
  EXPECT_EQ(eviction_names().size(), 3u);
  EXPECT_FALSE(eviction_kind("lru").has_value());
  EXPECT_TRUE(eviction_per_layer(EvictionKind::LfuPerLayer));
  EXPECT_FALSE(eviction_per_layer(EvictionKind::LruGlobal));
}

// bench_routing's cache figures replay a trace through the policy objects alone
// (storage/policy_replay.h): they must count exactly the hits the store itself counts for the same
// acquires, for every policy and cache size.
TEST(ExpertStore, PolicyReplayCountsTheStoresHits) {
  const gguf::File f = gguf::File::open(test_file());
  RoutingTrace trace;
  uint64_t x = 12345;
  for (int t = 0; t < 120; ++t) {
    std::vector<std::vector<uint32_t>> tok;
    for (uint32_t L = 0; L < kLayers; ++L) {
      std::vector<uint32_t> sel;
      while (sel.size() < 2) {  // skewed: low ids more often, as a trained router's are
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const uint32_t e = (uint32_t)(((x >> 33) % 64) * ((x >> 17) % 64) / 512) % kExperts;
        if (std::find(sel.begin(), sel.end(), e) == sel.end()) sel.push_back(e);
      }
      tok.push_back(sel);
    }
    trace.push_back(tok);
  }
  for (EvictionKind k : {EvictionKind::LruPerLayer, EvictionKind::LruGlobal, EvictionKind::LfuPerLayer})
    for (uint32_t slots : {6u, 9u, 13u, 24u}) {
      ExpertStore store(f, kLayers, kExperts, slots_opts(slots, k));
      for (const auto& tok : trace)
        for (uint32_t L = 0; L < kLayers; ++L) {
          std::vector<uint32_t> u = tok[L];
          std::sort(u.begin(), u.end());
          store.acquire(L, u);  // the lease ends here, as replay's does
        }
      const ReplayResult r = replay_policy(k, slots, kLayers, kExperts, trace);
      ASSERT_TRUE(r.feasible);
      EXPECT_EQ(r.requests, store.stats().total().requests) << eviction_name(k) << " " << slots;
      EXPECT_EQ(r.hits, store.stats().total().hits) << eviction_name(k) << " " << slots;
    }
  // A layer share below one token's experts: the store refuses it, the replay says so.
  EXPECT_FALSE(replay_policy(EvictionKind::LruPerLayer, 5, kLayers, kExperts, trace).feasible);
}

TEST(ExpertStore, LeasedEntriesAreNeverEvicted) {
  const gguf::File f = gguf::File::open(test_file());
  ExpertStore store(f, kLayers, kExperts, slots_opts(4));
  Lease a = store.acquire(0, ids({0, 1}));
  Lease b = store.acquire(1, ids({5, 6}));
  // Every slot is leased: a third user gets a clear error, and nothing leased moves.
  const std::string err = error_of([&] { store.acquire(2, ids({0})); });
  EXPECT_TRUE(has(err, "leased")) << err;
  EXPECT_TRUE(same_expert(f, a, 0, 0));
  EXPECT_TRUE(same_expert(f, a, 0, 1));
  EXPECT_TRUE(same_expert(f, b, 1, 5));
  EXPECT_TRUE(same_expert(f, b, 1, 6));
  EXPECT_TRUE(store.resident(2).empty());
  b.release();
  Lease c = store.acquire(2, ids({0, 3}));  // evicts layer 1's entries, never layer 0's
  EXPECT_EQ(store.resident(0), ids({0, 1}));
  EXPECT_TRUE(store.resident(1).empty());
  EXPECT_TRUE(same_expert(f, a, 0, 1));
  EXPECT_TRUE(same_expert(f, c, 2, 3));
  EXPECT_THROW(c.get(2, 1), Error);
  EXPECT_THROW(c.get(0, 0), Error);
}

// acquire_resident leases only the experts resident at the call (the file's bytes), reads none of
// the others, and holds what it leased like any lease: never evicted while held.
TEST(ExpertStore, AcquireResidentLeasesOnlyResidentExpertsAndReadsNothing) {
  const gguf::File f = gguf::File::open(test_file());
  ExpertStore store(f, kLayers, kExperts, slots_opts(4));
  store.acquire(0, ids({1, 3})).release();
  const uint64_t reads = store.stats().total().reads;
  Lease r = store.acquire_resident(0, ids({0, 1, 2, 3}));
  EXPECT_EQ(std::vector<uint32_t>(r.experts().begin(), r.experts().end()), ids({1, 3}));
  EXPECT_TRUE(same_expert(f, r, 0, 1));
  EXPECT_TRUE(same_expert(f, r, 0, 3));
  EXPECT_THROW(r.get(0, 0), Error);
  EXPECT_EQ(store.stats().total().reads, reads) << "acquire_resident read an expert";
  EXPECT_EQ(store.resident(0), ids({1, 3}));
  EXPECT_TRUE(store.acquire_resident(1, ids({0, 1})).empty());
  // The other two slots, then none: what r holds is leased, so a third user is refused.
  Lease b = store.acquire(1, ids({5, 6}));
  const std::string err = error_of([&] { store.acquire(2, ids({0})); });
  EXPECT_TRUE(has(err, "leased")) << err;
  EXPECT_TRUE(same_expert(f, r, 0, 1));
  r.release();
  Lease c = store.acquire(2, ids({0}));  // r's slots are free again
  EXPECT_TRUE(same_expert(f, c, 2, 0));
  EXPECT_THROW(store.acquire_resident(0, ids({3, 1})), Error);  // not ascending
  EXPECT_THROW(store.acquire_resident(kLayers, ids({0})), Error);
}

TEST(ExpertStore, AnAcquireThatRunsOutOfSlotsMidwayLeavesCompleteEntries) {
  const gguf::File f = gguf::File::open(test_file());
  ExpertStore store(f, kLayers, kExperts, slots_opts(4));
  Lease a = store.acquire(0, ids({0, 1, 2}));
  // Expert 3 takes the last free slot and starts loading; expert 4 finds every slot leased.
  const std::string err = error_of([&] { store.acquire(1, ids({3, 4})); });
  EXPECT_TRUE(has(err, "leased")) << err;
  store.wait_idle();  // the started load completes and becomes an ordinary, unleased entry
  EXPECT_EQ(store.resident(1), ids({3}));
  Lease b = store.acquire(1, ids({3}));
  EXPECT_TRUE(same_expert(f, b, 1, 3));
  EXPECT_EQ(store.stats().layers[1].hits, 1u);
}

TEST(ExpertStore, UnionThatDoesNotFitThrowsAndLeavesTheStoreUsable) {
  const gguf::File f = gguf::File::open(test_file());
  ExpertStore store(f, kLayers, kExperts, slots_opts(6, EvictionKind::LruPerLayer));
  ASSERT_EQ(store.max_union_experts(), 2u);
  Lease l = store.acquire(1, ids({1, 2}));
  const auto before = store.stats().total();
  const std::string err = error_of([&] { store.acquire(1, ids({3, 4, 5})); });
  EXPECT_TRUE(has(err, "reduce the chunk size")) << err;
  EXPECT_TRUE(has(err, "layer 1")) << err;
  const auto after = store.stats().total();
  EXPECT_EQ(after.requests, before.requests);
  EXPECT_EQ(store.resident(1), ids({1, 2}));
  EXPECT_TRUE(same_expert(f, l, 1, 2));
  l.release();
  Lease m = store.acquire(1, ids({3, 4}));
  EXPECT_TRUE(same_expert(f, m, 1, 4));
  // Bad ids are errors too, not aborts.
  EXPECT_THROW(store.acquire(1, ids({4, 3})), Error);
  EXPECT_THROW(store.acquire(1, ids({3, 3})), Error);
  EXPECT_THROW(store.acquire(1, ids({kExperts})), Error);
  EXPECT_THROW(store.acquire(kLayers, ids({0})), Error);

  // Through the ExpertSource adapter a union larger than the layer's share streams in windows of
  // one (half the share): each expert's bytes are right, going back is refused, an expert not in
  // the union is refused, and the next prepare works.
  m.release();
  StreamedExperts src(store);
  src.prepare(0, ids({0, 7}));
  EXPECT_EQ(src.window(), 2u);
  EXPECT_NE(src.get(0, 7).down, nullptr);
  src.prepare(0, ids({1, 2, 3}));
  EXPECT_EQ(src.window(), 1u);
  for (uint32_t e : {1u, 2u, 3u}) {
    const Expected want = expected(f, 0, e);
    EXPECT_EQ(std::memcmp(src.get(0, e).gate, want.part[0].data(), want.part[0].size()), 0) << e;
  }
  EXPECT_TRUE(has(error_of([&] { src.get(0, 1); }), "ascending order"));
  EXPECT_THROW(src.get(0, 7), Error);
  src.prepare(2, ids({5, 6}));
  const Expected x = expected(f, 2, 6);
  EXPECT_EQ(std::memcmp(src.get(2, 6).up, x.part[1].data(), x.part[1].size()), 0);
}

TEST(ExpertStore, BudgetIsComputedBeforeAllocation) {
  const gguf::File f = gguf::File::open(test_file());
  const uint64_t slot = slot_bytes_expected(f);
  StoreOptions o;
  o.cache_bytes = slot * 10 + slot / 2;
  o.policy = EvictionKind::LruGlobal;
  const storage::StoreBudget b = storage::bytes_needed(storage::expert_geometry(f, kLayers, kExperts), o);
  EXPECT_EQ(b.slot_bytes, slot);
  EXPECT_EQ(b.slot_bytes % kPage, 0u);
  EXPECT_EQ(b.slots, 10u);
  EXPECT_EQ(b.cache_bytes, slot * 10);
  EXPECT_EQ(b.bounce_bytes, 0u);
  EXPECT_EQ(b.total, b.cache_bytes + b.bounce_bytes + b.metadata_bytes);
  EXPECT_EQ(b.max_union_experts, kExperts);
  ExpertStore store(f, kLayers, kExperts, o);
  EXPECT_EQ(store.budget().total, b.total);
  EXPECT_EQ(store.stats().slots, 10u);
  o.policy = EvictionKind::LruPerLayer;
  EXPECT_EQ(storage::bytes_needed(storage::expert_geometry(f, kLayers, kExperts), o).max_union_experts, 3u);
  // Too small for one expert per layer: a clear error naming the sizes.
  o.cache_bytes = slot * 2;
  const std::string err = error_of([&] { ExpertStore s(f, kLayers, kExperts, o); });
  EXPECT_TRUE(has(err, "too small")) << err;
  EXPECT_TRUE(has(err, std::to_string(slot))) << err;
  o.max_read_bytes = 1000;
  EXPECT_THROW(storage::bytes_needed(storage::expert_geometry(f, kLayers, kExperts), o), Error);
  EXPECT_THROW(storage::expert_geometry(f, kLayers + 1, kExperts), Error);  // missing tensors
  EXPECT_THROW(storage::expert_geometry(f, kLayers, kExperts + 1), Error);  // wrong expert count
}

TEST(ExpertStore, StatsAddUp) {
  const gguf::File f = gguf::File::open(test_file());
  StoreOptions o = slots_opts(kLayers * kExperts);
  o.max_read_bytes = kPage;
  ExpertStore store(f, kLayers, kExperts, o);
  std::map<std::pair<uint32_t, uint32_t>, int> seen;
  uint64_t requests = 0, bytes = 0;
  auto use = [&](uint32_t L, std::vector<uint32_t> u) {
    store.acquire(L, u);
    for (uint32_t e : u) {
      ++requests;
      if (seen[{L, e}]++ == 0) bytes += load_bytes(f, L, e);
    }
  };
  use(0, {0, 1, 2});
  use(0, {1, 2, 3});
  use(2, {7});
  use(1, {0, 7});
  use(2, {6, 7});
  use(0, {0, 1, 2, 3});
  const storage::StoreStats s = store.stats();
  const auto t = s.total();
  EXPECT_EQ(t.requests, requests);
  EXPECT_EQ(t.misses, seen.size());
  EXPECT_EQ(t.hits, requests - seen.size());
  EXPECT_EQ(t.hits + t.misses, t.requests);
  EXPECT_EQ(t.bytes_demand, bytes);
  EXPECT_EQ(t.bytes_prefetch, 0u);
  EXPECT_EQ(t.reads, t.latency.count);
  EXPECT_GE(t.reads * kPage, bytes);  // reads of at most one page each
  EXPECT_EQ(t.read_errors, 0u);
  EXPECT_EQ(s.slots_used, seen.size());
  EXPECT_EQ(s.layers[0].requests, 3u + 3 + 4);
  EXPECT_EQ(s.layers[0].misses, 4u);
  EXPECT_EQ(s.layers[2].hits, 1u);
  uint64_t buckets = 0;
  for (uint64_t c : t.latency.buckets) buckets += c;
  EXPECT_EQ(buckets, t.latency.count);
  EXPECT_GE(t.latency.sum_ns, t.latency.max_ns);
  EXPECT_TRUE(has(s.summary(), "requests " + std::to_string(requests))) << s.summary();
  store.reset_stats();
  EXPECT_EQ(store.stats().total().requests, 0u);
}

// ---------------------------------------------------------------------------------------------
// Prefetch

TEST(ExpertStore, HintedExpertsArriveAsHitsWithinTheBudget) {
  const gguf::File f = gguf::File::open(test_file());
  StoreOptions o = slots_opts(kLayers * kExperts);
  o.prefetch_budget_bytes = 1ull << 30;
  ExpertStore store(f, kLayers, kExperts, o);
  store.hint(1, ids({3, 0, 2, 0, 1}));  // any order, duplicates ignored
  store.wait_idle();
  EXPECT_EQ(store.resident(1), ids({0, 1, 2, 3}));
  Lease l = store.acquire(1, ids({0, 1, 2, 3, 4}));
  for (uint32_t e = 0; e < 5; ++e) EXPECT_TRUE(same_expert(f, l, 1, e));
  auto t = store.stats().total();
  EXPECT_EQ(t.prefetch_issued, 4u);
  EXPECT_EQ(t.prefetch_used, 4u);
  EXPECT_EQ(t.hits, 4u);
  EXPECT_EQ(t.misses, 1u);
  uint64_t pf = 0;
  for (uint32_t e = 0; e < 4; ++e) pf += load_bytes(f, 1, e);
  EXPECT_EQ(t.bytes_prefetch, pf);
  EXPECT_EQ(t.bytes_demand, load_bytes(f, 1, 4));

  // Budget: only what fits in flight at once is issued; the rest is dropped, not queued.
  StoreOptions small = slots_opts(kLayers * kExperts);
  small.prefetch_budget_bytes = load_bytes(f, 2, 0);
  small.queue_depth = 1;
  ExpertStore s2(f, kLayers, kExperts, small);
  s2.hint(2, ids({0, 1, 2, 3}));
  auto t2 = s2.stats().total();
  EXPECT_EQ(t2.prefetch_issued, 1u);
  EXPECT_EQ(t2.prefetch_dropped, 3u);
  s2.wait_idle();
  // Without a budget hints do nothing.
  ExpertStore s3(f, kLayers, kExperts, slots_opts(kLayers * kExperts));
  s3.hint(0, ids({1}));
  s3.wait_idle();
  EXPECT_TRUE(s3.resident(0).empty());
  EXPECT_THROW(s3.hint(0, ids({kExperts})), Error);
}

TEST(ExpertStore, WrongHintsCostOnlyIoAndNeverTakeLeasedSlots) {
  const gguf::File f = gguf::File::open(test_file());
  StoreOptions o = slots_opts(4);
  o.prefetch_budget_bytes = 1ull << 30;
  ExpertStore store(f, kLayers, kExperts, o);
  Lease a = store.acquire(0, ids({0, 1, 2}));
  store.hint(1, ids({0, 1, 2, 3}));  // one free slot: one issued, the rest dropped
  store.wait_idle();
  auto t = store.stats().total();
  EXPECT_EQ(t.prefetch_issued, 1u);
  EXPECT_EQ(t.prefetch_dropped, 3u);
  EXPECT_EQ(store.resident(0), ids({0, 1, 2}));
  for (uint32_t e = 0; e < 3; ++e) EXPECT_TRUE(same_expert(f, a, 0, e));
  a.release();
  // The guess was wrong: layer 1 needs other experts. The unused prefetch is evicted (wasted).
  Lease b = store.acquire(1, ids({4, 5, 6, 7}));
  for (uint32_t e = 4; e < 8; ++e) EXPECT_TRUE(same_expert(f, b, 1, e));
  t = store.stats().total();
  EXPECT_EQ(t.prefetch_wasted, 1u);
  EXPECT_EQ(t.prefetch_used, 0u);
}

TEST(ExpertStore, DemandReadsGoFirstAndJoinPrefetchesInFlight) {
  const gguf::File f = gguf::File::open(test_file());
  std::vector<uint32_t> all(kExperts);
  std::iota(all.begin(), all.end(), 0);
  uint64_t prefetch_bytes = 0;
  for (uint32_t e = 0; e < kExperts; ++e) prefetch_bytes += load_bytes(f, 2, e);
  // Whether the last hinted expert is still queued when its demand arrives depends on timing
  // (a descheduled test thread could let all prefetches finish first), so a few fresh tries.
  uint64_t joins = 0;
  for (int attempt = 0; attempt < 5 && joins == 0; ++attempt) {
    std::mutex mu;
    std::vector<std::pair<bool, uint32_t>> order;  // (prefetch, expert) per completed read
    StoreOptions o = slots_opts(kLayers * kExperts);
    o.prefetch_budget_bytes = 1ull << 30;
    o.queue_depth = 1;
    o.max_read_bytes = kPage;
    o.fault_injector = [&](const ReadAttempt& a) {
      std::lock_guard<std::mutex> g(mu);
      order.push_back({a.prefetch, a.layer * 100 + a.expert});
      return ReadFault::ok();
    };
    ExpertStore store(f, kLayers, kExperts, o);
    store.hint(2, all);
    Lease l = store.acquire(0, ids({5}));  // a miss while layer 2's prefetch is queued
    {
      std::lock_guard<std::mutex> g(mu);
      // The demand's reads ran back to back: no prefetch read started once they were queued.
      size_t first = order.size(), last = 0;
      for (size_t i = 0; i < order.size(); ++i) {
        if (!order[i].first) {
          first = std::min(first, i);
          last = i;
        }
      }
      ASSERT_LT(first, order.size());
      for (size_t i = first; i <= last; ++i) EXPECT_FALSE(order[i].first) << i;
    }
    EXPECT_TRUE(same_expert(f, l, 0, 5));
    // A demand for the last hinted expert joins its prefetch if that is still queued or running.
    Lease j = store.acquire(2, ids({kExperts - 1}));
    EXPECT_TRUE(same_expert(f, j, 2, kExperts - 1));
    store.wait_idle();
    auto t = store.stats().total();
    EXPECT_EQ(t.hits + t.misses, t.requests);
    EXPECT_EQ(t.prefetch_issued, kExperts);
    EXPECT_EQ(t.bytes_prefetch, prefetch_bytes);  // nothing read twice
    EXPECT_EQ(t.bytes_demand, load_bytes(f, 0, 5));
    EXPECT_EQ(t.prefetch_used, 1u);
    EXPECT_EQ(t.joined + t.hits, 1u);
    joins += t.joined;
  }
  EXPECT_GE(joins, 1u);
}

// ---------------------------------------------------------------------------------------------
// Faults

uint64_t slice_offset(const gguf::File& f, uint32_t L, int p, uint32_t e) {
  const gguf::TensorInfo* t = f.find_tensor(tensor_name(L, p));
  return t->file_offset + e * (t->nbytes / kExperts);
}

TEST(ExpertStoreFaults, IoErrorNamesTensorExpertAndOffsetAndTheNextRequestWorks) {
  const gguf::File f = gguf::File::open(test_file());
  for (bool pread : {false, true}) {
    std::atomic<bool> broken{true};
    StoreOptions o = slots_opts(kLayers * kExperts);
    o.force_pread = pread;
    o.fault_injector = [&](const ReadAttempt& a) {
      return broken && a.layer == 1 && a.expert == 3 && a.part == 1 ? ReadFault::fail(EIO) : ReadFault::ok();
    };
    ExpertStore store(f, kLayers, kExperts, o);
    const std::string err = error_of([&] { store.acquire(1, ids({2, 3, 4})); });
    EXPECT_TRUE(has(err, "blk.1.ffn_up_exps.weight")) << err;
    EXPECT_TRUE(has(err, "expert 3")) << err;
    EXPECT_TRUE(has(err, "file offset " + std::to_string(slice_offset(f, 1, 1, 3)))) << err;
    EXPECT_TRUE(has(err, std::strerror(EIO))) << err;
    // Nothing half-filled is visible; the good neighbours are complete entries.
    const std::vector<uint32_t> r = store.resident(1);
    EXPECT_TRUE(std::find(r.begin(), r.end(), 3u) == r.end());
    Lease ok = store.acquire(1, ids({2, 4}));
    EXPECT_TRUE(same_expert(f, ok, 1, 2));
    EXPECT_TRUE(same_expert(f, ok, 1, 4));
    // Still broken: fails again, cleanly.
    EXPECT_THROW(store.acquire(1, ids({3})), Error);
    broken = false;
    Lease fixed = store.acquire(1, ids({3}));
    EXPECT_TRUE(same_expert(f, fixed, 1, 3));
    // A failed load's slot is freed once its other reads have drained (asynchronously).
    store.wait_idle();
    const storage::StoreStats s = store.stats();
    EXPECT_EQ(s.layers[1].read_errors, 2u);
    EXPECT_TRUE(has(s.last_error, "blk.1.ffn_up_exps.weight"));
    EXPECT_EQ(s.slots_used, 3u);  // failed loads gave their slots back
  }
}

TEST(ExpertStoreFaults, OneEioIsRetried) {
  const gguf::File f = gguf::File::open(test_file());
  StoreOptions o = slots_opts(kLayers * kExperts);
  o.fault_injector = [&](const ReadAttempt& a) {
    return a.attempt == 0 && a.part == 2 ? ReadFault::fail(EIO) : ReadFault::ok();
  };
  ExpertStore store(f, kLayers, kExperts, o);
  Lease l = store.acquire(0, ids({0, 6}));
  EXPECT_TRUE(same_expert(f, l, 0, 0));
  EXPECT_TRUE(same_expert(f, l, 0, 6));
  const auto t = store.stats().total();
  EXPECT_EQ(t.retries, 2u);
  EXPECT_EQ(t.read_errors, 0u);
  EXPECT_EQ(t.bytes_demand, load_bytes(f, 0, 0) + load_bytes(f, 0, 6));
}

TEST(ExpertStoreFaults, ShortReadsContinueAndEndOfFileIsAnError) {
  const gguf::File f = gguf::File::open(test_file());
  for (bool direct : {true, false}) {
    // A short read stops after 100 bytes (unaligned): the remainder is read where it stopped.
    StoreOptions o = slots_opts(kLayers * kExperts);
    o.direct_io = direct;
    o.fault_injector = [&](const ReadAttempt& a) {
      return a.attempt == 0 ? ReadFault::short_read(100) : ReadFault::ok();
    };
    ExpertStore store(f, kLayers, kExperts, o);
    Lease l = store.acquire(2, ids({1, 7}));
    EXPECT_TRUE(same_expert(f, l, 2, 1));
    EXPECT_TRUE(same_expert(f, l, 2, 7));
    EXPECT_EQ(store.stats().total().bytes_demand, load_bytes(f, 2, 1) + load_bytes(f, 2, 7));

    // A read that returns 0 before the slice ends means the file is truncated.
    std::atomic<bool> eof{true};
    StoreOptions e = slots_opts(kLayers * kExperts);
    e.direct_io = direct;
    e.fault_injector = [&](const ReadAttempt& a) {
      return eof && a.layer == 0 && a.expert == 4 && a.part == 0 ? ReadFault::short_read(0) : ReadFault::ok();
    };
    ExpertStore s2(f, kLayers, kExperts, e);
    const std::string err = error_of([&] { s2.acquire(0, ids({4})); });
    EXPECT_TRUE(has(err, "truncated")) << err;
    EXPECT_TRUE(has(err, "blk.0.ffn_gate_exps.weight expert 4")) << err;
    EXPECT_TRUE(has(err, "file offset " + std::to_string(slice_offset(f, 0, 0, 4)))) << err;
    eof = false;
    Lease l2 = s2.acquire(0, ids({4}));
    EXPECT_TRUE(same_expert(f, l2, 0, 4));
  }
}

TEST(ExpertStoreFaults, TruncatedFileGivesAClearErrorForTheMissingExpertsOnly) {
  const std::string path = make_file("truncated.gguf");
  const gguf::File f = gguf::File::open(path);
  // Cut the file in the middle of expert 5 of the last layer's down tensor.
  const uint64_t cut = slice_offset(f, kLayers - 1, 2, 5) + 100;
  StoreOptions o = slots_opts(kLayers * kExperts);
  ExpertStore store(f, kLayers, kExperts, o);
  ASSERT_EQ(::truncate(path.c_str(), (off_t)cut), 0);
  const std::string err = error_of([&] { store.acquire(kLayers - 1, ids({5, 6})); });
  EXPECT_TRUE(has(err, "truncated")) << err;
  EXPECT_TRUE(has(err, tensor_name(kLayers - 1, 2))) << err;
  EXPECT_TRUE(has(err, "expert 5") || has(err, "expert 6")) << err;
  // Experts wholly before the cut still load, and the failed ones stay out of the cache.
  std::vector<uint8_t> want(f.find_tensor(tensor_name(kLayers - 1, 2))->nbytes / kExperts);
  Lease l = store.acquire(kLayers - 1, ids({0, 4}));
  const storage::ExpertBytes b = l.get(kLayers - 1, 4);
  ASSERT_EQ(::pread(f.fd(), want.data(), want.size(), (off_t)slice_offset(f, kLayers - 1, 2, 4)), (ssize_t)want.size());
  EXPECT_EQ(std::memcmp(b.down, want.data(), want.size()), 0);
  const std::vector<uint32_t> r = store.resident(kLayers - 1);
  EXPECT_EQ(r, ids({0, 4}));
}

TEST(ExpertStoreFaults, DirectIoRefusedFallsBackToBufferedReads) {
  const gguf::File f = gguf::File::open(test_file());
  StoreOptions o = slots_opts(kLayers * kExperts);
  o.fault_injector = [&](const ReadAttempt& a) { return a.direct ? ReadFault::fail(EINVAL) : ReadFault::ok(); };
  ExpertStore store(f, kLayers, kExperts, o);
  Lease l = store.acquire(1, ids({0, 1, 2, 3, 4, 5, 6, 7}));
  for (uint32_t e = 0; e < kExperts; ++e) EXPECT_TRUE(same_expert(f, l, 1, e));
  const storage::StoreStats s = store.stats();
  EXPECT_FALSE(s.direct_io);
  EXPECT_TRUE(has(s.direct_io_note, "O_DIRECT")) << s.direct_io_note;
  EXPECT_EQ(s.total().read_errors, 0u);
}

TEST(ExpertStoreFaults, FailedPrefetchIsInvisibleAndDemandRereads) {
  const gguf::File f = gguf::File::open(test_file());
  std::atomic<bool> broken{true};
  StoreOptions o = slots_opts(kLayers * kExperts);
  o.prefetch_budget_bytes = 1ull << 30;
  o.fault_injector = [&](const ReadAttempt& a) {
    return broken && a.prefetch ? ReadFault::fail(EIO) : ReadFault::ok();
  };
  ExpertStore store(f, kLayers, kExperts, o);
  store.hint(2, ids({1, 2}));
  store.wait_idle();
  EXPECT_TRUE(store.resident(2).empty());
  EXPECT_EQ(store.stats().total().read_errors, 2u);
  broken = false;
  Lease l = store.acquire(2, ids({1, 2}));
  EXPECT_TRUE(same_expert(f, l, 2, 1));
  EXPECT_TRUE(same_expert(f, l, 2, 2));
}

// ---------------------------------------------------------------------------------------------
// With a real generated model: the streamed source equals the resident weights, and the forward
// pass gives the same logits whichever it uses.

TEST(ExpertStoreModel, StreamedExpertsMatchResidentWeightsAndLogits) {
  const std::string path = (test_dir() / "tiny.gguf").string();
  const std::string cmd = std::string(SLUICE_BINARY) + " make-model --preset tiny -o " + path + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::unique_ptr<Model> m = load_model(path);
  const ModelConfig& c = model_config(*m);
  const ExpertSource& resident = resident_expert_source(*m);
  StoreOptions o;
  o.policy = EvictionKind::LruGlobal;
  o.cache_bytes = 0;
  {
    // The smallest cache that still holds one token's experts (num_experts_per_tok).
    storage::StoreOptions probe;
    probe.max_slots = 1;
    const storage::StoreBudget b =
        storage::bytes_needed(storage::expert_geometry(m->file, c.num_hidden_layers, c.n_routed_experts), probe);
    o.cache_bytes = b.slot_bytes * c.num_experts_per_tok;
  }
  std::unique_ptr<storage::ExpertStore> store = open_expert_store(*m, o);
  ASSERT_EQ(store->max_union_experts(), c.num_experts_per_tok);
  StreamedExperts streamed(*store);
  for (uint32_t L = 0; L < c.num_hidden_layers; ++L) {
    const ExpertLayout& lay = m->layers[L].experts;
    for (uint32_t e0 = 0; e0 < c.n_routed_experts; e0 += c.num_experts_per_tok) {
      std::vector<uint32_t> u;
      for (uint32_t e = e0; e < std::min(c.n_routed_experts, e0 + c.num_experts_per_tok); ++e) u.push_back(e);
      streamed.prepare(L, u);
      for (uint32_t e : u) {
        const ExpertWeights a = resident.get(L, e), b = streamed.get(L, e);
        ASSERT_EQ(std::memcmp(a.gate, b.gate, lay.gate_bytes), 0) << L << " " << e;
        ASSERT_EQ(std::memcmp(a.up, b.up, lay.up_bytes), 0) << L << " " << e;
        ASSERT_EQ(std::memcmp(a.down, b.down, lay.down_bytes), 0) << L << " " << e;
      }
    }
  }
  streamed.release();

  // Decode-sized chunks (one token each) fit the minimal cache; compare logits bit for bit.
  std::vector<uint32_t> toks;
  for (uint32_t i = 0; i < 6; ++i) toks.push_back((i * 7919u + 3) % c.vocab_size);
  auto logits_of = [&](const ExpertSource* src) {
    EngineOptions eo;
    eo.ctx = 64;
    eo.chunk = 1;
    eo.experts = src;
    Engine eng(*m, eo);
    SequenceState s = eng.new_sequence();
    std::vector<float> out(toks.size() * (size_t)c.vocab_size);
    eng.eval(s, toks, out.data());
    return out;
  };
  const std::vector<float> want = logits_of(nullptr);
  const std::vector<float> got = logits_of(&streamed);
  ASSERT_EQ(want.size(), got.size());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
  EXPECT_GT(store->stats().total().evictions, 0u);

  // A larger chunk routes to more experts than the minimal cache holds: they stream through it
  // in windows, with the same logits.
  if (c.n_routed_experts > c.num_experts_per_tok) {
    EngineOptions eo;
    eo.ctx = 64;
    eo.chunk = 6;
    eo.experts = &streamed;
    Engine eng(*m, eo);
    SequenceState s = eng.new_sequence();
    std::vector<float> out(toks.size() * (size_t)c.vocab_size);
    eng.eval(s, toks, out.data());
    EXPECT_EQ(out, want);
  }
  EXPECT_EQ(logits_of(&streamed), want);
}

}  // namespace
}  // namespace sluice
