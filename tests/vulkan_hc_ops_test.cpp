// The hyper-connection ops on the Vulkan device (hc_mix, hc_pre_norm, hc_pre, hc_post): recorded
// into the deferred batch with the linears around them, reading their inputs where the batch
// writes them or staged from the host, with the CPU backend's bits (docs/backends.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu_backend.h"
#include "backend/vulkan_backend.h"
#include "kernels/fp.h"
#include "kernels/numerics.h"
#include "test_tensors.h"
#include "test_util.h"
#include "test_weights.h"

namespace sluice {
namespace {

constexpr bool kBuilt = test::kVulkanBuilt;

// BF16-exact values over many binades, as the residual streams hold.
std::vector<float> streams(std::mt19937_64& rng, size_t n, float spread) { return test::bf16_randoms(rng, n, spread, 4); }
using test::fill;
using test::first_difference;

struct HcWeights {
  test::HostWeight fn;       // the projections, F16 as in the published model
  Weight cpu_fn;             // the CPU's preparation of the same bytes
  std::vector<float> base, scale, norm;
};

HcWeights hc_weights(const Backend& gpu, const CpuBackend& cpu, uint32_t hc, size_t H, std::mt19937_64& rng, float spread) {
  HcWeights w{test::random_host_weight(GgmlType::F16, hc_mix_width(hc), hc * H, rng()), {}, {}, {}, {}};
  w.cpu_fn = w.fn.w;
  cpu.prepare_weight(w.cpu_fn);
  gpu.prepare_weight_for(w.fn.w, WeightUse::HcMix);
  w.base = streams(rng, hc_mix_width(hc), 1.0f);
  // Scales that put the sigmoids' and the Sinkhorn's arguments from tiny to past exp's range.
  w.scale = {spread, spread * 0.5f, spread * 2.0f};
  w.norm = streams(rng, H, 1.5f);
  return w;
}

// One sublayer's hyper-connection steps as the forward pass runs them (forward.cpp run_pass): the
// attention's mixes and collapse, its output written back, the FFN's mixes and collapse, and a
// router (an F32 linear) on the collapsed rows, on the device and on the CPU.
TEST(VulkanHc, SublayerStepsOnTheDeviceHaveTheCpuBits) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(GpuOptions{});
  const CpuBackend cpu(1);
  std::mt19937_64 rng(41);
  const uint32_t hc = 4;
  // The weights live as long as the backend: it may use their pages in place.
  std::deque<HcWeights> keep;
  std::deque<test::HostWeight> routers;
  for (const size_t H : {37u, 256u})
    for (const size_t n : {1u, 3u, 17u})
      for (const float spread : {0.05f, 3.0f, 300.0f}) {
        SCOPED_TRACE("H " + std::to_string(H) + " n " + std::to_string(n) + " spread " + std::to_string(spread));
        const HcParams hp{hc, 20, 1e-6f, 1e-6f};
        HcWeights& a = keep.emplace_back(hc_weights(*gpu, cpu, hc, H, rng, spread));
        HcWeights& f = keep.emplace_back(hc_weights(*gpu, cpu, hc, H, rng, spread));
        test::HostWeight& router = routers.emplace_back(test::random_host_weight(GgmlType::F32, 11, H, rng()));
        Weight cpu_router = router.w;
        cpu.prepare_weight(cpu_router);
        gpu->prepare_weight(router.w);
        const std::vector<float> x = streams(rng, n * hc * H, spread), out = streams(rng, n * H, spread);
        const std::vector<float> pre0 = streams(rng, n * hc, 1.0f);  // the lagged pre weights

        // The CPU.
        const Tensor cX = cpu.tensor(n, hc * H), cX2 = cpu.tensor(n, hc * H), cA = cpu.tensor(n, hc_mix_width(hc)),
                     cF = cpu.tensor(n, hc_mix_width(hc)), cP = cpu.tensor(n, hc), cin = cpu.tensor(n, H),
                     cout = cpu.tensor(n, H), cfin = cpu.tensor(n, H), clog = cpu.tensor(n, 11), cy = cpu.tensor(n, H);
        fill(cX, x);
        fill(cout, out);
        fill(cP, pre0);
        cpu.hc_mix(a.cpu_fn, a.base.data(), a.scale.data(), hp, cX.c(), cA.m());
        cpu.hc_pre_norm(cX.c(), cP.c(), a.norm.data(), hp, cin.m());
        cpu.hc_post(cout.c(), cX.c(), cA.c(), hc, cX2.m());
        cpu.hc_mix(f.cpu_fn, f.base.data(), f.scale.data(), hp, cX2.c(), cF.m());
        cpu.hc_pre_norm(cX2.c(), cA.c().cols(0, hc), f.norm.data(), hp, cfin.m());
        cpu.linear(cpu_router, cfin.c(), clog.m(), false, 0);
        cpu.hc_pre(cX2.c(), cF.c().cols(0, hc), hp, cy.m());

        // The device: every step deferred, one submission at the sync.
        const Tensor gX = gpu->tensor(n, hc * H), gX2 = gpu->tensor(n, hc * H), gA = gpu->tensor(n, hc_mix_width(hc)),
                     gF = gpu->tensor(n, hc_mix_width(hc)), gP = gpu->tensor(n, hc), gin = gpu->tensor(n, H),
                     gout = gpu->tensor(n, H), gfin = gpu->tensor(n, H), glog = gpu->tensor(n, 11), gy = gpu->tensor(n, H);
        fill(gX, x);
        fill(gout, out);
        fill(gP, pre0);
        const GpuStats s0 = gpu_stats(*gpu);
        gpu->hc_mix(a.fn.w, a.base.data(), a.scale.data(), hp, gX.c(), gA.m());
        gpu->hc_pre_norm(gX.c(), gP.c(), a.norm.data(), hp, gin.m());
        gpu->hc_post(gout.c(), gX.c(), gA.c(), hc, gX2.m());
        gpu->hc_mix(f.fn.w, f.base.data(), f.scale.data(), hp, gX2.c(), gF.m());
        gpu->hc_pre_norm(gX2.c(), gA.c().cols(0, hc), f.norm.data(), hp, gfin.m());
        gpu->linear(router.w, gfin.c(), glog.m(), false);
        gpu->hc_pre(gX2.c(), gF.c().cols(0, hc), hp, gy.m());
        const GpuStats s1 = gpu_stats(*gpu);
        EXPECT_EQ(s1.submissions - s0.submissions, 0u) << "a step ran before the sync";
        // Two hc_mix, two hc_pre and their norms, hc_post, hc_pre.
        EXPECT_EQ(s1.ops_on_device - s0.ops_on_device, 8u) << "a step ran on the host";
        gpu->sync();
        EXPECT_EQ(gpu_stats(*gpu).submissions - s0.submissions, 1u);
        EXPECT_EQ(first_difference(gA, cA), -1) << "the attention's mixes";
        EXPECT_EQ(first_difference(gin, cin), -1) << "the attention's input";
        EXPECT_EQ(first_difference(gX2, cX2), -1) << "the streams after the attention";
        EXPECT_EQ(first_difference(gF, cF), -1) << "the FFN's mixes (from streams the device wrote)";
        EXPECT_EQ(first_difference(gfin, cfin), -1) << "the FFN's input";
        EXPECT_EQ(first_difference(glog, clog), -1) << "the router, reading the FFN's input on the device";
        EXPECT_EQ(first_difference(gy, cy), -1) << "hc_pre with weights the device wrote";
      }
}

// Each sublayer collapses the streams into the same tensor (xin): the second collapse writes a new
// region of the batch, the reader before it keeps the first, the reader after it gets the second,
// and the tensor ends with the second (one submission).
TEST(VulkanHc, ACollapseRewritingRowsTheBatchWroteIsReadInOrder) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(GpuOptions{});
  const CpuBackend cpu(1);
  std::mt19937_64 rng(49);
  const uint32_t hc = 4;
  const size_t H = 64, n = 3;
  const HcParams hp{hc, 20, 1e-6f, 1e-6f};
  test::HostWeight w = test::random_host_weight(GgmlType::Q8_0, 16, H, rng());
  Weight cw = w.w;
  cpu.prepare_weight(cw);
  gpu->prepare_weight(w.w);
  const std::vector<float> x1 = streams(rng, n * hc * H, 1.0f), x2 = streams(rng, n * hc * H, 1.0f),
                           pre = streams(rng, n * hc, 1.0f), norm = streams(rng, H, 1.0f);
  const Tensor cX1 = cpu.tensor(n, hc * H), cX2 = cpu.tensor(n, hc * H), cP = cpu.tensor(n, hc), cin = cpu.tensor(n, H),
               cy1 = cpu.tensor(n, 16), cy2 = cpu.tensor(n, 16);
  const Tensor gX1 = gpu->tensor(n, hc * H), gX2 = gpu->tensor(n, hc * H), gP = gpu->tensor(n, hc), gin = gpu->tensor(n, H),
               gy1 = gpu->tensor(n, 16), gy2 = gpu->tensor(n, 16);
  for (const Tensor* t : {&cX1, &gX1}) fill(*t, x1);
  for (const Tensor* t : {&cX2, &gX2}) fill(*t, x2);
  for (const Tensor* t : {&cP, &gP}) fill(*t, pre);
  cpu.hc_pre_norm(cX1.c(), cP.c(), norm.data(), hp, cin.m());
  cpu.linear(cw, cin.c(), cy1.m(), true, 0);
  cpu.hc_pre_norm(cX2.c(), cP.c(), norm.data(), hp, cin.m());
  cpu.linear(cw, cin.c(), cy2.m(), true, 0);
  const GpuStats s0 = gpu_stats(*gpu);
  gpu->hc_pre_norm(gX1.c(), gP.c(), norm.data(), hp, gin.m());
  gpu->linear(w.w, gin.c(), gy1.m(), true, 0);
  gpu->hc_pre_norm(gX2.c(), gP.c(), norm.data(), hp, gin.m());
  gpu->linear(w.w, gin.c(), gy2.m(), true, 0);
  EXPECT_EQ(gpu_stats(*gpu).ops_on_device - s0.ops_on_device, 4u);
  gpu->sync();
  EXPECT_EQ(gpu_stats(*gpu).submissions - s0.submissions, 1u);
  EXPECT_EQ(first_difference(gy1, cy1), -1) << "the reader of the first collapse";
  EXPECT_EQ(first_difference(gy2, cy2), -1) << "the reader of the second collapse";
  EXPECT_EQ(first_difference(gin, cin), -1) << "the tensor after both";
}

// Where a step cannot join the batch (its output is not in one of the backend's tensors) it runs
// on the host after the batch, with the same bits.
TEST(VulkanHc, StepsOutsideTheBackendsTensorsRunOnTheHost) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(GpuOptions{});
  const CpuBackend cpu(1);
  std::mt19937_64 rng(43);
  const uint32_t hc = 4;
  const size_t H = 64, n = 5;
  const HcParams hp{hc, 20, 1e-6f, 1e-6f};
  HcWeights a = hc_weights(*gpu, cpu, hc, H, rng, 2.0f);
  const std::vector<float> x = streams(rng, n * hc * H, 2.0f);
  const Tensor cX = cpu.tensor(n, hc * H), cA = cpu.tensor(n, hc_mix_width(hc)), gX = gpu->tensor(n, hc * H);
  fill(cX, x);
  fill(gX, x);
  cpu.hc_mix(a.cpu_fn, a.base.data(), a.scale.data(), hp, cX.c(), cA.m());
  std::vector<float> mixes(n * hc_mix_width(hc), -1.0f);
  const GpuStats s0 = gpu_stats(*gpu);
  gpu->hc_mix(a.fn.w, a.base.data(), a.scale.data(), hp, gX.c(), Mat{mixes.data(), n, hc_mix_width(hc), hc_mix_width(hc)});
  EXPECT_EQ(gpu_stats(*gpu).ops_on_device, s0.ops_on_device);
  EXPECT_EQ(std::memcmp(mixes.data(), cA.c().p, mixes.size() * sizeof(float)), 0);
}

// The Engram gate before a layer's mixes (forward_engram.cpp): its keys and value from a deferred
// linear, the streams in place where the batch wrote them (hc_post) or staged from the host, some
// tokens masked, gates from the floor of |dot| to saturation.
TEST(VulkanHc, EngramGateOnTheDeviceHasTheCpuBits) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(GpuOptions{});
  const CpuBackend cpu(1);
  std::mt19937_64 rng(47);
  const uint32_t hc = 4;
  std::deque<test::HostWeight> keep;
  for (const size_t H : {32u, 96u})
    for (const size_t n : {1u, 5u})
      for (const float spread : {0.01f, 1.0f, 50.0f})
        for (const bool from_batch : {false, true}) {
          SCOPED_TRACE("H " + std::to_string(H) + " n " + std::to_string(n) + " spread " + std::to_string(spread) +
                       (from_batch ? " streams from the batch" : " streams from the host"));
          test::HostWeight& wkv = keep.emplace_back(test::random_host_weight(GgmlType::Q8_0, (hc + 1) * H, 64, rng()));
          Weight ckv = wkv.w;
          cpu.prepare_weight(ckv);
          gpu->prepare_weight(wkv.w);
          const std::vector<float> rows = streams(rng, n * 64, spread), x = streams(rng, n * hc * H, spread),
                                   out = streams(rng, n * H, spread), mix = streams(rng, n * hc_mix_width(hc), 1.0f),
                                   qn0 = streams(rng, hc * H, 1.0f), kn0 = streams(rng, hc * H, 1.0f);
          // Norm weights with all 24 bits, so that each product rounds (BF16 ones multiply exactly).
          std::vector<float> qn(qn0), kn(kn0);
          for (size_t i = 0; i < qn.size(); ++i) {
            qn[i] *= 1.0f + 0x1.5p-12f * (float)(i % 7);
            kn[i] *= 1.0f - 0x1.3p-13f * (float)(i % 5);
          }
          std::vector<uint8_t> masked(n, 0);
          if (n > 1) masked[1] = 1;
          const Tensor cr = cpu.tensor(n, 64), ckvt = cpu.tensor(n, (hc + 1) * H), cX = cpu.tensor(n, hc * H),
                       cF = cpu.tensor(n, H), cA = cpu.tensor(n, hc_mix_width(hc)), cY = cpu.tensor(n, hc * H);
          const Tensor gr = gpu->tensor(n, 64), gkvt = gpu->tensor(n, (hc + 1) * H), gX = gpu->tensor(n, hc * H),
                       gF = gpu->tensor(n, H), gA = gpu->tensor(n, hc_mix_width(hc)), gY = gpu->tensor(n, hc * H);
          for (const Tensor* t : {&cr, &gr}) fill(*t, rows);
          for (const Tensor* t : {&cX, &gX}) fill(*t, x);
          for (const Tensor* t : {&cF, &gF}) fill(*t, out);
          for (const Tensor* t : {&cA, &gA}) fill(*t, mix);
          // The streams the gate reads: X itself, or hc_post's output Y.
          cpu.hc_post(cF.c(), cX.c(), cA.c(), hc, cY.m());
          cpu.linear(ckv, cr.c(), ckvt.m(), true, 0);
          const Tensor& ct = from_batch ? cY : cX;
          cpu.engram_gate(ct.m(), hc, ckvt.c(), qn.data(), kn.data(), 1e-6f, masked.data());
          const GpuStats s0 = gpu_stats(*gpu);
          if (from_batch) gpu->hc_post(gF.c(), gX.c(), gA.c(), hc, gY.m());
          gpu->linear(wkv.w, gr.c(), gkvt.m(), true, 0);
          const Tensor& gt = from_batch ? gY : gX;
          gpu->engram_gate(gt.m(), hc, gkvt.c(), qn.data(), kn.data(), 1e-6f, masked.data());
          EXPECT_EQ(gpu_stats(*gpu).ops_on_device - s0.ops_on_device, from_batch ? 2u : 1u) << "the gate ran on the host";
          gpu->sync();
          EXPECT_EQ(gpu_stats(*gpu).submissions - s0.submissions, 1u);
          EXPECT_EQ(first_difference(gt, ct), -1);

          // The gates themselves, which the BF16 rounding of the streams mostly hides.
          std::vector<float> want(n * hc), wq(H);
          const float inv_sqrt_h = (float)(1.0 / std::sqrt((double)H));
          for (uint32_t h = 0; h < hc; ++h) {
            for (size_t k = 0; k < H; ++k) wq[k] = qn[h * H + k] * kn[h * H + k];
            for (size_t i = 0; i < n; ++i)
              want[i * hc + h] = engram_gate_value(x.data() + i * hc * H + h * H, ckvt.c().row(i) + h * H, wq.data(), H,
                                                   1e-6f, inv_sqrt_h);
          }
          const std::vector<float> got =
              gpu_engram_gates(*gpu, x.data(), ckvt.c().p, n, hc, H, qn.data(), kn.data(), 1e-6f);
          EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << "gate 0: " << got[0] << " vs " << want[0];
        }
}

}  // namespace
}  // namespace sluice
