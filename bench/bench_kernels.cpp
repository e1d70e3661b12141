// Dot-product throughput of every type with kernels, per ISA, single thread.
//
// For each type: a weight matrix of about --mib MiB (rows of 4096 elements, or the smallest
// multiple of the block >= 4096; Engram rows use their real length, 256) is dotted with one
// activation row prepared by quantize_activation. Speed is reported as GB/s of weight bytes read
// and as a ratio to memcpy of a buffer of the same size measured in the same run (memcpy GB/s
// counts the bytes copied). Each figure is the median of 5 passes over the whole matrix.
//
//   bench_kernels [--mib N] [--type NAME]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "kernels/cpu.h"
#include "kernels/engram_row.h"
#include "kernels/types.h"

using namespace sluice;

namespace {

constexpr int kReps = 5;

template <class F>
double median_seconds(F&& pass) {
  return bench::time_reps(kReps, pass).med;
}

double memcpy_gbs(size_t bytes) { return bench::memcpy_gbs(bytes, kReps); }

int64_t row_elements(const TypeTraits& t) {
  if (t.type == GgmlType::ENGRAM_ROW) return kEngramRandomHeadDim;  // layout is per row
  return (4096 + t.block_elems - 1) / t.block_elems * t.block_elems;
}

void usage() { std::fprintf(stderr, "usage: bench_kernels [--mib N] [--type NAME]\n"); }

}  // namespace

int main(int argc, char** argv) {
  double mib = 64;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) {
      char* end = nullptr;
      mib = std::strtod(argv[++i], &end);
      if (*end || !(mib > 0) || mib > 65536) {
        usage();
        return 2;
      }
    } else if (a == "--type" && i + 1 < argc) {
      only = argv[++i];
      if (!type_from_name(only)) {
        std::fprintf(stderr, "unknown type %s\n", only.c_str());
        return 2;
      }
    } else {
      usage();
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  const size_t target = (size_t)(mib * 1024 * 1024);

  std::printf("bench_kernels: %.1f MiB weight matrix per type, single thread, median of %d passes, cpu %s\n", mib,
              kReps, std::string(isa_name(detect_isa())).c_str());
  const double base = memcpy_gbs(target);
  std::printf("%-12s %-7s %6s %7s %9s %9s\n", "type", "isa", "row", "rows", "GB/s", "x memcpy");
  std::printf("%-12s %-7s %6s %7s %9.2f %9.2f\n", "memcpy", "-", "-", "-", base, 1.0);

  std::vector<uint32_t> ids;
  for (uint32_t id = 0; id <= 50; ++id) ids.push_back(id);
  ids.push_back(1000);
  for (uint32_t id : ids) {
    const TypeTraits* t = find_type(id);
    if (!t || !t->has_kernels || !t->dot_scalar || !t->random) continue;  // row missing or size-only
    if (!only.empty() && t->name != only) continue;
    const int64_t n = row_elements(*t);
    const size_t rb = (size_t)row_bytes(t->type, (uint64_t)n);
    const size_t rows = std::max<size_t>(1, target / rb);
    std::vector<uint8_t> w(rows * rb);
    t->random(w.data(), (int64_t)(rows * (size_t)n / (size_t)t->block_elems), 42, 1.0f);

    std::vector<float> x((size_t)n);
    for (int64_t i = 0; i < n; ++i) x[(size_t)i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
    std::vector<uint8_t> act(activation_bytes(t->act, n), 0);  // zeros if the quantizer is a stub
    try {
      quantize_activation(t->act, x.data(), act.data(), n);
    } catch (const std::exception& e) {
      std::printf("%-12s skipped: %s\n", std::string(t->name).c_str(), e.what());
      continue;
    }

    std::vector<float> ref(std::min<size_t>(rows, 256));
    for (size_t r = 0; r < ref.size(); ++r) ref[r] = t->dot_scalar(w.data() + r * rb, act.data(), n);
    DotFn previous = nullptr;
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
      if ((int)isa > (int)detect_isa()) break;
      const DotFn fn = dot_for(*t, isa);
      if (fn == previous) continue;  // no kernel of its own at this ISA
      previous = fn;
      volatile float sink = 0;
      const double s = median_seconds([&] {
        float sum = 0;
        for (size_t r = 0; r < rows; ++r) sum += fn(w.data() + r * rb, act.data(), n);
        sink = sink + sum;
      });
      bool same = true;
      for (size_t r = 0; r < ref.size(); ++r) {
        const float got = fn(w.data() + r * rb, act.data(), n);
        same &= std::memcmp(&got, &ref[r], sizeof got) == 0;
      }
      const double gbs = (double)(rows * rb) / s / 1e9;
      std::printf("%-12s %-7s %6lld %7zu %9.2f %9.2f%s\n", std::string(t->name).c_str(),
                  std::string(isa_name(isa)).c_str(), (long long)n, rows, gbs, gbs / base,
                  same ? "" : "   MISMATCH with scalar");
    }
  }
  return 0;
}
