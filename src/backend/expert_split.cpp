#include "backend/expert_split.h"

#include <algorithm>
#include <cmath>

namespace sluice {

size_t ExpertSplit::cpu_count(size_t hits, size_t misses) {
  if (misses == 0) return 0;
  if (!auto_) {
    carry_ += share_ * (double)misses;
    const size_t k = std::min(misses, (size_t)std::floor(carry_ + 1e-9));
    carry_ = std::max(0.0, carry_ - (double)k);
    return k;
  }
  if (costs_.cpu == 0) return (misses + 1) / 2;  // measure the CPU (at least one expert)
  if (costs_.device == 0) return misses / 2;     // and the device (at least one when m > 1)
  size_t k = best_k(costs_, hits, misses);
  // A side the model keeps idle is measured again now and then, or one slow first figure (a
  // cold start) would decide for the rest of the run.
  if (++decided_ % kRemeasureEvery == 0) {
    if (k == misses && hits == 0) k = misses - 1;
    else if (k == 0) k = 1;
  }
  return k;
}

size_t ExpertSplit::best_k(const ExpertSplitCosts& c, size_t hits, size_t misses) {
  size_t best = 0;
  double best_t = 0;
  for (size_t k = 0; k <= misses; ++k) {
    const double t = c.upload * (double)(misses - k) + std::max(c.device * (double)(hits + misses - k), c.cpu * (double)k);
    if (k == 0 || t < best_t) {
      best = k;
      best_t = t;
    }
  }
  return best;
}

std::vector<uint32_t> ExpertSplit::pick(std::span<const ExpertTriple> triples, std::span<const uint32_t> misses,
                                        size_t k) {
  // The triples are sorted by expert (backend.h), so each miss's tokens are one run of them.
  std::vector<std::pair<size_t, uint32_t>> order;  // (tokens, expert)
  order.reserve(misses.size());
  for (const uint32_t e : misses) {
    const auto run = std::equal_range(triples.begin(), triples.end(), ExpertTriple{e, 0, 0},
                                      [](const ExpertTriple& a, const ExpertTriple& b) { return a.expert < b.expert; });
    order.push_back({(size_t)(run.second - run.first), e});
  }
  std::sort(order.begin(), order.end());
  order.resize(std::min(k, order.size()));
  std::vector<uint32_t> out;
  out.reserve(order.size());
  for (const auto& [n, e] : order) out.push_back(e);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace sluice
