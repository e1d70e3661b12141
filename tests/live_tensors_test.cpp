// LiveTensors (backend/live_tensors.h): which live tensor holds a range of floats, so that work
// a device backend deferred writes only into the allocation it was issued for.
#include "backend/live_tensors.h"

#include <gtest/gtest.h>

#include <memory>

namespace sluice {
namespace {

TEST(LiveTensors, AFloatRangeBelongsToTheTensorThatHoldsItWhole) {
  const auto reg = std::make_shared<LiveTensors>();
  const Tensor a = LiveTensors::make(reg, 3, 5), b = LiveTensors::make(reg, 2, 7);
  EXPECT_EQ(reg->count(), 2u);
  const float* pa = a.c().p;
  const uint64_t ida = reg->holder(pa, 15).id;
  EXPECT_NE(ida, 0u);
  EXPECT_EQ(reg->holder(pa + 4, 11).id, ida) << "a view ending at the tensor's end";
  EXPECT_EQ(reg->holder(pa + 14, 1).id, ida);
  EXPECT_EQ(reg->holder(pa + 4, 12).id, 0u) << "a range running past the end is not held";
  EXPECT_NE(reg->holder(b.c().p, 14).id, 0u);
  EXPECT_NE(reg->holder(b.c().p, 14).id, ida);
  // Memory beyond a tensor's end (another allocation, a host vector) is no tensor's, however
  // far past it lies.
  const auto other = std::make_unique<float[]>(64);
  EXPECT_EQ(reg->holder(other.get(), 8).id, 0u);
  EXPECT_EQ(reg->holder(pa + 15, 1).id, 0u);
  EXPECT_EQ(reg->holder(pa - 1, 2).id, 0u);
  EXPECT_EQ(reg->holder(pa + 4, 3).start, pa);
  EXPECT_EQ(a.c().p[7], 0.0f) << "zero-filled";
}

TEST(LiveTensors, AFreedTensorIsNoLongerAliveAndItsAddressIsNotMistakenForANewOne) {
  const auto reg = std::make_shared<LiveTensors>();
  uint64_t id = 0;
  const float* p = nullptr;
  {
    const Tensor t = LiveTensors::make(reg, 4, 4);
    p = t.c().p;
    id = reg->holder(p, 16).id;
    const auto lk = reg->lock();
    EXPECT_TRUE(reg->alive(id));
  }
  EXPECT_EQ(reg->count(), 0u);
  EXPECT_EQ(reg->holder(p, 16).id, 0u);
  {
    const auto lk = reg->lock();
    EXPECT_FALSE(reg->alive(id));
    EXPECT_FALSE(reg->alive(0));
  }
  const Tensor again = LiveTensors::make(reg, 4, 4);  // may reuse the address
  const uint64_t id2 = reg->holder(again.c().p, 16).id;
  EXPECT_NE(id2, 0u);
  EXPECT_NE(id2, id);
  const auto lk = reg->lock();
  EXPECT_FALSE(reg->alive(id));
}

TEST(LiveTensors, TensorsOutliveTheirRegistryHandle) {
  Tensor t;
  {
    auto reg = std::make_shared<LiveTensors>();
    t = LiveTensors::make(reg, 2, 2);
  }
  t.m().p[3] = 1.0f;  // the registry lives as long as its tensors; ASan checks the free
  EXPECT_EQ(t.c().p[3], 1.0f);
}

}  // namespace
}  // namespace sluice
