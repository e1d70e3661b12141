// RoPE and the attention on the Vulkan device (rope, sparse_attention, attend_rows): recorded into
// the deferred batch, the rows each query attends staged from the host, with the CPU backend's
// bits (docs/backends.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu_backend.h"
#include "backend/vulkan_backend.h"
#include "format/tensor_type.h"
#include "kernels/exp_f32.h"
#include "kernels/fp.h"
#include "kernels/fp4_rows.h"
#include "kernels/numerics.h"
#include "kernels/types.h"
#include "test_tensors.h"
#include "test_util.h"
#include "test_weights.h"

namespace sluice {
namespace {

constexpr bool kBuilt = test::kVulkanBuilt;

std::vector<float> bf16_values(std::mt19937_64& rng, size_t n, float spread) { return test::bf16_randoms(rng, n, spread, 3); }
using test::fill;
using test::first_difference;

// RoPE on the rows a deferred linear writes runs on the device, in place, for odd head shapes
// (the rotated pairs the last of each head), far positions and both directions.
TEST(VulkanAttention, RopeOnTheDeviceHasTheCpuBits) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(GpuOptions{});
  const CpuBackend cpu(1);
  std::mt19937_64 rng(51);
  const uint32_t head_dim = 10, heads = 3;
  const std::vector<double> freqs = {1.0, 0.1, 1e-3};  // three pairs of the ten
  const RopeTable tab{freqs.data(), freqs.size()};
  test::HostWeight w = test::random_host_weight(GgmlType::Q8_0, heads * head_dim, 64, rng());
  Weight cw = w.w;
  cpu.prepare_weight(cw);
  gpu->prepare_weight(w.w);
  for (const size_t n : {1u, 7u})
    for (const bool inverse : {false, true}) {
      SCOPED_TRACE("n " + std::to_string(n) + (inverse ? " inverse" : ""));
      std::vector<uint64_t> pos(n);
      for (size_t i = 0; i < n; ++i) pos[i] = i == 0 ? 0 : (uint64_t)std::pow(9.0, (double)i) + i;
      const std::vector<float> x = bf16_values(rng, n * 64, 2.0f);
      const Tensor cx = cpu.tensor(n, 64), cy = cpu.tensor(n, heads * head_dim);
      const Tensor gx = gpu->tensor(n, 64), gy = gpu->tensor(n, heads * head_dim);
      fill(cx, x);
      fill(gx, x);
      cpu.linear(cw, cx.c(), cy.m(), true, 0);
      cpu.rope(cy.m(), head_dim, tab, pos, inverse);
      const GpuStats s0 = gpu_stats(*gpu);
      gpu->linear(w.w, gx.c(), gy.m(), true, 0);
      gpu->rope(gy.m(), head_dim, tab, pos, inverse);
      EXPECT_EQ(gpu_stats(*gpu).ops_on_device - s0.ops_on_device, 1u) << "RoPE ran on the host";
      gpu->sync();
      EXPECT_EQ(gpu_stats(*gpu).submissions - s0.submissions, 1u);
      EXPECT_EQ(first_difference(gy, cy), -1);
    }
}

// One query chunk's attention as the forward pass calls it: a window ring and the chunk's fresh
// rows, compressed rows packed on the NVFP4 grid with per-query selections (some past the query's
// visible count), sinks; queries from the host and from a deferred linear. And the drafter's
// attend_rows over one list.
TEST(VulkanAttention, SparseAttentionOnTheDeviceHasTheCpuBits) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(GpuOptions{});
  const CpuBackend cpu(1);
  std::mt19937_64 rng(53);
  const uint32_t hd = 32, heads = 3, W = 5, ratio = 2;
  test::HostWeight wq = test::random_host_weight(GgmlType::Q8_0, heads * hd, 64, rng());
  Weight cwq = wq.w;
  cpu.prepare_weight(cwq);
  gpu->prepare_weight(wq.w);
  for (const uint32_t p0 : {0u, 9u})
    for (const uint32_t n : {1u, 6u})
      for (const float spread : {0.5f, 8.0f}) {
        SCOPED_TRACE("p0 " + std::to_string(p0) + " n " + std::to_string(n) + " spread " + std::to_string(spread));
        auto bits = [&](size_t count) {
          std::vector<uint16_t> b(count);
          for (uint16_t& v : b) v = f32_to_bf16(bf16_values(rng, 1, spread)[0]);
          return b;
        };
        const std::vector<uint16_t> ring = bits((size_t)W * hd), fresh = bits((size_t)n * hd);
        // Compressed rows: (p0 + n) / ratio of them, packed; the first `first` are old.
        const uint32_t ncomp = (p0 + n) / ratio + 1, first = ncomp / 2;
        const std::vector<float> comp_vals = bf16_values(rng, (size_t)ncomp * hd, spread);
        const size_t rb = fp4_row_bytes(Fp4Grid::Nvfp4, hd);
        std::vector<uint8_t> packed((size_t)ncomp * rb);
        for (uint32_t g = 0; g < ncomp; ++g) fp4_pack_row(Fp4Grid::Nvfp4, comp_vals.data() + (size_t)g * hd, hd, packed.data() + g * rb);
        std::vector<std::vector<int32_t>> sel(n);
        for (uint32_t i = 0; i < n; ++i)
          for (uint32_t g = 0; g < ncomp; ++g)
            if ((g + i) % 3 != 1) sel[i].push_back((int32_t)g);  // ascending, the last beyond the visible count
        const std::vector<float> sinks = bf16_values(rng, heads, 4.0f);
        SparseAttention a;
        a.heads = heads;
        a.head_dim = hd;
        a.p0 = p0;
        a.window = WindowRows{ring.data(), fresh.data(), W, p0, hd};
        a.comp = CacheRows{packed.data(), packed.data() + first * rb, first, hd, Fp4Grid::Nvfp4};
        a.comp_ratio = ratio;
        a.sel = &sel;
        a.sinks = sinks.data();

        // Queries from the host.
        const std::vector<float> qv = bf16_values(rng, (size_t)n * heads * hd, spread);
        const Tensor cq = cpu.tensor(n, heads * hd), co = cpu.tensor(n, heads * hd);
        const Tensor gq = gpu->tensor(n, heads * hd), go = gpu->tensor(n, heads * hd);
        fill(cq, qv);
        fill(gq, qv);
        a.q = cq.c();
        cpu.sparse_attention(a, co.m());
        a.q = gq.c();
        GpuStats s0 = gpu_stats(*gpu);
        gpu->sparse_attention(a, go.m());
        EXPECT_EQ(gpu_stats(*gpu).ops_on_device - s0.ops_on_device, 1u) << "the attention ran on the host";
        gpu->sync();
        EXPECT_EQ(first_difference(go, co), -1) << "queries from the host";

        // Queries a deferred linear writes, the output turned back by RoPE: one submission.
        const std::vector<float> x = bf16_values(rng, (size_t)n * 64, 1.0f);
        const Tensor cx = cpu.tensor(n, 64), gx = gpu->tensor(n, 64), co2 = cpu.tensor(n, heads * hd),
                     go2 = gpu->tensor(n, heads * hd);
        fill(cx, x);
        fill(gx, x);
        const std::vector<double> freqs = {0.5, 0.01};
        const RopeTable tab{freqs.data(), freqs.size()};
        std::vector<uint64_t> pos(n);
        for (uint32_t i = 0; i < n; ++i) pos[i] = p0 + i;
        cpu.linear(cwq, cx.c(), cq.m(), true, 0);
        a.q = cq.c();
        cpu.sparse_attention(a, co2.m());
        cpu.rope(co2.m(), hd, tab, pos, true);
        s0 = gpu_stats(*gpu);
        gpu->linear(wq.w, gx.c(), gq.m(), true, 0);
        a.q = gq.c();
        gpu->sparse_attention(a, go2.m());
        gpu->rope(go2.m(), hd, tab, pos, true);
        EXPECT_EQ(gpu_stats(*gpu).submissions, s0.submissions);
        gpu->sync();
        EXPECT_EQ(gpu_stats(*gpu).submissions - s0.submissions, 1u);
        EXPECT_EQ(first_difference(go2, co2), -1) << "queries from a deferred linear";

        // The drafter's attention: every query over one list (here the window's ring).
        std::vector<const uint16_t*> list;
        for (uint32_t k = 0; k < W; ++k) list.push_back(ring.data() + (size_t)((k * 2) % W) * hd);
        const RowAttention ra{cq.c(), heads, hd, list, sinks.data()};
        const Tensor co3 = cpu.tensor(n, heads * hd), go3 = gpu->tensor(n, heads * hd);
        cpu.attend_rows(ra, co3.m());
        RowAttention rg = ra;
        rg.q = gq.c();
        s0 = gpu_stats(*gpu);
        gpu->attend_rows(rg, go3.m());
        EXPECT_EQ(gpu_stats(*gpu).ops_on_device - s0.ops_on_device, 1u);
        gpu->sync();
        EXPECT_EQ(first_difference(go3, co3), -1) << "attend_rows";
      }
}

// Rows kept on the device (--gpu-kv): a second call reads them from their slots (the compressed
// ones packed, unpacked by the shader); a window row and a compressed row rewritten in place
// between calls are copied again, never read stale; with fewer slots than the call reads, the
// rest are staged. The CPU's bits every time.
TEST(VulkanAttention, KeptRowsAreReadAgainOnlyWhileTheirBytesAreUnchanged) {
  if (!kBuilt) return;
  const CpuBackend cpu(1);
  std::mt19937_64 rng(59);
  const uint32_t hd = 32, heads = 2, W = 6, ratio = 1, n = 3, p0 = 20, ncomp = p0 + n;
  std::vector<uint16_t> ring((size_t)W * hd), fresh((size_t)n * hd);
  for (uint16_t& v : ring) v = f32_to_bf16(bf16_values(rng, 1, 2.0f)[0]);
  for (uint16_t& v : fresh) v = f32_to_bf16(bf16_values(rng, 1, 2.0f)[0]);
  const size_t rb = fp4_row_bytes(Fp4Grid::Nvfp4, hd);
  std::vector<uint8_t> packed((size_t)ncomp * rb);
  // Compressed rows whose blocks take the E4M3 scales' corners (the shader unpacks kept ones):
  // small values (subnormal scales), large ones (scales near 448's binade), signed zeros, and a
  // scale with its sign bit set.
  auto pack = [&](uint32_t g) {
    std::vector<float> v = bf16_values(rng, hd, 2.0f);
    for (uint32_t k = 0; k < hd; ++k) {
      if (g % 4 == 1) v[k] = std::ldexp(v[k], -8);
      if (g % 4 == 2) v[k] = std::ldexp(v[k], 8);
      if (g % 4 == 3 && k < 16) v[k] = k % 2 ? -0.0f : 0.0f;
    }
    uint8_t* const row = packed.data() + (size_t)g * rb;
    fp4_pack_row(Fp4Grid::Nvfp4, v.data(), hd, row);
    if (g % 4 == 3) row[hd / 2 + 1] |= 0x80;  // a negative scale: bytes no packing makes, unpacked all the same
  };
  for (uint32_t g = 0; g < ncomp; ++g) pack(g);
  std::vector<std::vector<int32_t>> sel(n);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t g = i; g < ncomp; g += 3) sel[i].push_back((int32_t)g);
  const std::vector<float> sinks = bf16_values(rng, heads, 2.0f), qv = bf16_values(rng, (size_t)n * heads * hd, 2.0f);
  SparseAttention a;
  a.heads = heads;
  a.head_dim = hd;
  a.p0 = p0;
  a.window = WindowRows{ring.data(), fresh.data(), W, p0, hd};
  a.comp = CacheRows{packed.data(), packed.data(), ncomp, hd, Fp4Grid::Nvfp4};
  a.comp_ratio = ratio;
  a.sel = &sel;
  a.sinks = sinks.data();
  const Tensor cq = cpu.tensor(n, heads * hd), co = cpu.tensor(n, heads * hd);
  fill(cq, qv);
  for (const uint64_t slots : {64u, 5u}) {
    SCOPED_TRACE(std::to_string(slots) + " slots");
    GpuOptions go;
    go.kv_auto = false;
    go.kv_bytes = slots * hd * sizeof(uint16_t);
    const std::unique_ptr<Backend> gpu = make_vulkan_backend(go);
    const Tensor gq = gpu->tensor(n, heads * hd), go1 = gpu->tensor(n, heads * hd);
    fill(gq, qv);
    for (int round = 0; round < 3; ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      if (round == 2) {  // rewritten in place: a ring row (position p0 - 1) and a selected compressed row
        for (uint32_t k = 0; k < hd; ++k) ring[(size_t)((p0 - 1) % W) * hd + k] ^= 0x0040;
        pack(4);
      }
      a.q = cq.c();
      cpu.sparse_attention(a, co.m());
      a.q = gq.c();
      const GpuStats s0 = gpu_stats(*gpu);
      gpu->sparse_attention(a, go1.m());
      gpu->sync();
      EXPECT_EQ(first_difference(go1, co), -1);
      const GpuStats s1 = gpu_stats(*gpu);
      EXPECT_EQ(s1.kv_slots, slots);
      EXPECT_EQ(s1.ops_on_device - s0.ops_on_device, 1u) << "the attention ran on the host";
      const uint64_t hits = s1.kv_hits - s0.kv_hits, misses = s1.kv_misses - s0.kv_misses, staged = s1.kv_staged - s0.kv_staged;
      // The call reads W - 1 ring rows (the window's others are the chunk's fresh rows, a second
      // set of pointers) and the union of the selections.
      EXPECT_GT(hits + misses + staged, slots == 64 ? 0u : 5u);
      if (slots == 64) {
        EXPECT_EQ(staged, 0u);
        EXPECT_EQ(hits == 0, round == 0);
        EXPECT_EQ(misses, round == 0 ? hits + misses : round == 1 ? 0u : 2u) << "rows copied again: " << misses;
      } else {
        EXPECT_GT(staged, 0u) << "5 slots held every row";
        EXPECT_LE(misses, 5u);
      }
    }
  }
}

// The fake-quant grids on rows the batch holds (the window row after its RoPE, the index
// queries): every grid on blocks whose largest value spans the binades (down to the amax floors,
// up to past E4M3's 448 saturation), zeros and NaNs, the CPU's bits.
TEST(VulkanAttention, FakeQuantOnTheDeviceHasTheCpuBits) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(GpuOptions{});
  const CpuBackend cpu(1);
  std::mt19937_64 rng(57);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-120, 120);
  const size_t n = 64, width = 96;
  std::vector<float> x(n * width);
  for (size_t t = 0; t < n; ++t) {
    const int e = ex(rng), spread = (int)(t % 9);  // a row's scale, and how far its values spread below it
    for (size_t i = 0; i < width; ++i) x[t * width + i] = round_bf16(std::ldexp(u(rng), std::max(-125, e - (int)(i % 8) * spread)));
  }
  x[5] = 0.0f;
  x[width + 3] = std::numeric_limits<float>::quiet_NaN();
  for (size_t i = 0; i < 32; ++i) x[2 * width + i] = 0.0f;  // an all-zero block
  // Ties on each grid: E4M3 steps of 1/8 in [1, 2) and 2 in [16, 32) under a scale of 1 (amax 448),
  // and the E2M1 midpoints under a scale of 1 (amax 6 in every block of 16).
  const float e4m3_ties[] = {448.0f, 1.0625f, 1.1875f, -1.3125f, 17.0f, -19.0f, 0.5f + 1.0f / 32.0f, 0.0f};
  const float e2m1_ties[] = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.25f, -0.75f, -1.25f, -1.75f, -2.5f, -3.5f, -5.0f, 0.0f};
  for (size_t i = 0; i < width; ++i) {
    x[3 * width + i] = e4m3_ties[i % 8];
    x[4 * width + i] = e2m1_ties[i % 16];
  }
  const std::vector<float> ones(n, 1.0f);
  for (const FakeQuant kind : {FakeQuant::Fp8Window, FakeQuant::Nvfp4, FakeQuant::Mxfp4}) {
    SCOPED_TRACE("grid " + std::to_string((int)kind));
    const Tensor cX = cpu.tensor(n, width), cw = cpu.tensor(n, 1), cx = cpu.tensor(n, width);
    const Tensor gX = gpu->tensor(n, width), gw = gpu->tensor(n, 1), gy = gpu->tensor(n, width);
    for (const Tensor* t : {&cX, &gX}) fill(*t, x);
    for (const Tensor* t : {&cw, &gw}) fill(*t, ones);
    // hc_pre with one stream and weight 1 copies the rows into a region of the batch (they are
    // BF16; -0 becomes +0, on the CPU too).
    const HcParams hp{1, 1, 0.0f, 1e-6f};
    cpu.hc_pre(cX.c(), cw.c(), hp, cx.m());
    cpu.fake_quant(cx.m(), kind);
    gpu->hc_pre(gX.c(), gw.c(), hp, gy.m());
    const GpuStats s0 = gpu_stats(*gpu);
    gpu->fake_quant(gy.m(), kind);
    EXPECT_EQ(gpu_stats(*gpu).ops_on_device - s0.ops_on_device, 1u) << "fake_quant ran on the host";
    gpu->sync();
    EXPECT_EQ(first_difference(gy, cx), -1) << "first difference at " << first_difference(gy, cx);
  }
}

// The window row's store waits for the batch that writes it (store_bf16 of a region), and an
// attention recorded meanwhile reads the row where the batch holds it: the forward pass's plain
// layers run from the streams to the router in one submission. The stored bits are the CPU's.
TEST(VulkanAttention, PendingWindowRowsAreReadWhereTheBatchHoldsThem) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(GpuOptions{});
  const CpuBackend cpu(1);
  std::mt19937_64 rng(59);
  const uint32_t hd = 32, heads = 2, W = 4, n = 3, p0 = 6;
  test::HostWeight wkv = test::random_host_weight(GgmlType::Q8_0, hd, 64, rng());
  Weight ckv = wkv.w;
  cpu.prepare_weight(ckv);
  gpu->prepare_weight(wkv.w);
  std::vector<uint16_t> ring((size_t)W * hd);
  for (uint16_t& v : ring) v = f32_to_bf16(bf16_values(rng, 1, 1.0f)[0]);
  const std::vector<float> x = bf16_values(rng, (size_t)n * 64, 1.0f), qv = bf16_values(rng, (size_t)n * heads * hd, 1.0f),
                           sinks = bf16_values(rng, heads, 1.0f);
  // The CPU: kv = linear(x), fake-quantized, stored, attended.
  std::vector<uint16_t> cfresh((size_t)n * hd), gfresh((size_t)n * hd, 0xffff);
  const Tensor cx = cpu.tensor(n, 64), ckvt = cpu.tensor(n, hd), cq = cpu.tensor(n, heads * hd), co = cpu.tensor(n, heads * hd);
  const Tensor gx = gpu->tensor(n, 64), gkvt = gpu->tensor(n, hd), gq = gpu->tensor(n, heads * hd), go = gpu->tensor(n, heads * hd);
  for (const Tensor* t : {&cx, &gx}) fill(*t, x);
  for (const Tensor* t : {&cq, &gq}) fill(*t, qv);
  SparseAttention a;
  a.heads = heads;
  a.head_dim = hd;
  a.p0 = p0;
  a.sinks = sinks.data();
  cpu.linear(ckv, cx.c(), ckvt.m(), true, 0);
  cpu.fake_quant(ckvt.m(), FakeQuant::Fp8Window);
  cpu.store_bf16(ckvt.c(), cfresh.data(), hd);
  a.q = cq.c();
  a.window = WindowRows{ring.data(), cfresh.data(), W, p0, hd};
  cpu.sparse_attention(a, co.m());
  // The device: the same, one submission at the sync.
  const GpuStats s0 = gpu_stats(*gpu);
  gpu->linear(wkv.w, gx.c(), gkvt.m(), true, 0);
  gpu->fake_quant(gkvt.m(), FakeQuant::Fp8Window);
  for (uint32_t i = 0; i < n; ++i) gpu->store_bf16(gkvt.c().rows(i, 1), gfresh.data() + (size_t)i * hd, hd);  // row by row, as a batch of sequences would
  EXPECT_EQ(gfresh[0], 0xffff) << "the store did not wait for the batch";
  a.q = gq.c();
  a.window = WindowRows{ring.data(), gfresh.data(), W, p0, hd};
  gpu->sparse_attention(a, go.m());
  EXPECT_EQ(gpu_stats(*gpu).submissions, s0.submissions);
  gpu->sync();
  EXPECT_EQ(gpu_stats(*gpu).submissions - s0.submissions, 1u);
  EXPECT_EQ(gfresh, cfresh) << "the stored rows";
  EXPECT_EQ(first_difference(go, co), -1) << "the attention over rows the batch held";

  // Dropped with the rest of the batch (an abandoned eval): the store never lands.
  std::vector<uint16_t> gone((size_t)n * hd, 0x1234);
  gpu->linear(wkv.w, gx.c(), gkvt.m(), true, 0);
  gpu->store_bf16(gkvt.c(), gone.data(), hd);
  gpu->drop_pending();
  gpu->sync();
  EXPECT_EQ(gone, std::vector<uint16_t>((size_t)n * hd, 0x1234)) << "a dropped store was written";

  // Rows rewritten in place after their store (not in the forward pass): the store keeps the rows
  // as they were when it was issued.
  std::vector<uint16_t> kept((size_t)n * hd), want((size_t)n * hd);
  gpu->linear(wkv.w, gx.c(), gkvt.m(), true, 0);
  gpu->store_bf16(gkvt.c(), kept.data(), hd);
  gpu->fake_quant(gkvt.m(), FakeQuant::Fp8Window);
  gpu->sync();
  cpu.linear(ckv, cx.c(), ckvt.m(), true, 0);
  cpu.store_bf16(ckvt.c(), want.data(), hd);
  cpu.fake_quant(ckvt.m(), FakeQuant::Fp8Window);
  EXPECT_EQ(kept, want) << "the store read the rewritten rows";
  EXPECT_EQ(first_difference(gkvt, ckvt), -1);
}

// A KV source's compressor over a run of chunks as the forward pass calls it: the projections k
// and g from deferred float linears (or, for one chunk, the host's rows), the pooling with the
// carry across chunks (groups open across two chunks included), then the latents' norm and RoPE
// and their packed store, all in the one submission of the sync, with the CPU's groups, latents,
// carry and packed rows. Gate spreads from near-uniform softmaxes to ones that underflow.
TEST(VulkanAttention, CompressorPoolingOnTheDeviceHasTheCpuBits) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(GpuOptions{});
  const CpuBackend cpu(1);
  std::mt19937_64 rng(61);
  const uint32_t hd = 80, cols = 72, maxn = 6;
  const std::vector<double> freqs = {1.0, 0.01, 1e-4};
  const RopeTable tab{freqs.data(), freqs.size()};
  const std::vector<float> norm_w = bf16_values(rng, hd, 1.0f);
  for (const uint32_t ratio : {1u, 2u, 4u})
    for (const float spread : {0.05f, 40.0f}) {
      SCOPED_TRACE("ratio " + std::to_string(ratio) + " spread " + std::to_string(spread));
      test::HostWeight wk = test::random_host_weight(GgmlType::F16, hd, cols, rng());
      test::HostWeight wg = test::random_host_weight(GgmlType::F16, hd, cols, rng(), spread);
      Weight ck = wk.w, cg = wg.w;
      cpu.prepare_weight(ck);
      cpu.prepare_weight(cg);
      gpu->prepare_weight(wk.w);
      gpu->prepare_weight(wg.w);
      std::vector<float> c_carry_k((size_t)(ratio - 1) * hd), c_carry_s(c_carry_k.size());
      std::vector<float> g_carry_k(c_carry_k.size()), g_carry_s(c_carry_k.size());
      const size_t rb = fp4_row_bytes(Fp4Grid::Nvfp4, hd);
      std::vector<uint8_t> c_rows, g_rows;
      uint32_t p0 = 0;
      const uint32_t chunks[] = {3, 1, 1, 5, 1, 2, 6};
      for (size_t c = 0; c < std::size(chunks); ++c) {
        const uint32_t n = chunks[c];
        SCOPED_TRACE("chunk at " + std::to_string(p0) + " of " + std::to_string(n));
        const bool from_host = c == 3;  // k and g the host's rows: staged
        const std::vector<float> x = bf16_values(rng, (size_t)n * cols, 1.0f);
        const Tensor cx = cpu.tensor(n, cols), cK = cpu.tensor(n, hd), cG = cpu.tensor(n, hd), cl = cpu.tensor(maxn, hd);
        const Tensor gx = gpu->tensor(n, cols), gK = gpu->tensor(n, hd), gG = gpu->tensor(n, hd), gl = gpu->tensor(maxn, hd);
        fill(cx, x);
        fill(gx, x);
        cpu.linear(ck, cx.c(), cK.m(), false, 0);
        cpu.linear(cg, cx.c(), cG.m(), false, 0);
        const std::vector<uint32_t> cgroups =
            cpu.compress_pool(cK.c(), ratio > 1 ? cG.c() : CMat{}, ratio, p0, c_carry_k.data(), c_carry_s.data(), cl.m());
        const GpuStats s0 = gpu_stats(*gpu);
        if (from_host) {
          fill(gK, std::vector<float>(cK.c().p, cK.c().p + (size_t)n * hd));
          fill(gG, std::vector<float>(cG.c().p, cG.c().p + (size_t)n * hd));
        } else {
          gpu->linears(std::vector<LinearCall>{{&wk.w, gx.c(), gK.m(), false}, {&wg.w, gx.c(), gG.m(), false}});
        }
        const std::vector<uint32_t> ggroups =
            gpu->compress_pool(gK.c(), ratio > 1 ? gG.c() : CMat{}, ratio, p0, g_carry_k.data(), g_carry_s.data(), gl.m());
        ASSERT_EQ(ggroups, cgroups);
        const uint32_t G = (uint32_t)cgroups.size();
        std::vector<uint64_t> pos(G);
        for (uint32_t q = 0; q < G; ++q) pos[q] = (uint64_t)cgroups[q] * ratio;
        const size_t base = c_rows.size() / rb;
        c_rows.resize((base + G) * rb);
        g_rows.resize((base + G) * rb, 0xee);
        if (G) {
          for (const Backend* b : std::initializer_list<const Backend*>{&cpu, gpu.get()}) {
            const Mat l = (b == &cpu ? cl : gl).m().rows(0, G);
            b->rms_norm(l, norm_w.data(), 1e-6f);
            b->rope(l, hd, tab, pos, false);
            b->store_fp4(l, Fp4Grid::Nvfp4, (b == &cpu ? c_rows : g_rows).data() + base * rb);
          }
        }
        EXPECT_EQ(gpu_stats(*gpu).submissions, s0.submissions) << "an op waited for the device";
        gpu->sync();
        EXPECT_LE(gpu_stats(*gpu).submissions - s0.submissions, 1u);
        EXPECT_EQ(gpu_stats(*gpu).ops_on_device - s0.ops_on_device, G ? 3u : 0u);
        for (uint32_t q = 0; q < G; ++q)
          EXPECT_EQ(std::memcmp(cl.c().row(q), gl.c().row(q), hd * sizeof(float)), 0) << "latent " << q;
        EXPECT_EQ(g_rows, c_rows) << "the packed rows";
        // Bit for bit (ratio 1 has no carry: empty vectors, whose data() memcmp may not take).
        auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
          return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        };
        EXPECT_TRUE(same_bits(g_carry_k, c_carry_k)) << "carry k";
        EXPECT_TRUE(same_bits(g_carry_s, c_carry_s)) << "carry s";
        p0 += n;
      }
    }
}

// The pooled values before their BF16 rounding, against a plain scalar reference of the spec's
// pooling, on f32 projections with all 24 bits: groups open across the chunk's start (the carry)
// and inside it, ratios 2 to 5, softmaxes from flat to underflowing.
TEST(VulkanAttention, CompressorPoolingUnroundedEqualsTheScalarReference) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(GpuOptions{});
  std::mt19937_64 rng(67);
  const uint32_t hd = 37, n = 11;
  for (const uint32_t ratio : {2u, 3u, 4u, 5u})
    for (const float spread : {0.01f, 3.0f, 200.0f}) {
      SCOPED_TRACE("ratio " + std::to_string(ratio) + " spread " + std::to_string(spread));
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      const uint32_t p0 = 3 * ratio - 2;  // the first group reads ratio - 2 carried members
      std::vector<float> carry_k((size_t)(ratio - 1) * hd), carry_s(carry_k.size());
      for (float& v : carry_k) v = u(rng) * 4.0f;
      for (float& v : carry_s) v = u(rng) * spread;
      const Tensor k = gpu->tensor(n, hd), s = gpu->tensor(n, hd), lat = gpu->tensor(n, hd);
      for (size_t i = 0; i < n * hd; ++i) {
        k.m().p[i] = u(rng) * 4.0f;
        s.m().p[i] = u(rng) * spread;
      }
      // The reference: member a of the group completing at row i is at row i - (ratio - 1) + a.
      std::vector<std::vector<float>> want;
      for (uint32_t i = 0; i < n; ++i) {
        if ((p0 + i) % ratio != ratio - 1) continue;
        auto member = [&](const Tensor& t, const std::vector<float>& carry, uint32_t a) {
          const int64_t row = (int64_t)i - (ratio - 1) + a;
          return row < 0 ? carry.data() + (size_t)a * hd : t.c().row((size_t)row);
        };
        std::vector<float> pooled(hd);
        for (uint32_t d = 0; d < hd; ++d) {
          float mx = -std::numeric_limits<float>::infinity();
          for (uint32_t a = 0; a < ratio; ++a) mx = std::max(mx, member(s, carry_s, a)[d]);
          float den = 0.0f;
          for (uint32_t a = 0; a < ratio; ++a) den += exp_f32(member(s, carry_s, a)[d] - mx);
          float acc = 0.0f;
          for (uint32_t a = 0; a < ratio; ++a) acc += member(k, carry_k, a)[d] * (exp_f32(member(s, carry_s, a)[d] - mx) / den);
          pooled[d] = acc;
        }
        want.push_back(pooled);
      }
      const std::vector<uint32_t> groups =
          gpu_compress_pool_unrounded(*gpu, k.c(), s.c(), ratio, p0, carry_k.data(), carry_s.data(), lat.m());
      ASSERT_EQ(groups.size(), want.size());
      for (size_t q = 0; q < want.size(); ++q)
        for (uint32_t d = 0; d < hd; ++d)
          ASSERT_EQ(std::bit_cast<uint32_t>(lat.c().row(q)[d]), std::bit_cast<uint32_t>(want[q][d]))
              << "group " << q << " channel " << d << ": " << lat.c().row(q)[d] << " for " << want[q][d];
    }
}

// The indexer's scores on the device (--gpu-indexer device): the same selections and candidate
// blocks as the CPU's for every k, so the same order of scores, ties and NaN keys included; for
// head dims of one and four MXFP4 blocks, one head and five, compression ratios 1 and 4, a first
// chunk and a later one, queries off the grid (the CPU's float path) and on it (its integer
// path), plain layers, candidate sources and consumers; and with staging buffers that take a few
// queries at a time.
TEST(VulkanAttention, IndexScoresOnTheDeviceSelectWhatTheCpuSelects) {
  if (!kBuilt) return;
  std::mt19937_64 rng(73);
  const CpuBackend cpu(2);
  for (const uint64_t staging : {(uint64_t)0, (uint64_t)6000}) {
    GpuOptions go;
    go.threads = 2;
    go.indexer = GpuIndexer::Device;
    go.io_staging_bytes = staging;
    const std::unique_ptr<Backend> gpu = make_vulkan_backend(go);
    uint64_t calls = 0;
    for (const uint32_t hd : {32u, 128u})
      for (const uint32_t heads : {1u, 5u})
        for (const uint32_t ratio : {1u, 4u})
          for (const uint32_t p0 : {0u, 37u})
            for (const bool on_grid : {false, true})
              for (int mode = 0; mode < 3; ++mode) {  // plain, candidate source, candidate consumer
                const uint32_t n = 9, rows_total = (p0 + n) / ratio, first = p0 / ratio;
                if (rows_total == 0) continue;
                SCOPED_TRACE("staging " + std::to_string(staging) + " hd " + std::to_string(hd) + " heads " +
                             std::to_string(heads) + " ratio " + std::to_string(ratio) + " p0 " + std::to_string(p0) +
                             (on_grid ? " on the grid" : " off the grid") + " mode " + std::to_string(mode));
                // Keys: random, a few repeated (equal scores: ties go to the lower row), one with a NaN.
                const size_t rb = fp4_row_bytes(Fp4Grid::Mxfp4, hd);
                std::vector<uint8_t> packed((size_t)rows_total * rb);
                for (uint32_t r = 0; r < rows_total; ++r) {
                  std::vector<float> v = bf16_values(rng, hd, 2.0f);
                  if (r == 3 && rows_total > 5) v[hd / 2] = std::numeric_limits<float>::quiet_NaN();
                  fp4_pack_row(Fp4Grid::Mxfp4, v.data(), hd, packed.data() + (size_t)r * rb);
                  if (r % 5 == 4) std::memcpy(packed.data() + (size_t)r * rb, packed.data() + (size_t)(r - 2) * rb, rb);
                }
                // Off the grid: full mantissas over a wide spread of magnitudes, so the order of
                // the dot's additions shows in its bits (on the grid every order is exact).
                std::vector<float> q((size_t)n * heads * hd), w = bf16_values(rng, (size_t)n * heads, 1.0f);
                std::uniform_real_distribution<float> u(-1.0f, 1.0f);
                std::uniform_int_distribution<int> ex(-12, 12);
                for (float& v : q) v = std::ldexp(u(rng), ex(rng));
                if (on_grid) fake_quant_mxfp4(q.data(), q.size());
                IndexSelect a;
                a.q = CMat{q.data(), n, (size_t)heads * hd, (size_t)heads * hd};
                a.w = CMat{w.data(), n, heads, heads};
                a.heads = heads;
                a.head_dim = hd;
                a.denom = std::sqrt((float)(hd * heads));
                a.keys = CacheRows{packed.data(), packed.data() + (size_t)first * rb, first, hd, Fp4Grid::Mxfp4};
                a.ratio = ratio;
                a.p0 = p0;
                a.candidate_source = mode == 1;
                a.candidate_consumer = mode == 2;
                a.block = 4;
                a.keep_blocks = 2;
                std::vector<std::vector<uint8_t>> keep(n);
                for (auto& k : keep) {
                  k.assign((rows_total + a.block - 1) / a.block, 0);
                  for (auto& b : k) b = (uint8_t)(rng() % 2);
                }
                {
                  // The scores themselves against a plain scalar reference, bit for bit.
                  std::vector<std::vector<uint8_t>> gc = keep;
                  const std::vector<float> got = gpu_index_scores(*gpu, a, gc);
                  ASSERT_EQ(got.size(), (size_t)n * rows_total);
                  std::vector<uint16_t> key(hd);
                  size_t bad = 0;
                  for (uint32_t i = 0; i < n; ++i)
                    for (uint32_t j = 0; j < (p0 + i + 1) / ratio; ++j) {
                      float want = 0.0f;
                      if (mode == 2 && !keep[i][j / a.block]) {
                        want = -std::numeric_limits<float>::infinity();
                      } else {
                        fp4_unpack_row(Fp4Grid::Mxfp4, packed.data() + (size_t)j * rb, hd, key.data());
                        for (uint32_t h = 0; h < heads; ++h) {
                          const float d = type_traits(GgmlType::BF16).dot_scalar(key.data(), q.data() + ((size_t)i * heads + h) * hd, hd);
                          want += std::max(d, 0.0f) * (w[(size_t)i * heads + h] / a.denom);
                        }
                      }
                      const float g = got[(size_t)i * rows_total + j];
                      if (std::bit_cast<uint32_t>(g) != std::bit_cast<uint32_t>(want) && !(std::isnan(g) && std::isnan(want)) &&
                          bad++ < 3)
                        ADD_FAILURE() << "query " << i << " key " << j << ": " << g << ", want " << want;
                    }
                  EXPECT_EQ(bad, 0u);
                }
                for (const uint32_t topk : {1u, 3u, rows_total}) {
                  a.topk = topk;
                  std::vector<std::vector<uint8_t>> cc = keep, gc = keep;
                  std::vector<std::vector<int32_t>> cs, gs;
                  cpu.index_select(a, cc, cs);
                  const uint64_t before = gpu_stats(*gpu).index_on_device;
                  gpu->index_select(a, gc, gs);
                  const uint64_t took = gpu_stats(*gpu).index_on_device - before;
                  EXPECT_GE(took, 1u) << "scored on the CPU";
                  calls += took;
                  EXPECT_EQ(gs, cs) << "top " << topk;
                  EXPECT_EQ(gc, cc) << "candidate blocks, top " << topk;
                }
              }
    if (staging) {
      EXPECT_GT(calls, 3u * 2 * 2 * 2 * 2 * 2 * 3) << "small staging buffers took all the queries at once";
    }
  }
}

// The scores recorded into the deferred batch: queries and head weights that linears of the batch
// write are read there, and so are keys a pending store_fp4 will pack from rows the batch writes
// (put on the MXFP4 grid by the shader as the store will); index_select costs the one submission
// that runs the batch, with the CPU's scores and selections.
TEST(VulkanAttention, IndexScoresRideInTheBatchThatWritesTheQueries) {
  if (!kBuilt) return;
  std::mt19937_64 rng(79);
  GpuOptions go;
  go.indexer = GpuIndexer::Device;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(go);
  const CpuBackend cpu(1);
  const uint32_t heads = 4, hd = 64, cols = 64, n = 9, p0 = 14, ratio = 2, rows_total = (p0 + n) / ratio;
  const uint32_t first = p0 / ratio, fresh_keys = 3;  // the last 3 keys: stored from rows the batch writes
  test::HostWeight wq = test::random_host_weight(GgmlType::Q8_0, heads * hd, cols, rng());
  test::HostWeight ww = test::random_host_weight(GgmlType::Q8_0, heads, cols, rng());
  test::HostWeight wk = test::random_host_weight(GgmlType::Q8_0, hd, cols, rng());
  Weight cq = wq.w, cw = ww.w, ck = wk.w;
  for (Weight* w : {&cq, &cw, &ck}) cpu.prepare_weight(*w);
  for (test::HostWeight* w : {&wq, &ww, &wk}) gpu->prepare_weight(w->w);
  const size_t rb = fp4_row_bytes(Fp4Grid::Mxfp4, hd);
  std::vector<uint8_t> packed((size_t)rows_total * rb);
  for (uint32_t r = 0; r < rows_total; ++r) {
    const std::vector<float> v = bf16_values(rng, hd, 2.0f);
    fp4_pack_row(Fp4Grid::Mxfp4, v.data(), hd, packed.data() + (size_t)r * rb);
  }
  // x's rows with full mantissas, so the keys computed from them are off the grid until stored.
  std::vector<float> x((size_t)n * cols);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : x) v = u(rng);
  const Tensor cx = cpu.tensor(n, cols), cqt = cpu.tensor(n, heads * hd), cwt = cpu.tensor(n, heads),
               ckt = cpu.tensor(fresh_keys, hd);
  fill(cx, x);
  cpu.linear(cq, cx.c(), cqt.m(), true, 0);
  cpu.linear(cw, cx.c(), cwt.m(), true, 0);
  cpu.linear(ck, cx.c().rows(0, fresh_keys), ckt.m(), false, 0);
  std::vector<uint8_t> cpu_keys = packed;
  cpu.store_fp4(ckt.c(), Fp4Grid::Mxfp4, cpu_keys.data() + (size_t)(rows_total - fresh_keys) * rb);
  IndexSelect a;
  a.heads = heads;
  a.head_dim = hd;
  a.denom = std::sqrt((float)(hd * heads));
  a.ratio = ratio;
  a.p0 = p0;
  a.topk = 4;
  IndexSelect ca = a;
  ca.q = cqt.c();
  ca.w = cwt.c();
  ca.keys = CacheRows{cpu_keys.data(), cpu_keys.data() + (size_t)first * rb, first, hd, Fp4Grid::Mxfp4};
  std::vector<std::vector<uint8_t>> cc(n);
  std::vector<std::vector<int32_t>> want;
  cpu.index_select(ca, cc, want);
  for (const bool pending : {false, true}) {
    SCOPED_TRACE(pending ? "the last keys stored from the batch's rows" : "the keys on the host");
    std::vector<uint8_t> gpu_keys = pending ? packed : cpu_keys;
    const Tensor gx = gpu->tensor(n, cols), gq = gpu->tensor(n, heads * hd), gw = gpu->tensor(n, heads),
                 gk = gpu->tensor(fresh_keys, hd);
    fill(gx, x);
    std::vector<LinearCall> calls = {{&wq.w, gx.c(), gq.m(), true, 0}, {&ww.w, gx.c(), gw.m(), true, 0}};
    if (pending) calls.push_back({&wk.w, gx.c().rows(0, fresh_keys), gk.m(), false, 0});
    gpu->linears(calls);  // deferred: their outputs are tensors
    if (pending) gpu->store_fp4(gk.c(), Fp4Grid::Mxfp4, gpu_keys.data() + (size_t)(rows_total - fresh_keys) * rb);
    IndexSelect ga = a;
    ga.q = gq.c();
    ga.w = gw.c();
    ga.keys = CacheRows{gpu_keys.data(), gpu_keys.data() + (size_t)first * rb, first, hd, Fp4Grid::Mxfp4};
    const uint64_t s0 = gpu_stats(*gpu).submissions;
    std::vector<std::vector<uint8_t>> gc(n);
    const std::vector<float> got = gpu_index_scores(*gpu, ga, gc);
    EXPECT_EQ(gpu_stats(*gpu).submissions - s0, 1u) << "the scores took a round trip of their own";
    EXPECT_EQ(gpu_keys, cpu_keys) << "the store's bytes";
    // The scores against a scalar reference on the stored keys, bit for bit.
    std::vector<uint16_t> key(hd);
    size_t bad = 0;
    for (uint32_t i = 0; i < n; ++i)
      for (uint32_t j = 0; j < (p0 + i + 1) / ratio; ++j) {
        fp4_unpack_row(Fp4Grid::Mxfp4, cpu_keys.data() + (size_t)j * rb, hd, key.data());
        float s = 0.0f;
        for (uint32_t h = 0; h < heads; ++h) {
          const float d = type_traits(GgmlType::BF16).dot_scalar(key.data(), cqt.c().row(i) + (size_t)h * hd, hd);
          s += std::max(d, 0.0f) * (cwt.c().row(i)[h] / a.denom);
        }
        const float g = got[(size_t)i * rows_total + j];
        if (std::bit_cast<uint32_t>(g) != std::bit_cast<uint32_t>(s) && bad++ < 3)
          ADD_FAILURE() << "query " << i << " key " << j << ": " << g << ", want " << s;
      }
    EXPECT_EQ(bad, 0u);
    // And index_select itself: the CPU's selections in the one submission that runs the batch.
    const Tensor gx2 = gpu->tensor(n, cols), gq2 = gpu->tensor(n, heads * hd), gw2 = gpu->tensor(n, heads);
    fill(gx2, x);
    const LinearCall again[] = {{&wq.w, gx2.c(), gq2.m(), true, 0}, {&ww.w, gx2.c(), gw2.m(), true, 0}};
    gpu->linears(again);
    ga.q = gq2.c();
    ga.w = gw2.c();
    const uint64_t s1 = gpu_stats(*gpu).submissions;
    std::vector<std::vector<int32_t>> sel;
    gpu->index_select(ga, gc, sel);
    EXPECT_EQ(sel, want);
    EXPECT_EQ(gpu_stats(*gpu).submissions - s1, 1u) << "index_select took a round trip of its own";
  }
}

}  // namespace
}  // namespace sluice
