// Timing shared by the micro-benchmarks: the median of repeated passes with min and max, and the
// memcpy bandwidth they report as their same-run memory baseline.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

namespace sluice::bench {

struct Stat {
  double med = 0, lo = 0, hi = 0;  // seconds
};

// One warm-up pass (page faults, caches, frequency), then reps timed passes.
template <class F>
Stat time_reps(int reps, F&& pass) {
  pass();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front(), t.back()};
}

// GB/s of memcpy over a buffer of `bytes` (bytes copied per second), median of reps passes.
inline double memcpy_gbs(size_t bytes, int reps) {
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
  const Stat s = time_reps(reps, [&] {
    std::memcpy(dst.data(), src.data(), bytes);
    src[0] = (uint8_t)(src[0] + dst[bytes - 1]);  // keep the copy observable
  });
  return (double)bytes / s.med / 1e9;
}

}  // namespace sluice::bench
