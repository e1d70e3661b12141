// The routed FFN's operation sequence, written once for every backend (spec 3.6, numerics.md 7):
// experts in triple order (ascending), each over its tokens in order: gate and up projections of
// the token rows (quantized once per token for all experts), the clamped SwiGLU times the routing
// weight, the hidden rows quantized for the down projection, the down projection; each triple's
// term is handed to take(j, row) in triple order. Where the weights live and how a projection
// runs is the backend's: `expert(e)` returns its handle to expert e's weights (called once per
// expert, in order, after the previous expert's projections are done), `project(h, part, acts,
// stride, y, rows)` writes y[t * rows + r] = row r of part (0 gate, 1 up, 2 down) dotted with
// acts[t], rounded to BF16, with the CPU's bits. The gate and up projections of an expert read
// the same token rows and neither needs the other, so they are asked for together:
// `gate_up(h, acts, strides, y, rows)` does parts 0 and 1 (acts[i], strides[i], y[i] for part i),
// in one round trip where the backend can (gate_up_by_parts adapts a backend that cannot).
#pragma once
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu_linear.h"
#include "backend/swiglu.h"

namespace sluice {

// gate_up for a backend whose projections run one at a time.
template <class Project>
auto gate_up_by_parts(Project& project) {
  return [&project](const auto& h, std::span<const uint8_t* const> acts[2], const size_t strides[2], float* y[2],
                    size_t rows) {
    for (int i = 0; i < 2; ++i) project(h, i, acts[i], strides[i], y[i], rows);
  };
}

template <class Expert, class GateUp, class Project, class Take>
void routed_terms(ExpertTensors t, std::span<const ExpertTriple> triples, float limit, CMat x, Expert&& expert,
                  GateUp&& gate_up, Project&& project, Take&& take) {
  const size_t H = x.width, F = t.gate->rows;
  const ActRows xg = quantize_rows(t.gate->act(), x.p, x.stride, x.n, H);
  const bool same = t.up->act() == t.gate->act();
  const ActRows xu = same ? ActRows{} : quantize_rows(t.up->act(), x.p, x.stride, x.n, H);
  const ActRows& xu_ref = same ? xg : xu;
  std::vector<float> eg, eu, ed;
  std::vector<const uint8_t*> ag, au, ad;
  for (size_t b = 0; b < triples.size();) {
    size_t e_end = b;
    while (e_end < triples.size() && triples[e_end].expert == triples[b].expert) ++e_end;
    const auto h = expert(triples[b].expert);
    const size_t ne = e_end - b;
    ag.resize(ne);
    au.resize(same ? 0 : ne);
    for (size_t j = 0; j < ne; ++j) {
      ag[j] = xg.row(triples[b + j].token);
      if (!same) au[j] = xu.row(triples[b + j].token);
    }
    eg.resize(ne * F);
    eu.resize(ne * F);
    std::span<const uint8_t* const> acts[2] = {ag, same ? ag : au};  // one span when both read one format
    const size_t strides[2] = {xg.stride, xu_ref.stride};
    float* ys[2] = {eg.data(), eu.data()};
    gate_up(h, acts, strides, ys, F);
    for (size_t j = 0; j < ne; ++j)
      for (size_t k = 0; k < F; ++k) eg[j * F + k] = swiglu(eg[j * F + k], eu[j * F + k], limit, triples[b + j].weight);
    const ActRows hq = quantize_rows(t.down->act(), eg.data(), F, ne, F);
    ad.resize(ne);
    for (size_t j = 0; j < ne; ++j) ad[j] = hq.row(j);
    ed.resize(ne * H);
    project(h, 2, std::span<const uint8_t* const>(ad), hq.stride, ed.data(), H);
    for (size_t j = 0; j < ne; ++j) take(b + j, ed.data() + j * H);
    b = e_end;
  }
}

// The distinct experts of triples sorted by expert, ascending.
inline std::vector<uint32_t> experts_of(std::span<const ExpertTriple> triples) {
  std::vector<uint32_t> used;
  for (const ExpertTriple& t : triples)
    if (used.empty() || used.back() != t.expert) used.push_back(t.expert);
  return used;
}

}  // namespace sluice
