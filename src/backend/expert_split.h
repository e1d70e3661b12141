// The CPU's share of a device's routed-expert misses (--cpu-experts F|auto). An expert without a
// device slot costs an upload before the device can run it; the CPU can run it instead, straight
// from the host store's memory, while the device runs the rest of the layer (the split Strata
// measured worth a few percent on a PCIe card). Either side computes the expert's sums with the
// same bits (docs/backends.md), so the split changes time, never a result.
//
// Fixed F: of each layer call's misses, F of them go to the CPU, the remainder carried to the next
// call so the share over a run is F. auto: a cost model from times measured in the run, per
// expert: U the upload into a slot, D the device's projections, C the CPU's. The uploads come
// first and the CPU's projections overlap the device's, so a call with h slot hits and m misses
// of which k run on the CPU takes about U (m - k) + max(D (h + m - k), C k); auto takes the k that
// minimises it (the smallest of equals: an expert uploaded now may be a hit later). Until the CPU
// and the device each have a measurement, it splits the misses in half to get them, and every
// kRemeasureEvery calls a side the model leaves idle gets one expert, to be measured again.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace sluice {

struct ExpertSplitCosts {
  double upload = 0, device = 0, cpu = 0;  // seconds per expert; 0: not measured yet
};

class ExpertSplit {
 public:
  // share in [0, 1]; auto_share: the cost model instead of share.
  ExpertSplit(double share, bool auto_share) : share_(share), auto_(auto_share) {}
  bool active() const { return auto_ || share_ > 0; }

  // How many of a call's m misses run on the CPU (h: its slot hits).
  size_t cpu_count(size_t hits, size_t misses);
  // The k misses with the fewest tokens in `triples` (sorted by expert; a projection over many tokens is the
  // device's strength; one over a token or two is a read of the weights either way), ascending
  // expert ids on ties; returned ascending.
  static std::vector<uint32_t> pick(std::span<const ExpertTriple> triples, std::span<const uint32_t> misses, size_t k);

  // Measurements: seconds spent on `n` experts. Each moves its figure a quarter of the way.
  void upload_took(double s, size_t n) { blend(costs_.upload, s, n); }
  void device_took(double s, size_t n) { blend(costs_.device, s, n); }
  void cpu_took(double s, size_t n) { blend(costs_.cpu, s, n); }
  const ExpertSplitCosts& costs() const { return costs_; }
  // The cost model's k for (h, m) with these costs (auto after both sides were measured).
  static size_t best_k(const ExpertSplitCosts& c, size_t hits, size_t misses);
  // auto: every this many decided calls, a side the model would leave idle gets one expert.
  static constexpr uint64_t kRemeasureEvery = 64;

 private:
  static void blend(double& v, double s, size_t n) {
    if (n == 0 || s < 0) return;
    const double x = s / (double)n;
    v = v == 0 ? x : 0.75 * v + 0.25 * x;
  }
  double share_ = 0;
  bool auto_ = false;
  double carry_ = 0;  // fixed share: the fraction of an expert owed to the CPU
  uint64_t decided_ = 0;  // auto: calls the cost model decided
  ExpertSplitCosts costs_;
};

}  // namespace sluice
