#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "util/error.h"

namespace sluice {

void validate(const SamplerOptions& o) {
  if (!std::isfinite(o.temp) || o.temp < 0)
    throw Error("temperature must be a finite number >= 0 (got " + std::to_string(o.temp) + ")");
  if (!(o.top_p > 0 && o.top_p <= 1))
    throw Error("top-p must be in (0, 1] (got " + std::to_string(o.top_p) + ")");
}

uint32_t argmax_lowest(std::span<const float> logits) {
  bool found = false;
  uint32_t best = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    // Strictly greater: an equal value later in the row never displaces the lower id.
    if (!found || logits[i] > logits[best]) best = (uint32_t)i, found = true;
  }
  if (!found) throw Error("sampler: no usable logit (" + std::to_string(logits.size()) + " entries, all NaN or none)");
  return best;
}

std::vector<TokenProb> nucleus(std::span<const float> logits, float temp, float top_p) {
  validate(SamplerOptions{temp, top_p, 0});
  if (temp == 0) throw Error("sampler: nucleus needs a temperature > 0");
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity())
      throw Error("sampler: logit " + std::to_string(i) + " is not finite");
    mx = std::max(mx, (double)logits[i]);
  }
  if (std::isinf(mx)) throw Error("sampler: every logit is -inf");

  std::vector<TokenProb> v;
  v.reserve(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    // Shift by the max first: exp never overflows, and the max token gets exactly 1.
    const double e = std::exp(((double)logits[i] - mx) / (double)temp);
    if (e > 0) v.push_back({(uint32_t)i, e});
    sum += e;
  }
  for (TokenProb& t : v) t.p /= sum;
  std::sort(v.begin(), v.end(), [](const TokenProb& a, const TokenProb& b) {
    return a.p != b.p ? a.p > b.p : a.id < b.id;
  });
  double cum = 0;
  for (size_t k = 0; k < v.size(); ++k) {
    cum += v[k].p;
    if (cum >= (double)top_p) {
      v.resize(k + 1);
      break;
    }
  }
  return v;
}

double uniform01(std::mt19937_64& rng) {
  return (double)(rng() >> 11) * 0x1.0p-53;
}

Sampler::Sampler(const SamplerOptions& o) : opt_(o), rng_(o.seed) { validate(o); }

uint32_t Sampler::sample(std::span<const float> logits) {
  if (opt_.temp == 0) return argmax_lowest(logits);
  const std::vector<TokenProb> keep = nucleus(logits, opt_.temp, opt_.top_p);
  double mass = 0;
  for (const TokenProb& t : keep) mass += t.p;
  // Inverse CDF over the kept tokens in nucleus order (renormalised by their mass).
  const double u = uniform01(rng_) * mass;
  double cum = 0;
  for (const TokenProb& t : keep) {
    cum += t.p;
    if (u < cum) return t.id;
  }
  return keep.back().id;  // u landed in the rounding gap at the very end
}

}  // namespace sluice
