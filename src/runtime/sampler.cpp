#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "util/error.h"

namespace sluice {

namespace {

// "1.5", "0.95", "nan": short enough to read in an error message.
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void in_unit(const std::optional<double>& v, const char* name) {
  if (v && !(*v >= 0 && *v <= 1)) throw Error(std::string(name) + " must be in [0, 1] (got " + num(*v) + ")");
}

}  // namespace

void check_sampling(const SamplingRequest& r) {
  if (r.temperature && !(*r.temperature >= 0 && *r.temperature <= kMaxTemperature))
    throw Error("temperature must be in [0, " + num(kMaxTemperature) + "] (got " + num(*r.temperature) + ")");
  in_unit(r.top_p, "top_p");
  in_unit(r.min_p, "min_p");
  if (r.top_k && (*r.top_k < 0 || *r.top_k > kMaxTopK))
    throw Error("top_k must be an integer in [0, " + std::to_string(kMaxTopK) + "] (got " + std::to_string(*r.top_k) + ")");
  if (r.max_tokens && *r.max_tokens < 1)
    throw Error("max_tokens must be at least 1 (got " + std::to_string(*r.max_tokens) + ")");
}

void validate(const SamplerOptions& o) {
  SamplingRequest r;
  r.temperature = o.temp;
  r.top_p = o.top_p;
  r.min_p = o.min_p;
  r.top_k = o.top_k;
  check_sampling(r);
}

TokenId argmax_lowest(std::span<const float> logits) {
  bool found = false;
  TokenId best = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    // Strictly greater: an equal value later in the row never displaces the lower id.
    if (!found || logits[i] > logits[best]) best = (TokenId)i, found = true;
  }
  if (!found) throw Error("sampler: no usable logit (" + std::to_string(logits.size()) + " entries, all NaN or none)");
  return best;
}

std::vector<TokenProb> nucleus(std::span<const float> logits, float temp, float top_p, uint32_t top_k,
                               float min_p) {
  validate(SamplerOptions{temp, top_p, 0, top_k, min_p});
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
    if (e > 0) v.push_back({(TokenId)i, e});
    sum += e;
  }
  for (TokenProb& t : v) t.p /= sum;
  std::sort(v.begin(), v.end(), [](const TokenProb& a, const TokenProb& b) {
    return a.p != b.p ? a.p > b.p : a.id < b.id;
  });
  if (top_k > 0 && v.size() > top_k) v.resize(top_k);
  double cum = 0;
  for (size_t k = 0; k < v.size(); ++k) {
    cum += v[k].p;
    if (cum >= (double)top_p) {
      v.resize(k + 1);
      break;
    }
  }
  // The first token always stays (p >= min_p * p for min_p <= 1).
  const double floor_p = (double)min_p * v.front().p;
  size_t keep = 1;
  while (keep < v.size() && v[keep].p >= floor_p) ++keep;
  v.resize(keep);
  return v;
}

double uniform01(std::mt19937_64& rng) {
  return (double)(rng() >> 11) * 0x1.0p-53;
}

Sampler::Sampler(const SamplerOptions& o) : opt_(o), rng_(o.seed) { validate(o); }

TokenId Sampler::sample(std::span<const float> logits) {
  if (opt_.temp == 0) return argmax_lowest(logits);
  const std::vector<TokenProb> keep = nucleus(logits, opt_.temp, opt_.top_p, opt_.top_k, opt_.min_p);
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
