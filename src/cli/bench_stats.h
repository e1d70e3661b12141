// Median, min and max of repeated benchmark runs.
#pragma once
#include <algorithm>
#include <vector>

namespace sluice::cli {

struct Figure {
  double median = 0, min = 0, max = 0;
};

inline Figure figure(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return {med, v.front(), v.back()};
}

int resolved_threads(int t);  // 0: all cores

}  // namespace sluice::cli
