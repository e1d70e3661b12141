// GCC 12's AVX-512 intrinsic headers seed results with _mm512_undefined_*(), which -O3 inlining
// reports as maybe-uninitialized (a known false positive, as in the kernels' avx512 files).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "backend/read_bandwidth.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu.h"
#include "util/error.h"

namespace sluice {
namespace {

// Eight independent accumulators so the loop is bound by loads, not by one add chain.
uint64_t sum_words(const uint64_t* p, size_t n) {
  uint64_t a[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) a[k] += p[i + (size_t)k];
  for (; i < n; ++i) a[0] += p[i];
  uint64_t s = 0;
  for (uint64_t v : a) s += v;
  return s;
}

// The widest loads the kernels use: the ceiling must not be set by the baseline's own loop
// (on this machine class 128-bit loads read ~25% less than 512-bit ones).
__attribute__((target("avx512f"))) uint64_t sum_words_avx512(const uint64_t* p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 8));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 16));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 24));
  }
  // Lanes summed as unsigned words: _mm512_reduce_add_epi64 adds signed 64-bit values, whose
  // wrap-around UBSan rightly reports.
  alignas(64) uint64_t v[8];
  _mm512_store_si512(v, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t s = sum_words(p + i, n - i);
  for (uint64_t x : v) s += x;
  return s;
}

__attribute__((target("avx2"))) uint64_t sum_words_avx2(const uint64_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) uint64_t v[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(v), _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return v[0] + v[1] + v[2] + v[3] + sum_words(p + i, n - i);
}

}  // namespace

ReadBandwidth measure_read_bandwidth(ThreadPool& pool, uint64_t bytes, int passes) {
  if (bytes < (1u << 20)) throw Error("read bandwidth: buffer must be at least 1 MiB");
  if (passes < 1) throw Error("read bandwidth: at least one pass");
  const size_t words = (size_t)(bytes / 8);
  std::unique_ptr<uint64_t[]> buf(new uint64_t[words]);
  // Distinct values, written once: every page is really backed before timing.
  for (size_t i = 0; i < words; ++i) buf[i] = i * 0x9e3779b97f4a7c15ull;
  std::atomic<uint64_t> sink{0};
  const Isa isa = active_isa();
  auto sum = isa == Isa::Avx512 ? sum_words_avx512 : isa == Isa::Avx2 ? sum_words_avx2 : sum_words;
  auto pass = [&] {
    pool.parallel_for(words, [&](size_t b, size_t e) { sink.fetch_add(sum(buf.get() + b, e - b)); },
                      words / (size_t)pool.size() / 4 + 1);
  };
  pass();
  std::vector<double> g;
  for (int r = 0; r < passes; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    g.push_back((double)words * 8 / s / 1e9);
  }
  std::sort(g.begin(), g.end());
  ReadBandwidth out;
  out.median_gbps = g[g.size() / 2];
  out.min_gbps = g.front();
  out.max_gbps = g.back();
  out.bytes = (uint64_t)words * 8;
  out.passes = passes;
  // The sum is observable, so the reads cannot be optimised away.
  if (sink.load() == 0x5eed) out.passes += 0;
  return out;
}

}  // namespace sluice
