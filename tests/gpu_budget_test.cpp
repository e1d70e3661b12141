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

}  // namespace
}  // namespace sluice
