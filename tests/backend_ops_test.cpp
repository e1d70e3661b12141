// Every Backend op against a plain reference, on random inputs of odd sizes, for every backend
// in backends() (in the spirit of llama.cpp's test-backend-ops). The references below are
// written straight from docs/numerics.md with the scalar primitives (kernels/numerics.h) and
// each type's scalar dot (which defines the bits): no threads, no strides, no batching. Inputs
// are passed through strided views so an op that ignores a stride is caught.
//
// Each backend states its tolerance per op (docs/numerics.md "Backends"): the CPU backend is
// held to the scalar-defined bits, exactly, with 1 and with 3 threads. A second backend adds one
// line to backends() with its own tolerances; selection ops (index_select) then compare the
// chosen rows, which must agree except where scores tie within the tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu_backend.h"
#include "backend/vulkan_backend.h"
#include "format/tensor_type.h"
#include "kernels/fp.h"
#include "kernels/numerics.h"
#include "kernels/types.h"
#include "test_weights.h"

namespace sluice {
namespace {

// Largest allowed |got - want| <= abs + rel * |want|; both 0: bit for bit.
struct Tolerance {
  double abs = 0, rel = 0;
  bool exact() const { return abs == 0 && rel == 0; }
};

struct BackendCase {
  std::string name;
  std::function<std::unique_ptr<Backend>()> make;
  std::function<Tolerance(const std::string& op)> tolerance;
  // A backend with a device: whether the op must run there (its stats show it); null: no device.
  std::function<bool(const std::string& op)> on_device = nullptr;
};

std::vector<BackendCase> backends() {
  auto exact = [](const std::string&) { return Tolerance{}; };
  std::vector<BackendCase> out = {
      {"cpu1", [] { return std::make_unique<CpuBackend>(1); }, exact},
      {"cpu3", [] { return std::make_unique<CpuBackend>(3); }, exact},
  };
  // The Vulkan backend on the machine's first device (lavapipe in CI; vulkan_backend_test fails
  // when a build with Vulkan finds none), held to the CPU's bits (docs/numerics.md 1b). Every op
  // but two runs on the device here: embed decodes the table's rows on the host, and store_fp4
  // packs rows on the host once the batch has run (so does store_bf16, beside add_round and
  // fill_rows in bf16_add_fill). The ops that run on the device only on rows the batch holds
  // take their inputs from produced().
  const auto device_but_host_ops = [](const std::string& op) { return op != "embed" && op != "store_fp4"; };
  if (vulkan_built())
    out.push_back({"vulkan",
                   [] {
                     GpuOptions o;
                     o.threads = 2;
                     o.indexer = GpuIndexer::Device;  // index_select's scores there too
                     return make_vulkan_backend(o);
                   },
                   exact, device_but_host_ops});
  // The same with routed-expert slots on the device, fewer than the op tests' experts: the routed
  // FFN runs there and evicts (vulkan_backend_test counts the hits and the reads); and the
  // quantized linears a subgroup per output where the device can (auto leaves lavapipe, a CPU
  // device, with an invocation per output), with the device's integer dot product where it has
  // one (auto leaves lavapipe's, not accelerated, unused).
  if (vulkan_built())
    out.push_back({"vulkan_slots",
                   [] {
                     GpuOptions o;
                     o.threads = 2;
                     o.expert_slots = 3;
                     if (vulkan_devices()[0].subgroup_linears) o.linears = GpuLinears::Subgroup;
                     if (vulkan_devices()[0].int_dot) o.int_dot = GpuIntDot::On;
                     return make_vulkan_backend(o);
                   },
                   exact,
                   [=](const std::string& op) {  // the indexer as auto chooses: calls this small on the CPU
                     return device_but_host_ops(op) && op != "index_select";
                   }});
  return out;
}

using Rng = std::mt19937_64;

float uniform(Rng& r, float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(r); }
std::vector<float> randoms(Rng& r, size_t n, float lo = -1.0f, float hi = 1.0f, bool bf16 = false) {
  std::vector<float> v(n);
  for (float& x : v) x = bf16 ? round_bf16(uniform(r, lo, hi)) : uniform(r, lo, hi);
  return v;
}

// A strided backend tensor holding `rows` x `width` values: one column of padding on each side,
// filled with NaN so reading it shows.
struct Strided {
  Tensor t;
  size_t width = 0;
  Mat m() const { return t.m().cols(1, width); }
  CMat c() const { return m(); }
};
Strided upload(const Backend& be, const std::vector<float>& v, size_t rows, size_t width) {
  Strided s{be.tensor(rows, width + 2), width};
  const Mat all = s.t.m();
  for (size_t i = 0; i < rows; ++i) {
    std::fill(all.row(i), all.row(i) + width + 2, std::numeric_limits<float>::quiet_NaN());
    std::copy(v.begin() + (long)(i * width), v.begin() + (long)((i + 1) * width), all.row(i) + 1);
  }
  return s;
}
// Values as an earlier op's output: uploaded, then copied by an exact F32 identity linear into a
// fresh strided tensor. A backend that keeps results where it computed them (the Vulkan batch)
// runs the op under test there too, on rows it holds; uploaded rows it would leave to the CPU.
struct Produced {
  Strided in, out;
  test::HostWeight identity;  // read by the linear until it has run
  Mat m() const { return out.m(); }
  CMat c() const { return out.c(); }
};
Produced produced(const Backend& be, const std::vector<float>& v, size_t rows, size_t width) {
  Produced p{upload(be, v, rows, width), upload(be, std::vector<float>(rows * width), rows, width), {}};
  p.identity = test::random_host_weight(GgmlType::F32, width, width, 1);
  float* w = reinterpret_cast<float*>(p.identity.bytes.data());
  std::fill(w, w + width * width, 0.0f);
  for (size_t k = 0; k < width; ++k) w[k * width + k] = 1.0f;
  be.prepare_weight(p.identity.w);
  be.linear(p.identity.w, p.in.c(), p.out.m(), false);
  return p;
}

std::vector<float> download(const Backend& be, CMat m) {
  be.sync();
  std::vector<float> v(m.n * m.width);
  for (size_t i = 0; i < m.n; ++i) std::copy(m.row(i), m.row(i) + m.width, v.begin() + (long)(i * m.width));
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, Tolerance tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = tol.exact() ? std::memcmp(&got[i], &want[i], sizeof(float)) == 0
                                : std::fabs((double)got[i] - want[i]) <= tol.abs + tol.rel * std::fabs((double)want[i]);
    if (!ok && bad++ < 3) ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", want " << want[i];
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ";
}

// A random weight of `type`, owned by the test, prepared for be.
using test::HostWeight;
HostWeight random_weight(const Backend& be, GgmlType type, uint64_t rows, uint64_t cols, uint64_t seed, float scale = 0.5f) {
  HostWeight h = test::random_host_weight(type, rows, cols, seed, scale);
  be.prepare_weight(h.w);
  return h;
}

// The reference linear layer: quantize the row, the type's scalar dot, optional BF16 rounding.
float ref_dot(const Weight& w, uint64_t r, const float* x) {
  std::vector<uint8_t> act(activation_bytes(w.act(), (int64_t)w.cols));
  quantize_activation(w.act(), x, act.data(), (int64_t)w.cols);
  return w.traits->dot_scalar(w.row(r), act.data(), (int64_t)w.cols);
}
std::vector<float> ref_linear(const Weight& w, const std::vector<float>& x, size_t n, bool round, uint64_t row0,
                              uint64_t nrows) {
  std::vector<float> y(n * nrows);
  for (size_t t = 0; t < n; ++t)
    for (uint64_t r = 0; r < nrows; ++r) {
      const float v = ref_dot(w, row0 + r, x.data() + t * w.cols);
      y[t * nrows + r] = round ? round_bf16(v) : v;
    }
  return y;
}

float ref_swiglu(float g, float u, float lim, float wk) {
  g = std::min(g, lim);
  u = std::clamp(u, -lim, lim);
  return round_bf16((silu(g) * u) * wk);
}

// Types with kernels and a random-block generator.
std::vector<GgmlType> weight_types() {
  std::vector<GgmlType> out;
  for (uint32_t id = 0; id < 64; ++id) {
    const TypeTraits* t = find_type(id);
    if (t && t->has_kernels && t->random) out.push_back(t->type);
  }
  return out;
}

const size_t kTokens[] = {1, 3, 7};

// ---------------------------------------------------------------------------------------------
// One function per op: build inputs, run the op, compare with the reference.

void op_linear(const Backend& be, Rng& rng, Tolerance tol) {
  for (const GgmlType type : weight_types()) {
    const TypeTraits& tt = type_traits(type);
    const uint64_t cols = (uint64_t)tt.block_elems * (tt.block_elems >= 256 ? 1 : 3);
    for (const size_t n : kTokens) {
      const uint64_t rows = 13;
      const HostWeight hw = random_weight(be, type, rows, cols, rng());
      const std::vector<float> x = randoms(rng, n * cols);
      const Strided xs = upload(be, x, n, cols);
      for (const bool round : {false, true}) {
        const uint64_t row0 = 2, nrows = 9;  // a row range, as the grouped output uses
        const Strided y = upload(be, std::vector<float>(n * nrows), n, nrows);
        be.linear(hw.w, xs.c(), y.m(), round, row0);
        expect_close(download(be, y.c()), ref_linear(hw.w, x, n, round, row0, nrows), tol,
                     std::string(tt.name) + " n=" + std::to_string(n) + " round=" + std::to_string(round));
      }
    }
  }
}

// Independent linears in one call (Backend::linears), each as linear() computes it: two weights
// reading one input (a GPU stages it once), a row range into a few columns of a wider output, an
// unrounded one on another input; every weight type against Q8_0.
void op_linears(const Backend& be, Rng& rng, Tolerance tol) {
  const uint64_t cols = 256;
  for (const GgmlType type : weight_types()) {
    const size_t n = 1 + rng() % 5;
    const HostWeight a = random_weight(be, type, 13, cols, rng()), b = random_weight(be, GgmlType::Q8_0, 11, cols, rng());
    const std::vector<float> x = randoms(rng, n * cols), x2 = randoms(rng, n * cols);
    const Strided xs = upload(be, x, n, cols), xs2 = upload(be, x2, n, cols);
    const Strided ya = upload(be, std::vector<float>(n * 13), n, 13), yb = upload(be, std::vector<float>(n * 11), n, 11),
                  wide = upload(be, std::vector<float>(n * 20), n, 20), y2 = upload(be, std::vector<float>(n * 13), n, 13);
    const LinearCall calls[] = {{&a.w, xs.c(), ya.m(), true, 0},
                                {&b.w, xs.c(), yb.m(), true, 0},
                                {&a.w, xs.c(), wide.m().cols(5, 9), true, 2},
                                {&a.w, xs2.c(), y2.m(), false, 0}};
    be.linears(calls);
    const std::string what = std::string(type_traits(type).name) + " n=" + std::to_string(n);
    expect_close(download(be, ya.c()), ref_linear(a.w, x, n, true, 0, 13), tol, what + ": the first");
    expect_close(download(be, yb.c()), ref_linear(b.w, x, n, true, 0, 11), tol, what + ": Q8_0 on the same input");
    std::vector<float> want_wide(n * 20, 0.0f);
    const std::vector<float> range = ref_linear(a.w, x, n, true, 2, 9);
    for (size_t t = 0; t < n; ++t) std::copy_n(range.begin() + (long)(t * 9), 9, want_wide.begin() + (long)(t * 20 + 5));
    expect_close(download(be, wide.c()), want_wide, tol, what + ": rows 2..10 into columns 5..13");
    expect_close(download(be, y2.c()), ref_linear(a.w, x2, n, false, 0, 13), tol, what + ": unrounded, another input");
  }
}

void op_embed(const Backend& be, Rng& rng, Tolerance tol) {
  const uint64_t V = 11, H = 96;
  for (const GgmlType type : {GgmlType::F32, GgmlType::BF16, GgmlType::Q8_0}) {
    const HostWeight hw = random_weight(be, type, V, H, rng());
    const std::vector<uint32_t> toks = {3, 0, 10, 3, 7};
    const uint32_t copies = 3;
    const Strided X = upload(be, std::vector<float>(toks.size() * copies * H), toks.size(), copies * H);
    be.embed(hw.w, toks, copies, X.m());
    std::vector<float> want(toks.size() * copies * H), e(H);
    for (size_t i = 0; i < toks.size(); ++i) {
      hw.w.traits->dequant(hw.w.row(toks[i]), e.data(), (int64_t)H);
      for (uint32_t h = 0; h < copies; ++h)
        for (uint64_t k = 0; k < H; ++k) want[(i * copies + h) * H + k] = round_bf16(e[k]);
    }
    expect_close(download(be, X.c()), want, tol, "embed " + std::string(hw.w.traits->name));
  }
}

void op_rms_norm(const Backend& be, Rng& rng, Tolerance tol) {
  for (const size_t n : kTokens) {
    const size_t w = 37;
    const std::vector<float> x = randoms(rng, n * w, -3, 3), g = randoms(rng, w, 0.5f, 1.5f);
    const Produced xs = produced(be, x, n, w);
    be.rms_norm(xs.m(), g.data(), 1e-6f);
    std::vector<float> want(n * w);
    for (size_t i = 0; i < n; ++i) {
      float ss = 0.0f;
      for (size_t k = 0; k < w; ++k) ss += x[i * w + k] * x[i * w + k];
      const float r = 1.0f / std::sqrt(ss / (float)w + 1e-6f);
      for (size_t k = 0; k < w; ++k) want[i * w + k] = round_bf16((x[i * w + k] * r) * g[k]);
    }
    expect_close(download(be, xs.c()), want, tol, "rms_norm n=" + std::to_string(n));
  }
}

void op_rope(const Backend& be, Rng& rng, Tolerance tol) {
  const uint32_t hd = 24, heads = 3;
  const std::vector<double> freqs = {1.0, 0.31, 0.047, 0.0009};  // rope on the last 8 dims
  for (const bool inverse : {false, true})
    for (const size_t n : kTokens) {
      const std::vector<float> x = randoms(rng, n * hd * heads, -2, 2, true);
      std::vector<uint64_t> pos(n);
      for (size_t i = 0; i < n; ++i) pos[i] = 5 + 1000 * i;
      const Produced xs = produced(be, x, n, (size_t)hd * heads);
      be.rope(xs.m(), hd, RopeTable{freqs.data(), freqs.size()}, pos, inverse);
      std::vector<float> want = x;
      for (size_t i = 0; i < n; ++i)
        for (uint32_t h = 0; h < heads; ++h) {
          float* v = want.data() + (i * heads + h) * hd + (hd - 2 * freqs.size());
          for (size_t p = 0; p < freqs.size(); ++p) {
            const double ang = (double)pos[i] * freqs[p];
            const float c = (float)std::cos(ang), s = inverse ? -(float)std::sin(ang) : (float)std::sin(ang);
            const float re = v[2 * p], im = v[2 * p + 1];
            v[2 * p] = round_bf16(re * c - im * s);
            v[2 * p + 1] = round_bf16(re * s + im * c);
          }
        }
      expect_close(download(be, xs.c()), want, tol, "rope inverse=" + std::to_string(inverse));
    }
}

void op_fake_quant(const Backend& be, Rng& rng, Tolerance tol) {
  for (const FakeQuant kind : {FakeQuant::Fp8Window, FakeQuant::Nvfp4, FakeQuant::Mxfp4})
    for (const size_t n : kTokens) {
      const size_t w = 96;
      const std::vector<float> x = randoms(rng, n * w, -40, 40, true);
      const Produced xs = produced(be, x, n, w);
      be.fake_quant(xs.m(), kind);
      std::vector<float> want = x;
      for (size_t i = 0; i < n; ++i) {
        float* v = want.data() + i * w;
        if (kind == FakeQuant::Fp8Window) fake_quant_fp8_window(v, w);
        if (kind == FakeQuant::Nvfp4) fake_quant_nvfp4(v, w);
        if (kind == FakeQuant::Mxfp4) fake_quant_mxfp4(v, w);
      }
      expect_close(download(be, xs.c()), want, tol, "fake_quant " + std::to_string((int)kind));
    }
}

// store_fp4: the rows fake-quantized to the grid and packed; unpacked, the reference's BF16 bits.
void op_store_fp4(const Backend& be, Rng& rng, Tolerance) {
  for (const Fp4Grid grid : {Fp4Grid::Nvfp4, Fp4Grid::Mxfp4})
    for (const size_t n : kTokens) {
      const size_t w = 96, rb = fp4_row_bytes(grid, w);
      const std::vector<float> x = randoms(rng, n * w, -40, 40, true);
      const Produced xs = produced(be, x, n, w);
      std::vector<uint8_t> packed(n * rb + 1, 0xa5);
      be.store_fp4(xs.c(), grid, packed.data());
      be.sync();
      EXPECT_EQ(packed.back(), 0xa5) << "store_fp4 wrote past its rows";
      for (size_t i = 0; i < n; ++i) {
        std::vector<float> want(x.begin() + (long)(i * w), x.begin() + (long)((i + 1) * w));
        grid == Fp4Grid::Nvfp4 ? fake_quant_nvfp4(want.data(), w) : fake_quant_mxfp4(want.data(), w);
        std::vector<uint16_t> got(w);
        fp4_unpack_row(grid, packed.data() + i * rb, w, got.data());
        for (size_t k = 0; k < w; ++k)  // exact on every backend: a cache row is state
          ASSERT_EQ(got[k], f32_to_bf16(want[k])) << "store_fp4 grid " << (int)grid << " row " << i << " element " << k;
      }
    }
}

void op_small(const Backend& be, Rng& rng, Tolerance tol) {  // store_bf16, add_round, fill_rows
  const size_t n = 5, w = 19;
  const std::vector<float> a = randoms(rng, n * w, -2, 2, true), b = randoms(rng, n * w, -2, 2);
  const Produced as = produced(be, a, n, w), bs = produced(be, b, n, w);
  const Strided out = upload(be, std::vector<float>(n * w), n, w);
  std::vector<uint16_t> bits(n * (w + 3), 0xffff);
  be.store_bf16(as.c(), bits.data(), w + 3);
  be.add_round(as.c(), bs.c(), out.m());
  be.sync();  // dst is written once the ops before have run (Backend::store_bf16)
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < w; ++k) EXPECT_EQ(bits[i * (w + 3) + k], f32_to_bf16(a[i * w + k]));
    EXPECT_EQ(bits[i * (w + 3) + w], 0xffff) << "store_bf16 wrote past the row";
  }
  std::vector<float> want(n * w);
  for (size_t k = 0; k < n * w; ++k) want[k] = round_bf16(a[k] + b[k]);
  expect_close(download(be, out.c()), want, tol, "add_round");
  const std::vector<float> row = randoms(rng, w);
  be.fill_rows(out.m(), row);
  for (size_t i = 0; i < n; ++i) std::copy(row.begin(), row.end(), want.begin() + (long)(i * w));
  expect_close(download(be, out.c()), want, tol, "fill_rows");
}

void op_hc(const Backend& be, Rng& rng, Tolerance tol) {  // hc_mix, hc_pre_norm, hc_post
  const uint32_t hc = 3, H = 40;
  const size_t flat = (size_t)hc * H, mw = hc_mix_width(hc);
  HcParams p{hc, 7, 1e-6f, 1e-6f};
  for (const size_t n : kTokens) {
    const HostWeight fn = random_weight(be, GgmlType::F32, mw, flat, rng(), 0.1f);
    const std::vector<float> base = randoms(rng, mw), scale = randoms(rng, 3, 0.1f, 1.0f);
    const std::vector<float> X = randoms(rng, n * flat, -2, 2, true);
    const Strided Xs = upload(be, X, n, flat), mixes = upload(be, std::vector<float>(n * mw), n, mw);
    be.hc_mix(fn.w, base.data(), scale.data(), p, Xs.c(), mixes.m());
    std::vector<float> want(n * mw);
    for (size_t i = 0; i < n; ++i) {
      std::vector<float> m(mw);
      float ss = 0.0f;
      for (size_t k = 0; k < flat; ++k) ss += X[i * flat + k] * X[i * flat + k];
      const float r = 1.0f / std::sqrt(ss / (float)flat + p.norm_eps);
      for (size_t k = 0; k < mw; ++k) m[k] = ref_dot(fn.w, k, X.data() + i * flat) * r;
      const HcMix mx = hc_mix_from_projections(m.data(), base.data(), scale.data(), hc, p.sinkhorn_iters, p.hc_eps);
      std::copy(mx.pre.begin(), mx.pre.end(), want.begin() + (long)(i * mw));
      std::copy(mx.post.begin(), mx.post.end(), want.begin() + (long)(i * mw + hc));
      std::copy(mx.comb.begin(), mx.comb.end(), want.begin() + (long)(i * mw + 2 * hc));
    }
    const std::vector<float> got_mix = download(be, mixes.c());
    expect_close(got_mix, want, tol, "hc_mix n=" + std::to_string(n));

    // The collapse and the write-back, with the mixes just computed (pre = the first hc columns).
    const std::vector<float> g = randoms(rng, H, 0.5f, 1.5f), F = randoms(rng, n * H, -1, 1, true);
    const Strided y = upload(be, std::vector<float>(n * H), n, H), Fs = upload(be, F, n, H);
    const Strided Y = upload(be, std::vector<float>(n * flat), n, flat);
    be.hc_pre_norm(Xs.c(), mixes.c().cols(0, hc), g.data(), p, y.m());
    be.hc_post(Fs.c(), Xs.c(), mixes.c(), hc, Y.m());
    std::vector<float> want_y(n * H), want_Y(n * flat);
    for (size_t i = 0; i < n; ++i) {
      const float* mi = want.data() + i * mw;
      std::vector<float> c(H);
      for (uint32_t k = 0; k < H; ++k) {
        float acc = 0.0f;
        for (uint32_t h = 0; h < hc; ++h) acc += mi[h] * X[i * flat + (size_t)h * H + k];
        c[k] = round_bf16(acc);
      }
      float ss = 0.0f;
      for (uint32_t k = 0; k < H; ++k) ss += c[k] * c[k];
      const float r = 1.0f / std::sqrt(ss / (float)H + p.norm_eps);
      for (uint32_t k = 0; k < H; ++k) want_y[i * H + k] = round_bf16((c[k] * r) * g[k]);
      for (uint32_t j = 0; j < hc; ++j)
        for (uint32_t k = 0; k < H; ++k) {
          float acc = mi[hc + j] * F[i * H + k];
          for (uint32_t s = 0; s < hc; ++s) acc += mi[2 * hc + s * hc + j] * X[i * flat + (size_t)s * H + k];
          want_Y[i * flat + (size_t)j * H + k] = round_bf16(acc);
        }
    }
    expect_close(download(be, y.c()), want_y, tol, "hc_pre_norm n=" + std::to_string(n));
    expect_close(download(be, Y.c()), want_Y, tol, "hc_post n=" + std::to_string(n));
  }
}

void op_compress_pool(const Backend& be, Rng& rng, Tolerance tol) {
  const size_t hd = 24;
  for (const uint32_t ratio : {1u, 4u})
    for (const uint32_t p0 : {0u, 6u}) {
      const size_t n = 7;
      const std::vector<float> k = randoms(rng, n * hd, -2, 2), g = randoms(rng, n * hd, -3, 3);
      std::vector<float> ck = randoms(rng, (ratio - 1) * hd), cs = randoms(rng, (ratio - 1) * hd);
      std::vector<float> ck_ref = ck, cs_ref = cs;
      const Strided ks = upload(be, k, n, hd), gs = upload(be, g, n, hd), lat = upload(be, std::vector<float>(n * hd), n, hd);
      const std::vector<uint32_t> groups =
          be.compress_pool(ks.c(), ratio > 1 ? gs.c() : CMat{}, ratio, p0, ck.data(), cs.data(), lat.m());
      std::vector<uint32_t> want_groups;
      std::vector<float> want;
      for (size_t i = 0; i < n; ++i) {
        const uint32_t t = p0 + (uint32_t)i, j = t % ratio;
        if (ratio > 1 && j + 1 < ratio) {
          std::copy(k.begin() + (long)(i * hd), k.begin() + (long)((i + 1) * hd), ck_ref.begin() + (long)(j * hd));
          std::copy(g.begin() + (long)(i * hd), g.begin() + (long)((i + 1) * hd), cs_ref.begin() + (long)(j * hd));
          continue;
        }
        for (size_t d = 0; d < hd; ++d) {
          float pooled = k[i * hd + d];
          if (ratio > 1) {  // softmax over the group members, per channel
            auto kv = [&](uint32_t a) { return a + 1 < ratio ? ck_ref[a * hd + d] : k[i * hd + d]; };
            auto sc = [&](uint32_t a) { return a + 1 < ratio ? cs_ref[a * hd + d] : g[i * hd + d]; };
            float mx = sc(0);
            for (uint32_t a = 1; a < ratio; ++a) mx = std::max(mx, sc(a));
            std::vector<float> ex(ratio);
            float den = 0.0f;
            for (uint32_t a = 0; a < ratio; ++a) den += ex[a] = std::exp(sc(a) - mx);
            pooled = 0.0f;
            for (uint32_t a = 0; a < ratio; ++a) pooled += kv(a) * (ex[a] / den);
          }
          want.push_back(round_bf16(pooled));
        }
        want_groups.push_back(t / ratio);
      }
      EXPECT_EQ(groups, want_groups) << "ratio " << ratio;
      std::vector<float> got = download(be, lat.c());
      got.resize(want.size());
      expect_close(got, want, tol, "compress_pool ratio=" + std::to_string(ratio));
      expect_close(ck, ck_ref, tol, "compress_pool carry_k");
      expect_close(cs, cs_ref, tol, "compress_pool carry_s");
    }
}

// Packed FP4 cache rows split into committed (first rows) and fresh.
struct Cache {
  std::vector<uint8_t> old, fresh;
  std::vector<float> all;  // every row as floats: the fake-quantized values
  Fp4Grid grid = Fp4Grid::Nvfp4;
  CacheRows rows(uint32_t width) const {
    return CacheRows{old.data(), fresh.data(), (uint32_t)(old.size() / fp4_row_bytes(grid, width)), width, grid};
  }
};
Cache random_cache(Rng& rng, uint32_t committed, uint32_t fresh, uint32_t width, Fp4Grid grid) {
  Cache c;
  c.grid = grid;
  c.all = randoms(rng, (size_t)(committed + fresh) * width, -1, 1, true);
  const size_t rb = fp4_row_bytes(grid, width);
  for (uint32_t r = 0; r < committed + fresh; ++r) {
    float* v = c.all.data() + (size_t)r * width;
    std::vector<uint8_t>& dst = r < committed ? c.old : c.fresh;
    dst.resize(dst.size() + rb);
    fp4_pack_row(grid, v, width, dst.data() + dst.size() - rb);
    grid == Fp4Grid::Nvfp4 ? fake_quant_nvfp4(v, width) : fake_quant_mxfp4(v, width);
  }
  return c;
}
float ref_bf16_dot(const float* row, const float* q, uint32_t n) {
  std::vector<uint16_t> bits(n);
  for (uint32_t k = 0; k < n; ++k) bits[k] = f32_to_bf16(row[k]);
  return type_traits(GgmlType::BF16).dot_scalar(bits.data(), q, n);
}

void op_index_select(const Backend& be, Rng& rng, Tolerance tol) {
  const uint32_t heads = 3, hd = 32, ratio = 2, p0 = 40, n = 5, topk = 6, block = 4, keep = 3;
  const uint32_t rows_total = (p0 + n) / ratio, first = p0 / ratio;
  const Cache keys = random_cache(rng, first, rows_total - first, hd, Fp4Grid::Mxfp4);
  std::vector<float> q = randoms(rng, (size_t)n * heads * hd, -1, 1, true);
  const std::vector<float> w = randoms(rng, n * heads, -1, 1, true);
  // Off the grid (the float path) and, as the model's queries are, on the MXFP4 grid (the CPU's
  // integer indexer where the CPU has VNNI).
  for (const bool grid : {false, true}) {
    if (grid) fake_quant_mxfp4(q.data(), q.size());
    const Strided qs = upload(be, q, n, (size_t)heads * hd), ws = upload(be, w, n, heads);
    for (const int mode : {0, 1, 2}) {  // plain, candidate source, candidate consumer
      IndexSelect a;
      a.q = qs.c();
      a.w = ws.c();
      a.heads = heads;
      a.head_dim = hd;
      a.denom = std::sqrt((float)(hd * heads));
      a.keys = keys.rows(hd);
      a.ratio = ratio;
      a.p0 = p0;
      a.topk = topk;
      a.candidate_source = mode == 1;
      a.candidate_consumer = mode == 2;
      a.block = block;
      a.keep_blocks = keep;
      std::vector<std::vector<uint8_t>> cand(n), want_cand(n);
      if (mode == 2)
        for (uint32_t i = 0; i < n; ++i) {
          cand[i].assign((rows_total + block - 1) / block, 0);
          for (auto& b : cand[i]) b = (uint8_t)(rng() % 2);
          want_cand[i] = cand[i];
        }
      std::vector<std::vector<int32_t>> sel;
      be.index_select(a, cand, sel);
      ASSERT_EQ(sel.size(), n);
      for (uint32_t i = 0; i < n; ++i) {
        const uint32_t n_vis = (p0 + i + 1) / ratio;
        std::vector<float> scores(n_vis);
        for (uint32_t j = 0; j < n_vis; ++j) {
          float acc = 0.0f;
          for (uint32_t h = 0; h < heads; ++h) {
            const float d = ref_bf16_dot(keys.all.data() + (size_t)j * hd, q.data() + ((size_t)i * heads + h) * hd, hd);
            acc += std::max(d, 0.0f) * (w[i * heads + h] / a.denom);
          }
          scores[j] = acc;
        }
        if (mode == 1) want_cand[i] = candidate_blocks(scores, n_vis, block, keep);
        if (mode == 2)
          for (uint32_t j = 0; j < n_vis; ++j)
            if (!want_cand[i][j / block]) scores[j] = -std::numeric_limits<float>::infinity();
        const std::vector<int32_t> want = topk_ascending(scores, topk);
        if (tol.exact()) {
          EXPECT_EQ(sel[i], want) << "index_select mode " << mode << " token " << i;
        } else {  // near-ties may pick other rows; the count must agree
          EXPECT_EQ(sel[i].size(), want.size()) << "index_select mode " << mode << " token " << i;
        }
        if (mode == 1) {
          EXPECT_EQ(cand[i], want_cand[i]) << "candidate blocks of token " << i;
        }
      }
    }
  }
}

void op_sparse_attention(const Backend& be, Rng& rng, Tolerance tol) {
  const uint32_t heads = 3, hd = 16, W = 5, ratio = 3;
  for (const uint32_t p0 : {0u, 9u})
    for (const bool with_comp : {false, true}) {
      const uint32_t n = 11;  // more than one group of queries (kAttentionGroup)
      // Window: a ring of W committed rows (positions < p0) and n fresh rows.
      const std::vector<float> ring = randoms(rng, (size_t)W * hd, -1, 1, true), fresh = randoms(rng, (size_t)n * hd, -1, 1, true);
      std::vector<uint16_t> ring_b(ring.size()), fresh_b(fresh.size());
      for (size_t k = 0; k < ring.size(); ++k) ring_b[k] = f32_to_bf16(ring[k]);
      for (size_t k = 0; k < fresh.size(); ++k) fresh_b[k] = f32_to_bf16(fresh[k]);
      const uint32_t rows_total = (p0 + n) / ratio;
      const Cache comp = random_cache(rng, p0 / ratio, rows_total - p0 / ratio, hd, Fp4Grid::Nvfp4);
      std::vector<std::vector<int32_t>> sel(n);
      for (uint32_t i = 0; i < n; ++i)
        for (uint32_t g = 0; g < rows_total; ++g)
          if (rng() % 2) sel[i].push_back((int32_t)g);  // ascending; some beyond what token i sees
      const std::vector<float> q = randoms(rng, (size_t)n * heads * hd, -2, 2, true), sinks = randoms(rng, heads);
      const Strided qs = upload(be, q, n, (size_t)heads * hd), o = upload(be, std::vector<float>((size_t)n * heads * hd), n, (size_t)heads * hd);
      SparseAttention a;
      a.q = qs.c();
      a.heads = heads;
      a.head_dim = hd;
      a.p0 = p0;
      a.window = WindowRows{ring_b.data(), fresh_b.data(), W, p0, hd};
      if (with_comp) {
        a.comp = comp.rows(hd);
        a.comp_ratio = ratio;
        a.sel = &sel;
      }
      a.sinks = sinks.data();
      be.sparse_attention(a, o.m());
      std::vector<float> want((size_t)n * heads * hd);
      const float scale = (float)(1.0 / std::sqrt((double)hd));
      for (uint32_t i = 0; i < n; ++i) {
        const uint32_t t = p0 + i;
        std::vector<const float*> rows;
        for (uint32_t p = t + 1 > W ? t + 1 - W : 0; p <= t; ++p)
          rows.push_back(p < p0 ? ring.data() + (size_t)(p % W) * hd : fresh.data() + (size_t)(p - p0) * hd);
        if (with_comp)
          for (int32_t g : sel[i])
            if ((uint32_t)g < (t + 1) / ratio) rows.push_back(comp.all.data() + (size_t)g * hd);
        for (uint32_t h = 0; h < heads; ++h) {
          const float* qh = q.data() + ((size_t)i * heads + h) * hd;
          std::vector<float> s(rows.size());
          float mx = -std::numeric_limits<float>::infinity();
          for (size_t k = 0; k < rows.size(); ++k) mx = std::max(mx, s[k] = ref_bf16_dot(rows[k], qh, hd) * scale);
          float den = 0.0f;
          std::vector<float> acc(hd, 0.0f);
          for (size_t k = 0; k < rows.size(); ++k) {
            const float pr = std::exp(s[k] - mx);
            den += pr;
            for (uint32_t d = 0; d < hd; ++d) acc[d] += round_bf16(pr) * rows[k][d];
          }
          den += std::exp(sinks[h] - mx);
          for (uint32_t d = 0; d < hd; ++d) want[((size_t)i * heads + h) * hd + d] = round_bf16(acc[d] / den);
        }
      }
      expect_close(download(be, o.c()), want, tol, "sparse_attention p0=" + std::to_string(p0) + " comp=" + std::to_string(with_comp));
    }
}

// Plain FFN of one expert for one token: down(swiglu(gate x, up x)).
std::vector<float> ref_expert(const Weight& g, const Weight& u, const Weight& d, const float* x, float lim, float wk) {
  std::vector<float> h(g.rows), out(d.rows);
  for (uint64_t r = 0; r < g.rows; ++r)
    h[r] = ref_swiglu(round_bf16(ref_dot(g, r, x)), round_bf16(ref_dot(u, r, x)), lim, wk);
  for (uint64_t r = 0; r < d.rows; ++r) out[r] = round_bf16(ref_dot(d, r, h.data()));
  return out;
}

class TestExperts final : public ExpertSource {
 public:
  std::vector<HostWeight> gate, up, down;
  ExpertWeights get(uint32_t, uint32_t e) const override { return {gate[e].w.data, up[e].w.data, down[e].w.data}; }
};

void op_ffn(const Backend& be, Rng& rng, Tolerance tol) {
  const uint64_t H = 64, F = 96;
  const float lim = 1.5f;
  for (const auto& [tg, td] : {std::pair{GgmlType::F32, GgmlType::Q8_0}, std::pair{GgmlType::Q8_0, GgmlType::BF16}}) {
    const uint32_t E = 4;
    const size_t n = 5;
    TestExperts ex;
    for (uint32_t e = 0; e < E; ++e) {
      ex.gate.push_back(random_weight(be, tg, F, H, rng()));
      ex.up.push_back(random_weight(be, tg, F, H, rng()));
      ex.down.push_back(random_weight(be, td, H, F, rng()));
    }
    const std::vector<float> x = randoms(rng, n * H, -1, 1, true);
    const Strided xs = upload(be, x, n, H);

    // Shared expert = expert 0 with weight 1.
    const Strided sh = upload(be, std::vector<float>(n * H), n, H);
    be.shared_ffn(ex.gate[0].w, ex.up[0].w, ex.down[0].w, lim, xs.c(), sh.m());
    std::vector<float> want_sh;
    for (size_t t = 0; t < n; ++t) {
      const std::vector<float> o = ref_expert(ex.gate[0].w, ex.up[0].w, ex.down[0].w, x.data() + t * H, lim, 1.0f);
      want_sh.insert(want_sh.end(), o.begin(), o.end());
    }
    expect_close(download(be, sh.c()), want_sh, tol, "shared_ffn");

    // Routed: two distinct experts per token, sorted by expert then token.
    std::vector<ExpertTriple> triples;
    for (uint32_t t = 0; t < n; ++t) {
      const uint32_t e1 = (uint32_t)(rng() % E), e2 = (e1 + 1 + (uint32_t)(rng() % (E - 1))) % E;
      triples.push_back({e1, t, uniform(rng, 0.1f, 1.0f)});
      triples.push_back({e2, t, uniform(rng, 0.1f, 1.0f)});
    }
    std::stable_sort(triples.begin(), triples.end(), [](const ExpertTriple& a, const ExpertTriple& b) { return a.expert < b.expert; });
    const Strided routed = upload(be, std::vector<float>(n * H), n, H);
    Weight lay_g = ex.gate[0].w, lay_u = ex.up[0].w, lay_d = ex.down[0].w;
    lay_g.data = lay_u.data = lay_d.data = nullptr;  // geometry only: the bytes come from the source
    be.routed_ffn(ExpertTensors{&lay_g, &lay_u, &lay_d}, ex, 0, triples, lim, xs.c(), routed.m());
    std::vector<float> want(n * H, 0.0f);
    for (const ExpertTriple& tr : triples) {
      const std::vector<float> o = ref_expert(ex.gate[tr.expert].w, ex.up[tr.expert].w, ex.down[tr.expert].w,
                                              x.data() + tr.token * H, lim, tr.weight);
      for (uint64_t k = 0; k < H; ++k) want[tr.token * H + k] += o[k];
    }
    expect_close(download(be, routed.c()), want, tol, "routed_ffn " + std::string(type_traits(tg).name));
  }
}

void op_engram_gate(const Backend& be, Rng& rng, Tolerance tol) {
  const uint32_t hc = 3, H = 24;
  for (const size_t n : kTokens) {
    const std::vector<float> X = randoms(rng, n * hc * H, -2, 2, true), kv = randoms(rng, n * (hc + 1) * H, -1, 1, true);
    const std::vector<float> qn = randoms(rng, hc * H, 0.5f, 1.5f), kn = randoms(rng, hc * H, 0.5f, 1.5f);
    std::vector<uint8_t> masked(n, 0);
    if (n > 1) masked[1] = 1;
    const Strided Xs = upload(be, X, n, (size_t)hc * H), kvs = upload(be, kv, n, (size_t)(hc + 1) * H);
    be.engram_gate(Xs.m(), hc, kvs.c(), qn.data(), kn.data(), 1e-6f, masked.data());
    std::vector<float> want = X;
    for (size_t i = 0; i < n; ++i)
      for (uint32_t h = 0; h < hc; ++h) {
        float* x = want.data() + (i * hc + h) * H;
        const float* key = kv.data() + (i * (hc + 1) + h) * H;
        const float* val = kv.data() + (i * (hc + 1) + hc) * H;
        float dot = 0.0f, sx = 0.0f, sk = 0.0f;
        for (uint32_t k = 0; k < H; ++k) dot += (x[k] * (qn[h * H + k] * kn[h * H + k])) * key[k];
        for (uint32_t k = 0; k < H; ++k) sx += x[k] * x[k];
        for (uint32_t k = 0; k < H; ++k) sk += key[k] * key[k];
        dot *= 1.0f / std::sqrt(sx / (float)H + 1e-6f);
        dot *= 1.0f / std::sqrt(sk / (float)H + 1e-6f);
        dot *= (float)(1.0 / std::sqrt((double)H));
        const float sgn = dot > 0.0f ? 1.0f : (dot < 0.0f ? -1.0f : 0.0f);
        const float gate = masked[i] ? 0.0f : 1.0f / (1.0f + std::exp(-(sgn * std::sqrt(std::max(std::fabs(dot), 1e-6f)))));
        for (uint32_t k = 0; k < H; ++k) x[k] = round_bf16(x[k] + gate * val[k]);
      }
    expect_close(download(be, Xs.c()), want, tol, "engram_gate n=" + std::to_string(n));
  }
}

struct OpCase {
  std::string name;
  void (*run)(const Backend&, Rng&, Tolerance);
};
const OpCase kOps[] = {
    {"linear", op_linear},           {"linears", op_linears},
    {"embed", op_embed},
    {"rms_norm", op_rms_norm},       {"rope", op_rope},
    {"fake_quant", op_fake_quant},   {"bf16_add_fill", op_small},
    {"store_fp4", op_store_fp4},
    {"hc", op_hc},                   {"compress_pool", op_compress_pool},
    {"index_select", op_index_select}, {"sparse_attention", op_sparse_attention},
    {"ffn", op_ffn},                 {"engram_gate", op_engram_gate},
};

struct Param {
  size_t backend, op;
};
void PrintTo(const Param& p, std::ostream* os) { *os << backends()[p.backend].name << "/" << kOps[p.op].name; }
std::vector<Param> all_params() {
  std::vector<Param> out;
  for (size_t b = 0; b < backends().size(); ++b)
    for (size_t o = 0; o < std::size(kOps); ++o) out.push_back({b, o});
  return out;
}

class BackendOps : public ::testing::TestWithParam<Param> {};

TEST_P(BackendOps, MatchesTheReference) {
  const BackendCase bc = backends()[GetParam().backend];
  const OpCase& op = kOps[GetParam().op];
  const std::unique_ptr<Backend> be = bc.make();
  Rng rng(0x5eed + GetParam().op);
  op.run(*be, rng, bc.tolerance(op.name));
  if (bc.on_device) {
    // What the op put on the device: linears for the linear ops, other ops for the rest (so the
    // identity linears of produced() do not count).
    const GpuStats g = gpu_stats(*be);
    const uint64_t work = op.name == "linear" || op.name == "linears" ? g.linear_on_device : g.ops_on_device;
    if (bc.on_device(op.name))
      EXPECT_GT(work, 0u) << op.name << " ran on the CPU: the device's build of it went untested";
    else
      EXPECT_EQ(work, 0u) << op.name << " ran on the device: say so in backends()";
  }
}

INSTANTIATE_TEST_SUITE_P(All, BackendOps, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Param>& i) {
                           return backends()[i.param.backend].name + "_" + kOps[i.param.op].name;
                         });

}  // namespace
}  // namespace sluice
