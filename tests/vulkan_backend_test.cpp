// The Vulkan backend (backend/vulkan_backend.h) on the machine's Vulkan device: lavapipe in CI
// (scripts/setup installs mesa-vulkan-drivers). In a build with Vulkan a device must be there:
// these tests fail, rather than skip, when it is not. In a build without it, the tests check that
// every entry point says so.
//
// The linear shaders are held to the CPU's bits: Q8_0 is exact on every conformant device
// (linear_q8_0.comp says why), and the float formats are exact where fma is fused and denormals
// kept, as on lavapipe (docs/numerics.md 1b). Each test also checks that the work ran on the
// device: a backend that quietly fell back to the CPU would otherwise pass.
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu_backend.h"
#include "backend/swiglu.h"
#include "kernels/exp_f32.h"
#include "backend/vulkan_backend.h"
#include "format/tensor_type.h"
#include "kernels/fp.h"
#include "kernels/types.h"
#include "model/deepseek41/forward.h"
#include "model/model.h"
#include "runtime/session.h"
#include "server/metrics.h"
#include "test_util.h"
#include "test_weights.h"
#include "util/error.h"
#include "util/format_bytes.h"

namespace sluice {
namespace {

using test::HostWeight;
HostWeight random_weight(GgmlType type, uint64_t rows, uint64_t cols, uint64_t seed) {
  return test::random_host_weight(type, rows, cols, seed);
}

std::vector<float> randoms(std::mt19937_64& r, size_t n) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(r);
  return v;
}

// y = W x on backend be, x given with a stride wider than its width.
std::vector<float> run_linear(const Backend& be, const Weight& w, const std::vector<float>& x, size_t n, bool round,
                              uint64_t row0, uint64_t nrows) {
  const Tensor xt = be.tensor(n, w.cols + 3);
  for (size_t t = 0; t < n; ++t) std::memcpy(xt.m().row(t), x.data() + t * w.cols, w.cols * sizeof(float));
  const Tensor yt = be.tensor(n, nrows + 5);
  be.linear(w, xt.c().cols(0, w.cols), yt.m().cols(0, nrows), round, row0);
  be.sync();
  std::vector<float> y(n * nrows);
  for (size_t t = 0; t < n; ++t) std::memcpy(y.data() + t * nrows, yt.m().row(t), nrows * sizeof(float));
  return y;
}

constexpr bool kBuilt = test::kVulkanBuilt;

TEST(Vulkan, BuildAndEntryPointsAgree) {
  EXPECT_EQ(vulkan_built(), kBuilt);
  if (!kBuilt) {
    try {
      make_vulkan_backend({});
      FAIL() << "a build without Vulkan made a Vulkan backend";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("built without the Vulkan backend"), std::string::npos) << e.what();
    }
    EXPECT_THROW(vulkan_devices(), Error);
    return;
  }
  const std::vector<GpuDevice> devs = vulkan_devices();
  ASSERT_FALSE(devs.empty()) << "built with Vulkan but no device (scripts/setup installs lavapipe)";
  for (const GpuDevice& d : devs) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_FALSE(d.heaps.empty()) << d.name;
    EXPECT_GT(d.max_storage_buffer, 0u) << d.name;
  }
}

TEST(Vulkan, LinearOnTheDeviceHasTheCpuBits) {
  if (!kBuilt) return;  // BuildAndEntryPointsAgree covers a build without Vulkan
  // Weights used in place (their pages imported, where the device can) and copied; the quantized
  // linears a subgroup per output (where the device can) and an invocation per output, each also
  // with the device's integer dot product (where it has one).
  struct Config {
    bool no_import, plain, int_dot;
  };
  for (const auto& [no_import, plain, int_dot] : {Config{false, false, false}, Config{true, false, false},
                                                  Config{false, true, false}, Config{false, false, true},
                                                  Config{false, true, true}}) {
    SCOPED_TRACE(std::string(no_import ? "copied" : "imported where the device can") +
                 (plain ? ", an invocation per output" : ", a subgroup per output where the device can") +
                 (int_dot ? ", integer dot product" : ""));
    GpuOptions go;
    go.no_import = no_import;
    go.linears = plain ? GpuLinears::Plain : GpuLinears::Subgroup;
    go.int_dot = int_dot ? GpuIntDot::On : GpuIntDot::Off;
    if (!plain && !vulkan_devices()[0].subgroup_linears) {  // refused, naming why
      try {
        make_vulkan_backend(go);
        ADD_FAILURE() << "a device without the subgroup operations was asked for the subgroup linears";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--gpu-linears plain or auto"), std::string::npos) << e.what();
      }
      continue;
    }
    if (int_dot && !vulkan_devices()[0].int_dot) {  // refused, naming why
      try {
        make_vulkan_backend(go);
        ADD_FAILURE() << "a device without the integer dot product was asked for it";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--gpu-int-dot off or auto"), std::string::npos) << e.what();
      }
      continue;
    }
    const std::unique_ptr<Backend> gpu = make_vulkan_backend(go);
    const CpuBackend cpu(1);
    std::mt19937_64 rng(42);
    struct Case {
      GgmlType type;
      uint64_t rows, cols;
    };
    // Odd row counts around the 64-wide workgroup, columns not a multiple of 16 for the float lanes.
    // 300 Q8_0 blocks: many rounds of a subgroup's blocks.
    const Case cases[] = {{GgmlType::Q8_0, 13, 96},  {GgmlType::Q8_0, 67, 160}, {GgmlType::Q8_0, 1, 32},
                          {GgmlType::Q8_0, 5, 9600}, {GgmlType::F16, 7, 1000},
                          {GgmlType::F16, 13, 17},   {GgmlType::F16, 130, 48},  {GgmlType::BF16, 67, 33},
                          {GgmlType::F32, 5, 1},     {GgmlType::F32, 66, 71},
                          // The quantized formats of the published recipe (IQ2_XXS gate/up, Q2_K
                          // down) and the rest of the type table, one and several super-blocks.
                          {GgmlType::Q2_K, 67, 256},    {GgmlType::Q2_K, 5, 768},
                          {GgmlType::IQ2_XXS, 67, 256}, {GgmlType::IQ2_XXS, 3, 1280},
                          {GgmlType::IQ2_XS, 13, 512},  {GgmlType::Q3_K, 13, 512},
                          {GgmlType::Q4_K, 13, 512},    {GgmlType::Q6_K, 13, 512},
                          {GgmlType::TQ2_0, 13, 512},   {GgmlType::Q2_0, 13, 192},
                          // Several rounds of a subgroup's blocks, the last one partial.
                          {GgmlType::Q2_0, 7, 1408},    {GgmlType::Q4_K, 3, 2304}};
    uint64_t on_device = 0, gemm_calls = 0;
    for (const Case& c : cases) {
      HostWeight hw = random_weight(c.type, c.rows, c.cols, rng());
      Weight gw = hw.w, cw = hw.w;
      gpu->prepare_weight(gw);
      cpu.prepare_weight(cw);
      ASSERT_NE(gw.device, nullptr) << type_traits(c.type).name << " was not uploaded";
      // 1 token, a token tile and a part of one (4 + 3), a GEMM tile and a part of one (16 + 3).
      for (const size_t n : {1u, 3u, 7u, 19u})
        for (const bool round : {false, true}) {
          const uint64_t row0 = c.rows > 2 ? 1 : 0, nrows = c.rows - row0 - (c.rows > 2 ? 1 : 0);
          const std::vector<float> x = randoms(rng, n * c.cols);
          const std::vector<float> want = run_linear(cpu, cw, x, n, round, row0, nrows);
          const std::vector<float> got = run_linear(*gpu, gw, x, n, round, row0, nrows);
          ++on_device;
          gemm_calls += n >= 16;
          size_t bad = 0;
          for (size_t i = 0; i < got.size(); ++i)
            if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && bad++ < 3)
              ADD_FAILURE() << type_traits(c.type).name << " " << c.rows << "x" << c.cols << " n=" << n
                            << " round=" << round << ": element " << i << " is " << got[i] << ", want " << want[i];
          EXPECT_EQ(bad, 0u);
        }
    }
    const GpuStats st = gpu_stats(*gpu);
    EXPECT_EQ(st.linear_on_device, on_device) << "a linear call ran on the CPU";
    EXPECT_EQ(st.linear_on_host, 0u);
    EXPECT_EQ(st.weights_on_device, std::size(cases));
    const bool can_import = vulkan_devices()[0].uma && vulkan_devices()[0].host_import;
    EXPECT_EQ(st.weights_imported, !no_import && can_import ? std::size(cases) : 0u);
    EXPECT_EQ(st.bytes_on_device == 0, !no_import && can_import) << "imported weights were copied too";
    EXPECT_EQ(st.subgroup_linears, !plain);
    EXPECT_EQ(st.int_dot, int_dot);
    // Every quantized format's GEMM tile fits 20 KiB of workgroup memory (lavapipe has 32); the
    // float formats' build (which the float cases above need shaderFloat64 for) takes 4 KiB.
    if (vulkan_devices()[0].max_workgroup_memory >= 20u << 10) {
      EXPECT_EQ(st.gemm_formats, 12u);
      EXPECT_EQ(st.gemm_dispatches, gemm_calls);
    }
  }
}

// Independent linears in one call (Backend::linears: the forward's projections of one input)
// take one submission where they fit the staging buffers, the input staged once per format, and
// each has the bits linear() alone gives it; with small staging buffers they split.
TEST(Vulkan, IndependentLinearsShareASubmission) {
  if (!kBuilt) return;
  for (const uint64_t staging : {(uint64_t)0, (uint64_t)2000}) {
    SCOPED_TRACE("staging " + std::to_string(staging));
    GpuOptions go;
    go.io_staging_bytes = staging;
    const std::unique_ptr<Backend> gpu = make_vulkan_backend(go);
    std::mt19937_64 rng(11);
    const size_t n = 3, cols = 512;
    std::vector<HostWeight> hw;
    hw.push_back(random_weight(GgmlType::Q8_0, 64, cols, rng()));
    hw.push_back(random_weight(GgmlType::IQ2_XXS, 40, cols, rng()));
    hw.push_back(random_weight(GgmlType::Q2_K, 24, cols, rng()));
    hw.push_back(random_weight(GgmlType::Q8_0, 9, cols, rng()));
    for (HostWeight& h : hw) gpu->prepare_weight(h.w);
    const std::vector<float> x = randoms(rng, n * cols);
    const Tensor xt = gpu->tensor(n, cols);
    std::memcpy(xt.m().p, x.data(), x.size() * sizeof(float));
    std::vector<Tensor> ys;
    std::vector<LinearCall> calls;
    for (const HostWeight& h : hw) {
      ys.push_back(gpu->tensor(n, h.w.rows));
      calls.push_back({&h.w, xt.c(), ys.back().m(), &h != &hw.back(), 0});
    }
    const uint64_t s0 = gpu_stats(*gpu).submissions;
    gpu->linears(calls);
    gpu->sync();  // the outputs are tensors: the batch waits for the next submission or sync
    const uint64_t took = gpu_stats(*gpu).submissions - s0;
    if (staging == 0) {
      EXPECT_EQ(took, 1u) << "independent linears took a round trip each";
    } else {
      EXPECT_GT(took, 1u) << "2,000-byte staging buffers hold one input's rows in one format at a time";
    }
    for (size_t i = 0; i < hw.size(); ++i) {
      const std::vector<float> alone = run_linear(*gpu, hw[i].w, x, n, calls[i].round, 0, hw[i].w.rows);
      EXPECT_EQ(std::memcmp(ys[i].m().p, alone.data(), alone.size() * sizeof(float)), 0) << "call " << i;
    }
    EXPECT_EQ(gpu_stats(*gpu).linear_on_host, 0u);
  }
}

// The device's activation quantizers against the CPU's, byte for byte: random rows of odd
// lengths and scales, and the edge cases of each rule — ties of the rounding (away from zero for
// Q8_0, to even for Q8_K), the first of two equal magnitudes as Q8_K's max, all-zero blocks, fp16
// scales that are subnormal or overflow, very large values. Then a linear's bits with the device
// quantizing and with the host quantizing.
TEST(Vulkan, ActivationQuantizersHaveTheCpuBytes) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(GpuOptions{});
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-40, 40);
  for (const ActType a : {ActType::Q8_0, ActType::Q8_K}) {
    const size_t block = a == ActType::Q8_0 ? 32 : 256;
    for (const size_t blocks : {1u, 3u, 5u})
      for (const size_t n : {1u, 3u, 7u}) {
        SCOPED_TRACE(std::string(a == ActType::Q8_0 ? "Q8_0" : "Q8_K") + " blocks " + std::to_string(blocks) +
                     " rows " + std::to_string(n));
        const size_t cols = blocks * block;
        std::vector<float> x(n * cols);
        for (size_t b = 0; b < n * blocks; ++b) {
          float* v = x.data() + b * block;
          const int kind = (int)(b % 8);
          const float scale = std::ldexp(1.0f, ex(rng));  // 2^-40 .. 2^40: subnormal and overflowing fp16 scales
          for (size_t j = 0; j < block; ++j) v[j] = u(rng) * scale;
          if (kind == 1) {  // amax 127: Q8_0 d = 1, Q8_K iscale = -1; halves are ties
            v[0] = 127.0f;
            for (size_t j = 1; j < block; ++j) v[j] = (float)((int)(j % 9) - 4) + 0.5f;
          } else if (kind == 2) {
            std::fill(v, v + block, 0.0f);
          } else if (kind == 3) {  // two equal magnitudes: the first (negative) is Q8_K's max
            v[3] = -5.0f;
            v[7] = 5.0f;
            for (size_t j = 8; j < block; ++j) v[j] = std::fmod(v[j], 4.0f);
          } else if (kind == 4) {
            std::fill(v, v + block, 0.0f);
            v[block - 1] = -3.0e-6f;  // one value: fp16 scale subnormal
          } else if (kind == 5) {
            for (size_t j = 0; j < block; ++j) v[j] = u(rng) * 1e30f;
          } else if (kind == 6) {  // Q8_0's d = amax / 127 = (2k + 1) * 2^-25 exactly: a tie of the subnormal fp16 scale
            const float odd = (float)(2 * (rng() % 1000) + 1);
            for (size_t j = 0; j < block; ++j) v[j] = std::ldexp(u(rng) * odd, -25);
            v[b % block] = std::ldexp(127.0f * odd, -25);
          }
        }
        std::vector<uint8_t> want(n * activation_bytes(a, (int64_t)cols));
        for (size_t t = 0; t < n; ++t)
          quantize_activation(a, x.data() + t * cols, want.data() + t * activation_bytes(a, (int64_t)cols), (int64_t)cols);
        const std::vector<uint8_t> got = gpu_quantize(*gpu, a, x.data(), n, cols);
        ASSERT_EQ(got.size(), want.size());
        size_t first = want.size();
        for (size_t i = 0; i < want.size() && first == want.size(); ++i)
          if (got[i] != want[i]) first = i;
        EXPECT_EQ(first, want.size()) << "first differing byte " << first;
      }
  }
  // The linear path: device-quantized and host-quantized activations give the same outputs.
  GpuOptions host;
  host.host_quantize = true;
  const std::unique_ptr<Backend> gpu_h = make_vulkan_backend(host);
  for (const GgmlType type : {GgmlType::Q8_0, GgmlType::IQ2_XXS, GgmlType::Q2_K}) {
    HostWeight hw = random_weight(type, 37, 512, rng());
    Weight wd = hw.w, wh = hw.w;
    gpu->prepare_weight(wd);
    gpu_h->prepare_weight(wh);
    const std::vector<float> x = randoms(rng, 5 * 512);
    const uint64_t q0 = gpu_stats(*gpu).inputs_quantized_on_device;
    const std::vector<float> d = run_linear(*gpu, wd, x, 5, true, 0, 37), h = run_linear(*gpu_h, wh, x, 5, true, 0, 37);
    EXPECT_EQ(gpu_stats(*gpu).inputs_quantized_on_device - q0, 1u) << type_traits(type).name << ": the host quantized";
    EXPECT_EQ(std::memcmp(d.data(), h.data(), d.size() * sizeof(float)), 0) << type_traits(type).name;
  }
  EXPECT_EQ(gpu_stats(*gpu_h).inputs_quantized_on_device, 0u);
}

// The device's rms_norm (rms_norm.comp) against the CPU's, bit for bit: odd widths, values over
// many orders of magnitude (none so small that its square is an f32 denormal: the device may
// flush those), two epsilons.
TEST(Vulkan, RmsNormOnTheDeviceHasTheCpuBits) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(GpuOptions{});
  const CpuBackend cpu(1);
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-18, 18);
  for (const size_t width : {1u, 7u, 64u, 257u, 4096u})
    for (const float eps : {1e-6f, 1e-5f}) {
      SCOPED_TRACE("width " + std::to_string(width) + " eps " + std::to_string(eps));
      // Enough rows that a root or quotient one ulp off shows through the BF16 rounding.
      const size_t n = std::min<size_t>(4096, 524288 / width);
      std::vector<float> x(n * width), w(width);
      for (size_t t = 0; t < n; ++t) {
        const float scale = std::ldexp(1.0f, 3 * ex(rng));
        for (size_t i = 0; i < width; ++i) x[t * width + i] = u(rng) * scale;
      }
      for (float& v : w) v = round_bf16(1.0f + u(rng) * 0.5f);
      std::vector<float> want = x, got = x;
      cpu.rms_norm(Mat{want.data(), n, width, width}, w.data(), eps);
      gpu_rms_norm(*gpu, got.data(), n, width, w.data(), eps);
      size_t first = want.size();
      for (size_t i = 0; i < want.size() && first == want.size(); ++i)
        if (std::memcmp(&got[i], &want[i], 4) != 0) first = i;
      EXPECT_EQ(first, want.size()) << "first differing value " << first << ": " << got[first] << " vs " << want[first];
    }
}

// --gpu-experts auto chooses by the device's kind (no device needed: the choice is a rule).
TEST(Vulkan, AutoExpertsFollowTheDeviceKind) {
  GpuDevice d;
  d.kind = "discrete";
  GpuExpertsChoice c = auto_gpu_experts(d, 15360);
  EXPECT_EQ(c.slots, 15360u);
  EXPECT_FALSE(c.in_place);
  EXPECT_NE(c.why.find("memory of its own"), std::string::npos) << c.why;
  d.kind = "integrated";
  d.uma = true;
  d.host_import = true;
  c = auto_gpu_experts(d, 15360);
  EXPECT_EQ(c.slots, 0u);
  EXPECT_TRUE(c.in_place);
  d.host_import = false;
  c = auto_gpu_experts(d, 15360);
  EXPECT_EQ(c.slots, 0u);
  EXPECT_FALSE(c.in_place);
  EXPECT_NE(c.why.find("VK_EXT_external_memory_host"), std::string::npos) << c.why;
  d.kind = "cpu";
  d.host_import = true;
  c = auto_gpu_experts(d, 15360);
  EXPECT_EQ(c.slots, 0u);
  EXPECT_FALSE(c.in_place) << "lavapipe would run the experts in place";
}

// The device's exp_f32 (exp_f32.glsl) against the CPU's, bit for bit, on every 613th f32 of each
// sign up to 90 in magnitude (every binade), the edges of the range, infinities and a NaN.
TEST(Vulkan, ExpOnTheDeviceHasTheCpuBits) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(GpuOptions{});
  std::vector<float> x = {0.0f, -0.0f, 88.72283f, 88.7229f, 89.0f, 89.5f, -87.33f, -87.4f, -88.0f, -88.5f,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (const float sign : {1.0f, -1.0f})
    for (uint32_t b = 0; b <= std::bit_cast<uint32_t>(90.0f); b += 613) x.push_back(sign * std::bit_cast<float>(b));
  std::vector<float> got = x;
  gpu_exp(*gpu, got.data(), got.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = exp_f32(x[i]);
    if (std::memcmp(&got[i], &want, 4) != 0 && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << "of " << x.size() << "; first: exp(" << x[first] << ") = " << got[first] << ", the CPU's "
                     << exp_f32(x[first]);
  EXPECT_GT(x.size(), 3000000u);
  float nan = std::numeric_limits<float>::quiet_NaN();
  gpu_exp(*gpu, &nan, 1);
  EXPECT_TRUE(std::isnan(nan));
}

// The device's SwiGLU (swiglu.comp, with exp_f32.glsl) against the CPU's swiglu(), bit for bit:
// odd widths; BF16 gates and ups over many orders of magnitude, both signs, beyond the limit on
// either side, zeros, gates so negative that exp overflows (silu is then a signed zero); weight 1
// and random weights per row. No input so small that a result would be an f32 denormal (the
// device may flush those).
TEST(Vulkan, SwigluOnTheDeviceHasTheCpuBits) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(GpuOptions{});
  std::mt19937_64 rng(29);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-20, 12), pick(0, 31);
  auto value = [&] {
    const int k = pick(rng);
    if (k == 0) return 0.0f;
    if (k == 1) return -0.0f;
    if (k == 2) return round_bf16(-100.0f - 1000.0f * std::fabs(unit(rng)));  // exp(-g) overflows
    return round_bf16(unit(rng) * std::ldexp(1.0f, ex(rng)));
  };
  size_t checked = 0;
  for (const size_t width : {1u, 7u, 65u, 300u})
    for (const float limit : {7.0f, 10.0f})
      for (const bool weighted : {false, true}) {
        SCOPED_TRACE("width " + std::to_string(width) + " limit " + std::to_string(limit) + (weighted ? " weighted" : ""));
        const size_t n = 20000 / width + 1;
        std::vector<float> gu(n * 2 * width), wk(n);
        for (float& v : gu) v = value();
        for (float& w : wk) w = 0.05f + std::fabs(unit(rng));
        std::vector<float> got = gu;
        gpu_swiglu(*gpu, got.data(), n, width, limit, weighted ? wk.data() : nullptr);
        size_t bad = 0, first = 0;
        for (size_t t = 0; t < n; ++t)
          for (size_t i = 0; i < 2 * width; ++i) {
            const float* row = &gu[t * 2 * width];
            const float want = i < width ? swiglu(row[i], row[width + i], limit, weighted ? wk[t] : 1.0f) : row[i];
            if (std::memcmp(&got[t * 2 * width + i], &want, 4) != 0 && bad++ == 0) first = t * 2 * width + i;
            ++checked;
          }
        EXPECT_EQ(bad, 0u) << "first at " << first << ": g " << gu[first] << " u " << gu[first + width] << " got "
                           << got[first];
      }
  EXPECT_GT(checked, 300000u);
}

// Linears whose outputs are the backend's tensors wait for the next submission (deferred
// submissions, docs/backends.md): a later batch carries them, a linear that reads their outputs
// in a format the device quantizes reads them on the device in the same submission (chained),
// and whatever else reads them (a linear that cannot chain, any other op, sync) submits them
// first. Same bits as the CPU throughout.
TEST(Vulkan, LinearsIntoTensorsWaitForTheNextSubmission) {
  if (!kBuilt) return;
  std::atomic<bool> fail{false};
  GpuOptions go;
  go.fault = [&](const char*) { return fail.load(); };
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(go);
  const CpuBackend cpu(1);
  std::mt19937_64 rng(23);
  const size_t n = 3, cols = 256;
  HostWeight a = random_weight(GgmlType::Q8_0, 64, cols, rng());
  HostWeight b = random_weight(GgmlType::Q8_0, 40, 64, rng());
  HostWeight c = random_weight(GgmlType::Q2_K, 24, cols, rng());
  HostWeight e = random_weight(GgmlType::F16, 8, 64, rng());  // F32 activations: no quantizer, never chained
  HostWeight h32 = random_weight(GgmlType::Q8_0, 16, 32, rng());  // reads the second half of a row
  Weight ca_w = a.w, cb_w = b.w, cc_w = c.w, ce_w = e.w, c32_w = h32.w;  // the CPU's own preparation of each
  for (Weight* w : {&ca_w, &cb_w, &cc_w, &ce_w, &c32_w}) cpu.prepare_weight(*w);
  for (HostWeight* h : {&a, &b, &c, &e, &h32}) gpu->prepare_weight(h->w);
  const std::vector<float> x = randoms(rng, n * cols);
  const Tensor xt = gpu->tensor(n, cols);
  std::memcpy(xt.m().p, x.data(), x.size() * sizeof(float));
  // The CPU's results: ya = A x, yb = B ya, yc = C x, and rms_norm(A x).
  const Tensor ca = cpu.tensor(n, 64), cb = cpu.tensor(n, 40), cc = cpu.tensor(n, 24), cn = cpu.tensor(n, 64);
  const Tensor ce = cpu.tensor(n, 8);
  cpu.linear(ca_w, xt.c(), ca.m(), true, 0);
  cpu.linear(cb_w, ca.c(), cb.m(), true, 0);
  cpu.linear(ce_w, ca.c(), ce.m(), true, 0);
  cpu.linear(cc_w, xt.c(), cc.m(), true, 0);
  cpu.linear(ca_w, xt.c(), cn.m(), true, 0);
  const std::vector<float> norm_w(64, 1.25f);
  cpu.rms_norm(cn.m(), norm_w.data(), 1e-6f);
  auto same = [](const Tensor& g, const Tensor& want) {
    return std::memcmp(g.c().p, want.c().p, want.bytes()) == 0;
  };
  auto submissions = [&] { return gpu_stats(*gpu).submissions; };

  const Tensor ya = gpu->tensor(n, 64), yb = gpu->tensor(n, 40), yc = gpu->tensor(n, 24);
  uint64_t s0 = submissions();
  const uint64_t chained0 = gpu_stats(*gpu).inputs_chained;
  gpu->linear(a.w, xt.c(), ya.m(), true);
  gpu->linear(c.w, xt.c(), yc.m(), true);
  EXPECT_EQ(submissions() - s0, 0u) << "linears into tensors were submitted before anything read them";
  gpu->linear(b.w, ya.c(), yb.m(), true);  // reads A's deferred output (Q8_0): on the device, chained
  EXPECT_EQ(submissions() - s0, 0u);
  EXPECT_EQ(gpu_stats(*gpu).inputs_chained - chained0, 1u);
  gpu->sync();
  EXPECT_EQ(submissions() - s0, 1u);
  EXPECT_TRUE(same(ya, ca));
  EXPECT_TRUE(same(yb, cb)) << "a chained linear read its input before it was written";
  EXPECT_TRUE(same(yc, cc));
  gpu->sync();
  EXPECT_EQ(submissions() - s0, 1u) << "sync with nothing deferred submitted something";

  // The attention output's groups: two linears write the two halves of each row, and the
  // linear that reads the whole rows chains after both.
  const Tensor yz = gpu->tensor(n, 64), yz_b = gpu->tensor(n, 40), yz_h = gpu->tensor(n, 16), c_h = cpu.tensor(n, 16);
  cpu.linear(c32_w, ca.c().cols(32, 32), c_h.m(), true, 0);
  s0 = submissions();
  gpu->linear(a.w, xt.c(), yz.m().cols(0, 32), true, 0);
  gpu->linear(a.w, xt.c(), yz.m().cols(32, 32), true, 32);
  gpu->linear(b.w, yz.c(), yz_b.m(), true);
  gpu->linear(h32.w, yz.c().cols(32, 32), yz_h.m(), true);
  EXPECT_EQ(submissions() - s0, 0u) << "the column halves' readers were not chained";
  gpu->sync();
  EXPECT_EQ(submissions() - s0, 1u);
  EXPECT_TRUE(same(yz, ca));
  EXPECT_TRUE(same(yz_b, cb));
  EXPECT_TRUE(same(yz_h, c_h)) << "a chained read of a row's second half";

  // Rows only partly written by deferred linears (the rest the host's) submit the deferred linears
  // first; a float weight's linear reads the f32 rows a deferred linear writes where it writes them.
  const Tensor yh = gpu->tensor(n, 64), yh_b = gpu->tensor(n, 40), ye = gpu->tensor(n, 8);
  gpu->fill_rows(yh.m(), std::vector<float>(64, 0.5f));
  const Tensor ch = cpu.tensor(n, 64), ch_b = cpu.tensor(n, 40);
  cpu.fill_rows(ch.m(), std::vector<float>(64, 0.5f));
  cpu.linear(ca_w, xt.c(), ch.m().cols(0, 32), true, 0);
  cpu.linear(cb_w, ch.c(), ch_b.m(), true, 0);
  s0 = submissions();
  gpu->linear(a.w, xt.c(), yh.m().cols(0, 32), true, 0);
  gpu->linear(b.w, yh.c(), yh_b.m(), true);
  EXPECT_EQ(submissions() - s0, 1u) << "rows partly written on the host were read on the device";
  const uint64_t ops_in = gpu_stats(*gpu).linear_on_device;
  gpu->linear(a.w, xt.c(), ya.m(), true);
  gpu->linear(e.w, ya.c(), ye.m(), true);
  EXPECT_EQ(submissions() - s0, 1u) << "a linear reading f32 rows in place submitted what writes them";
  EXPECT_EQ(gpu_stats(*gpu).linear_on_device - ops_in, 2u);
  gpu->sync();
  EXPECT_EQ(submissions() - s0, 2u);
  EXPECT_TRUE(same(yh, ch));
  EXPECT_TRUE(same(yh_b, ch_b));
  EXPECT_TRUE(same(ye, ce));

  // rms_norm on rows deferred linears write runs on the device in their batch, and a linear
  // reading the normalized rows chains after it: one submission for the three.
  const Tensor yn = gpu->tensor(n, 64), ynb = gpu->tensor(n, 40), cnb = cpu.tensor(n, 40);
  cpu.linear(cb_w, cn.c(), cnb.m(), true, 0);
  s0 = submissions();
  const uint64_t ops0 = gpu_stats(*gpu).ops_on_device;
  gpu->linear(a.w, xt.c(), yn.m(), true);
  gpu->rms_norm(yn.m(), norm_w.data(), 1e-6f);
  gpu->linear(b.w, yn.c(), ynb.m(), true);
  EXPECT_EQ(submissions() - s0, 0u);
  EXPECT_EQ(gpu_stats(*gpu).ops_on_device - ops0, 1u) << "rms_norm ran on the host";
  gpu->sync();
  EXPECT_EQ(submissions() - s0, 1u);
  EXPECT_TRUE(same(yn, cn)) << "rms_norm on the device";
  EXPECT_TRUE(same(ynb, cnb)) << "the linear after the device's rms_norm";

  // A linear rewriting rows whole that deferred work reads and normalizes (each layer's attention
  // output, written again by the next layer's) writes a new region in the same batch: the readers
  // recorded before read the old rows, normalized; those after, and the tensor, the new ones.
  const std::vector<float> x2 = randoms(rng, n * cols);
  const Tensor xt2 = gpu->tensor(n, cols), yw = gpu->tensor(n, 64), cw2 = cpu.tensor(n, 64);
  const Tensor yr1 = gpu->tensor(n, 40), yr2 = gpu->tensor(n, 40), cr2 = cpu.tensor(n, 40);
  std::memcpy(xt2.m().p, x2.data(), x2.size() * sizeof(float));
  cpu.linear(ca_w, xt2.c(), cw2.m(), true, 0);
  cpu.linear(cb_w, cw2.c(), cr2.m(), true, 0);
  s0 = submissions();
  gpu->linear(a.w, xt.c(), yw.m(), true);
  gpu->rms_norm(yw.m(), norm_w.data(), 1e-6f);
  gpu->linear(b.w, yw.c(), yr1.m(), true);
  gpu->linear(a.w, xt2.c(), yw.m(), true);
  gpu->linear(b.w, yw.c(), yr2.m(), true);
  EXPECT_EQ(submissions() - s0, 0u) << "rows written again whole submitted the batch";
  gpu->sync();
  EXPECT_EQ(submissions() - s0, 1u);
  EXPECT_TRUE(same(yr1, cnb)) << "a reader before the rewrite read the new rows";
  EXPECT_TRUE(same(yw, cw2)) << "the rewrite did not come last";
  EXPECT_TRUE(same(yr2, cr2)) << "a reader after the rewrite read the old rows";
  // Half of a region's columns written again: a reader of the whole rows finds no region holding
  // them as they are now, and reads them after the batch.
  const Tensor cmix = cpu.tensor(n, 64), cr3 = cpu.tensor(n, 40);
  std::memcpy(cmix.m().p, ca.c().p, ca.bytes());
  for (size_t t = 0; t < n; ++t) std::memcpy(cmix.m().row(t), cw2.c().row(t), 32 * sizeof(float));
  cpu.linear(cb_w, cmix.c(), cr3.m(), true, 0);
  s0 = submissions();
  gpu->linear(a.w, xt.c(), yw.m().cols(0, 32), true, 0);
  gpu->linear(a.w, xt.c(), yw.m().cols(32, 32), true, 32);
  gpu->linear(a.w, xt2.c(), yw.m().cols(0, 32), true, 0);
  EXPECT_EQ(submissions() - s0, 0u);
  gpu->linear(b.w, yw.c(), yr2.m(), true);
  EXPECT_EQ(submissions() - s0, 1u) << "rows partly rewritten were read in place";
  gpu->sync();
  EXPECT_TRUE(same(yw, cmix));
  EXPECT_TRUE(same(yr2, cr3)) << "the reader of rows partly rewritten";

  // Any op the CPU runs submits the deferred linears first: gather_rows reads A's output on the host.
  const Tensor yq = gpu->tensor(n, 64), cq = cpu.tensor(n, 64), yq2 = gpu->tensor(n, 64), cq2 = cpu.tensor(n, 64);
  std::vector<uint32_t> back(n);
  for (size_t t = 0; t < n; ++t) back[t] = (uint32_t)(n - 1 - t);
  cpu.linear(ca_w, xt.c(), cq.m(), true, 0);
  cpu.gather_rows(cq.c(), back, cq2.m());
  s0 = submissions();
  gpu->linear(a.w, xt.c(), yq.m(), true);
  gpu->gather_rows(yq.c(), back, yq2.m());
  EXPECT_EQ(submissions() - s0, 1u);
  EXPECT_TRUE(same(yq2, cq2)) << "gather_rows ran before the linear it reads";

  // Outputs outside the backend's tensors (the caller's own memory) are written before the call returns.
  std::vector<float> host(n * 24, -1.0f);
  s0 = submissions();
  gpu->linear(c.w, xt.c(), Mat{host.data(), n, 24, 24}, true);
  EXPECT_EQ(submissions() - s0, 1u);
  EXPECT_EQ(std::memcmp(host.data(), cc.c().p, cc.bytes()), 0);

  // A tensor freed before its deferred linear ran is not written (ASan watches the free).
  s0 = submissions();
  {
    const Tensor gone = gpu->tensor(n, 64);
    gpu->linear(a.w, xt.c(), gone.m(), true);
  }
  gpu->sync();
  EXPECT_EQ(submissions() - s0, 1u);

  // A deferred batch that fails is reported by whatever submitted it, and writes nothing.
  const Tensor yf = gpu->tensor(n, 64);
  const std::vector<float> seven(64, 7.0f);
  gpu->fill_rows(yf.m(), seven);
  gpu->linear(a.w, xt.c(), yf.m(), true);
  fail = true;
  try {
    gpu->sync();
    ADD_FAILURE() << "a failed deferred submission was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not finish"), std::string::npos) << e.what();
  }
  fail = false;
  for (size_t i = 0; i < n * 64; ++i) ASSERT_EQ(yf.c().p[i], 7.0f) << "a failed submission wrote output " << i;
  gpu->sync();  // nothing is left of the failed batch
  gpu->linear(a.w, xt.c(), yf.m(), true);
  gpu->sync();
  EXPECT_TRUE(same(yf, ca)) << "the backend did not recover from the failed submission";
}

// On a device that uses the weights' own pages: release_gpu_imports (a session calls it before
// its models free their buffers) leaves every weight runnable, on the CPU, with the same bits.
TEST(Vulkan, ReleasedImportsRunOnTheCpu) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend({});
  const CpuBackend cpu(1);
  HostWeight hw = random_weight(GgmlType::IQ2_XXS, 37, 512, 4);
  Weight gw = hw.w, cw = hw.w;
  gpu->prepare_weight(gw);
  cpu.prepare_weight(cw);
  std::mt19937_64 rng(3);
  const std::vector<float> x = randoms(rng, 3 * 512);
  const std::vector<float> want = run_linear(cpu, cw, x, 3, true, 0, 37);
  EXPECT_EQ(run_linear(*gpu, gw, x, 3, true, 0, 37), want);
  const GpuDevice d = vulkan_devices()[0];
  EXPECT_EQ(gpu_stats(*gpu).weights_imported, d.uma && d.host_import ? 1u : 0u);
  release_gpu_imports(*gpu);
  EXPECT_EQ(run_linear(*gpu, gw, x, 3, true, 0, 37), want);
  const GpuStats st = gpu_stats(*gpu);
  EXPECT_EQ(st.linear_on_device, st.weights_imported ? 1u : 2u);
  EXPECT_EQ(st.linear_on_host, st.weights_imported ? 1u : 0u) << "a released import still ran on the device";
}

// Row counts past 65,535 (the published output head has 129,280), where a dispatch that gave
// each row a workgroup of its own would run out of workgroups in x.
TEST(Vulkan, RowsBeyondOneDispatchDimensionHaveTheCpuBits) {
  if (!kBuilt) return;
  // More rows than the workgroups a dispatch is given (capped at 1,000 here; a device allows at
  // least 65,535): the subgroup build's rows in turn (70,001 rows at lavapipe's 8 per workgroup,
  // one token) and the GEMM builds' (64 per workgroup, 17 tokens; the float one's 8 rows, 10,007 of
  // them: the 262,147 rows' outputs take the tokens in groups too small for a GEMM) cover them all.
  GpuOptions go;
  go.max_groups_x = 1000;
  if (vulkan_devices()[0].subgroup_linears) go.linears = GpuLinears::Subgroup;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(go);
  const CpuBackend cpu(1);
  std::mt19937_64 rng(17);
  const std::tuple<GgmlType, uint64_t, uint64_t> cases[] = {{GgmlType::Q8_0, 70001, 32}, {GgmlType::F16, 262147, 16},
                                                             {GgmlType::F16, 10007, 16}};
  for (const auto& [type, rows, cols] : cases)
    for (const size_t n : {1u, 17u}) {
      HostWeight h = random_weight(type, rows, cols, rng());
      Weight gw = h.w, cw = h.w;
      gpu->prepare_weight(gw);
      cpu.prepare_weight(cw);
      ASSERT_NE(gw.device, nullptr);
      const std::vector<float> x = randoms(rng, n * cols);
      const std::vector<float> got = run_linear(*gpu, gw, x, n, false, 0, rows);
      const std::vector<float> want = run_linear(cpu, cw, x, n, false, 0, rows);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << type_traits(type).name << " n=" << n;
    }
  const GpuStats st = gpu_stats(*gpu);
  EXPECT_EQ(st.linear_on_device, 6u);
  EXPECT_EQ(st.gemm_dispatches, 2u);
}

// Q8_0 blocks at the edges: -128 against -128 (the product a 16-bit pair sum cannot hold),
// subnormal and largest fp16 scales. The activations come from the CPU's quantizer either way.
TEST(Vulkan, Q8_0EdgeBlocksHaveTheCpuBits) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend({});
  const CpuBackend cpu(1);
  const uint64_t rows = 8, cols = 64;
  HostWeight hw = random_weight(GgmlType::Q8_0, rows, cols, 7);
  const uint16_t scales[] = {0x0001, 0x03ff, 0x7bff, 0xfbff, 0x0400, 0x0000, 0x3c00, 0x8001};
  for (uint64_t r = 0; r < rows; ++r)
    for (uint64_t b = 0; b < cols / 32; ++b) {
      uint8_t* blk = hw.bytes.data() + r * hw.w.row_bytes + b * 34;
      std::memcpy(blk, &scales[(r + b) % 8], 2);
      if (r % 2 == 0) std::memset(blk + 2, 0x80, 32);
    }
  Weight gw = hw.w, cw = hw.w;
  gpu->prepare_weight(gw);
  cpu.prepare_weight(cw);
  std::vector<float> x(cols * 2);
  for (size_t i = 0; i < x.size(); ++i) x[i] = i % 3 == 0 ? -1000.0f : (float)i * 1e-3f;  // codes -127 in each block
  const std::vector<float> want = run_linear(cpu, cw, x, 2, false, 0, rows);
  const std::vector<float> got = run_linear(*gpu, gw, x, 2, false, 0, rows);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  EXPECT_EQ(gpu_stats(*gpu).linear_on_device, 1u);  // one call, two tokens
}

// A term where rounding twice (the product to float, or the sum to double and then to float)
// gives another float than the CPU's single rounding of fma: lane 0 holds 1 + 2^-23, then adds
// (2^-24 (1 + 2^-23)) x (1 - 2^-23) = 2^-24 - 2^-70, just below the midpoint to the next float.
TEST(Vulkan, FloatLinearRoundsEachFmaOnceLikeTheCpu) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend({});
  const CpuBackend cpu(1);
  const uint64_t cols = 17;  // elements 0 and 16 share lane 0
  std::vector<float> wrow(cols, 0.0f), x(cols, 0.0f);
  wrow[0] = 1.0f;
  x[0] = 1.0f + 0x1p-23f;
  wrow[16] = 0x1p-24f * (1.0f + 0x1p-23f);
  x[16] = 1.0f - 0x1p-23f;
  HostWeight hw = random_weight(GgmlType::F32, 1, cols, 1);
  std::memcpy(hw.bytes.data(), wrow.data(), cols * 4);
  Weight gw = hw.w, cw = hw.w;
  gpu->prepare_weight(gw);
  cpu.prepare_weight(cw);
  ASSERT_NE(gw.device, nullptr);
  const std::vector<float> want = run_linear(cpu, cw, x, 1, false, 0, 1);
  ASSERT_EQ(want[0], 1.0f + 0x1p-23f) << "the CPU's fma is not fused";
  const std::vector<float> got = run_linear(*gpu, gw, x, 1, false, 0, 1);
  EXPECT_EQ(got[0], want[0]) << "rounded twice: " << got[0] - 1.0f;
  EXPECT_EQ(gpu_stats(*gpu).linear_on_device, 1u);
}

TEST(Vulkan, SharedExpertRunsItsProjectionsOnTheDevice) {
  if (!kBuilt) return;
  const std::unique_ptr<Backend> gpu = make_vulkan_backend({});
  const CpuBackend cpu(1);
  const uint64_t H = 96, F = 160;
  HostWeight g = random_weight(GgmlType::Q8_0, F, H, 11), u = random_weight(GgmlType::F16, F, H, 12),
             d = random_weight(GgmlType::BF16, H, F, 13);
  Weight gg = g.w, gu = u.w, gd = d.w, cg = g.w, cu = u.w, cd = d.w;
  for (Weight* w : {&gg, &gu, &gd}) gpu->prepare_weight(*w);
  for (Weight* w : {&cg, &cu, &cd}) cpu.prepare_weight(*w);
  std::mt19937_64 rng(3);
  const size_t n = 5;
  std::vector<float> x = randoms(rng, n * H);
  for (float& v : x) v = round_bf16(v);
  std::vector<float> want(n * H), got(n * H);
  cpu.shared_ffn(cg, cu, cd, 7.0f, CMat{x.data(), n, H, H}, Mat{want.data(), n, H, H});
  gpu->shared_ffn(gg, gu, gd, 7.0f, CMat{x.data(), n, H, H}, Mat{got.data(), n, H, H});
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  EXPECT_EQ(gpu_stats(*gpu).linear_on_device, 3u) << "the shared expert's projections did not run on the device";
  // Above, up is F16 (no device quantizer) and down reads f32 rows, so the SwiGLU and the down
  // projection waited for the gate and up. With every projection in a quantized format the whole
  // expert is recorded: gate and up, the SwiGLU on the device, down chained after it, into a
  // tensor of the backend; nothing is submitted until something reads the output.
  const uint64_t H2 = 256;
  const HostWeight g2 = random_weight(GgmlType::Q8_0, F, H2, 14), u2 = random_weight(GgmlType::Q2_K, F, H2, 15),
                   d2 = random_weight(GgmlType::Q8_0, H2, F, 16);
  Weight wg = g2.w, wu = u2.w, wd = d2.w, cg2 = g2.w, cu2 = u2.w, cd2 = d2.w;
  for (Weight* w : {&wg, &wu, &wd}) gpu->prepare_weight(*w);
  for (Weight* w : {&cg2, &cu2, &cd2}) cpu.prepare_weight(*w);
  for (const size_t tokens : {1u, 5u, 17u}) {
    SCOPED_TRACE(std::to_string(tokens) + " tokens");
    std::vector<float> x2 = randoms(rng, tokens * H2);
    for (float& v : x2) v = round_bf16(v);
    std::vector<float> want2(tokens * H2);
    cpu.shared_ffn(cg2, cu2, cd2, 7.0f, CMat{x2.data(), tokens, H2, H2}, Mat{want2.data(), tokens, H2, H2});
    const Tensor out = gpu->tensor(tokens, H2);
    const GpuStats s0 = gpu_stats(*gpu);
    gpu->shared_ffn(wg, wu, wd, 7.0f, CMat{x2.data(), tokens, H2, H2}, out.m());
    const GpuStats s1 = gpu_stats(*gpu);
    EXPECT_EQ(s1.submissions - s0.submissions, 0u) << "the shared expert was submitted before anything read it";
    EXPECT_EQ(s1.ops_on_device - s0.ops_on_device, 1u) << "the SwiGLU ran on the host";
    EXPECT_EQ(s1.inputs_chained - s0.inputs_chained, 1u) << "the down projection did not chain after the SwiGLU";
    gpu->sync();
    EXPECT_EQ(gpu_stats(*gpu).submissions - s1.submissions, 1u);
    EXPECT_EQ(std::memcmp(out.m().p, want2.data(), want2.size() * sizeof(float)), 0);
  }
}

// The upload path of a discrete card (device-local memory the host cannot map): forced on
// lavapipe, in chunks smaller than one weight, so a weight spans several transfers.
TEST(Vulkan, WeightsUploadedThroughStagingHaveTheCpuBits) {
  if (!kBuilt) return;
  GpuOptions o;
  o.force_staging = true;
  o.staging_bytes = 1000;  // not a multiple of a Q8_0 block or of 4
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(o);
  const CpuBackend cpu(1);
  std::mt19937_64 rng(9);
  for (const GgmlType t : {GgmlType::Q8_0, GgmlType::F16}) {
    HostWeight h = random_weight(t, 37, 96, rng());
    Weight gw = h.w, cw = h.w;
    gpu->prepare_weight(gw);
    cpu.prepare_weight(cw);
    ASSERT_NE(gw.device, nullptr);
    const std::vector<float> x = randoms(rng, 3 * 96);
    const std::vector<float> got = run_linear(*gpu, gw, x, 3, true, 0, 37);
    const std::vector<float> want = run_linear(cpu, cw, x, 3, true, 0, 37);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << type_traits(t).name;
  }
  const GpuStats st = gpu_stats(*gpu);
  EXPECT_EQ(st.staged_uploads, 2u) << "the weights were not staged";
  EXPECT_EQ(st.linear_on_device, 2u);
}

TEST(Vulkan, WeightsPastTheBudgetOrWithoutAShaderRunOnTheCpu) {
  if (!kBuilt) return;
  GpuOptions o;
  o.weight_budget = 4096;  // one small weight fits, the second does not
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(o);
  const CpuBackend cpu(1);
  HostWeight a = random_weight(GgmlType::Q8_0, 16, 128, 1), b = random_weight(GgmlType::Q8_0, 64, 128, 2);
  HostWeight c = random_weight(GgmlType::Q8_K, 4, 256, 3);  // an activation format: no shader
  Weight ca_w = a.w, cb_w = b.w, cc_w = c.w;  // the CPU's own preparation of each
  for (Weight* w : {&ca_w, &cb_w, &cc_w}) cpu.prepare_weight(*w);
  for (HostWeight* h : {&a, &b, &c}) gpu->prepare_weight(h->w);
  EXPECT_NE(a.w.device, nullptr);
  EXPECT_EQ(b.w.device, nullptr) << "a weight past the device budget was uploaded";
  EXPECT_EQ(c.w.device, nullptr);
  GpuStats st = gpu_stats(*gpu);
  EXPECT_EQ(st.weights_on_device, 1u);
  EXPECT_EQ(st.weights_on_host, 2u);
  EXPECT_LE(st.bytes_on_device, o.weight_budget);
  std::mt19937_64 rng(5);
  for (HostWeight* h : {&b, &c}) {
    Weight cw = h->w;
    cpu.prepare_weight(cw);
    const std::vector<float> x = randoms(rng, 3 * h->w.cols);
    const std::vector<float> got = run_linear(*gpu, h->w, x, 3, true, 0, h->w.rows);
    const std::vector<float> want = run_linear(cpu, cw, x, 3, true, 0, h->w.rows);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  }
  st = gpu_stats(*gpu);
  EXPECT_EQ(st.linear_on_host, 2u);
  EXPECT_EQ(st.linear_on_device, 0u);
}

// An expert source that records what the backend asks of it, and holds it to the contract a
// streaming store enforces: get() only for an expert of the last prepare().
class CountingExperts final : public ExpertSource {
 public:
  std::vector<HostWeight> gate, up, down;
  mutable std::vector<std::vector<uint32_t>> prepared;
  mutable uint64_t gets = 0;
  bool states_memory = false;  // held_memory(): each expert's slice is a span of its own
  void prepare(uint32_t, std::span<const uint32_t> experts) const override {
    prepared.emplace_back(experts.begin(), experts.end());
  }
  ExpertWeights get(uint32_t, uint32_t e) const override {
    ++gets;
    if (prepared.empty() || std::find(prepared.back().begin(), prepared.back().end(), e) == prepared.back().end())
      throw Error("expert " + std::to_string(e) + " was not prepared");
    return {gate[e].w.data, up[e].w.data, down[e].w.data};
  }
  bool holds_union() const override { return true; }
  std::vector<HeldMemory> held_memory() const override {
    std::vector<HeldMemory> out;
    if (states_memory)
      for (const std::vector<HostWeight>* part : {&gate, &up, &down})
        for (const HostWeight& h : *part) out.push_back({h.w.data, h.w.rows * h.w.row_bytes, h.w.rows * h.w.row_bytes});
    return out;
  }
};

// A source that moves on at every get(): the bytes it returned for the last expert are
// overwritten by the next one's (a streaming store's window of one), so a backend that keeps an
// expert's pointers past the next get() computes with another expert's weights.
class WindowOfOne final : public ExpertSource {
 public:
  explicit WindowOfOne(const CountingExperts& in) : in_(in) {}
  void prepare(uint32_t layer, std::span<const uint32_t> experts) const override { in_.prepare(layer, experts); }
  ExpertWeights get(uint32_t layer, uint32_t e) const override {
    const ExpertWeights w = in_.get(layer, e);
    const size_t bytes[3] = {in_.gate[e].w.rows * in_.gate[e].w.row_bytes, in_.up[e].w.rows * in_.up[e].w.row_bytes,
                             in_.down[e].w.rows * in_.down[e].w.row_bytes};
    const uint8_t* from[3] = {w.gate, w.up, w.down};
    for (int p = 0; p < 3; ++p) {
      if (buf_[p].empty()) buf_[p].resize(bytes[p]);  // once: the addresses stay, the bytes change
      if (buf_[p].size() != bytes[p]) throw Error("WindowOfOne: experts of different sizes");
      std::memcpy(buf_[p].data(), from[p], bytes[p]);
    }
    return {buf_[0].data(), buf_[1].data(), buf_[2].data()};
  }
  // Its three buffers, from the first get() on.
  std::vector<HeldMemory> held_memory() const override {
    std::vector<HeldMemory> out;
    for (const std::vector<uint8_t>& b : buf_)
      if (!b.empty()) out.push_back({b.data(), b.size(), b.size()});
    return out;
  }

 private:
  const CountingExperts& in_;
  mutable std::vector<uint8_t> buf_[3];
};

CountingExperts published_recipe_experts(uint32_t E, uint64_t H, uint64_t F, uint64_t seed,
                                        GgmlType up = GgmlType::IQ2_XXS) {
  CountingExperts ex;
  for (uint32_t e = 0; e < E; ++e) {
    ex.gate.push_back(random_weight(GgmlType::IQ2_XXS, F, H, seed + 3 * e));
    ex.up.push_back(random_weight(up, F, H, seed + 3 * e + 1));
    ex.down.push_back(random_weight(GgmlType::Q2_K, H, F, seed + 3 * e + 2));
  }
  return ex;
}

// The routed FFN in device slots, in the published recipe's types (IQ2_XXS gate/up, Q2_K down):
// the CPU's bits with 1 slot (every expert evicts the last), 2 and all of them; a slot hit asks
// nothing of the source; a second source with the same layer and expert numbers is not served
// the first one's copies. `up`: the up projection's type (Q8_0 reads other activation rows than
// the gate, so the paired gate/up submission stages two sets).
void routed_experts_in_slots(GgmlType up) {
  const uint64_t H = 256, F = 512;
  const uint32_t E = 8, n = 5, layer = 3;
  const CpuBackend cpu(1);
  std::mt19937_64 rng(9);
  std::vector<ExpertTriple> triples;
  for (uint32_t t = 0; t < n; ++t)
    for (uint32_t k = 0; k < 3; ++k)
      triples.push_back({2 + (uint32_t)((t * 2 + k * 2 + (t == 4 ? 1 : 0)) % 6), t,
                         std::uniform_real_distribution<float>(0.1f, 1.0f)(rng)});
  std::stable_sort(triples.begin(), triples.end(), [](const ExpertTriple& a, const ExpertTriple& b) { return a.expert < b.expert; });
  std::vector<uint32_t> used;
  for (const ExpertTriple& t : triples)
    if (used.empty() || used.back() != t.expert) used.push_back(t.expert);
  ASSERT_GE(used.size(), 4u);
  const std::vector<float> x = randoms(rng, n * H);
  CountingExperts ex = published_recipe_experts(E, H, F, 100, up), other = published_recipe_experts(E, H, F, 200, up);
  Weight lg = ex.gate[0].w, lu = ex.up[0].w, ld = ex.down[0].w;
  lg.data = lu.data = ld.data = nullptr;  // geometry only: the bytes come from the source
  for (Weight* w : {&lg, &lu, &ld}) cpu.prepare_weight(*w);
  const ExpertTensors et{&lg, &lu, &ld};

  // The same tokens routed to expert 0, which no call used before, and to the lowest expert the
  // first call used: the least recently used slot holds it, and placing expert 0 must not evict
  // it before its turn.
  std::vector<ExpertTriple> shifted;
  for (uint32_t t = 0; t < n; ++t) shifted.push_back({0, t, 0.5f});
  for (uint32_t t = 0; t < n; ++t) shifted.push_back({used[0], t, 0.75f});
  uint64_t before_sync = 0;  // the last call's submissions before its sync
  auto routed = [&](const Backend& be, const ExpertSource& src, bool rows, const std::vector<ExpertTriple>* tr = nullptr) {
    const std::vector<ExpertTriple>& triples_ = tr ? *tr : triples;
    const uint64_t s0 = gpu_stats(be).submissions;
    const Tensor xt = be.tensor(n, H);
    for (uint32_t t = 0; t < n; ++t) std::memcpy(xt.m().row(t), x.data() + t * H, H * sizeof(float));
    const Tensor out = be.tensor(rows ? triples_.size() : n, H);
    // Sums that start from values with all 24 bits, so the order the BF16 terms are added in shows.
    std::vector<float> start(H);
    for (size_t k = 0; k < H; ++k) start[k] = rows ? 0.0f : (float)(k % 7 + 1) / 3.0f;
    be.fill_rows(out.m(), start);
    if (rows)
      be.routed_ffn_rows(et, src, layer, triples_, 1.5f, xt.c(), out.m());
    else
      be.routed_ffn(et, src, layer, triples_, 1.5f, xt.c(), out.m());
    before_sync = gpu_stats(be).submissions - s0;
    be.sync();
    std::vector<float> v;
    for (size_t i = 0; i < out.c().n; ++i) v.insert(v.end(), out.c().row(i), out.c().row(i) + H);
    return v;
  };
  const std::vector<float> want = routed(cpu, ex, false), want_rows = routed(cpu, ex, true),
                           want_other = routed(cpu, other, false);
  ASSERT_EQ(ex.prepared.back(), used) << "the CPU backend prepares every expert it reads";
  const std::vector<float> want_shifted = routed(cpu, ex, false, &shifted);
  // 1 and 2 slots: fewer than a call's experts; used.size(): exactly a call's, so the shifted
  // call must place its new experts without evicting the ones it still needs (a source that
  // streams was not asked for those).
  for (const uint64_t slots : {(uint64_t)1, (uint64_t)2, (uint64_t)used.size(), (uint64_t)64}) {
    SCOPED_TRACE("slots " + std::to_string(slots));
    GpuOptions o;
    o.expert_slots = slots;
    const std::unique_ptr<Backend> gpu = make_vulkan_backend(o);
    ex.prepared.clear();
    ex.gets = 0;
    EXPECT_EQ(routed(*gpu, ex, false), want);
    ASSERT_EQ(ex.prepared.size(), 1u);
    EXPECT_EQ(ex.prepared[0], used) << "a cold start reads every expert";
    GpuStats st = gpu_stats(*gpu);
    EXPECT_EQ(st.expert_slots, std::min<uint64_t>(slots, 64));
    EXPECT_EQ(st.expert_slot_bytes, gpu_expert_slot_bytes(F * lg.row_bytes, F * lu.row_bytes, H * ld.row_bytes));
    EXPECT_EQ(st.expert_misses, used.size());
    EXPECT_EQ(st.expert_hits, 0u);
    EXPECT_EQ(st.linear_on_host + st.expert_calls_on_host, 0u);
    // One round trip per group of experts (as many as the slots hold, at most 32): every gate and
    // up projection of the group, each expert's SwiGLU on the device, its down projection's
    // activations quantized there and its down projection, in one submission (the slots are
    // host-visible here, so placing an expert submits nothing).
    const uint64_t group = std::min<uint64_t>(slots, 32);
    EXPECT_EQ(st.submissions, (used.size() + group - 1) / group);
    // A call that is one group adds its terms into the sums on the device (routed_sum.comp) and
    // waits in the deferred batch for the sync.
    const bool one_group = used.size() <= group;
    EXPECT_EQ(st.ops_on_device, used.size() + (one_group ? 1 : 0)) << "an expert's SwiGLU or the sums ran on the host";
    if (one_group) {
      EXPECT_EQ(before_sync, 0u) << "a call of one group was submitted before its sums were read";
    }
    // Again, and as rows: all hits when every expert has a slot, nothing asked of the source.
    EXPECT_EQ(routed(*gpu, ex, false), want);
    EXPECT_EQ(routed(*gpu, ex, true), want_rows);
    st = gpu_stats(*gpu);
    if (slots >= used.size()) {
      EXPECT_EQ(st.expert_hits, 2 * used.size());
      EXPECT_EQ(ex.gets, used.size());
      EXPECT_EQ(ex.prepared.size(), 1u) << "a call whose experts all have slots prepared the source";
    } else {
      EXPECT_EQ(st.expert_misses + st.expert_hits, 3 * used.size());
      EXPECT_GT(st.expert_misses, used.size());
    }
    EXPECT_EQ(routed(*gpu, ex, false, &shifted), want_shifted);
    EXPECT_EQ(routed(*gpu, other, false), want_other) << "another source was served the first one's copies";
  }
  // Staging buffers of 5,000 bytes: a group's projections split over several submissions and an
  // expert with three tokens (6 KiB of gate outputs) runs alone in token groups; same bits.
  GpuOptions o;
  o.expert_slots = 64;
  o.io_staging_bytes = 5000;
  const std::unique_ptr<Backend> small = make_vulkan_backend(o);
  EXPECT_EQ(routed(*small, ex, false), want);
  EXPECT_EQ(routed(*small, ex, true), want_rows);
  EXPECT_GT(gpu_stats(*small).submissions, 4 * used.size()) << "the small buffers did not split the batches";
  // Those small buffers make several groups of a call, and lavapipe's slots are mapped: each next
  // group's misses were copied in while the device ran the group before, counted as misses once.
  const GpuStats ss = gpu_stats(*small);
  EXPECT_GT(ss.expert_uploads_ahead, 0u);
  EXPECT_EQ(ss.expert_misses, used.size()) << "a copy ahead was counted as a hit, or made twice";
  EXPECT_EQ(ss.expert_hits, used.size());

  // Two calls without a sync between, as many slots as the first call's experts: the first call's
  // group waits in the deferred batch, reading its slots, while the second places expert 0 in the
  // least recently used slot, one the first reads: the batch runs before the slot is replaced.
  {
    GpuOptions so;
    so.expert_slots = used.size();
    const std::unique_ptr<Backend> two = make_vulkan_backend(so);
    const Tensor xt = two->tensor(n, H), o1 = two->tensor(n, H), o2 = two->tensor(n, H);
    std::memcpy(xt.m().p, x.data(), xt.bytes());
    std::vector<float> start(H);
    for (size_t k = 0; k < H; ++k) start[k] = (float)(k % 7 + 1) / 3.0f;
    two->fill_rows(o1.m(), start);
    two->fill_rows(o2.m(), start);
    two->routed_ffn(et, ex, layer, triples, 1.5f, xt.c(), o1.m());
    EXPECT_EQ(gpu_stats(*two).submissions, 0u);
    two->routed_ffn(et, ex, layer, shifted, 1.5f, xt.c(), o2.m());
    two->sync();
    EXPECT_EQ(std::vector<float>(o1.c().p, o1.c().p + n * H), want) << "a slot was replaced under the waiting group";
    EXPECT_EQ(std::vector<float>(o2.c().p, o2.c().p + n * H), want_shifted);
  }

  // A call of one group that finds the deferred batch too full to hold its terms and sums beside
  // it (a large linear waiting there): the group is submitted, its terms come back and the host
  // adds them; the same bits.
  {
    GpuOptions fo;
    fo.expert_slots = 64;
    fo.io_staging_bytes = 200000;  // one group's intermediates (76,800 bytes) within half of it
    const std::unique_ptr<Backend> full = make_vulkan_backend(fo);
    HostWeight big = random_weight(GgmlType::Q8_0, 3200, H, 77);
    full->prepare_weight(big.w);
    const Tensor bx = full->tensor(n, H), by = full->tensor(n, 3200);
    std::memcpy(bx.m().p, x.data(), bx.bytes());
    const Tensor xt = full->tensor(n, H), out = full->tensor(n, H);
    std::memcpy(xt.m().p, x.data(), xt.bytes());
    std::vector<float> start(H);
    for (size_t k = 0; k < H; ++k) start[k] = (float)(k % 7 + 1) / 3.0f;
    full->fill_rows(out.m(), start);
    full->linear(big.w, bx.c(), by.m(), true);  // 64,000 bytes of outputs wait in the batch
    const uint64_t s0 = gpu_stats(*full).submissions, ops0 = gpu_stats(*full).ops_on_device;
    full->routed_ffn(et, ex, layer, triples, 1.5f, xt.c(), out.m());
    EXPECT_GT(gpu_stats(*full).submissions, s0) << "the group waited in a batch with no room for it";
    EXPECT_EQ(gpu_stats(*full).ops_on_device - ops0, used.size()) << "the sums ran on the device";
    full->sync();
    EXPECT_EQ(std::vector<float>(out.c().p, out.c().p + n * H), want);
  }

  // A device that does not quantize activations (GpuOptions::host_quantize, as one without
  // shaderFloat64): the SwiGLU and the down projection's activations on the host between two
  // submissions per group; the same bits.
  {
    GpuOptions ho;
    ho.expert_slots = 64;
    ho.host_quantize = true;
    const std::unique_ptr<Backend> hq = make_vulkan_backend(ho);
    EXPECT_EQ(routed(*hq, ex, false), want);
    EXPECT_EQ(routed(*hq, ex, true), want_rows);
    EXPECT_EQ(gpu_stats(*hq).submissions, 2u * 2) << "two round trips per group without the device's SwiGLU";
    EXPECT_EQ(gpu_stats(*hq).ops_on_device, 0u);
  }

  // Slots as a card's VRAM gives them (not mapped): each miss is staged and its copies recorded
  // at the head of its group's submission, so a group still takes one round trip;
  // with room in the staging buffer for an expert and a half, a part that does not fit flushes
  // the ones before it in a submission of its own. The CPU's bits either way.
  const uint64_t part_bytes[3] = {F * lg.row_bytes, F * lu.row_bytes, H * ld.row_bytes};
  const uint64_t expert_bytes = part_bytes[0] + part_bytes[1] + part_bytes[2];
  for (const uint64_t staging : {(uint64_t)0, expert_bytes + expert_bytes / 2}) {
    SCOPED_TRACE("staged uploads, staging " + std::to_string(staging));
    GpuOptions vo;
    vo.expert_slots = 64;
    vo.force_staging = true;
    vo.staging_bytes = staging;
    const std::unique_ptr<Backend> vram = make_vulkan_backend(vo);
    const GpuStats s0 = gpu_stats(*vram);
    EXPECT_EQ(routed(*vram, ex, false), want);
    const GpuStats s1 = gpu_stats(*vram);
    EXPECT_EQ(s1.expert_misses, used.size());
    EXPECT_EQ(s1.staged_uploads - s0.staged_uploads, 3 * used.size()) << "the slots were mapped after all";
    uint64_t flushes = 0, fill = 0;
    for (size_t k = 0; k < used.size() && staging; ++k)
      for (const uint64_t b : part_bytes) {
        if (fill + b > staging) ++flushes, fill = 0;
        fill += b;
      }
    EXPECT_EQ(s1.submissions - s0.submissions, 1 + flushes) << "the misses' uploads took round trips of their own";
    if (staging) {
      EXPECT_GT(flushes, 1u);
    }
    EXPECT_EQ(routed(*vram, ex, true), want_rows);
    EXPECT_EQ(gpu_stats(*vram).expert_hits, used.size());
  }

  // The CPU's share of the misses (--cpu-experts): half of them, all of them and auto, in front
  // of a source that holds its union and one that moves on at every get(): the CPU's bits, the
  // CPU's experts counted and never placed in a slot (all on the CPU: nothing submitted).
  const WindowOfOne moving(ex);
  for (int mode = 0; mode < 3; ++mode)
    for (const bool window : {false, true}) {
      SCOPED_TRACE("cpu-experts " + std::string(mode == 0 ? "0.5" : mode == 1 ? "1" : "auto") +
                   (window ? ", a window of one" : ""));
      GpuOptions co;
      co.expert_slots = 64;
      co.cpu_experts = mode == 0 ? 0.5 : 1.0;
      co.cpu_experts_auto = mode == 2;
      const std::unique_ptr<Backend> split = make_vulkan_backend(co);
      const ExpertSource& src = window ? static_cast<const ExpertSource&>(moving) : ex;
      EXPECT_EQ(routed(*split, src, false), want);
      EXPECT_EQ(routed(*split, src, true), want_rows);
      const GpuStats st = gpu_stats(*split);
      EXPECT_EQ(st.expert_on_cpu + st.expert_misses + st.expert_hits, 2 * used.size());
      if (mode == 1) {
        EXPECT_EQ(st.expert_on_cpu, 2 * used.size());
        EXPECT_EQ(st.submissions, 0u);
        EXPECT_EQ(st.expert_upload_bytes, 0u);
      } else {
        EXPECT_GT(st.expert_on_cpu, 0u);
        EXPECT_GT(st.expert_misses, 0u);
        EXPECT_GT(st.split_cpu_s, 0.0);
        EXPECT_GT(st.split_upload_s, 0.0);
      }
      if (mode == 0) {
        // Half of the first call's misses (the ones with the fewest tokens), then half of the
        // second call's: the CPU's experts were not uploaded, so they are its misses again.
        const uint64_t k1 = used.size() / 2, k2 = (k1 + used.size() % 2) / 2;
        EXPECT_EQ(st.expert_on_cpu, k1 + k2);
        EXPECT_EQ(st.expert_hits, used.size() - k1);
      }
    }

  // In place (--gpu-experts in-place): no slots; the device reads each expert where the source
  // holds it, through chunks of the source's memory mapped once. The CPU's bits in front of a
  // source that holds its union (one group per call) and of a window of one (each expert ends
  // its group: its dispatches finish before the next get() overwrites its bytes); nothing
  // copied. A source that does not state its memory runs on the CPU, counted.
  ASSERT_TRUE(gpu_stats(*make_vulkan_backend(GpuOptions{})).imports_host_memory) << "lavapipe imports host memory";
  for (const int mode : {0, 1, 2}) {
    SCOPED_TRACE(mode == 0 ? "in place" : mode == 1 ? "in place, a window of one" : "in place, memory not stated");
    ex.states_memory = mode != 2;
    GpuOptions io;
    io.experts_in_place = true;
    const std::unique_ptr<Backend> gpu = make_vulkan_backend(io);
    const ExpertSource& src = mode == 1 ? static_cast<const ExpertSource&>(moving) : ex;
    EXPECT_EQ(routed(*gpu, src, false), want);
    EXPECT_EQ(routed(*gpu, src, true), want_rows);
    const GpuStats st = gpu_stats(*gpu);
    EXPECT_TRUE(st.experts_in_place);
    EXPECT_EQ(st.expert_slots + st.expert_hits + st.expert_misses + st.expert_upload_bytes, 0u) << "something was copied";
    if (mode == 2) {
      EXPECT_EQ(st.expert_in_place_refused, 2 * used.size());
      EXPECT_EQ(st.submissions, 0u);
      continue;
    }
    EXPECT_EQ(st.expert_in_place, 2 * used.size());
    EXPECT_EQ(st.expert_in_place_refused, 0u);
    // Every slice a span of its own (a window's three buffers for all): each mapped once.
    EXPECT_EQ(st.expert_chunks_mapped, mode == 1 ? 3u : 3 * used.size()) << "a chunk mapped twice, or none";
    EXPECT_EQ(st.submissions, mode == 1 ? 2 * used.size() : 2u) << "groups as the source allows";
    uint64_t per_layer = 0;
    for (const GpuLayerStats& l : st.expert_layers) per_layer += l.in_place;
    EXPECT_EQ(per_layer, st.expert_in_place);
    // Released (a session ending, its sources' memory about to go): the CPU runs them after.
    release_gpu_imports(*gpu);
    EXPECT_EQ(routed(*gpu, src, false), want);
    EXPECT_EQ(gpu_stats(*gpu).expert_in_place, st.expert_in_place);
    EXPECT_EQ(gpu_stats(*gpu).expert_calls_on_host, 1u);
  }
  ex.states_memory = false;
  // Refused where it cannot hold: a device told not to import, beside slots, beside --cpu-experts.
  for (int bad = 0; bad < 3; ++bad) {
    GpuOptions io;
    io.experts_in_place = true;
    io.no_import = bad == 0;
    io.expert_slots = bad == 1 ? 4 : 0;
    io.cpu_experts = bad == 2 ? 0.5 : 0;
    try {
      make_vulkan_backend(io);
      ADD_FAILURE() << "case " << bad << " was not refused";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(bad == 0 ? "in-place" : bad == 1 ? "not both" : "--cpu-experts"), std::string::npos) << m;
    }
  }
}

TEST(Vulkan, RoutedExpertsInDeviceSlotsHaveTheCpuBits) {
  if (!kBuilt) return;
  routed_experts_in_slots(GgmlType::IQ2_XXS);
}

TEST(Vulkan, RoutedExpertsWithUpInAnotherFormatHaveTheCpuBits) {
  if (!kBuilt) return;
  routed_experts_in_slots(GgmlType::Q8_0);
}

// The FFN's tail with the routed experts on the CPU (no slots): the shared expert waits in the
// deferred batch while the CPU sums the routed experts (the CPU reads x and writes the sums on the
// host: nothing to submit for it), and f_out = bf16(routed + shared) is recorded into the batch,
// on the device: one submission at the sync for the whole FFN, with the CPU's bits.
TEST(Vulkan, RoutedExpertsOnTheCpuLeaveTheSharedExpertInTheBatch) {
  if (!kBuilt) return;
  const uint64_t H = 256, F = 512;
  const uint32_t E = 4, n = 3, layer = 1;
  const CpuBackend cpu(1);
  const std::unique_ptr<Backend> gpu = make_vulkan_backend({});
  std::mt19937_64 rng(21);
  const HostWeight g = random_weight(GgmlType::Q8_0, F, H, 31), u = random_weight(GgmlType::Q8_0, F, H, 32),
                   d = random_weight(GgmlType::Q8_0, H, F, 33);
  Weight gg = g.w, gu = u.w, gd = d.w, cg = g.w, cu = u.w, cd = d.w;
  for (Weight* w : {&gg, &gu, &gd}) gpu->prepare_weight(*w);
  for (Weight* w : {&cg, &cu, &cd}) cpu.prepare_weight(*w);
  CountingExperts ex = published_recipe_experts(E, H, F, 300);
  Weight lg = ex.gate[0].w, lu = ex.up[0].w, ld = ex.down[0].w;
  lg.data = lu.data = ld.data = nullptr;
  for (Weight* w : {&lg, &lu, &ld}) cpu.prepare_weight(*w);
  const ExpertTensors et{&lg, &lu, &ld};
  const std::vector<ExpertTriple> triples = {{0, 1, 0.25f}, {1, 0, 0.5f}, {1, 2, 0.75f}, {3, 0, 1.5f}};
  std::vector<float> x = randoms(rng, n * H);
  for (float& v : x) v = round_bf16(v);
  auto ffn = [&](const Backend& be, const Weight& wg, const Weight& wu, const Weight& wd, uint64_t* subs) {
    const Tensor xt = be.tensor(n, H), sh = be.tensor(n, H), routed = be.tensor(n, H), out = be.tensor(n, H);
    for (uint32_t t = 0; t < n; ++t) std::memcpy(xt.m().row(t), x.data() + t * H, H * sizeof(float));
    be.fill_rows(routed.m(), std::vector<float>(H, 0.0f));
    const uint64_t s0 = gpu_stats(be).submissions;
    be.shared_ffn(wg, wu, wd, 7.0f, xt.c(), sh.m());
    be.routed_ffn(et, ex, layer, triples, 7.0f, xt.c(), routed.m());
    be.add_round(routed.c(), sh.c(), out.m());
    if (subs) *subs = gpu_stats(be).submissions - s0;
    be.sync();
    return std::vector<float>(out.c().p, out.c().p + n * H);
  };
  const std::vector<float> want = ffn(cpu, cg, cu, cd, nullptr);
  uint64_t before_sync = 0;
  const uint64_t ops0 = gpu_stats(*gpu).ops_on_device, s0 = gpu_stats(*gpu).submissions;
  EXPECT_EQ(ffn(*gpu, gg, gu, gd, &before_sync), want);
  EXPECT_EQ(before_sync, 0u) << "the CPU's routed experts or the sum submitted the shared expert";
  EXPECT_EQ(gpu_stats(*gpu).submissions - s0, 1u);
  EXPECT_EQ(gpu_stats(*gpu).ops_on_device - ops0, 2u) << "the SwiGLU and the sum on the device";
}

// The batch's rows come first out of the device's budget where they are its memory: a budget
// without room for them is refused when the backend is made, naming them and the fix; with room,
// the weights get what is left.
TEST(Vulkan, ABudgetWithoutRoomForTheBatchRowsIsRefused) {
  if (!kBuilt) return;
  GpuOptions go;
  go.scratch_on_device = true;
  go.weight_budget = 8ull << 20;
  try {
    (void)make_vulkan_backend(go);
    FAIL() << "8 MiB for 16 MiB of rows was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("scratch (the deferred batch's rows) 16.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("--gpu-mem"), std::string::npos) << m;
    EXPECT_NE(m.find("llvmpipe"), std::string::npos) << m;
  }
  go.weight_budget = 20ull << 20;
  const GpuStats st = gpu_stats(*make_vulkan_backend(go));
  EXPECT_EQ(st.device_total, 20ull << 20);
  EXPECT_EQ(st.kv_bytes, (20ull << 20) / 8) << "--gpu-kv auto: an eighth of a budget under 512 MiB";
  EXPECT_EQ(st.device_budget, (4ull << 20) - st.kv_bytes);
  // Kept attention rows asked for beyond the budget are refused the same way, and named.
  go.kv_auto = false;
  go.kv_bytes = 8ull << 20;
  try {
    (void)make_vulkan_backend(go);
    FAIL() << "16 MiB of rows and 8 MiB of kept attention rows in 20 MiB was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sequence state (attention rows kept, --gpu-kv) 8.00 MiB"), std::string::npos)
        << e.what();
  }
  go.kv_auto = true;
  // Where the host maps the rows they are not the device's: the whole budget is the weights'.
  go.scratch_on_device = false;
  const GpuStats mapped = gpu_stats(*make_vulkan_backend(go));
  EXPECT_EQ(mapped.device_budget, 20ull << 20);
  EXPECT_EQ(mapped.scratch_bytes, 0u);
}

TEST(Vulkan, AMissingDeviceIsNamedWithTheCount) {
  if (!kBuilt) return;
  GpuOptions o;
  o.device = 99;
  try {
    make_vulkan_backend(o);
    FAIL() << "device 99 was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no device 99"), std::string::npos) << m;
    EXPECT_NE(m.find("sluice devices"), std::string::npos) << m;
  }
}

// With no Vulkan driver (the loader pointed at none), `devices` and a run on the Vulkan backend
// fail with one line saying so and what to install.
TEST(Vulkan, NoDriverIsNamed) {
  if (!kBuilt) return;
  const test::TempDir dir("sluice_vulkan_no_driver");
  const std::string model = dir / "tiny.gguf";
  ASSERT_EQ(test::run_sluice(dir, "make-model --preset tiny -o " + test::q(model)).rc, 0);
  test::CmdResult d, r;
  {
    const std::string none = dir / "no-such-icd.json";
    const test::ScopedEnv icd("VK_ICD_FILENAMES", none), driver("VK_DRIVER_FILES", none);
    d = test::run_sluice(dir, "devices");
    r = test::run_sluice(dir, "run -m " + test::q(model) + " --tokens 5 -n 1 --backend vulkan");
  }
  for (const test::CmdResult* c : {&d, &r}) {
    EXPECT_EQ(c->rc, 1) << c->err;
    EXPECT_EQ(c->err_lines(), 1u) << c->err;
    EXPECT_NE(c->err.find("sluice: error: vulkan: no Vulkan driver answered (install the GPU's Vulkan driver"),
              std::string::npos)
        << c->err;
  }
}

// A shader the driver cannot build is named, with the driver's result, when the backend is made;
// what was built before it is freed (ASan's leak check sees it), and the device works after.
TEST(Vulkan, AShaderTheDriverCannotBuildIsNamed) {
  if (!kBuilt) return;
  for (const std::string shader : {"linear_q2_k", "rms_norm", "attention"}) {
    SCOPED_TRACE(shader);
    GpuOptions o;
    o.threads = 1;
    int asked = 0;
    o.fault_shader = [&](const char* what) {
      ++asked;
      return shader == what;
    };
    try {
      make_vulkan_backend(o);
      FAIL() << "the backend was made without shader " << shader;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "vulkan: the driver could not build shader " + shader +
                                           ": out of device memory");
    }
    EXPECT_GT(asked, 1);
  }
  GpuOptions o;
  o.threads = 1;
  const std::unique_ptr<Backend> be = make_vulkan_backend(o);
  std::vector<float> x(64, 1.5f), w(64, 1.0f);
  gpu_rms_norm(*be, x.data(), 1, 64, w.data(), 1e-6f);
  EXPECT_FLOAT_EQ(x[0], 1.0f);
}

// The whole engine on the tiny model: every logit row of a chunked prompt and of the decode steps
// equals the CPU backend's, and the dense linear layers really ran on the device.
TEST(Vulkan, TinyModelLogitsEqualTheCpuBackend) {
  if (!kBuilt) return;
  const test::TempDir dir("sluice_vulkan");
  const std::string model = dir / "tiny.gguf";
  ASSERT_EQ(test::run_sluice(dir, "make-model --preset tiny -o " + test::q(model)).rc, 0);
  struct Experts {
    uint64_t slots = 0;
    bool stream = false;
    double cpu_share = 0;
    bool cpu_auto = false;
    bool in_place = false;
    uint32_t cache_experts = 0;  // the host store's (0: the plan's)
    GpuLinears linears = GpuLinears::Auto;
    uint32_t chunk = 8;
    bool scratch = false;  // GpuOptions::scratch_on_device
    bool unmapped = false;  // GpuOptions::force_staging: slots the host does not map, hint-started copies
    bool no_timeline = false;  // GpuOptions::no_timeline
    GpuIndexer indexer = GpuIndexer::Auto;
    uint32_t prompt = 21;  // tokens
    GpuIntDot int_dot = GpuIntDot::Auto;
    std::optional<uint64_t> kv = std::nullopt;  // --gpu-kv bytes (none: auto)
  };
  auto rows_of = [&](const std::string& backend, SessionStats* st, GpuStats* gs, Experts x = {}) {
    const uint64_t slots = x.slots;
    SessionOptions so;
    so.model_path = model;
    so.ctx = 64;
    so.chunk = x.chunk;
    so.threads = 2;
    so.budget = BudgetSpec{false, 2ull << 30};
    so.allow_swap = true;
    so.stream_experts = x.stream;
    so.max_cache_experts = x.cache_experts;
    so.backend = backend;
    so.gpu_experts = slots;
    so.cpu_experts = x.cpu_share;
    so.cpu_experts_auto = x.cpu_auto;
    so.gpu_experts_in_place = x.in_place;
    so.gpu_linears = x.linears;
    so.gpu_scratch_on_device = x.scratch;
    so.gpu_force_staging = x.unmapped;
    so.gpu_no_timeline = x.no_timeline;
    so.gpu_indexer = x.indexer;
    so.gpu_int_dot = x.int_dot;
    so.gpu_kv_auto = !x.kv;
    so.gpu_kv = x.kv.value_or(0);
    Session s(so);
    std::vector<float> rows;
    EvalObserver o;
    o.on_eval = [&](uint32_t, std::span<const TokenId> toks, const float* logits, const std::vector<TokenTrace>*) {
      if (logits) rows.insert(rows.end(), logits, logits + toks.size() * s.config().vocab_size);
    };
    GenerateRequest r;
    for (uint32_t i = 0; i < x.prompt; ++i) r.prompt.push_back((i * 37u + 5u) % 400u + 3u);
    r.max_tokens = 6;
    r.ignore_eos = true;
    r.observer = &o;
    s.generate(r, {}, {});
    *st = s.stats();
    *gs = gpu_stats(s.backend());
    // The device's copies are planned before they are made, and hold to the plan.
    uint64_t planned = 0, held = 0;
    std::string copies_detail;
    for (const PlanLine& l : s.plan().mandatory) {
      if (l.name == "GPU weight copies") {
        planned = l.bytes;
        copies_detail = l.detail;
      }
      if (l.name == "GPU deferred rows") held = l.bytes;
    }
    if (backend == "cpu") {
      EXPECT_EQ(planned + held, 0u);
    } else {
      // The shared expert's [g | u] rows that a deferred batch holds past the op, for a chunk.
      const ModelConfig& mc = s.config();
      EXPECT_EQ(held, (uint64_t)s.plan().chunk * 2 * mc.moe_intermediate_size * std::max<uint32_t>(1, mc.n_shared_experts) * 4);
      EXPECT_GT(planned, 0u) << "the plan has no line for the device's copies";
      EXPECT_LE(gs->bytes_on_device + kGpuStagingBuffers * kGpuStagingBytes, planned);
      // Hint-started copies have a staging buffer of their own, in the plan.
      const uint64_t staging = kGpuStagingBuffers + (x.scratch ? 1 : 0) + (gs->hint_staging ? 1 : 0);
      EXPECT_NE(copies_detail.find(std::to_string(staging) + " x " + format_bytes(kGpuStagingBytes) + " staging"),
                std::string::npos)
          << copies_detail;
      EXPECT_TRUE(gs->weights_in_host_memory) << "lavapipe's memory is the host's";
      // lavapipe imports host memory: the dense weights are used in place, the plan has no copy of them.
      if (gs->imports_host_memory) {
        EXPECT_GT(gs->weights_imported, 0u);
        // In place: the experts are the host store's or the model's own bytes; only a group's
        // rows are the device path's.
        if (slots == 0) {
          EXPECT_EQ(planned, (kGpuStagingBuffers + x.scratch) * kGpuStagingBytes + (x.in_place ? 2 * kGpuExpertGroupBytes : 0) +
                                 2 * gs->kv_bytes);
        }
      }
      // The device's own plan: its budget, its mandatory part (the batch's rows where they are
      // device memory), and the lines and what is unused adding up to the budget.
      std::map<std::string, uint64_t> dev;
      for (const PlanLine& l : s.plan().device_plan) dev[l.name] = l.bytes;
      EXPECT_EQ(dev["budget"], gs->device_total);
      EXPECT_EQ(dev["scratch"], gs->scratch_bytes);
      EXPECT_EQ(dev["sequence state"], gs->kv_bytes);
      EXPECT_EQ(dev["mandatory total"], gs->scratch_bytes + gs->kv_bytes);
      EXPECT_EQ(dev["scratch"] + dev["sequence state"] + dev["dense weights"] + dev["expert slots"] + dev["unused"],
                dev["budget"]);
      EXPECT_EQ(gs->device_budget + gs->scratch_bytes + gs->kv_bytes, gs->device_total);
    }
    return rows;
  };
  SessionStats cs, gs;
  GpuStats cg, gg;
  const std::vector<float> cpu = rows_of("cpu", &cs, &cg);
  const std::vector<float> gpu = rows_of("vulkan", &gs, &gg);
  ASSERT_FALSE(cpu.empty());
  ASSERT_EQ(gpu.size(), cpu.size());
  EXPECT_EQ(std::memcmp(gpu.data(), cpu.data(), cpu.size() * sizeof(float)), 0) << "logits differ from the CPU's";
  EXPECT_EQ(cg.linear_on_device, 0u);
  EXPECT_GT(gg.weights_on_device, 0u);
  EXPECT_GT(gg.linear_on_device, 0u) << "no linear layer ran on the device";
  EXPECT_EQ(gg.expert_hits + gg.expert_misses, 0u) << "routed experts ran on the device without slots";
  EXPECT_EQ(gg.gemm_dispatches, 0u) << "a chunk of 8 tokens ran the GEMM build";
  {
    // The prompt's 21 tokens in one chunk: the dense linears run the GEMM build (a tile of 16
    // tokens and a part of one), and the logits are still the CPU's (whose chunks are 8 tokens).
    // With the device's integer dot product where it has one.
    const bool dot = vulkan_devices()[0].int_dot;
    SessionStats ss;
    GpuStats sg;
    const std::vector<float> got =
        rows_of("vulkan", &ss, &sg, {.slots = 100000u, .chunk = 32, .int_dot = dot ? GpuIntDot::On : GpuIntDot::Auto});
    ASSERT_EQ(got.size(), cpu.size());
    EXPECT_EQ(std::memcmp(got.data(), cpu.data(), cpu.size() * sizeof(float)), 0) << "one chunk of 21: logits differ";
    EXPECT_GT(sg.gemm_dispatches, 0u);
    EXPECT_EQ(sg.int_dot, dot);
  }
  // The routed experts in device slots: one slot (every expert evicts the one before), 7 in front
  // of the streaming expert store (which refuses an expert it was not asked to prepare), and one
  // per expert of the model give the CPU's logits. The last two with the quantized linears a
  // subgroup per output (and a tile of tokens in the prefill), where the device can.
  const GpuLinears subgroup = vulkan_devices()[0].subgroup_linears ? GpuLinears::Subgroup : GpuLinears::Auto;
  for (const uint64_t slots : {1u, 7u, 100000u}) {
    SessionStats ss;
    GpuStats sg;
    const std::vector<float> got = rows_of(
        "vulkan", &ss, &sg, {.slots = slots, .stream = slots == 7, .linears = slots == 1 ? GpuLinears::Auto : subgroup});
    ASSERT_EQ(got.size(), cpu.size());
    EXPECT_EQ(std::memcmp(got.data(), cpu.data(), cpu.size() * sizeof(float)), 0) << slots << " slots: logits differ";
    EXPECT_GT(sg.expert_misses, 0u);
    EXPECT_EQ(sg.expert_calls_on_host, 0u);
    EXPECT_EQ(sg.subgroup_linears, slots == 1 ? auto_subgroup_linears(vulkan_devices()[0]) : subgroup == GpuLinears::Subgroup);
    // The session's stats carry the device's, and /metrics shows the slot tier.
    ASSERT_TRUE(ss.gpu);
    EXPECT_EQ(ss.gpu_stats.expert_hits, sg.expert_hits);
    server::MetricsInput in;
    in.loaded = true;
    in.session = ss;
    const std::string metrics = server::render_metrics(in);
    EXPECT_NE(metrics.find("\nsluice_gpu_expert_slots " + std::to_string(sg.expert_slots) + "\n"), std::string::npos) << metrics;
    EXPECT_NE(metrics.find("\nsluice_gpu_expert_hits_total " + std::to_string(sg.expert_hits) + "\n"), std::string::npos) << metrics;
    EXPECT_NE(metrics.find("\nsluice_gpu_expert_misses_total " + std::to_string(sg.expert_misses) + "\n"), std::string::npos)
        << metrics;
    if (slots < 100000) {
      EXPECT_EQ(sg.expert_slots, slots);
    } else {
      EXPECT_LT(sg.expert_slots, slots) << "more slots than the model has experts";
      EXPECT_GT(sg.expert_hits, sg.expert_misses) << "a slot per expert, and still mostly misses";
    }
  }
  // The batch's rows in device memory the host does not map, as on a card with memory of its
  // own (forced on lavapipe): the host reads what it needs of them through read-back copies at
  // the end of each submission. The CPU's logits, with the routed experts on the CPU and in 7
  // slots (their groups and sums in the batch).
  for (const uint64_t slots : {0u, 7u}) {
    SCOPED_TRACE("scratch on the device, " + std::to_string(slots) + " slots");
    SessionStats ss;
    GpuStats sg;
    // 1 MiB of kept rows (8,192 slots: every row the tiny model reads; auto would keep 64 MiB,
    // twice counted on lavapipe, whose memory is the host's: past the 2 GiB budget under ASan).
    const std::vector<float> got = rows_of("vulkan", &ss, &sg, {.slots = slots, .scratch = true, .kv = 1u << 20});
    ASSERT_EQ(got.size(), cpu.size());
    EXPECT_EQ(std::memcmp(got.data(), cpu.data(), cpu.size() * sizeof(float)), 0) << "logits differ";
    EXPECT_TRUE(sg.scratch_on_device);
    EXPECT_EQ(sg.scratch_bytes, kGpuStagingBytes);
    EXPECT_GT(sg.bytes_read_back, 0u);
    EXPECT_EQ(sg.expert_misses > 0, slots > 0);
    // The attention rows kept on the device: the decode steps read again rows they copied
    // before, and the window ring's rows rewritten at the same places are copied again (window 8,
    // 27 positions).
    EXPECT_EQ(sg.kv_bytes, 1u << 20);
    EXPECT_EQ(sg.kv_slots, (1u << 20) / 128);
    EXPECT_GT(sg.kv_hits, 0u);
    EXPECT_GT(sg.kv_misses, 0u);
    EXPECT_EQ(sg.kv_staged, 0u) << "a batch read more rows than the slots hold";
    // A window row goes up as its 128 bytes of BF16, a compressed one packed (36 bytes).
    EXPECT_LT(sg.kv_upload_bytes, sg.kv_misses * 128) << "no compressed row went up packed";
    EXPECT_GT(sg.kv_upload_bytes, sg.kv_misses * 36) << "no window row went up";
  }
  // Fewer kept rows than a layer reads (8 of 64 BF16 values): some are staged with their batch,
  // the slots are given to other rows every step; and none kept. The CPU's logits either way.
  for (const uint64_t kv : {1024u, 0u}) {
    SCOPED_TRACE("--gpu-kv " + std::to_string(kv));
    SessionStats ss;
    GpuStats sg;
    const std::vector<float> got = rows_of("vulkan", &ss, &sg, {.scratch = true, .kv = kv});
    ASSERT_EQ(got.size(), cpu.size());
    EXPECT_EQ(std::memcmp(got.data(), cpu.data(), cpu.size() * sizeof(float)), 0) << "logits differ";
    EXPECT_EQ(sg.kv_bytes, kv);
    EXPECT_EQ(sg.kv_slots, kv / 128);
    EXPECT_EQ(sg.kv_staged > 0, kv > 0);
    EXPECT_EQ(sg.kv_hits > 0, kv > 0);
  }
  EXPECT_FALSE(gg.scratch_on_device);
  // Slots the host does not map, as a card's VRAM (forced on lavapipe): this layer's misses and
  // the next layer's guessed experts go in by hint-started copies, submitted without waiting,
  // from the resident experts and from the streaming store (what it holds). One slot (each copy
  // evicts the last; this layer's are never evicted by a guess), 7 streamed, and one per expert:
  // the CPU's logits. lavapipe has Vulkan 1.3 and one queue: the copies signal a timeline
  // semaphore that the submissions touching their slots wait for; 7 slots also as on a Vulkan 1.1
  // device, ordered by a barrier instead.
  for (const uint64_t slots : {1u, 7u, 100000u, 7u + 1000000u}) {
    const bool timeline = slots < 1000000u;
    SCOPED_TRACE("unmapped slots, " + std::to_string(slots % 1000000u) + (timeline ? "" : ", no timeline"));
    SessionStats ss;
    GpuStats sg;
    const std::vector<float> got =
        rows_of("vulkan", &ss, &sg,
                {.slots = slots % 1000000u, .stream = slots % 1000000u == 7, .unmapped = true, .no_timeline = !timeline});
    ASSERT_EQ(got.size(), cpu.size());
    EXPECT_EQ(std::memcmp(got.data(), cpu.data(), cpu.size() * sizeof(float)), 0) << "logits differ";
    EXPECT_TRUE(sg.hint_staging);
    EXPECT_GT(sg.hint_submissions, 0u);
    EXPECT_GT(sg.expert_uploads_hinted, 0u);
    EXPECT_GT(sg.expert_hints_used, 0u) << "no hint-started copy was used";
    EXPECT_LE(sg.expert_hints_used, sg.expert_uploads_hinted);
    EXPECT_LE(sg.expert_hints_used, sg.expert_misses);
    EXPECT_FALSE(sg.transfer_queue) << "lavapipe has one queue family";
    EXPECT_EQ(sg.timeline_semaphores, timeline);
    EXPECT_EQ(sg.hint_waits > 0, timeline) << "no submission waited for a hint's copy";
    server::MetricsInput in;
    in.loaded = true;
    in.session = ss;
    EXPECT_NE(server::render_metrics(in).find("\nsluice_gpu_expert_uploads_hinted_total " +
                                              std::to_string(sg.expert_uploads_hinted) + "\n"),
              std::string::npos);
  }
  // The indexer's scores on the device (--gpu-indexer device): the CPU's logits; auto leaves them
  // to the CPU on a CPU device.
  {
    SessionStats ss;
    GpuStats sg;
    const std::vector<float> got = rows_of("vulkan", &ss, &sg, {.indexer = GpuIndexer::Device});
    ASSERT_EQ(got.size(), cpu.size());
    EXPECT_EQ(std::memcmp(got.data(), cpu.data(), cpu.size() * sizeof(float)), 0) << "indexer on the device: logits differ";
    EXPECT_GT(sg.index_on_device, 0u);
    EXPECT_EQ(gg.index_on_device, 0u) << "auto scored on a CPU device";
    // A prompt long enough that the top-k (8 of the tiny model's compressed rows) leaves rows
    // out, so the scores decide what the attention reads: the CPU's logits still.
    SessionStats cl, gl;
    GpuStats cgl, ggl;
    const std::vector<float> cpu_long = rows_of("cpu", &cl, &cgl, {.chunk = 16, .prompt = 61});
    const std::vector<float> gpu_long =
        rows_of("vulkan", &gl, &ggl, {.chunk = 16, .indexer = GpuIndexer::Device, .prompt = 61});
    ASSERT_EQ(gpu_long.size(), cpu_long.size());
    EXPECT_EQ(std::memcmp(gpu_long.data(), cpu_long.data(), cpu_long.size() * sizeof(float)), 0)
        << "indexer on the device, 61 tokens: logits differ";
    EXPECT_GT(ggl.index_on_device, 0u);
  }
  EXPECT_EQ(gg.bytes_read_back, 0u) << "read-back copies where the host maps the rows";
  // A share of the slot misses on the CPU (--cpu-experts): a third of them in front of the
  // streaming store, auto with a slot per expert; the CPU's logits, the share counted and shown.
  for (const bool automatic : {false, true}) {
    SessionStats ss;
    GpuStats sg;
    const std::vector<float> got = rows_of(
        "vulkan", &ss, &sg,
        {.slots = automatic ? 100000u : 7u, .stream = !automatic, .cpu_share = 1.0 / 3, .cpu_auto = automatic});
    ASSERT_EQ(got.size(), cpu.size());
    EXPECT_EQ(std::memcmp(got.data(), cpu.data(), cpu.size() * sizeof(float)), 0)
        << (automatic ? "auto" : "1/3") << ": logits differ";
    EXPECT_GT(sg.expert_on_cpu, 0u);
    EXPECT_GT(sg.expert_misses, 0u);
    // The per-layer figures (run --expert-stats) add up to the totals, over every routed layer.
    GpuLayerStats sum;
    size_t layers_seen = 0;
    for (const GpuLayerStats& l : sg.expert_layers) {
      sum.hits += l.hits;
      sum.misses += l.misses;
      sum.on_cpu += l.on_cpu;
      sum.upload_bytes += l.upload_bytes;
      layers_seen += l.hits + l.misses + l.on_cpu > 0;
    }
    EXPECT_EQ(sum.hits, sg.expert_hits);
    EXPECT_EQ(sum.misses, sg.expert_misses);
    EXPECT_EQ(sum.on_cpu, sg.expert_on_cpu);
    EXPECT_EQ(sum.upload_bytes, sg.expert_upload_bytes);
    EXPECT_GT(layers_seen, 1u);
    EXPECT_EQ(layers_seen, sg.expert_layers.size()) << "a routed layer has no slot-tier figures";
    server::MetricsInput in;
    in.loaded = true;
    in.session = ss;
    const std::string metrics = server::render_metrics(in);
    EXPECT_NE(metrics.find("\nsluice_gpu_expert_cpu_total " + std::to_string(sg.expert_on_cpu) + "\n"), std::string::npos)
        << metrics;
  }
  // In place (--gpu-experts in-place): the device reads the experts from the loaded model's
  // buffers, from the streaming store's slots, and from a store whose cache of 48 experts holds a
  // prefill chunk's union a window at a time; the CPU's logits, nothing copied, and the plan
  // holds no copy of them.
  for (int mode = 0; mode < 3; ++mode) {
    SCOPED_TRACE(mode == 0 ? "in place, resident" : mode == 1 ? "in place, streamed" : "in place, 48 cached experts");
    SessionStats ss;
    GpuStats sg;
    const std::vector<float> got =
        rows_of("vulkan", &ss, &sg, {.stream = mode > 0, .in_place = true, .cache_experts = mode == 2 ? 48u : 0u,
                                      .linears = mode == 1 ? subgroup : GpuLinears::Auto});
    ASSERT_EQ(got.size(), cpu.size());
    EXPECT_EQ(std::memcmp(got.data(), cpu.data(), cpu.size() * sizeof(float)), 0) << "logits differ";
    EXPECT_GT(sg.expert_in_place, 0u);
    EXPECT_EQ(sg.expert_in_place_refused + sg.expert_calls_on_host, 0u) << "experts ran on the CPU";
    EXPECT_EQ(sg.expert_slots + sg.expert_upload_bytes, 0u);
    EXPECT_GT(sg.expert_chunks_mapped, 0u);
    server::MetricsInput in;
    in.loaded = true;
    in.session = ss;
    const std::string metrics = server::render_metrics(in);
    EXPECT_NE(metrics.find("\nsluice_gpu_expert_in_place_total " + std::to_string(sg.expert_in_place) + "\n"),
              std::string::npos)
        << metrics;
  }
}

// A dispatch that fails in the middle of a multi-chunk prompt: a clear error naming the device,
// the sequence as it was, and the same prompt afterwards equal to an undisturbed CPU run.
// Read-ahead hints leave out the experts the device holds in slots: with a slot for every expert
// in front of a small host cache, each expert is read from the file about once (the hints used to
// fetch, again and again, experts the host cache had dropped but the device still held).
TEST(Vulkan, ExpertsHeldInSlotsAreNotReadAhead) {
  if (!kBuilt) return;
  const test::TempDir dir("sluice_vulkan_hints");
  const std::string model = dir / "tiny.gguf";
  ASSERT_EQ(test::run_sluice(dir, "make-model --preset tiny -o " + test::q(model)).rc, 0);
  SessionOptions so;
  so.model_path = model;
  so.ctx = 96;
  so.threads = 2;
  so.budget = BudgetSpec{false, 2ull << 30};
  so.allow_swap = true;
  so.stream_experts = true;
  so.max_cache_experts = 48;
  so.backend = "vulkan";
  so.gpu_experts = 100000;
  Session s(so);
  GenerateRequest r;
  for (uint32_t i = 0; i < 30; ++i) r.prompt.push_back((i * 53u + 11u) % 400u + 3u);
  r.max_tokens = 40;
  r.ignore_eos = true;
  s.generate(r, {}, {});
  const SessionStats st = s.stats();
  const uint64_t all = (uint64_t)s.config().num_hidden_layers * s.config().n_routed_experts *
                       gpu_stats(s.backend()).expert_slot_bytes;  // >= every expert's bytes once
  const uint64_t read = st.store.total().bytes_demand + st.store.total().bytes_prefetch;
  EXPECT_GT(read, 0u);
  EXPECT_LE(read, 2 * all) << "experts the device holds were read ahead again";
}

// The weights that only ops run on the host read (the token table for embed) get no device copy
// and take none of the device budget; the linears' and hc_mix's (which runs on the device) do.
TEST(Vulkan, WeightsOnlyHostOpsReadStayOffTheDevice) {
  if (!kBuilt) return;
  const test::TempDir dir("sluice_vulkan_uses");
  const std::string path = dir / "tiny.gguf";
  ASSERT_EQ(test::run_sluice(dir, "make-model --preset tiny -o " + test::q(path)).rc, 0);
  GpuOptions go;
  go.no_import = true;  // copies, so the bytes on the device count them
  const std::unique_ptr<Backend> gpu = make_vulkan_backend(go);
  LoadOptions lo;
  lo.backend = gpu.get();
  const std::unique_ptr<Model> m = load_model(path, lo);
  EXPECT_EQ(m->token_embd.device, nullptr) << "the token table was copied to the device";
  EXPECT_NE(m->output.device, nullptr);
  uint64_t linear_bytes = m->output.rows * m->output.row_bytes;
  for (const LayerWeights& w : m->layers) {
    EXPECT_NE(w.hc_attn_fn.device, nullptr);
    EXPECT_NE(w.hc_ffn_fn.device, nullptr);
    EXPECT_NE(w.q_a.device, nullptr);
    EXPECT_NE(w.q_b.device, nullptr);
    linear_bytes += w.q_a.rows * w.q_a.row_bytes + w.q_b.rows * w.q_b.row_bytes;
    linear_bytes += w.hc_attn_fn.rows * w.hc_attn_fn.row_bytes + w.hc_ffn_fn.rows * w.hc_ffn_fn.row_bytes;
  }
  EXPECT_GE(gpu_stats(*gpu).bytes_on_device, linear_bytes);
}

TEST(Vulkan, AFailedDispatchLeavesTheSequenceAsItWas) {
  if (!kBuilt) return;
  const test::TempDir dir("sluice_vulkan_fault");
  const std::string path = dir / "tiny.gguf";
  ASSERT_EQ(test::run_sluice(dir, "make-model --preset tiny -o " + test::q(path)).rc, 0);
  // Without expert slots; and with a slot for every expert, filled through the staging copy, so
  // the failure strikes an expert's upload into a slot, which must leave that slot empty (a
  // slot named before its bytes are all there would be found by the retry).
  // Third: half the slot misses on the CPU, the failure striking a submission the CPU's experts
  // ran beside.
  // Fourth: slots filled through the staging buffer with the copies recorded in the group's
  // gate and up submission, the failure striking one: the slots it would have filled must not be
  // found by the retry (hint-started copies off, or they would take the misses first).
  // Fifth: the hint-started copies' own submission failing before it reaches the queue: the
  // slots it named must not be found by the retry either.
  // Sixth: attention rows kept on the device (--gpu-kv, with the batch's rows there), the
  // failure striking a submission carrying their copies: the slots it would have filled must
  // not be found by the retry.
  for (const int mode : {0, 1, 2, 3, 4, 5}) {
    const bool slots = mode == 1;
    SCOPED_TRACE(mode == 0   ? "no expert slots"
                 : slots     ? "expert slots, staged uploads"
                 : mode == 2 ? "expert slots, --cpu-experts 0.5"
                 : mode == 3 ? "expert slots, uploads folded into a group's submission"
                 : mode == 4 ? "expert slots, hint-started copies"
                             : "kept attention rows");
    // Fail the submission (with slots: the upload) at which this counts down to 1.
    std::atomic<int> armed{0};
    GpuOptions go;
    go.threads = 2;
    go.fault = [&armed, slots, mode](const char* what) {
      if (slots && std::string(what) != "uploading a weight") return false;
      if (mode == 2 && std::string(what) != "a batch of linear dispatches beside the CPU's experts") return false;
      if (mode == 3 && std::string(what) != "expert uploads and a batch of linear dispatches") return false;
      if (mode == 4 && std::string(what) != "copying hinted experts") return false;
      if (mode == 5 && std::string(what) != "attention-row copies and a batch of linear dispatches") return false;
      return armed.load() > 0 && armed.fetch_sub(1) == 1;
    };
    if (slots) {
      go.expert_slots = 1000;
      go.force_staging = true;
      go.staging_bytes = 1000;  // an expert's slices go up in many copies: a failure stops one midway
    }
    if (mode == 2) {
      go.expert_slots = 1000;
      go.cpu_experts = 0.5;
    }
    if (mode >= 3) {
      // Before it reaches the queue, so none of its copies land.
      go.expert_slots = mode == 5 ? 0 : 1000;
      go.scratch_on_device = mode == 5;
      go.force_staging = true;
      go.fault_before_submit = go.fault;
      go.fault = nullptr;
    }
    const std::unique_ptr<Backend> gpu = make_vulkan_backend(go);
    LoadOptions lo;
    lo.backend = gpu.get();
    const std::unique_ptr<Model> m = load_model(path, lo);
    EngineOptions eo;
    eo.ctx = 64;
    eo.chunk = 4;
    eo.backend = gpu.get();
    eo.prefetch = mode != 3;
    Engine eng(*m, eo);
    const uint32_t V = m->config.vocab_size;
    std::vector<uint32_t> p1, p2;
    for (uint32_t i = 0; i < 9; ++i) p1.push_back(i * 13 + 7);
    for (uint32_t i = 0; i < 11; ++i) p2.push_back(i * 29 + 3);  // three chunks
    SequenceState s = eng.new_sequence();
    eng.eval(s, p1, nullptr);
    const uint32_t before = s.position();
    uint64_t p2_submissions = 0;
    if (mode == 0) {  // how many submissions p2 takes (on a copy of the sequence), to fail one in its second chunk
      SequenceState dry = eng.new_sequence();
      eng.eval(dry, p1, nullptr);
      const uint64_t s0 = gpu_stats(*gpu).submissions;
      std::vector<float> l(p2.size() * V);
      eng.eval(dry, p2, l.data());
      p2_submissions = gpu_stats(*gpu).submissions - s0;
      ASSERT_GT(p2_submissions, 6u);
    }
    // Into p2's second chunk; the 40th upload copy; the 6th folded or hinted copy.
    armed = mode == 0 ? (int)(p2_submissions / 2) : mode == 1 ? 40 : 6;
    std::vector<float> got(p2.size() * V);
    std::string err;
    try {
      eng.eval(s, p2, got.data());
    } catch (const Error& e) {
      err = e.what();
    }
    ASSERT_FALSE(err.empty()) << "the failed dispatch was not reported";
    if (slots) {
      EXPECT_NE(err.find("uploading a weight"), std::string::npos) << "meant to fail an expert's upload: " << err;
    }
    EXPECT_NE(err.find("device lost"), std::string::npos) << err;
    EXPECT_NE(err.find("llvmpipe"), std::string::npos) << err;
    EXPECT_EQ(s.position(), before) << "the failed eval moved the sequence";
    if (mode == 2) {
      EXPECT_NE(err.find("beside the CPU's experts"), std::string::npos) << err;
    }
    if (mode == 3) {
      EXPECT_NE(err.find("expert uploads and a batch"), std::string::npos) << err;
    }
    if (mode == 4) {
      EXPECT_NE(err.find("copying hinted experts"), std::string::npos) << err;
    }
    if (mode == 5) {
      EXPECT_NE(err.find("attention-row copies"), std::string::npos) << err;
      EXPECT_GT(gpu_stats(*gpu).kv_slots, 0u);
    }
    armed = 0;
    eng.eval(s, p2, got.data());
    const std::unique_ptr<Model> cm = load_model(path);
    EngineOptions ro;
    ro.ctx = 64;
    ro.chunk = 4;
    Engine ref(*cm, ro);
    SequenceState r = ref.new_sequence();
    ref.eval(r, p1, nullptr);
    std::vector<float> want(p2.size() * V);
    ref.eval(r, p2, want.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "the retry after the failure differs from an undisturbed run";
    if (slots) {
      const GpuStats st = gpu_stats(*gpu);
      EXPECT_GT(st.expert_misses, 0u);
      EXPECT_GT(st.staged_uploads, st.weights_on_device) << "no expert went into a slot through the staging copy";
    }
    if (mode == 4) {
      const GpuStats st = gpu_stats(*gpu);
      EXPECT_TRUE(st.hint_staging);
      EXPECT_GT(st.expert_hints_used, 0u) << "no hint-started copy was used";
    }
  }
}

// `sluice plan --backend vulkan` opens the device as run would and shows its lines: its share of
// the host's budget and its own plan, whose lines and unused bytes add up to its budget; the
// device options without --backend vulkan are a usage error.
TEST(Vulkan, ThePlanCommandShowsTheDevicesOwnLines) {
  const test::TempDir dir("sluice_vulkan_plan");
  const std::string model = dir / "tiny.gguf";
  ASSERT_EQ(test::run_sluice(dir, "make-model --preset tiny -o " + test::q(model)).rc, 0);
  const test::CmdResult bad = test::run_sluice(dir, "plan -m " + test::q(model) + " --gpu-mem 1GiB");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("need --backend vulkan"), std::string::npos) << bad.err;
  const test::CmdResult r = test::run_sluice(dir, "plan -m " + test::q(model) + " --backend vulkan --gpu-experts 10 --json");
  if (!kBuilt) {
    EXPECT_EQ(r.rc, 1);
    EXPECT_NE(r.err.find("built without the Vulkan backend"), std::string::npos) << r.err;
    return;
  }
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("device")) << r.out;
  EXPECT_NE(j["device"]["title"].get<std::string>().find("llvmpipe"), std::string::npos);
  std::map<std::string, uint64_t> dev;
  for (const auto& l : j["device"]["lines"]) dev[l["name"].get<std::string>()] = l["bytes"].get<uint64_t>();
  for (const char* name : {"budget", "scratch", "sequence state", "staging", "dense weights", "expert slots",
                           "mandatory total", "unused"})
    EXPECT_TRUE(dev.count(name)) << "no device line " << name << ": " << r.out;
  EXPECT_GT(dev["budget"], 0u);
  EXPECT_GT(dev["expert slots"], 0u);
  EXPECT_EQ(dev["expert slots"] % 10, 0u) << "10 slots asked";
  EXPECT_EQ(dev["scratch"] + dev["sequence state"] + dev["staging"] + dev["dense weights"] + dev["expert slots"] +
                dev["unused"],
            dev["budget"]);
  bool host_line = false;
  for (const auto& l : j["mandatory"]) host_line |= l["name"] == "GPU weight copies";
  EXPECT_TRUE(host_line) << "the host's plan has no line for the device's share of it";
  EXPECT_EQ(dev["sequence state"], 0u) << "kept attention rows on a device whose memory is the host's (auto: none)";
  // --gpu-kv: the kept attention rows are the device's sequence state, in its mandatory part, and
  // the host's copies of them are in its GPU line; too many for one binding, or a bad value, are refused.
  const test::CmdResult kv =
      test::run_sluice(dir, "plan -m " + test::q(model) + " --backend vulkan --gpu-experts 10 --gpu-kv 3MiB --json");
  ASSERT_EQ(kv.rc, 0) << kv.err;
  const nlohmann::json jk = nlohmann::json::parse(kv.out);
  std::map<std::string, uint64_t> kdev;
  for (const auto& l : jk["device"]["lines"]) kdev[l["name"].get<std::string>()] = l["bytes"].get<uint64_t>();
  EXPECT_EQ(kdev["sequence state"], 3ull << 20);
  EXPECT_EQ(kdev["mandatory total"], dev["mandatory total"] + (3ull << 20));
  uint64_t copies = 0, kv_copies = 0;
  for (const auto& l : j["mandatory"])
    if (l["name"] == "GPU weight copies") copies = l["bytes"].get<uint64_t>();
  for (const auto& l : jk["mandatory"])
    if (l["name"] == "GPU weight copies") kv_copies = l["bytes"].get<uint64_t>();
  // lavapipe's memory is the host's: the slots and the host's copies of their rows.
  EXPECT_EQ(kv_copies, copies + 2 * (3ull << 20)) << "the kept rows are not in the host's plan";
  const test::CmdResult huge = test::run_sluice(dir, "plan -m " + test::q(model) + " --backend vulkan --gpu-kv 1TiB");
  EXPECT_EQ(huge.rc, 1);
  EXPECT_NE(huge.err.find("--gpu-kv 1.00 TiB is more than device"), std::string::npos) << huge.err;
  const test::CmdResult word = test::run_sluice(dir, "plan -m " + test::q(model) + " --backend vulkan --gpu-kv lots");
  EXPECT_EQ(word.rc, 2);
  EXPECT_NE(word.err.find("--gpu-kv"), std::string::npos) << word.err;
  const test::CmdResult cpu = test::run_sluice(dir, "plan -m " + test::q(model) + " --gpu-kv off");
  EXPECT_EQ(cpu.rc, 2);
  EXPECT_NE(cpu.err.find("need --backend vulkan"), std::string::npos) << cpu.err;
}

TEST(Vulkan, CommandLine) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "runs the binary on the device some twenty times (95 s under the sanitizer, the longest "
                  "test there); the in-process Vulkan tests run the same backend code under it";
#endif
  const test::TempDir dir("sluice_vulkan_cli");
  const test::CmdResult d = test::run_sluice(dir, "devices");
  if (!kBuilt) {
    EXPECT_EQ(d.rc, 1);
    EXPECT_NE(d.err.find("built without the Vulkan backend"), std::string::npos) << d.err;
    return;
  }
  EXPECT_EQ(d.rc, 0) << d.err;
  EXPECT_NE(d.out.find("0: "), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("memory heaps"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find(", transfer queue no\n"), std::string::npos) << "lavapipe has one queue family: " << d.out;
  EXPECT_NE(d.out.find("integer dot product yes, not accelerated (--gpu-int-dot on uses it)"), std::string::npos)
      << "lavapipe has the integer dot product, emulated: " << d.out;
  const std::string model = dir / "tiny.gguf";
  ASSERT_EQ(test::run_sluice(dir, "make-model --preset tiny -o " + test::q(model)).rc, 0);
  const test::CmdResult r =
      test::run_sluice(dir, "run -m " + test::q(model) + " --tokens 5,6,7 -n 4 --resident-experts --backend vulkan");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("vulkan: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("on the device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" submissions (host-device round trips)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("(0 inputs quantized on the device)"), std::string::npos) << "lavapipe has shaderFloat64: " << r.err;
  EXPECT_NE(r.err.find(" inputs quantized on the device; quantized linears "), std::string::npos) << r.err;
  const test::CmdResult c = test::run_sluice(dir, "run -m " + test::q(model) + " --tokens 5,6,7 -n 4 --resident-experts");
  EXPECT_EQ(c.out, r.out) << "the Vulkan run generated other tokens";
  // --gpu-experts auto (the default) on lavapipe, a CPU device: the routed experts on the CPU, and
  // the summary says why; an explicit 0 says nothing of auto; auto is accepted without the device.
  EXPECT_NE(r.err.find("routed experts on the CPU (--gpu-experts auto: a CPU device"), std::string::npos) << r.err;
  const test::CmdResult zero = test::run_sluice(
      dir, "run -m " + test::q(model) + " --tokens 5,6,7 -n 4 --resident-experts --backend vulkan --gpu-experts 0");
  EXPECT_EQ(zero.rc, 0) << zero.err;
  EXPECT_EQ(zero.out, c.out);
  EXPECT_NE(zero.err.find("routed experts on the CPU"), std::string::npos) << zero.err;
  EXPECT_EQ(zero.err.find("--gpu-experts auto"), std::string::npos) << zero.err;
  EXPECT_EQ(test::run_sluice(dir, "run -m " + test::q(model) + " --tokens 5 -n 1 --gpu-experts auto").rc, 0);

  // --gpu-mem caps the copies: with room for none, every linear runs on the CPU, same tokens.
  const test::CmdResult capped = test::run_sluice(
      dir, "run -m " + test::q(model) + " --tokens 5,6,7 -n 4 --resident-experts --backend vulkan --gpu-mem 1 --print-plan");
  EXPECT_EQ(capped.rc, 0) << capped.err;
  EXPECT_EQ(capped.out, c.out);
  EXPECT_NE(capped.err.find("vulkan: 0 weights on the device"), std::string::npos) << capped.err;
  EXPECT_NE(capped.err.find("GPU weight copies"), std::string::npos) << capped.err;
  EXPECT_EQ(test::run_sluice(dir, "run -m " + test::q(model) + " --tokens 5 -n 1 --gpu-mem 1GiB").rc, 2)
      << "--gpu-mem without --backend vulkan was accepted";
  // More than the device has (lavapipe lists a 2 GiB heap) is refused before anything is loaded,
  // naming the option and what the device has.
  const test::CmdResult over = test::run_sluice(
      dir, "run -m " + test::q(model) + " --tokens 5 -n 1 --resident-experts --backend vulkan --gpu-mem 64TiB");
  EXPECT_NE(over.rc, 0);
  EXPECT_NE(over.err.find("--gpu-mem 64.00 TiB is more than device"), std::string::npos) << over.err;
  EXPECT_NE(over.err.find("device-local heap"), std::string::npos) << over.err;
  EXPECT_EQ(over.out, "");
  // Streamed experts in 4 device slots: the same tokens, and the summary shows the slot tier.
  const test::CmdResult slots = test::run_sluice(
      dir, "run -m " + test::q(model) + " --tokens 5,6,7 -n 4 --backend vulkan --gpu-experts 4 --print-plan");
  EXPECT_EQ(slots.rc, 0) << slots.err;
  EXPECT_EQ(slots.out, c.out);
  EXPECT_NE(slots.err.find("routed experts on the device: 4 slots"), std::string::npos) << slots.err;
  EXPECT_NE(slots.err.find("4 routed-expert slots x"), std::string::npos) << "the plan does not count the slots: " << slots.err;
  EXPECT_NE(slots.err.find("16.00 MiB expert-group rows"), std::string::npos)
      << "the plan does not count the host rows of a group of experts: " << slots.err;
  EXPECT_EQ(test::run_sluice(dir, "run -m " + test::q(model) + " --tokens 5 -n 1 --gpu-experts 4").rc, 2)
      << "--gpu-experts without --backend vulkan was accepted";
  EXPECT_EQ(test::run_sluice(dir, "run -m " + test::q(model) + " --tokens 5 -n 1 --gpu-linears subgroup").rc, 2)
      << "--gpu-linears without --backend vulkan was accepted";
  EXPECT_EQ(test::run_sluice(dir, "run -m " + test::q(model) + " --tokens 5 -n 1 --backend vulkan --gpu-linears fast").rc, 2);
  EXPECT_EQ(test::run_sluice(dir, "run -m " + test::q(model) + " --tokens 5 -n 1 --gpu-gemm off").rc, 2)
      << "--gpu-gemm without --backend vulkan was accepted";
  EXPECT_EQ(test::run_sluice(dir, "run -m " + test::q(model) + " --tokens 5 -n 1 --backend vulkan --gpu-gemm maybe").rc, 2);
  // A prompt of 17 tokens in one chunk runs the GEMM build, and says so; off, the same tokens.
  const std::string prompt17 = " --tokens 5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21 -n 2 -c 32 --chunk 32 --backend vulkan";
  const test::CmdResult mm = test::run_sluice(dir, "run -m " + test::q(model) + prompt17);
  const test::CmdResult no_mm = test::run_sluice(dir, "run -m " + test::q(model) + prompt17 + " --gpu-gemm off");
  EXPECT_EQ(mm.rc, 0) << mm.err;
  EXPECT_EQ(no_mm.rc, 0) << no_mm.err;
  EXPECT_EQ(mm.out, no_mm.out);
  EXPECT_NE(mm.err.find(", prefill GEMM tiles of 16 tokens)"), std::string::npos) << mm.err;
  EXPECT_NE(no_mm.err.find(", no GEMM)"), std::string::npos) << no_mm.err;
  // The integer dot product: on (where the device has it) the same tokens, and the summary says
  // so; auto leaves a device whose driver does not accelerate it without; the option needs
  // --backend vulkan and one of its three words.
  if (vulkan_devices()[0].int_dot) {
    const test::CmdResult dot = test::run_sluice(dir, "run -m " + test::q(model) + prompt17 + " --gpu-int-dot on");
    EXPECT_EQ(dot.rc, 0) << dot.err;
    EXPECT_EQ(dot.out, mm.out);
    EXPECT_NE(dot.err.find(", the device's integer dot product, prefill GEMM"), std::string::npos) << dot.err;
  }
  EXPECT_EQ(mm.err.find("integer dot product") == std::string::npos, !auto_int_dot(vulkan_devices()[0])) << mm.err;
  EXPECT_EQ(test::run_sluice(dir, "run -m " + test::q(model) + " --tokens 5 -n 1 --gpu-int-dot on").rc, 2)
      << "--gpu-int-dot without --backend vulkan was accepted";
  EXPECT_EQ(test::run_sluice(dir, "run -m " + test::q(model) + " --tokens 5 -n 1 --backend vulkan --gpu-int-dot fast").rc, 2);
  // Half of the slot misses on the CPU: the same tokens, the share in the summary; the option
  // needs slots and a share from 0 to 1.
  const test::CmdResult half = test::run_sluice(
      dir, "run -m " + test::q(model) + " --tokens 5,6,7 -n 4 --backend vulkan --gpu-experts 4 --cpu-experts 0.5");
  EXPECT_EQ(half.rc, 0) << half.err;
  EXPECT_EQ(half.out, c.out);
  EXPECT_NE(half.err.find("misses computed on the CPU from host memory (--cpu-experts"), std::string::npos) << half.err;
  // --expert-stats: the slot tier per layer above the host store's table.
  const test::CmdResult table = test::run_sluice(
      dir, "run -m " + test::q(model) +
               " --tokens 5,6,7 -n 4 --backend vulkan --gpu-experts 4 --cpu-experts 0.5 --expert-stats");
  EXPECT_EQ(table.rc, 0) << table.err;
  EXPECT_NE(table.err.find("device slots: 4 of "), std::string::npos) << table.err;
  EXPECT_NE(table.err.find("  layer slot hits   uploads    on CPU   MiB up  upload ms\n      0 "), std::string::npos)
      << table.err;
  EXPECT_LT(table.err.find("device slots: 4 of "), table.err.find("layer  requests")) << table.err;
  // In place: the runs per layer from the host store's memory.
  const test::CmdResult stats_in_place = test::run_sluice(
      dir, "run -m " + test::q(model) + " --tokens 5,6,7 -n 4 --backend vulkan --gpu-experts in-place --expert-stats");
  EXPECT_EQ(stats_in_place.rc, 0) << stats_in_place.err;
  EXPECT_EQ(stats_in_place.out, c.out);
  EXPECT_NE(stats_in_place.err.find("device in place: 1 chunks of the host store's memory"), std::string::npos) << stats_in_place.err;
  EXPECT_NE(stats_in_place.err.find("  layer  in place    on CPU\n      0 "), std::string::npos) << stats_in_place.err;
  EXPECT_LT(stats_in_place.err.find("device in place: "), stats_in_place.err.find("layer  requests")) << stats_in_place.err;
  for (const char* bad_share : {"--gpu-experts 4 --cpu-experts 1.5", "--gpu-experts 4 --cpu-experts half",
                                "--cpu-experts 0.5", "--gpu-experts in-place --cpu-experts 0.5"}) {
    const test::CmdResult r = test::run_sluice(
        dir, "run -m " + test::q(model) + " --tokens 5 -n 1 --backend vulkan " + bad_share);
    EXPECT_EQ(r.rc, 2) << bad_share;
    EXPECT_NE(r.err.find("--cpu-experts"), std::string::npos) << r.err;
  }
  // With the DSpark drafter: its linears run on the device too (its weights are prepared for the
  // device like the model's), and the run gives the CPU's tokens.
  const std::string with_drafter = dir / "tiny-d.gguf", support = dir / "tiny-d.dspark.gguf";
  ASSERT_EQ(test::run_sluice(dir, "make-model --preset tiny -o " + test::q(with_drafter) + " --dspark-out " +
                                      test::q(support))
                .rc,
            0);
  const std::string drafted = "run -m " + test::q(with_drafter) + " --dspark " + test::q(support) + " --tokens 5,6,7 -n 6";
  const test::CmdResult dc = test::run_sluice(dir, drafted), dg = test::run_sluice(dir, drafted + " --backend vulkan");
  EXPECT_EQ(dg.rc, 0) << dg.err;
  EXPECT_EQ(dg.out, dc.out);
  EXPECT_NE(dg.err.find("on the device, 0 on the CPU"), std::string::npos) << "the drafter's linears ran on the CPU: " << dg.err;
  // In place: the same tokens, no copies, the summary and the plan say so.
  const test::CmdResult in_place = test::run_sluice(
      dir, "run -m " + test::q(model) + " --tokens 5,6,7 -n 4 --backend vulkan --gpu-experts in-place --print-plan");
  EXPECT_EQ(in_place.rc, 0) << in_place.err;
  EXPECT_EQ(in_place.out, c.out);
  EXPECT_NE(in_place.err.find("routed experts on the device in place: "), std::string::npos) << in_place.err;
  EXPECT_NE(in_place.err.find("weights and routed experts used in place (imported pages, no copies)"), std::string::npos)
      << in_place.err;
  for (const char* bad_count : {"--gpu-experts lots", "--gpu-experts -1", "--gpu-experts 4x"}) {
    const test::CmdResult r =
        test::run_sluice(dir, "run -m " + test::q(model) + " --tokens 5 -n 1 --backend vulkan " + bad_count);
    EXPECT_EQ(r.rc, 2) << bad_count;
    EXPECT_NE(r.err.find("--gpu-experts must be a slot count, in-place or auto"), std::string::npos) << r.err;
  }
  // bench --backend vulkan: the copy rate into device memory beside a memcpy, and the device's share.
  const test::CmdResult bench = test::run_sluice(
      dir, "bench -m " + test::q(model) + " -p 4 -n 2 -r 1 --backend vulkan --gpu-experts 8 --gpu-kv 64KiB");
  EXPECT_EQ(bench.rc, 0) << bench.err;
  EXPECT_NE(bench.out.find("GPU kept rows 512 attention-row slots (64.00 KiB, --gpu-kv): "), std::string::npos) << bench.out;
  EXPECT_NE(bench.out.find("GPU copy      host -> device "), std::string::npos) << bench.out;
  EXPECT_NE(bench.out.find("host memcpy "), std::string::npos) << bench.out;
  EXPECT_NE(bench.out.find("routed experts in 8 device slots, hit rate "), std::string::npos) << bench.out;
  EXPECT_NE(bench.out.find(" copied in ("), std::string::npos) << bench.out;
  EXPECT_NE(bench.out.find(" on the device (quantized ones "), std::string::npos) << bench.out;
  // bench --ops --backend vulkan: the device's linear at the model's shapes, each figure naming
  // the build that ran it (the GEMM from 16 tokens on).
  const test::CmdResult ops = test::run_sluice(
      dir, "bench --ops -m " + test::q(model) + " -n 1,17 -r 1 --op-seconds 0 --read-mib 64 --json --backend vulkan");
  EXPECT_EQ(ops.rc, 0) << ops.err;
  size_t figures = 0, gemm = 0;
  std::istringstream lines(ops.out);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    ++figures;
    EXPECT_EQ(j["backend"], "vulkan") << line;
    const bool quantized = j["type"] != "F16" && j["type"] != "BF16" && j["type"] != "F32";
    const bool want_gemm = j["n"] == 17;
    gemm += want_gemm;
    EXPECT_EQ(j["gpu_build"], want_gemm ? "gemm" : auto_subgroup_linears(vulkan_devices()[0]) && quantized ? "subgroup" : "plain")
        << line;
  }
  EXPECT_GT(figures, 4u) << ops.out;
  EXPECT_GT(gemm, 0u) << ops.out;
  // A device budget that holds the largest shape (the tiny model's output, 139 KiB in Q8_0) but
  // not every shape's copies: each shape has the budget to itself, so every figure is the
  // device's, none "on the CPU".
  const test::CmdResult tight = test::run_sluice(dir, "bench --ops -m " + test::q(model) +
                                                          " -n 1 -r 1 --op-seconds 0 --read-mib 64 --json --backend "
                                                          "vulkan --type Q8_0,Q2_K --gpu-mem 200000");
  EXPECT_EQ(tight.rc, 0) << tight.err;
  size_t tight_figures = 0;
  std::istringstream tight_lines(tight.out);
  for (std::string line; std::getline(tight_lines, line); ++tight_figures)
    EXPECT_NE(nlohmann::json::parse(line)["gpu_build"], "on the CPU") << line;
  EXPECT_GT(tight_figures, 8u) << tight.out;
  EXPECT_EQ(test::run_sluice(dir, "bench --ops -n 1 --read-mib 64 --backend vulkan --gpu-experts 4").rc, 2);
  const test::CmdResult ignored = test::run_sluice(dir, "bench --ops -n 1 --read-mib 64 --gpu-gemm off");
  EXPECT_EQ(ignored.rc, 2) << "--gpu-gemm without --backend vulkan was ignored by bench --ops";
  EXPECT_NE(ignored.err.find("need --backend vulkan"), std::string::npos) << ignored.err;
  const test::CmdResult none = test::run_sluice(
      dir, "run -m " + test::q(model) + " --tokens 5,6,7 -n 2 --backend vulkan --gpu-experts 4 --gpu-mem 1");
  EXPECT_EQ(none.rc, 0) << none.err;
  EXPECT_NE(none.err.find("the device budget left no room for a slot"), std::string::npos) << none.err;
  EXPECT_EQ(test::run_sluice(dir, "run -m " + test::q(model) + " --tokens 5 -n 1 --backend vulkan --gpu-mem lots").rc, 2);
  const test::CmdResult bad =
      test::run_sluice(dir, "run -m " + test::q(model) + " --tokens 5,6,7 -n 4 --backend vulkan --device 9");
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("no device 9"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.err_lines(), 1u) << bad.err;
}

}  // namespace
}  // namespace sluice
