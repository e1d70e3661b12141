// Memory admission (src/runtime/admission.*, meminfo.*) and `sluice plan`.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/gguf.h"
#include "model/deepseek41/config.h"
#include "model/deepseek41/forward_workspace.h"
#include "model/deepseek41/forward.h"
#include "synth/generate.h"
#include "model/model.h"
#include "model/deepseek41/schema.h"
#include "synth/vocab.h"
#include "runtime/admission.h"
#include "runtime/state_disk.h"
#include "model/deepseek41/engine_footprint.h"
#include "runtime/meminfo.h"
#include "util/error.h"

#include "test_util.h"

namespace fs = std::filesystem;
using namespace sluice;
using sluice::test::CmdResult;
using sluice::test::q;
using sluice::test::run_sluice;
using sluice::test::TempDir;

namespace {

constexpr uint64_t GiB = 1ull << 30, MiB = 1ull << 20;
constexpr const char* kTmpPrefix = "sluice_admission_test";

// A host with plenty of memory and no swap, so plans do not depend on the test machine.
HostFacts quiet_host() {
  HostFacts h;
  h.mem.total = 512 * GiB;
  h.mem.available = 500 * GiB;
  h.mem.has_available = true;
  return h;
}

const ModelFootprint& published_footprint() {
  static const ModelFootprint fp = [] {
    const ModelConfig c = published_config();
    return footprint_from_specs(c, deepseek41_tensors(c));
  }();
  return fp;
}

PlanOptions published_options(uint64_t budget, uint32_t ctx = 131072) {
  PlanOptions o;
  o.ctx = ctx;
  o.threads = 4;
  o.budget = BudgetSpec{false, budget};
  return o;
}

const PlanLine* line_named(const Plan& p, const std::string& name) {
  for (const PlanLine& l : p.mandatory)
    if (l.name == name) return &l;
  return nullptr;
}

}  // namespace

TEST(AdmissionBytes, ParsesSizesWithUnits) {
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("0"), 0u);
  EXPECT_EQ(parse_bytes("116GiB"), 116ull * 1024 * 1024 * 1024);
  EXPECT_EQ(parse_bytes("116G"), 116ull * 1024 * 1024 * 1024);
  EXPECT_EQ(parse_bytes("116g"), 116ull * 1024 * 1024 * 1024);
  EXPECT_EQ(parse_bytes("8 GiB"), 8ull * 1024 * 1024 * 1024);
  EXPECT_EQ(parse_bytes("1.5K"), 1536u);
  EXPECT_EQ(parse_bytes("512M"), 512ull * 1024 * 1024);
  EXPECT_EQ(parse_bytes("500MB"), 500000000u);
  EXPECT_EQ(parse_bytes("2kb"), 2000u);
  EXPECT_EQ(parse_bytes("1T"), 1ull << 40);
  EXPECT_EQ(parse_bytes("3TB"), 3000000000000ull);
  EXPECT_EQ(parse_bytes("10B"), 10u);
  for (const char* bad : {"", "abc", "-5", "5X", "1.2.3", "G", "12 parsecs", "99999999999999999999", "20000000000G", "1e9"})
    EXPECT_THROW(parse_bytes(bad), Error) << bad;
  try {
    parse_bytes("lots", "--mem-budget");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--mem-budget"), std::string::npos) << e.what();
  }
}

TEST(AdmissionBytes, FormatsBinaryUnits) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(GiB), "1.00 GiB");
  EXPECT_EQ(format_bytes(116 * GiB), "116.0 GiB");
  EXPECT_EQ(format_bytes(10060841408ull), "9.37 GiB");
  EXPECT_EQ(format_bytes(1000 * MiB), "0.98 GiB");
}

TEST(AdmissionMeminfo, ParsesProcFiles) {
  const std::string meminfo =
      "MemTotal:       24684096 kB\nMemFree:        14872768 kB\nMemAvailable:   21062724 kB\n"
      "Buffers:            7792 kB\nSwapTotal:       2097148 kB\nSwapFree:        1048576 kB\nHugePages_Total:       0\n";
  const MemInfo m = parse_meminfo(meminfo);
  EXPECT_EQ(m.total, 24684096ull * 1024);
  EXPECT_EQ(m.free, 14872768ull * 1024);
  EXPECT_EQ(m.available, 21062724ull * 1024);
  EXPECT_TRUE(m.has_available);
  EXPECT_EQ(m.swap_total, 2097148ull * 1024);
  EXPECT_EQ(m.swap_free, 1048576ull * 1024);
  EXPECT_EQ(m.used(), (24684096ull - 21062724ull) * 1024);
  // Old kernels: no MemAvailable, MemFree stands in.
  const MemInfo old = parse_meminfo("MemTotal: 1000 kB\nMemFree: 300 kB\n");
  EXPECT_FALSE(old.has_available);
  EXPECT_EQ(old.available, 300u * 1024);
  EXPECT_THROW(parse_meminfo("MemFree: 1 kB\n"), Error);

  EXPECT_TRUE(parse_swaps("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n").empty());
  const auto swaps = parse_swaps(
      "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/dev/nvme0n1p3                          partition\t8388604\t\t1024\t\t-2\n");
  ASSERT_EQ(swaps.size(), 1u);
  EXPECT_EQ(swaps[0].name, "/dev/nvme0n1p3");
  EXPECT_EQ(swaps[0].type, "partition");
  EXPECT_EQ(swaps[0].size, 8388604ull * 1024);
  EXPECT_EQ(swaps[0].used, 1024u * 1024);
  EXPECT_EQ(swaps[0].priority, -2);

  const ProcMemory pm = parse_proc_status("Name:\tx\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads: 1\n");
  EXPECT_EQ(pm.rss, 102400ull * 1024);
  EXPECT_EQ(pm.hwm, 204800ull * 1024);

  // The command name may contain spaces and ')'.
  const auto st = parse_proc_stat(
      "4242 (evil) S 1 2 (x) R 17 4000 4000 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 1234 10000000 2560 "
      "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n");
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->pid, 4242);
  EXPECT_EQ(st->state, 'R');
  EXPECT_EQ(st->ppid, 17);
  EXPECT_EQ(st->pgrp, 4000);
  EXPECT_EQ(st->rss_pages, 2560u);
  EXPECT_FALSE(parse_proc_stat("garbage").has_value());
  EXPECT_FALSE(parse_proc_stat("12 (x) S 1").has_value());
}

TEST(AdmissionMeminfo, LiveReadersSeeThisProcess) {
  const MemInfo m = read_meminfo();
  EXPECT_GT(m.total, 0u);
  EXPECT_LE(m.available, m.total);
  const ProcMemory self = read_self_status();
  EXPECT_GT(self.rss, 0u);
  EXPECT_GE(self.hwm, self.rss);

  // The group sum includes us.
  const GroupMemory ours = process_group_memory(::getpgrp());
  EXPECT_GE(ours.processes, 1);
  EXPECT_GE(ours.rss, self.rss / 2);

  // Touching 64 MiB shows up in a group's sum. Measured on a child in a group of its own: the
  // test's own group may hold other test processes (ctest -j) that come and go meanwhile.
  int ready[2], go[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(go), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char c = 0;
    ::setpgid(0, 0);
    if (::write(ready[1], "r", 1) != 1 || ::read(go[0], &c, 1) != 1) ::_exit(1);
    const size_t n = 64 * MiB;
    void* mem = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) ::_exit(2);
    std::memset(mem, 1, n);
    if (::write(ready[1], "t", 1) != 1 || ::read(go[0], &c, 1) != 1) ::_exit(3);
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  const GroupMemory before = process_group_memory(child);
  ASSERT_EQ(::write(go[1], "g", 1), 1);
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  const GroupMemory after = process_group_memory(child);
  ASSERT_EQ(::write(go[1], "g", 1), 1);
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  for (int fd : {ready[0], ready[1], go[0], go[1]}) ::close(fd);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(before.processes, 1);
  EXPECT_EQ(after.processes, 1);
  EXPECT_GE(after.rss + 8 * MiB, before.rss + 48 * MiB) << "before " << before.rss << " after " << after.rss;
  EXPECT_THROW(process_group_memory(::getpgrp(), "/no/such/proc"), Error);
}

TEST(AdmissionFootprint, PublishedSchemaByteClasses) {
  const ModelFootprint& fp = published_footprint();
  // The published artifact's figures (spec 2.4, prior-art section 1).
  EXPECT_EQ(fp.resident_bytes, 10060841408ull);
  EXPECT_EQ(fp.routed_expert_bytes, 152882380800ull);
  EXPECT_EQ(fp.engram_bytes, 202758032400ull);
  EXPECT_EQ(fp.expert_gate_bytes, 3041280u);
  EXPECT_EQ(fp.expert_up_bytes, 3041280u);
  EXPECT_EQ(fp.expert_down_bytes, 3870720u);
  EXPECT_EQ(fp.expert_bytes(), 9953280u);
  EXPECT_EQ(fp.largest_expert_slice(), 3870720u);
  EXPECT_EQ(fp.total_experts(), 15360u);
  EXPECT_EQ(fp.routed_expert_bytes, fp.expert_bytes() * fp.total_experts());
}

TEST(AdmissionFootprint, SlotWindowsCoverUnalignedSlices) {
  ModelFootprint fp;
  // 3 experts of 6,000 B from offset 1,000: [1000,7000) [7000,13000) [13000,19000) span
  // 2, 3 and 2 pages of 4 KiB.
  fp.routed_tensors.push_back({0, 1000, 6000, 3});
  EXPECT_EQ(fp.slot_window_bytes(4096), 3u * 4096);
  fp.routed_tensors.push_back({2, 8192, 4096, 2});  // aligned: exactly one page each
  EXPECT_EQ(fp.slot_window_bytes(4096), 4u * 4096);
  fp.routed_tensors.push_back({0, 0, 4096, 1});  // a smaller gate tensor elsewhere: max per part
  EXPECT_EQ(fp.slot_window_bytes(4096), 4u * 4096);
}

TEST(AdmissionSequenceState, PublishedSizesMatchTheSpec) {
  const ModelConfig c = published_config();
  const SequenceStateBytes s = sequence_state_bytes(c, 131072);
  EXPECT_EQ(s.window, 40ull * 128 * 512 * 2);  // BF16 window rings
  // spec 7: packed (native) rows, 3 x (288 + 68) / 2 + (288 + 68) = 890 B of global KV per
  // token (with BF16 rows it was 2.5 x (1024 + 256) = 3,200 B).
  EXPECT_EQ(s.compressed_kv + s.index_keys, 890ull * 131072);
  EXPECT_EQ(s.carry, 3ull * 2 * 512 * 4);  // three ratio-2 compressors, k and s
  EXPECT_EQ(s.engram_history, 3u * 8);
  // Odd contexts: ratio-2 caches hold floor(ctx / 2) rows.
  const SequenceStateBytes odd = sequence_state_bytes(c, 5);
  EXPECT_EQ(odd.compressed_kv, (3ull * 2 + 5) * 288);
  EXPECT_EQ(odd.index_keys, (3ull * 2 + 5) * 68);
}

// What the engine allocates for a sequence equals the reported bytes: tests/engine_footprint_test.cpp.

// At 524,288 positions the state is the packed FP4 rows (0.44 GiB, not 1.57 GiB of BF16 rows) and
// a multi-chunk eval keeps no copy of it; what that frees goes to expert slots.
TEST(AdmissionPlan, HalfMillionContextStateIsPackedWithoutUndoCopy) {
  const ModelFootprint& fp = published_footprint();
  const Plan p = make_plan(fp, published_options(116 * GiB, 524288), quiet_host());
  ASSERT_TRUE(p.admitted) << format_plan(p);
  const PlanLine* state = line_named(p, "sequence state");
  ASSERT_NE(state, nullptr);
  EXPECT_LE(state->bytes, (uint64_t)(0.45 * (double)GiB)) << format_plan(p);
  EXPECT_EQ(line_named(p, "state undo copy"), nullptr);
  const PlanLine* rollback = line_named(p, "eval rollback point");
  ASSERT_NE(rollback, nullptr);
  EXPECT_LE(rollback->bytes, 6ull << 20);  // window rings (5 MiB), carries, Engram history
  // Against the same plan at 131,072: 393,216 more positions cost 890 B each in the state.
  const Plan q = make_plan(fp, published_options(116 * GiB, 131072), quiet_host());
  EXPECT_EQ(state->bytes - line_named(q, "sequence state")->bytes, 890ull * (524288 - 131072));
}

TEST(AdmissionPlan, PublishedAdmitsAt116GiBWith128KContext) {
  const ModelFootprint& fp = published_footprint();
  const Plan p = make_plan(fp, published_options(116 * GiB), quiet_host());
  ASSERT_TRUE(p.admitted) << format_plan(p);
  EXPECT_TRUE(p.refusals.empty());
  EXPECT_EQ(p.budget, 116 * GiB);
  // lru-per-layer (the store's default): ~11,000 slots give each of the 40 layers ~280. The
  // chunk is no longer bounded by that: the automatic cap of 256 tokens can route to all 384
  // experts of a layer, which stream through the share in windows of half of it.
  EXPECT_TRUE(p.cache_per_layer);
  EXPECT_EQ(p.union_capacity, p.cache_slots / 40);
  EXPECT_GE(p.union_capacity, 250u);
  EXPECT_LE(p.union_capacity, 300u);
  EXPECT_EQ(p.chunk, 256u);
  EXPECT_EQ(p.chunk_union, 384u);
  EXPECT_EQ(p.max_chunk_for_cache, p.union_capacity / 6);
  EXPECT_EQ(p.stream_window, p.union_capacity / 2);
  const PlanLine* resident = line_named(p, "resident weights");
  ASSERT_NE(resident, nullptr);
  EXPECT_EQ(resident->bytes, 10060841408ull);
  for (const char* name : {"sequence state", "eval rollback point", "scratch", "threads", "Engram row cache", "runtime overhead"})
    EXPECT_NE(line_named(p, name), nullptr) << name;
  uint64_t sum = 0;
  for (const PlanLine& l : p.mandatory) sum += l.bytes;
  EXPECT_EQ(sum, p.mandatory_bytes);
  // The halo-box reservation per bounce buffer: the largest expert slice + one 4 KiB page.
  EXPECT_EQ(p.bounce_bytes, 8ull * 3874816);
  // Whole experts: each slot holds the 4 KiB-aligned file windows of one expert's slices. The
  // gate/up slices are 742.5 pages (every window spans 743), down exactly 945 pages.
  EXPECT_EQ(fp.slot_window_bytes(4096), 743ull * 4096 * 2 + 945 * 4096);
  EXPECT_EQ(p.slot_bytes, 743ull * 4096 * 2 + 945 * 4096 + 256);
  EXPECT_GT(p.cache_slots, 10000u);
  EXPECT_LT(p.cache_slots, 15360u);
  EXPECT_EQ(p.cache_bytes, p.cache_slots * p.slot_bytes);
  EXPECT_LE(p.planned_bytes(), p.budget);
  EXPECT_LT(p.budget - p.planned_bytes(), p.slot_bytes) << "cache not rounded down to whole experts";
  EXPECT_EQ(p.unused_bytes, p.budget - p.planned_bytes());
  const std::string text = format_plan(p);
  EXPECT_NE(text.find("verdict: admitted"), std::string::npos) << text;
  EXPECT_NE(text.find("expert cache"), std::string::npos);
  EXPECT_NE(text.find("resident weights"), std::string::npos);
  const nlohmann::ordered_json j = plan_to_json(p);
  EXPECT_EQ(j["cache_slots"], p.cache_slots);
  EXPECT_EQ(j["admitted"], true);
  EXPECT_NO_THROW(require_admitted(p));

  // lru-global: every slot serves any layer, so the largest candidate chunk fits.
  PlanOptions o = published_options(116 * GiB);
  o.cache_per_layer = false;
  const Plan g = make_plan(fp, o, quiet_host());
  ASSERT_TRUE(g.admitted) << format_plan(g);
  EXPECT_EQ(g.chunk, o.max_chunk);
  EXPECT_EQ(g.chunk_union, 384u);
  EXPECT_EQ(g.union_capacity, 384u);
}

TEST(AdmissionPlan, RefusesASmallBudgetNamingTheResidentPart) {
  const Plan p = make_plan(published_footprint(), published_options(8 * GiB), quiet_host());
  EXPECT_FALSE(p.admitted);
  ASSERT_FALSE(p.refusals.empty());
  EXPECT_NE(p.refusals[0].find("mandatory part"), std::string::npos) << p.refusals[0];
  EXPECT_NE(p.refusals[0].find("resident weights 9.37 GiB"), std::string::npos) << p.refusals[0];
  EXPECT_NE(p.refusals[0].find("budget is 8.00 GiB"), std::string::npos) << p.refusals[0];
  EXPECT_EQ(p.cache_slots, 0u);
  const std::string text = format_plan(p);
  EXPECT_NE(text.find("verdict: refused"), std::string::npos) << text;
  EXPECT_NE(text.find("resident weights"), std::string::npos) << text;
  try {
    require_admitted(p);
    FAIL() << "admitted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("resident weights"), std::string::npos) << e.what();
  }
}

TEST(AdmissionPlan, RefusesActiveSwapUnlessAllowed) {
  HostFacts host = quiet_host();
  host.swaps.push_back(SwapArea{"/dev/sda2", "partition", 8 * GiB, 0, -2});
  PlanOptions o = published_options(116 * GiB);
  Plan p = make_plan(published_footprint(), o, host);
  EXPECT_FALSE(p.admitted);
  ASSERT_EQ(p.refusals.size(), 1u);
  EXPECT_NE(p.refusals[0].find("swap is active"), std::string::npos) << p.refusals[0];
  EXPECT_NE(p.refusals[0].find("/dev/sda2"), std::string::npos) << p.refusals[0];
  EXPECT_NE(p.refusals[0].find("--allow-swap"), std::string::npos) << p.refusals[0];
  o.allow_swap = true;
  p = make_plan(published_footprint(), o, host);
  EXPECT_TRUE(p.admitted);
  EXPECT_FALSE(p.warnings.empty());
  // SwapTotal alone also counts as active.
  host.swaps.clear();
  host.mem.swap_total = 1 * GiB;
  o.allow_swap = false;
  EXPECT_FALSE(make_plan(published_footprint(), o, host).admitted);
}

TEST(AdmissionPlan, TheChunkIsBoundedByMemoryNotByTheExpertCache) {
  const ModelFootprint& fp = published_footprint();
  for (const bool per_layer : {false, true}) {
    SCOPED_TRACE(per_layer ? "lru-per-layer" : "lru-global");
    const uint64_t share = per_layer ? 40 : 1;  // slots that give one layer one expert
    // The mandatory part for chunk 1, then a budget that lets one layer hold about 100 experts.
    PlanOptions o = published_options(1000 * GiB);
    o.cache_per_layer = per_layer;
    o.chunk = 1;
    const Plan one = make_plan(fp, o, quiet_host());
    ASSERT_TRUE(one.admitted);
    o.chunk = 0;
    o.budget.bytes = one.mandatory_bytes + one.bounce_bytes + 100 * share * one.slot_bytes + 1000;
    const Plan p = make_plan(fp, o, quiet_host());
    ASSERT_TRUE(p.admitted) << format_plan(p);
    EXPECT_TRUE(p.chunk_auto);
    EXPECT_EQ(p.union_capacity, per_layer ? p.cache_slots / 40 : p.cache_slots);
    EXPECT_LE(p.union_capacity, 100u);
    EXPECT_GE(p.union_capacity, 6u);
    // The largest chunk whose mandatory part fits (up to the automatic cap): one token more
    // needs more scratch than the budget has beside the cache the plan kept, or it is the cap.
    EXPECT_GT(p.chunk, p.union_capacity / 6) << "the chunk is still bounded by the cache";
    EXPECT_EQ(p.chunk_union, chunk_expert_union(p.chunk, 6, 384));
    EXPECT_EQ(p.max_chunk_for_cache, p.union_capacity / 6);
    EXPECT_EQ(p.stream_window, std::max<uint64_t>(1, p.union_capacity / 2));
    EXPECT_NE(format_plan(p).find("stream through it in windows of " + std::to_string(p.stream_window)),
              std::string::npos)
        << format_plan(p);

    // An explicit chunk whose union is every expert of a layer is admitted with the same cache
    // floor: windows, not a refusal.
    o.budget.bytes = 1000 * GiB;
    o.chunk = 2048;
    const Plan big_free = make_plan(fp, o, quiet_host());
    o.budget.bytes = big_free.mandatory_bytes + big_free.bounce_bytes + 200 * share * big_free.slot_bytes;
    const Plan big = make_plan(fp, o, quiet_host());
    EXPECT_EQ(big.cache_slots, 200 * share);
    EXPECT_TRUE(big.admitted) << format_plan(big);
    EXPECT_EQ(big.chunk_union, 384u);
    EXPECT_EQ(big.stream_window, 100u);
    EXPECT_FALSE(big.chunk_auto);

    // A union that fits is leased at once (no windows).
    o.chunk = 2;
    const Plan small = make_plan(fp, o, quiet_host());
    EXPECT_TRUE(small.admitted);
    EXPECT_EQ(small.stream_window, 0u);
    EXPECT_NE(format_plan(small).find("leased at once"), std::string::npos) << format_plan(small);

    // A layer's share smaller than one token's top_k.
    o.chunk = 0;
    o.budget.bytes = one.mandatory_bytes + one.bounce_bytes + 5 * share * one.slot_bytes;
    const Plan tiny_cache = make_plan(fp, o, quiet_host());
    EXPECT_FALSE(tiny_cache.admitted);
    EXPECT_EQ(tiny_cache.chunk, 1u);
    EXPECT_EQ(tiny_cache.cache_slots, 5 * share);
    EXPECT_EQ(tiny_cache.union_capacity, 5u);
    ASSERT_FALSE(tiny_cache.refusals.empty());
    EXPECT_NE(tiny_cache.refusals[0].find("top_k = 6"), std::string::npos) << tiny_cache.refusals[0];
  }
}

TEST(AdmissionPlan, CacheIsCappedAtEveryExpert) {
  const Plan p = make_plan(published_footprint(), published_options(1000 * GiB), quiet_host());
  ASSERT_TRUE(p.admitted);
  EXPECT_EQ(p.cache_slots, 15360u);
  EXPECT_EQ(p.unused_bytes, p.budget - p.planned_bytes());
  EXPECT_GT(p.unused_bytes, 800 * GiB);
  // --cache-experts caps it below what the budget leaves; the rest stays unused.
  PlanOptions o = published_options(1000 * GiB);
  o.max_cache_experts = 5000;
  const Plan q = make_plan(published_footprint(), o, quiet_host());
  ASSERT_TRUE(q.admitted);
  EXPECT_EQ(q.cache_slots, 5000u);
  EXPECT_EQ(q.cache_bytes, 5000u * q.slot_bytes);
  EXPECT_EQ(q.unused_bytes, q.budget - q.planned_bytes());
}

TEST(AdmissionPlan, ScratchAndStateGrowWithChunkAndContext) {
  const ModelConfig c = published_config();
  const ScratchBytes a = scratch_bytes(c, 64, 4096), b = scratch_bytes(c, 128, 4096), d = scratch_bytes(c, 128, 8192);
  EXPECT_EQ(a.logits, 64ull * 129280 * 4);
  EXPECT_EQ(b.logits, 2 * a.logits);
  // One query's scores and its top-k buffer (layer 20 has ratio 1: ctx visible rows), the
  // selection's sample and the query's integer form.
  EXPECT_EQ(a.indexer_scores, 4096ull * 8 + 1024 * 4 + (32 * 128 + 32 * 4 * 8 + 32 * 4));
  EXPECT_EQ(b.indexer_scores, a.indexer_scores);  // whatever the chunk
  EXPECT_EQ(b.workspace, 2 * a.workspace);
  EXPECT_EQ(a.workspace, workspace_bytes(c, 64));
  EXPECT_EQ(b.op_temporaries, 2 * a.op_temporaries);
  EXPECT_EQ(d.indexer_scores - b.indexer_scores, 4096ull * 8);
  EXPECT_GT(d.chunk_rows, b.chunk_rows);
  EXPECT_GT(sequence_state_bytes(c, 8192).total(), sequence_state_bytes(c, 4096).total());
}

TEST(AdmissionPlan, UsesTheStoreFigureWhenGiven) {
  const ModelFootprint& fp = published_footprint();
  PlanOptions o = published_options(40 * GiB, 8192);
  o.store_bytes = [](uint64_t slots) { return 1 * GiB + slots * 10 * MiB; };
  const Plan p = make_plan(fp, o, quiet_host());
  ASSERT_TRUE(p.admitted) << format_plan(p);
  EXPECT_TRUE(p.store_figure);
  EXPECT_EQ(p.bounce_bytes, 0u);
  const uint64_t avail = p.budget - p.mandatory_bytes;
  EXPECT_LE(o.store_bytes(p.cache_slots), avail);
  EXPECT_GT(o.store_bytes(p.cache_slots + 1), avail);
  EXPECT_EQ(p.cache_bytes, o.store_bytes(p.cache_slots));
  EXPECT_NE(format_plan(p).find("expert store"), std::string::npos);
  // A store that cannot fit even empty is a mandatory-part refusal.
  o.store_bytes = [](uint64_t slots) { return 100 * GiB + slots; };
  EXPECT_FALSE(make_plan(fp, o, quiet_host()).admitted);
}

TEST(AdmissionPlan, AutoBudgetIsASafeFractionOfAvailable) {
  HostFacts h;
  h.mem.total = 100 * GiB;
  h.mem.available = 60 * GiB;
  EXPECT_EQ(auto_budget(h), 50 * GiB);  // MemAvailable - 10% of MemTotal < 0.85 x 60
  h.mem.available = 95 * GiB;
  EXPECT_EQ(auto_budget(h), (uint64_t)(80.75 * GiB));  // 0.85 x 95 GiB
  h.mem.available = 5 * GiB;
  EXPECT_EQ(auto_budget(h), 0u);  // less than the 10% reserve: nothing
  h.mem.available = 95 * GiB;
  h.cgroup.limited = true;
  h.cgroup.limit = 40 * GiB;
  h.cgroup.usage = 10 * GiB;
  h.cgroup.inactive_file = 2 * GiB;
  EXPECT_EQ(h.cgroup.headroom(), 32 * GiB);
  EXPECT_EQ(auto_budget(h), 29205777612ull);  // 0.85 x 32 GiB = 29,205,777,612.8

  EXPECT_TRUE(parse_budget("auto").is_auto);
  EXPECT_TRUE(parse_budget("AUTO").is_auto);
  EXPECT_FALSE(parse_budget("116GiB").is_auto);
  EXPECT_EQ(parse_budget("116GiB").bytes, 116 * GiB);
  EXPECT_THROW(parse_budget("automatic"), Error);

  PlanOptions o = published_options(0);
  o.budget = BudgetSpec{};
  h.cgroup = {};
  h.mem.total = 200 * GiB;
  h.mem.available = 150 * GiB;
  const Plan p = make_plan(published_footprint(), o, h);
  EXPECT_EQ(p.budget, (uint64_t)(127.5 * GiB));  // 0.85 x 150 GiB
  EXPECT_NE(p.budget_source.find("auto"), std::string::npos);
  EXPECT_TRUE(p.admitted) << format_plan(p);
}

TEST(AdmissionPlan, RejectsInvalidOptions) {
  PlanOptions o = published_options(116 * GiB);
  o.ctx = 0;
  EXPECT_THROW(make_plan(published_footprint(), o, quiet_host()), Error);
  o.ctx = (uint32_t)published_config().max_position_embeddings + 1;
  EXPECT_THROW(make_plan(published_footprint(), o, quiet_host()), Error);
  o.ctx = 1024;
  o.threads = -1;
  EXPECT_THROW(make_plan(published_footprint(), o, quiet_host()), Error);
}

TEST(AdmissionPlan, FileFootprintEqualsTheSchemaFootprint) {
  TempDir dir(kTmpPrefix);
  const ModelConfig c = tiny_config();
  const std::string path = dir / "tiny.gguf";
  generate_model(c, synthetic_vocab(c.vocab_size), path, GenerateOptions{1, true});
  const gguf::File f = gguf::File::open(path);
  const ModelFootprint a = footprint_from_gguf(f);
  const ModelFootprint b = footprint_from_specs(c, deepseek41_tensors(c));
  EXPECT_EQ(a.resident_bytes, b.resident_bytes);
  EXPECT_EQ(a.resident_tensors, b.resident_tensors);
  EXPECT_EQ(a.routed_expert_bytes, b.routed_expert_bytes);
  EXPECT_EQ(a.engram_bytes, b.engram_bytes);
  EXPECT_EQ(a.expert_bytes(), b.expert_bytes());
  EXPECT_GT(a.expert_bytes(), 0u);
  EXPECT_EQ(a.metadata_bytes, f.data_offset());
  EXPECT_EQ(a.source, path);
  const SchemaReport rep = validate_deepseek41(f);
  EXPECT_EQ(a.resident_bytes, rep.resident_bytes);
  EXPECT_EQ(a.expert_bytes(), rep.expert_bytes_per_layer);
}

TEST(AdmissionCli, PlanOnThePublishedSparseFile) {
#if defined(__SANITIZE_ADDRESS__)
  // The plan's runtime overhead is this process's measured resident set, which under
  // AddressSanitizer includes shadow memory; these figures are checked in the optimized build.
  GTEST_SKIP() << "the measured runtime overhead includes ASan shadow memory";
#endif
  TempDir dir(kTmpPrefix);
  const std::string model = dir / "published.gguf";
  CmdResult r = run_sluice(dir, "make-model --preset published --sparse -o " + q(model));
  ASSERT_EQ(r.rc, 0) << r.err;

  // --allow-swap: the verdict must not depend on whether this machine has swap.
  r = run_sluice(dir, "plan -m " + q(model) + " --ctx 131072 --mem-budget 116GiB --threads 4 --allow-swap");
  EXPECT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("verdict: admitted"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("expert cache"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resident weights"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("9.37 GiB"), std::string::npos) << r.out;

  r = run_sluice(dir, "plan -m " + q(model) + " --ctx 131072 --mem-budget 116GiB --threads 4 --allow-swap --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["admitted"], true);
  EXPECT_EQ(j["budget"], 116 * GiB);
  EXPECT_EQ(j["ctx"], 131072);
  EXPECT_EQ(j["expert_bytes"], 9953280);
  EXPECT_GT(j["cache_slots"].get<uint64_t>(), 10000u);
  // The store's own figure: the slots plus its per-slot records, never less than the slots.
  EXPECT_GE(j["cache_bytes"].get<uint64_t>(), j["cache_slots"].get<uint64_t>() * j["slot_bytes"].get<uint64_t>());
  EXPECT_LT(j["cache_bytes"].get<uint64_t>(), j["cache_slots"].get<uint64_t>() * (j["slot_bytes"].get<uint64_t>() + 4096));
  EXPECT_EQ(j["cache_policy"], "lfu-per-layer");  // the CLI's default (cli/cache_policy_option.h)
  EXPECT_EQ(j["chunk"].get<uint64_t>(), 256u);
  EXPECT_EQ(j["stream_window"].get<uint64_t>(), j["union_capacity"].get<uint64_t>() / 2);
  EXPECT_EQ(j["union_capacity"].get<uint64_t>(), j["cache_slots"].get<uint64_t>() / 40);
  EXPECT_EQ(j["mandatory"][0]["name"], "resident weights");
  EXPECT_EQ(j["mandatory"][0]["bytes"], 10060841408ull);
  // The file and the schema give the same plan: the same engine lines; the expert cache differs
  // only by what this process measures (its resident set), the Engram row cache the CLI plans
  // and the bounce buffers the in-process plan keeps.
  const Plan from_specs = make_plan(published_footprint(), published_options(116 * GiB), quiet_host());
  uint64_t differs = 0;
  for (const nlohmann::json& l : j["mandatory"]) {
    const std::string name = l["name"];
    const uint64_t bytes = l["bytes"];
    if (name == "runtime overhead" || name == "Engram row cache") {
      differs += bytes;
      continue;
    }
    bool found = false;
    for (const PlanLine& pl : from_specs.mandatory)
      if (pl.name == name) {
        found = true;
        EXPECT_EQ(bytes, pl.bytes) << name;
      }
    EXPECT_TRUE(found) << name;
  }
  for (const PlanLine& pl : from_specs.mandatory)
    if (pl.name == "bounce buffers") differs += pl.bytes;
  EXPECT_NEAR((double)j["cache_slots"].get<uint64_t>(), (double)from_specs.cache_slots,
              2.0 + (double)differs / (double)j["slot_bytes"].get<uint64_t>())
      << format_plan(from_specs) << "\n" << j.dump(1);

  r = run_sluice(dir, "plan -m " + q(model) +
                         " --ctx 131072 --mem-budget 116GiB --threads 4 --allow-swap --json --cache-policy lru-global");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["chunk"], PlanOptions{}.max_chunk);

  r = run_sluice(dir, "plan -m " + q(model) + " --ctx 131072 --mem-budget 8GiB --allow-swap");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("verdict: refused"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resident weights"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.rfind("sluice: error: memory admission refused", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("resident weights 9.37 GiB"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);

  r = run_sluice(dir, "plan -m " + q(model) + " --ctx 4096 --mem-budget lots");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("--mem-budget"), std::string::npos) << r.err;
  r = run_sluice(dir, "plan -m " + q(dir / "missing.gguf") + " --mem-budget 1G");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("missing.gguf"), std::string::npos) << r.err;
}

namespace sluice {
namespace {

// plan --parallel N: N sequence states in the plan (its line's detail says so), and a chunk
// below N rows is a warning that the session would refuse.
TEST(AdmissionCli, PlanParallelHoldsNSequenceStates) {
  TempDir dir(kTmpPrefix);
  const std::string model = dir / "tiny.gguf";
  CmdResult r = run_sluice(dir, "make-model --preset tiny -o " + q(model));
  ASSERT_EQ(r.rc, 0) << r.err;
  auto state_line = [&](const std::string& args) {
    const CmdResult p = run_sluice(dir, "plan -m " + q(model) + " --allow-swap --mem-budget 4GiB --json " + args);
    EXPECT_EQ(p.rc, 0) << p.err;
    const nlohmann::json j = nlohmann::json::parse(p.out);
    for (const nlohmann::json& l : j["mandatory"])
      if (l["name"] == "sequence state") return std::pair{j["sequences"].get<uint32_t>(), l["bytes"].get<uint64_t>()};
    ADD_FAILURE() << "no sequence state line: " << p.out;
    return std::pair{0u, uint64_t{0}};
  };
  const auto [n1, one] = state_line("");
  const auto [n5, five] = state_line("--parallel 5");
  EXPECT_EQ(n1, 1u);
  EXPECT_EQ(n5, 5u);
  EXPECT_GT(one, 0u);
  EXPECT_EQ(five, 5 * one);
  EXPECT_EQ(state_line("-np 5"), std::pair(5u, five)) << "llama.cpp's spelling";
  r = run_sluice(dir, "plan -m " + q(model) + " --allow-swap --mem-budget 4GiB --parallel 5");
  EXPECT_NE(r.out.find("5 x ctx"), std::string::npos) << r.out;
  r = run_sluice(dir, "plan -m " + q(model) + " --allow-swap --mem-budget 4GiB --parallel 5 --chunk 3");
  EXPECT_NE(r.out.find("--parallel 5 needs a chunk of at least 5 rows; the plan has 3"), std::string::npos) << r.out;
  r = run_sluice(dir, "plan -m " + q(model) + " --parallel 0");
  EXPECT_EQ(r.rc, 2) << r.err;
  // --cache-ram: the shared prefix cache is one line of its own, whatever the sequences.
  for (const char* np : {"1", "3"}) {
    r = run_sluice(dir, "plan -m " + q(model) + " --allow-swap --mem-budget 4GiB --json --cache-ram 96MiB -np " + np);
    ASSERT_EQ(r.rc, 0) << r.err;
    uint64_t cache = 0;
    const nlohmann::json plan = nlohmann::json::parse(r.out);
    for (const nlohmann::json& l : plan["mandatory"])
      if (l["name"] == "prefix cache") cache = l["bytes"].get<uint64_t>();
    EXPECT_EQ(cache, 96ull << 20) << r.out;
  }
  r = run_sluice(dir, "plan -m " + q(model) + " --allow-swap --mem-budget 4GiB --cache-ram lots");
  EXPECT_EQ(r.rc, 2) << r.err;
  // --kv-disk: serve --kv-disk-dir's write queue (two of the largest snapshots) and read buffer.
  r = run_sluice(dir, "plan -m " + q(model) + " --allow-swap --mem-budget 4GiB --json --kv-disk");
  ASSERT_EQ(r.rc, 0) << r.err;
  {
    const nlohmann::json plan = nlohmann::json::parse(r.out);
    const uint32_t ctx = plan["ctx"];
    uint64_t disk = 0;
    for (const nlohmann::json& l : plan["mandatory"])
      if (l["name"] == "state disk buffers") disk = l["bytes"].get<uint64_t>();
    const ModelConfig c = tiny_config();  // make-model --preset tiny
    EXPECT_EQ(disk, 3 * state_queue_charge(state_shape(c, ctx), ctx, true)) << r.out;
    EXPECT_GT(disk, 3 * snapshot_bytes(c, ctx));
  }
}

// serve --parallel N plans N sequence states before it serves: one that does not fit ends the
// server with the plan's message, naming the sequence states and --parallel.
TEST(AdmissionCli, ServeRefusesAParallelThatDoesNotFit) {
  TempDir dir(kTmpPrefix);
  const std::string model = dir / "tiny.gguf";
  CmdResult r = run_sluice(dir, "make-model --preset tiny -o " + q(model));
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string common = " --port 0 --chunk 64 --checkpoint-budget 0 --allow-swap -m " + q(model);
  const CmdResult one = run_sluice(dir, "plan --json --parallel 1" + common.substr(common.find(" --chunk")));
  ASSERT_EQ(one.rc, 0) << one.err;
  const uint64_t planned = nlohmann::json::parse(one.out)["planned_bytes"].get<uint64_t>();
  // Room for one sequence (and a margin), not for 64.
  // Under timeout: a server that admitted it would serve until killed (exit 124).
  const std::string err_path = dir / "serve.err";
  const int st = std::system(("timeout 60 " + q(SLUICE_BINARY) + " serve --parallel 64 --mem-budget " +
                              std::to_string(planned + (4u << 20)) + common + " 2>" + q(err_path)).c_str());
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = test::slurp(err_path);
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("memory admission refused"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sequence state"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("lower --parallel (64 sequence states)"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace sluice

// issue 15 item 2: a DSpark drafter's routed experts are resident when the plan has room for
// them with a verify pass of two drafts or more, and otherwise stream through a cache of their
// own (one proposal's worst case: 3 stages x min(5 x 3, 128) = 45 experts); the plan says which.
TEST(AdmissionPlan, TheDrafterExpertsStreamOnlyWhenResidentOnesLeaveNoRoom) {
  const ModelFootprint& fp = published_footprint();
  auto options = [&](uint64_t budget, DsparkExperts mode) {
    PlanOptions o = published_options(budget, 16384);
    o.dspark_block = 5;
    o.dspark_fixed = 300 * MiB;
    o.dspark_expert_bytes = 3 * 128 * fp.expert_bytes();  // the drafter's experts have the target's widths
    o.dspark_stream_slots = 45;
    o.dspark_stream_bytes = 45 * fp.slot_window_bytes(4096);
    o.dspark_experts = mode;
    return o;
  };
  const uint64_t saved = 3 * 128 * fp.expert_bytes() - 45 * fp.slot_window_bytes(4096);
  const Plan roomy = make_plan(fp, options(116 * GiB, DsparkExperts::Auto), quiet_host());
  ASSERT_TRUE(roomy.admitted) << format_plan(roomy);
  EXPECT_FALSE(roomy.dspark_streamed);
  EXPECT_EQ(roomy.dspark_verify_max, 5u);
  EXPECT_NE(format_plan(roomy).find("the drafter's routed experts are resident"), std::string::npos) << format_plan(roomy);
  EXPECT_EQ(plan_to_json(roomy)["dspark_experts"], "resident");

  bool streamed_for_depth = false, streamed_to_fit = false;
  for (uint64_t budget = 10 * GiB; budget <= 24 * GiB; budget += GiB / 4) {
    const Plan a = make_plan(fp, options(budget, DsparkExperts::Auto), quiet_host());
    const Plan r = make_plan(fp, options(budget, DsparkExperts::Resident), quiet_host());
    const Plan s = make_plan(fp, options(budget, DsparkExperts::Streamed), quiet_host());
    ASSERT_FALSE(r.dspark_streamed);
    ASSERT_TRUE(s.dspark_streamed);
    EXPECT_EQ(s.dspark_cache_slots, 45u);
    // Streaming frees the difference for the target's cache (the same chunk and the same lines).
    if (r.admitted && s.admitted && r.chunk == s.chunk) {
      EXPECT_EQ(r.mandatory_bytes - s.mandatory_bytes, saved) << budget;
      EXPECT_GE(s.cache_slots, r.cache_slots) << budget;
    }
    const bool resident_ok = r.admitted && r.dspark_verify_max >= 2;
    if (resident_ok) {
      EXPECT_FALSE(a.dspark_streamed) << budget;
    } else if (s.admitted && (!r.admitted || s.dspark_verify_max >= 2)) {
      ASSERT_TRUE(a.dspark_streamed) << budget << "\n" << format_plan(a);
      const std::string text = format_plan(a);
      EXPECT_NE(text.find("the drafter's routed experts are streamed (45 slots of their own)"), std::string::npos) << text;
      EXPECT_NE(text.find(r.admitted ? "would leave the verify pass fewer than 2 drafts" : "do not fit the budget"),
                std::string::npos) << text;
      EXPECT_EQ(plan_to_json(a)["dspark_experts"], "streamed");
      (r.admitted ? streamed_for_depth : streamed_to_fit) = true;
    } else {
      EXPECT_FALSE(a.dspark_streamed) << budget;
    }
  }
  // Both reasons to stream occur between a budget too small for anything and a roomy one.
  EXPECT_TRUE(streamed_for_depth);
  EXPECT_TRUE(streamed_to_fit);
}
