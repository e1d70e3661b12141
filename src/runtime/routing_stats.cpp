#include "runtime/routing_stats.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace sluice {

namespace {

// Entropy of the popularity and the top decile's share, from the selection counts.
void popularity(std::vector<uint64_t> counts, LayerRouting& r) {
  const double total = (double)r.selections;
  if (total == 0 || counts.empty()) return;
  double h = 0;
  for (uint64_t c : counts)
    if (c) h -= (double)c / total * std::log2((double)c / total);
  r.entropy_bits = h;
  r.entropy_norm = counts.size() > 1 ? h / std::log2((double)counts.size()) : 0.0;
  std::sort(counts.begin(), counts.end(), std::greater<>());
  uint64_t top = 0;
  for (uint32_t i = 0; i < top_decile_count((uint32_t)counts.size()); ++i) top += counts[i];
  r.top10_share = (double)top / total;
}

double median(std::vector<uint64_t> v) {
  if (v.empty()) return 0;
  const size_t h = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + h, v.end());
  if (v.size() % 2) return (double)v[h];
  const uint64_t upper = v[h];
  return ((double)*std::max_element(v.begin(), v.begin() + h) + (double)upper) / 2;
}

size_t common(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  size_t n = 0;
  for (uint32_t e : a) n += std::count(b.begin(), b.end(), e) ? 1 : 0;
  return n;
}

// One layer's figures over the whole trace.
LayerRouting layer_stats(const storage::RoutingTrace& sel, const storage::RoutingTrace& guess, uint32_t L,
                         uint32_t n_expert) {
  LayerRouting r;
  std::vector<uint64_t> counts(n_expert, 0), distances;
  std::vector<int64_t> last(n_expert, -1);
  double overlap_sum = 0;
  uint64_t overlap_tokens = 0;
  for (size_t t = 0; t < sel.size(); ++t) {
    const std::vector<uint32_t>& s = sel[t][L];
    for (uint32_t e : s) {
      ++counts[e];
      ++r.selections;
      if (last[e] >= 0) distances.push_back(t - (uint64_t)last[e]);
      last[e] = (int64_t)t;
    }
    if (t > 0 && !s.empty()) {
      overlap_sum += (double)common(s, sel[t - 1][L]) / (double)s.size();
      ++overlap_tokens;
    }
    if (!guess.empty() && L > 0 && !guess[t][L].empty()) {
      r.guessed += guess[t][L].size();
      r.selected_with_guess += s.size();
      r.guess_hits += common(s, guess[t][L]);
    }
  }
  popularity(counts, r);
  r.reuses = distances.size();
  if (!distances.empty()) {
    double sum = 0;
    for (uint64_t d : distances) sum += (double)d;
    r.reuse_mean = sum / (double)distances.size();
    r.reuse_median = median(std::move(distances));
  }
  r.prev_overlap = overlap_tokens ? overlap_sum / (double)overlap_tokens : 0.0;
  return r;
}

}  // namespace

uint32_t top_decile_count(uint32_t n_expert) { return std::max(1u, (n_expert + 9) / 10); }

std::vector<LayerRouting> routing_stats(const storage::RoutingTrace& selected, const storage::RoutingTrace& guessed,
                                        uint32_t n_layer, uint32_t n_expert) {
  std::vector<LayerRouting> out;
  for (uint32_t L = 0; L < n_layer; ++L) out.push_back(layer_stats(selected, guessed, L, n_expert));
  return out;
}

UniformRouting uniform_routing(uint32_t n_expert, uint32_t top_k) {
  const double n = n_expert, k = top_k;
  return UniformRouting{top_decile_count(n_expert) / n, n / k, k / n};
}

}  // namespace sluice
