// The routed FFN's operation sequence, written once for every backend (spec 3.6, numerics.md 7):
// experts in triple order (ascending), each over its tokens in order: gate and up projections of
// the token rows (quantized once per token for all experts), the clamped SwiGLU times the routing
// weight, the hidden rows quantized for the down projection, the down projection; each triple's
// term is handed to take(j, row) in triple order. Where the weights live and how a projection
// runs is the backend's: `expert(e)` returns its handle to expert e's weights (called once per
// expert, in order, after the previous expert's projections are done), `project(h, part, acts,
// stride, y, rows)` writes y[t * rows + r] = row r of part (0 gate, 1 up, 2 down) dotted with
// acts[t], rounded to BF16, with the CPU's bits.
#pragma once
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu_linear.h"
#include "backend/swiglu.h"

namespace sluice {

template <class Expert, class Project, class Take>
void routed_terms(ExpertTensors t, std::span<const ExpertTriple> triples, float limit, CMat x, Expert&& expert,
                  Project&& project, Take&& take) {
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
    au.resize(ne);
    for (size_t j = 0; j < ne; ++j) {
      ag[j] = xg.row(triples[b + j].token);
      au[j] = xu_ref.row(triples[b + j].token);
    }
    eg.resize(ne * F);
    eu.resize(ne * F);
    project(h, 0, std::span<const uint8_t* const>(ag), xg.stride, eg.data(), F);
    project(h, 1, std::span<const uint8_t* const>(au), xu_ref.stride, eu.data(), F);
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
