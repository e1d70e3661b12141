// The lightning indexer's cost per key and per position, single thread.
//
// For a set of visible-row counts, one query (heads x head_dim on the MXFP4 grid) is scored against
// that many packed index keys by the float path (unpack to BF16, one f32 dot per head: what the CPU
// backend runs without VNNI) and by the integer kernel (kernels/index_scores.h), whose scores must
// be the same bits (checked); then the top-k of those scores (topk_ascending, against a plain
// nth_element over every index, which must pick the same rows). Figures are medians
// of --reps passes with min and max, against two limits measured in the same run: the arithmetic
// peak of vpdpbusd (int8 multiply-adds) and of f32 FMA on this core, and memcpy bandwidth for the
// keys' bytes. The last table turns ns per key into the published model's indexer cost per token
// at a position: index layers 2, 8, 14 see position/2 keys, 20 sees position, 24..36 see the
// candidate pool (at most 2,048 x 8 rows) each.
//
//   bench_indexer [--reps N] [--heads H] [--head-dim D]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "kernels/cpu.h"
#include "kernels/fp.h"
#include "kernels/fp4_rows.h"
#include "kernels/index_scores.h"
#include "kernels/numerics.h"
#include "kernels/peak_loops.h"
#include "kernels/types.h"

using namespace sluice;

namespace {

using bench::Stat;
using bench::time_reps;

volatile uint32_t g_sink;

double vnni_macs_per_s() {
  const size_t iters = 20'000'000;
  const Stat s = time_reps(3, [&] { g_sink = peak_loop_vnni_avx512(iters); });
  return (double)iters * 10 * 64 / s.med;
}

double fma_macs_per_s() {
  const size_t iters = 20'000'000;
  const Stat s = time_reps(3, [&] { g_sink = (uint32_t)peak_loop_fma_avx512(iters); });
  return (double)iters * 10 * 16 / s.med;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  uint32_t heads = 32, hd = 128;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--heads" && i + 1 < argc) heads = (uint32_t)std::atoi(argv[++i]);
    else if (a == "--head-dim" && i + 1 < argc) hd = (uint32_t)std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_indexer [--reps N] [--heads H] [--head-dim D]\n");
      return 2;
    }
  }
  const Isa isa = active_isa();
  const IndexScoresFn integer = index_scores_for(isa);
  const Fp4UnpackFn unpack = fp4_unpack_for(isa);
  const DotFn dot = dot_for(type_traits(GgmlType::BF16), isa);
  const size_t rb = fp4_row_bytes(Fp4Grid::Mxfp4, hd), macs_per_key = (size_t)heads * hd;

  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-2, 2);
  std::vector<float> q((size_t)heads * hd), w(heads);
  for (size_t i = 0; i < q.size(); i += 32) {
    const int x = e(rng);
    for (size_t k = 0; k < 32; ++k) q[i + k] = round_bf16(std::ldexp(u(rng), x));
  }
  fake_quant_mxfp4(q.data(), q.size());
  for (float& x : w) x = round_bf16(u(rng)) / 64.0f;
  IndexQuery iq;
  prepare_index_query(q.data(), w.data(), heads, hd, iq);

  const double peak_int = detect_isa() == Isa::Avx512 ? vnni_macs_per_s() : 0.0;
  const double peak_f32 = detect_isa() == Isa::Avx512 ? fma_macs_per_s() : 0.0;
  std::printf("isa %s, %u heads x %u, %zu B per key, %d reps (median, min-max)\n", std::string(isa_name(isa)).c_str(),
              heads, hd, rb, reps);
  std::printf("limits, this core: vpdpbusd %.1f G int8 MAC/s, f32 FMA %.1f G MAC/s, memcpy %.1f GB/s\n",
              peak_int / 1e9, peak_f32 / 1e9, bench::memcpy_gbs(64u << 20, 5));
  std::printf("\n%9s | %-26s | %-26s | %6s | %-28s | %s\n", "keys", "float path ns/key", "integer ns/key", "x",
              "top-512 ns/key / plain", "integer vs peak, key GB/s");

  std::vector<double> ns_int_at, ns_float_at, ns_topk_at;
  const std::vector<size_t> counts = {1024, 4096, 16384, 65536, 262144};
  for (size_t n : counts) {
    std::vector<uint8_t> keys(n * rb);
    for (size_t j = 0; j < n; ++j) {
      std::vector<float> k(hd);
      for (size_t i = 0; i < hd; i += 32) {
        const int x = e(rng);
        for (size_t t = 0; t < 32; ++t) k[i + t] = round_bf16(std::ldexp(u(rng), x));
      }
      fp4_pack_row(Fp4Grid::Mxfp4, k.data(), hd, keys.data() + j * rb);
    }
    std::vector<float> sf(n), si(n);
    std::vector<uint16_t> kb(hd);
    const Stat tf = time_reps(reps, [&] {
      for (size_t j = 0; j < n; ++j) {
        unpack(Fp4Grid::Mxfp4, keys.data() + j * rb, hd, kb.data());
        float acc = 0.0f;
        for (uint32_t h = 0; h < heads; ++h) acc += std::max(dot(kb.data(), q.data() + (size_t)h * hd, hd), 0.0f) * w[h];
        sf[j] = acc;
      }
    });
    Stat ti{};
    if (integer && iq.integer) {
      std::vector<uint32_t> fb(n);
      size_t nf = 0;
      ti = time_reps(reps, [&] { nf = integer(iq, keys.data(), n, si.data(), fb.data()); });
      if (nf != 0 || std::memcmp(sf.data(), si.data(), n * 4) != 0) {
        std::fprintf(stderr, "integer scores differ from the float path (%zu fallbacks)\n", nf);
        return 1;
      }
    }
    std::vector<int32_t> sel, plain;
    const Stat tk = time_reps(reps, [&] { sel = topk_ascending(sf, 512); });
    // The baseline: nth_element over every index by (score desc, index asc), then sort.
    const Stat tp = time_reps(reps, [&] {
      plain.resize(n);
      for (size_t j = 0; j < n; ++j) plain[j] = (int32_t)j;
      auto by = [&](int32_t x, int32_t y) { return sf[x] != sf[y] ? sf[x] > sf[y] : x < y; };
      std::nth_element(plain.begin(), plain.begin() + 512, plain.end(), by);
      plain.resize(std::min<size_t>(512, n));
      std::sort(plain.begin(), plain.end());
    });
    if (plain != sel) {
      std::fprintf(stderr, "top-k differs from the plain selection\n");
      return 1;
    }
    const double k = 1e9 / (double)n;
    char fcol[64], icol[64], kcol[64], lim[96] = "-";
    std::snprintf(fcol, sizeof fcol, "%.1f (%.1f-%.1f)", tf.med * k, tf.lo * k, tf.hi * k);
    std::snprintf(icol, sizeof icol, "%.1f (%.1f-%.1f)", ti.med * k, ti.lo * k, ti.hi * k);
    std::snprintf(kcol, sizeof kcol, "%.2f (%.2f-%.2f) / %.1f", tk.med * k, tk.lo * k, tk.hi * k, tp.med * k);
    if (ti.med > 0 && peak_int > 0)
      std::snprintf(lim, sizeof lim, "%.2f of peak, %.2f GB/s", (double)n * macs_per_key / ti.med / peak_int,
                    (double)n * rb / ti.med / 1e9);
    std::printf("%9zu | %-26s | %-26s | %6.1f | %-28s | %s\n", n, fcol, ti.med > 0 ? icol : "-",
                ti.med > 0 ? tf.med / ti.med : 0.0, kcol, lim);
    ns_float_at.push_back(tf.med * k);
    ns_int_at.push_back(ti.med > 0 ? ti.med * k : tf.med * k);
    ns_topk_at.push_back(tk.med * k);
  }

  // Per token of the published model at a position, one thread: the largest measured count's
  // ns/key (its keys no longer fit the caches, as at length).
  const double nsf = ns_float_at.back(), nsi = ns_int_at.back(), nsk = ns_topk_at.back();
  std::printf("\npublished model, one thread, per decode token at a position (8 index layers; ns/key of the %zu-key row)\n",
              counts.back());
  std::printf("%9s | %12s | %10s | %12s | %12s\n", "position", "keys scored", "float ms", "integer ms", "top-k ms");
  for (double pos : {32768.0, 131072.0, 524288.0}) {
    const double keys = 3 * (pos / 2) + pos + 4 * std::min(pos, 2048.0 * 8);
    std::printf("%9.0f | %12.0f | %10.1f | %12.1f | %12.2f\n", pos, keys, keys * nsf / 1e6, keys * nsi / 1e6,
                keys * nsk / 1e6);
  }
  return 0;
}
