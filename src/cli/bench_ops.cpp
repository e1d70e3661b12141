// `sluice bench --ops`: the linear op of the CPU backend, or with --backend vulkan the device's
// (activation quantization included, and on the device the staging in and out and the wait: as
// the forward pass calls it), at the model's real shapes.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

#include "backend/cpu_backend.h"
#include "backend/read_bandwidth.h"
#include "backend/vulkan_backend.h"
#include "cli/bench_stats.h"
#include "cli/cmd_bench.h"
#include "cli/cmd_run.h"
#include "kernels/cpu.h"
#include "model/deepseek41/schema.h"
#include "runtime/session.h"

namespace sluice::cli {
namespace {

struct Shape {
  std::string name;
  uint64_t rows = 0, cols = 0;
  GgmlType type = GgmlType::F32;
};

// The linear weights of layer 0 and the output head, one entry per distinct (rows, cols, type);
// a routed tensor contributes one expert's matrix. The head runs for one token only (prefill
// needs only the last position's logits).
std::vector<Shape> model_shapes(const ModelConfig& c) {
  std::vector<Shape> out;
  std::set<std::tuple<uint64_t, uint64_t, int>> seen;
  for (const TensorSpec& t : deepseek41_tensors(c)) {
    if (t.cls == ByteClass::Engram || t.ne.size() < 2 || t.name == "token_embd.weight") continue;
    if (t.layer != 0 && t.name != "output.weight") continue;
    if (!type_traits(t.type).has_kernels || t.type == GgmlType::F32) continue;
    const uint64_t cols = t.ne[0], rows = t.ne[1];
    if (!seen.insert({rows, cols, (int)t.type}).second) continue;
    out.push_back({t.name, rows, cols, t.type});
  }
  return out;
}

std::vector<uint32_t> token_counts(const std::string& s) {
  std::vector<uint32_t> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    unsigned long n = 0;
    try {
      n = std::stoul(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || n == 0 || n > 8192)
      throw UsageError("-n: token counts must be 1..8192, comma-separated (got '" + s + "')");
    v.push_back((uint32_t)n);
  }
  if (v.empty()) throw UsageError("-n: no token counts");
  return v;
}

std::vector<GgmlType> weight_types(const std::string& s) {
  std::vector<GgmlType> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    const std::optional<GgmlType> t = type_from_name(item);
    if (!t || *t == GgmlType::ENGRAM_ROW || !type_traits(*t).has_kernels)
      throw UsageError("--type: no kernels for type '" + item + "'");
    v.push_back(*t);
  }
  return v;
}

}  // namespace

int run_bench_ops(const BenchOptions& o) {
  const std::vector<uint32_t> ns = token_counts(o.n_gen.empty() ? "1,8,64,512" : o.n_gen);
  if (!(o.op_seconds >= 0 && o.op_seconds <= 600)) throw UsageError("--op-seconds must be in [0, 600]");
  const ModelConfig c = o.model.empty() ? published_config() : open_model_header(o.model).config;
  const int threads = resolved_threads(o.engine.threads);
  const ReadBandwidth rb = bench_read_bandwidth(o, threads);
  std::vector<Shape> shapes = model_shapes(c);
  if (!o.types.empty()) {
    std::vector<Shape> typed;
    for (GgmlType ty : weight_types(o.types))
      for (Shape s : shapes) {
        if (s.cols % (uint64_t)type_traits(ty).block_elems) continue;
        s.type = ty;
        bool dup = false;
        for (const Shape& t : typed) dup |= t.rows == s.rows && t.cols == s.cols && t.type == ty;
        if (!dup) typed.push_back(s);
      }
    shapes = typed;
  }
  // The backend: the CPU's, or the device's with the options a session would give it (checked as
  // a session's are: the device's options without --backend vulkan are refused, not ignored).
  const SessionOptions so = session_options(o.engine, o.model, 0);
  std::unique_ptr<Backend> gpu;
  if (o.engine.backend == "vulkan") {
    if (so.gpu_experts || so.gpu_experts_in_place) throw UsageError("--gpu-experts has no effect with --ops");
    gpu = make_vulkan_backend(gpu_options(so));
  } else if (o.engine.backend != "cpu") {
    throw UsageError("--backend must be cpu or vulkan (got '" + o.engine.backend + "')");
  }
  const CpuBackend cpu(threads);
  // On a device, what ran where: the build of its quantized linears, and the host memory's read
  // rate stands as the limit only where the device reads host memory (an integrated GPU, a CPU
  // device); a card's own memory bandwidth is not measured here.
  std::string where = "the CPU backend: isa " + std::string(isa_name(active_isa())) + ", threads " + std::to_string(threads);
  if (gpu) {
    const GpuStats g = gpu_stats(*gpu);
    where = "device " + vulkan_devices()[o.engine.device].name + " (quantized linears " + gpu_linears_text(g) + ")" +
            (g.weights_in_host_memory ? "" : "; /read compares with host memory, not the card's");
  }
  if (!o.json)
    std::printf("linear on %s; memory read %.2f GB/s (min %.2f, max %.2f)\n"
                "%-34s %-8s %6s %6s %5s %9s %8s %6s\n",
                where.c_str(), rb.median_gbps, rb.min_gbps, rb.max_gbps,
                "tensor", "type", "rows", "cols", "n", "GFLOPS", "GB/s", "/read");
  const bool on_gpu = gpu != nullptr;
  for (const Shape& s : shapes) {
    const TypeTraits& t = type_traits(s.type);
    Weight W;
    W.type = s.type;
    W.rows = s.rows;
    W.cols = s.cols;
    W.row_bytes = s.cols / (uint64_t)t.block_elems * (uint64_t)t.block_bytes;
    // Several copies, used in turn, so the weights a run streams exceed the last-level cache the
    // way a decode token's do (a single small matrix would be read from cache): at least half
    // the read-bandwidth buffer in all, 64 copies at most.
    const uint64_t one = W.row_bytes * W.rows;
    const uint64_t copies = std::clamp<uint64_t>(((o.read_mib << 20) / 2 + one - 1) / one, 1, 64);
    std::vector<uint8_t> bytes(one * copies);
    t.random(bytes.data(), (int64_t)(one / (uint64_t)t.block_bytes), 42, 0.05f);
    for (uint64_t k = 1; k < copies; ++k) std::memcpy(bytes.data() + k * one, bytes.data(), one);
    // On a device, a backend of its own for each shape (the first shape's is the header's, which
    // holds nothing yet), gone before the shape's bytes: the device never holds an import of freed
    // pages, and the copies of one shape leave the device budget whole for the next (else later
    // shapes would run on the CPU once the budget had filled).
    std::unique_ptr<Backend> dev;
    if (on_gpu) dev = gpu ? std::move(gpu) : make_vulkan_backend(gpu_options(so));
    const Backend& be = dev ? *dev : static_cast<const Backend&>(cpu);
    std::vector<Weight> ws((size_t)copies, W);
    for (uint64_t k = 0; k < copies; ++k) {
      ws[k].data = bytes.data() + k * one;
      be.prepare_weight(ws[k]);
    }
    // On a device: the copies it holds (a weight past its budget or its largest binding runs on
    // the CPU, and is reported so, never mixed into a device figure).
    const bool on_device = !dev || ws[0].device != nullptr;
    if (dev)
      ws.erase(std::find_if(ws.begin() + 1, ws.end(), [&](const Weight& w) { return (w.device != nullptr) != on_device; }),
               ws.end());
    for (uint32_t n : ns) {
      if (s.name == "output.weight" && n > 1) continue;
      std::vector<float> x((size_t)n * s.cols), y((size_t)n * s.rows);
      uint64_t seed = 9;
      for (float& v : x) v = (float)((double)((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 11) * 0x1p-53 - 0.5);
      const CMat xm(x.data(), n, s.cols, s.cols);
      const Mat ym{y.data(), n, s.rows, s.rows};
      be.linear(ws[0], xm, ym, true, 0);  // warm-up (the copies were written, so their pages exist)
      const uint64_t gemm_before = dev ? gpu_stats(*dev).gemm_dispatches : 0;
      std::vector<double> secs;
      double total = 0;
      size_t next = 0;
      while (secs.size() < o.repetitions || (total < o.op_seconds && secs.size() < 200)) {
        const Weight& w = ws[next++ % ws.size()];
        const auto t0 = std::chrono::steady_clock::now();
        be.linear(w, xm, ym, true, 0);
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        secs.push_back(dt);
        total += dt;
      }
      const Figure f = figure(secs);
      // The device's build for this figure: the GEMM, or the one --gpu-linears chose (the float
      // formats have one build, an invocation per output).
      const bool float_type = s.type == GgmlType::F32 || s.type == GgmlType::F16 || s.type == GgmlType::BF16;
      const std::string build = !dev ? std::string()
                                : !on_device ? std::string("on the CPU")
                                : gpu_stats(*dev).gemm_dispatches > gemm_before ? std::string("gemm")
                                : gpu_stats(*dev).subgroup_linears && !float_type ? std::string("subgroup")
                                                                                   : std::string("plain");
      const double gflops = 2.0 * (double)s.rows * (double)s.cols * n / f.median / 1e9;
      const double gbps = (double)one / f.median / 1e9;
      if (o.json) {
        nlohmann::json j;
        j["tensor"] = s.name;
        j["type"] = std::string(t.name);
        j["n"] = n;
        j["rows"] = s.rows;
        j["cols"] = s.cols;
        j["threads"] = threads;
        j["isa"] = std::string(isa_name(active_isa()));
        j["backend"] = std::string(be.name());
        if (dev) j["gpu_build"] = build;
        j["gflops"] = gflops;
        j["gflops_min"] = 2.0 * (double)s.rows * (double)s.cols * n / f.max / 1e9;
        j["gflops_max"] = 2.0 * (double)s.rows * (double)s.cols * n / f.min / 1e9;
        j["gbps"] = gbps;
        j["read_gbps"] = rb.median_gbps;
        j["read_ratio"] = gbps / rb.median_gbps;
        j["runs"] = secs.size();
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%-34s %-8s %6llu %6llu %5u %9.1f %8.2f %6.2f%s\n", s.name.c_str(), std::string(t.name).c_str(),
                    (unsigned long long)s.rows, (unsigned long long)s.cols, n, gflops, gbps, gbps / rb.median_gbps,
                    build.empty() ? "" : ("  " + build).c_str());
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace sluice::cli
