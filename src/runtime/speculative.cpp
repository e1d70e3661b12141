#include "runtime/speculative.h"

#include "util/error.h"

namespace sluice {

std::vector<TokenProb> sampling_distribution(std::span<const float> logits, const SamplerOptions& o) {
  if (o.temp == 0.0f) return {TokenProb{argmax_lowest(logits), 1.0}};
  std::vector<TokenProb> d = nucleus(logits, o.temp, o.top_p, o.top_k, o.min_p);
  double sum = 0;
  for (const TokenProb& t : d) sum += t.p;
  for (TokenProb& t : d) t.p /= sum;
  return d;
}

namespace {

// A draw from d without token `skip` (none when skip is out of the vocabulary), renormalised.
TokenId draw(const std::vector<TokenProb>& d, TokenId skip, std::mt19937_64& rng) {
  double mass = 0;
  size_t kept = 0, last = 0;
  for (size_t i = 0; i < d.size(); ++i)
    if (d[i].id != skip && d[i].p > 0) mass += d[i].p, ++kept, last = i;
  if (kept == 0) throw Error("speculative: no token left to sample after removing the rejected draft");
  if (kept == 1) return d[last].id;  // certain: no draw
  const double u = uniform01(rng) * mass;
  double cum = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i].id == skip || d[i].p <= 0) continue;
    cum += d[i].p;
    if (u < cum) return d[i].id;
  }
  return d[last].id;  // rounding left u at the very top
}

}  // namespace

Verdict verify_point_mass(std::span<const std::vector<TokenProb>> p, std::span<const TokenId> drafts,
                          std::mt19937_64& rng) {
  const size_t K = drafts.size();
  if (p.size() != K + 1)
    throw Error("speculative: " + std::to_string(p.size()) + " distributions for " + std::to_string(K) + " drafts");
  for (const std::vector<TokenProb>& d : p)
    if (d.empty()) throw Error("speculative: an empty distribution");
  Verdict v;
  for (size_t i = 0; i < K; ++i) {
    double pd = 0;
    for (const TokenProb& t : p[i])
      if (t.id == drafts[i]) pd = t.p;
    const bool accept = pd >= 1.0 ? true : pd <= 0.0 ? false : uniform01(rng) < pd;
    if (!accept) {
      v.accepted = (uint32_t)i;
      v.next = draw(p[i], drafts[i], rng);
      return v;
    }
  }
  v.accepted = (uint32_t)K;
  v.next = draw(p[K], ~TokenId{0}, rng);
  return v;
}

}  // namespace sluice
