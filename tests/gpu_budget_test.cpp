// The GPU weight budget (--gpu-mem B|auto) from a device's heaps, with and without the driver's
// VK_EXT_memory_budget figures: plain arithmetic, tested without a device.
#include "backend/gpu_budget.h"

#include <gtest/gtest.h>

#include <vector>

#include "util/error.h"

namespace sluice {
namespace {

constexpr uint64_t GiB = 1ull << 30;

GpuHeap heap(uint64_t bytes, bool local) {
  GpuHeap h;
  h.bytes = bytes;
  h.device_local = local;
  return h;
}

GpuHeap heap(uint64_t bytes, bool local, uint64_t budget, uint64_t usage) {
  GpuHeap h = heap(bytes, local);
  h.has_budget = true;
  h.budget = budget;
  h.usage = usage;
  return h;
}

TEST(GpuBudget, AutoIsAShareOfTheLargestDeviceLocalHeap) {
  // A discrete card: 24 GiB of VRAM beside a 32 GiB host-visible heap.
  const std::vector<GpuHeap> card = {heap(32 * GiB, false), heap(24 * GiB, true)};
  EXPECT_EQ(gpu_weight_budget(card, false, 0, "card").bytes, 24 * GiB / 5 * 4);
  // The same heaps on a device whose memory is the host's: half.
  EXPECT_EQ(gpu_weight_budget(card, true, 0, "apu").bytes, 12 * GiB);
  // No device-local heap (a CPU device can list one host heap): the largest heap.
  const std::vector<GpuHeap> cpu = {heap(8 * GiB, false), heap(16 * GiB, false)};
  EXPECT_EQ(gpu_weight_budget(cpu, true, 0, "cpu").bytes, 8 * GiB);
}

TEST(GpuBudget, TheDriversBudgetTakesOffWhatOthersAndWeUse) {
  // 24 GiB of VRAM of which the driver lets this process have 20 GiB, 2 GiB already in use (a
  // desktop, another model): 18 GiB free, 80% of it for weights.
  const std::vector<GpuHeap> card = {heap(32 * GiB, false), heap(24 * GiB, true, 20 * GiB, 2 * GiB)};
  const GpuWeightBudget b = gpu_weight_budget(card, false, 0, "card");
  EXPECT_EQ(b.bytes, 18 * GiB / 5 * 4);
  EXPECT_NE(b.why.find("VK_EXT_memory_budget"), std::string::npos) << b.why;
  // A budget the process has already used up leaves nothing for weights (they run on the CPU).
  const std::vector<GpuHeap> full = {heap(24 * GiB, true, 4 * GiB, 5 * GiB)};
  EXPECT_EQ(gpu_weight_budget(full, false, 0, "card").bytes, 0u);
  // A budget larger than the heap (drivers may report one) is held to the heap.
  const std::vector<GpuHeap> big = {heap(8 * GiB, true, 64 * GiB, 0)};
  EXPECT_EQ(gpu_weight_budget(big, false, 0, "card").bytes, 8 * GiB / 5 * 4);
}

TEST(GpuBudget, AnAskedBudgetMustFitWhatIsFree) {
  const std::vector<GpuHeap> card = {heap(24 * GiB, true, 20 * GiB, 2 * GiB)};
  EXPECT_EQ(gpu_weight_budget(card, false, 18 * GiB, "card").bytes, 18 * GiB);
  try {
    gpu_weight_budget(card, false, 19 * GiB, "RTX test");
    FAIL() << "19 GiB of 18 free was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--gpu-mem 19.00 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("RTX test"), std::string::npos) << m;
    EXPECT_NE(m.find("18.00 GiB of it free"), std::string::npos) << m;
  }
  // Without the extension the heap's size is the limit.
  const std::vector<GpuHeap> plain = {heap(24 * GiB, true)};
  EXPECT_EQ(gpu_weight_budget(plain, false, 24 * GiB, "card").bytes, 24 * GiB);
  EXPECT_THROW(gpu_weight_budget(plain, false, 24 * GiB + 1, "card"), Error);
  EXPECT_THROW(gpu_weight_budget({}, false, 0, "none"), Error);
}

// The card's own plan: the mandatory part (the batch's rows in its memory) first, then the dense
// weights, then as many expert slots as are left room for; a budget without room for the
// mandatory part is refused before anything is allocated, naming each part and how to fix it.
TEST(GpuBudget, TheDevicePlanHoldsTheMandatoryPartFirst) {
  constexpr uint64_t MiB = 1ull << 20;
  const GpuWeightBudget b{1000 * MiB, "--gpu-mem"};
  GpuDeviceNeeds n;
  n.scratch = 16 * MiB;
  n.dense = 900 * MiB;
  n.slot_bytes = 10 * MiB;
  n.slots = 20;
  n.host_staging = 48 * MiB;
  const GpuDevicePlan p = gpu_device_plan(b, false, n, "RTX test");
  EXPECT_EQ(p.mandatory, 16 * MiB);
  EXPECT_EQ(p.for_weights, 984 * MiB);
  EXPECT_EQ(p.dense, 900 * MiB);
  EXPECT_EQ(p.slots, 8u) << "84 MiB left holds 8 slots of 10 MiB";
  EXPECT_EQ(p.unused, 4 * MiB);
  ASSERT_EQ(p.lines.size(), 5u);
  EXPECT_EQ(p.lines[0].name, "scratch");
  EXPECT_EQ(p.lines[0].bytes, 16 * MiB);
  EXPECT_EQ(p.lines[1].name, "sequence state");
  EXPECT_EQ(p.lines[2].name, "staging");
  EXPECT_EQ(p.lines[2].bytes, 0u) << "host memory, not the device's";
  EXPECT_EQ(p.lines[3].name, "dense weights");
  EXPECT_EQ(p.lines[4].name, "expert slots");
  EXPECT_NE(p.lines[4].detail.find("fewer fit"), std::string::npos) << p.lines[4].detail;
  uint64_t sum = 0;
  for (const GpuPlanLine& l : p.lines) sum += l.bytes;
  EXPECT_EQ(sum + p.unused, p.budget) << "the lines and what is unused make the budget";
  // Dense weights beyond the room: what fits is the device's, the rest the CPU's.
  n.dense = 2000 * MiB;
  const GpuDevicePlan q = gpu_device_plan(b, false, n, "RTX test");
  EXPECT_EQ(q.dense, 984 * MiB);
  EXPECT_EQ(q.slots, 0u);
  EXPECT_NE(q.lines[3].detail.find("the rest run on the CPU"), std::string::npos) << q.lines[3].detail;
  // Auto slots: as many as fit; imported dense weights cost the device nothing.
  n.dense_in_place = true;
  n.slots_auto = true;
  n.slots = 0;
  EXPECT_EQ(gpu_device_plan(b, true, n, "apu").slots, 98u);
  // The mandatory part alone over the budget: refused, each part and the budget named.
  try {
    gpu_device_plan(GpuWeightBudget{12 * MiB, "80% of 15.00 MiB device-local heap"}, false, n, "RTX test");
    FAIL() << "16 MiB of rows in a 12 MiB budget was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("RTX test"), std::string::npos) << m;
    EXPECT_NE(m.find("scratch (the deferred batch's rows) 16.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("12.00 MiB (80% of 15.00 MiB device-local heap)"), std::string::npos) << m;
    EXPECT_NE(m.find("at least 16.00 MiB with --gpu-mem"), std::string::npos) << m;
  }
  n.scratch = 12 * MiB;  // exactly the budget: admitted, nothing left for weights
  const GpuDevicePlan e = gpu_device_plan(GpuWeightBudget{12 * MiB, "x"}, false, n, "RTX test");
  EXPECT_EQ(e.for_weights, 0u);
  EXPECT_EQ(e.slots, 0u);
}

}  // namespace
}  // namespace sluice
