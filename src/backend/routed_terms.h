// The routed FFN's operation sequence, written once for every backend (spec 3.6, numerics.md 7):
// experts in triple order (ascending), each over its tokens in order: gate and up projections of
// the token rows (quantized once per token for all experts), the clamped SwiGLU times the routing
// weight, the hidden rows quantized for the down projection, the down projection; each triple's
// term is handed to take(j, row) in triple order. Where the weights live and how a projection
// runs is the backend's. Experts go in groups (ExpertGrouping): `expert(e)` returns the backend's
// handle to expert e's weights (called once per expert, in order, for a whole group, after the
// previous group's projections are done); `gate_up(jobs)` then writes every job's gate and up
// outputs and, after the SwiGLU, `down(jobs)` its down outputs: row r of the part dotted with
// each token's activation row, rounded to BF16, with the CPU's bits. Each expert's sums are its
// own, so how many share a group changes no bit. A handle with a true `ends_group` member is
// the last of its group. A handle with a true `fused` member is an expert whose gate_up() call
// also computes the SwiGLU (with `weights`, `limit`), the down projection's activations and the
// down projection itself, writing down_y: the host's SwiGLU and quantization skip it, and down()
// has nothing left to do for it.
#pragma once
#include <algorithm>
#include <span>
#include <type_traits>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu_linear.h"
#include "backend/swiglu.h"

namespace sluice {

// The distinct experts of triples sorted by expert, ascending.
inline std::vector<uint32_t> experts_of(std::span<const ExpertTriple> triples) {
  std::vector<uint32_t> used;
  for (const ExpertTriple& t : triples)
    if (used.empty() || used.back() != t.expert) used.push_back(t.expert);
  return used;
}

// One expert's projections within a group: its handle, its tokens' rows for the gate and up
// projections (one span when both read one activation format) and for the down projection, and
// where each writes (n x F floats for gate and up, n x H for down).
template <class Handle>
struct ExpertJob {
  Handle h{};
  size_t n = 0;
  std::span<const uint8_t* const> acts[2];
  size_t strides[2] = {0, 0};
  float* y[2] = {nullptr, nullptr};
  std::span<const uint8_t* const> down_acts;
  size_t down_stride = 0;
  float* down_y = nullptr;   // n x H, set with the job (a fused expert writes it in gate_up)
  std::span<const float> weights;  // each token's routing weight
};

// How many experts a backend takes at once: at most max_experts, whose float intermediates
// (n x (2F + H) x 4 bytes each) stay within max_bytes; a group always takes at least one. The CPU
// takes one (each projection is already a GEMM over the expert's tokens); a device takes a
// layer's experts in a few round trips instead of two per expert.
struct ExpertGrouping {
  size_t max_experts = 1;
  uint64_t max_bytes = 0;
};

template <class Expert, class GateUp, class Down, class Take>
void routed_terms(ExpertTensors t, std::span<const ExpertTriple> triples, float limit, CMat x, ExpertGrouping grouping,
                  Expert&& expert, GateUp&& gate_up, Down&& down, Take&& take) {
  using Handle = std::decay_t<decltype(expert(uint32_t{}))>;
  const size_t H = x.width, F = t.gate->rows;
  const ActRows xg = quantize_rows(t.gate->act(), x.p, x.stride, x.n, H);
  const bool same = t.up->act() == t.gate->act();
  const ActRows xu = same ? ActRows{} : quantize_rows(t.up->act(), x.p, x.stride, x.n, H);
  struct Rows {  // one job's buffers, reused group after group
    std::vector<const uint8_t*> ag, au, ad;
    std::vector<float> eg, eu, ed, w;
    ActRows hq;
  };
  const size_t max_experts = std::max<size_t>(1, grouping.max_experts);
  std::vector<Rows> rows(std::min(max_experts, experts_of(triples).size()));
  std::vector<ExpertJob<Handle>> jobs;
  std::vector<size_t> first;  // each job's first triple
  for (size_t b = 0; b < triples.size();) {
    jobs.clear();
    first.clear();
    uint64_t bytes = 0;
    while (b < triples.size() && jobs.size() < max_experts) {
      size_t e_end = b;
      while (e_end < triples.size() && triples[e_end].expert == triples[b].expert) ++e_end;
      const size_t ne = e_end - b;
      const uint64_t need = (uint64_t)ne * (2 * F + H) * sizeof(float);
      if (!jobs.empty() && bytes + need > grouping.max_bytes) break;
      bytes += need;
      Rows& r = rows[jobs.size()];
      ExpertJob<Handle>& j = jobs.emplace_back();
      first.push_back(b);
      j.h = expert(triples[b].expert);
      j.n = ne;
      r.ag.resize(ne);
      r.au.resize(same ? 0 : ne);
      for (size_t k = 0; k < ne; ++k) {
        r.ag[k] = xg.row(triples[b + k].token);
        if (!same) r.au[k] = xu.row(triples[b + k].token);
      }
      // A fused expert's gate and up outputs stay with the backend (the same bytes, its scratch).
      bool fused = false;
      if constexpr (requires { j.h.fused; }) fused = j.h.fused;
      r.eg.resize(fused ? 0 : ne * F);
      r.eu.resize(fused ? 0 : ne * F);
      j.acts[0] = r.ag;
      j.acts[1] = same ? std::span<const uint8_t* const>(r.ag) : std::span<const uint8_t* const>(r.au);
      j.strides[0] = xg.stride;
      j.strides[1] = same ? xg.stride : xu.stride;
      j.y[0] = fused ? nullptr : r.eg.data();
      j.y[1] = fused ? nullptr : r.eu.data();
      r.ed.resize(ne * H);
      j.down_y = r.ed.data();
      r.w.resize(ne);
      for (size_t k = 0; k < ne; ++k) r.w[k] = triples[b + k].weight;
      j.weights = r.w;
      b = e_end;
      // A handle that holds the source's own pointers (the CPU's share of a device's misses)
      // ends its group: the next expert's get() may move a windowed source on.
      if constexpr (requires { j.h.ends_group; })
        if (j.h.ends_group) break;
    }
    gate_up(std::span<ExpertJob<Handle>>(jobs));
    for (size_t i = 0; i < jobs.size(); ++i) {
      Rows& r = rows[i];
      ExpertJob<Handle>& j = jobs[i];
      if constexpr (requires { j.h.fused; })
        if (j.h.fused) continue;
      swiglu_rows(r.eg.data(), F, r.eu.data(), F, j.n, F, limit, j.weights.data());
      r.hq = quantize_rows(t.down->act(), r.eg.data(), F, j.n, F);
      r.ad.resize(j.n);
      for (size_t k = 0; k < j.n; ++k) r.ad[k] = r.hq.row(k);
      j.down_acts = r.ad;
      j.down_stride = r.hq.stride;
    }
    down(std::span<ExpertJob<Handle>>(jobs));
    for (size_t i = 0; i < jobs.size(); ++i)
      for (size_t k = 0; k < jobs[i].n; ++k) take(first[i] + k, rows[i].ed.data() + k * H);
  }
}

}  // namespace sluice
