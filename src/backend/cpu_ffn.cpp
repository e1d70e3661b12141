// The CPU backend's feed-forward ops: the shared expert and the routed experts with the
// clamped SwiGLU (spec 3.6, docs/numerics.md 7).
#include <algorithm>

#include "backend/cpu_backend.h"
#include "backend/cpu_linear.h"
#include "backend/swiglu.h"
#include "kernels/fp.h"
#include "kernels/numerics.h"
#include "util/error.h"

namespace sluice {

void CpuBackend::shared_ffn(const Weight& gate, const Weight& up, const Weight& down, float limit, CMat x,
                            Mat out) const {
  const size_t n = x.n, F = gate.rows;
  std::vector<float> g(n * F), u(n * F);
  lin(pool_, gate, x.p, x.stride, n, g.data(), F, true, 0, F);
  lin(pool_, up, x.p, x.stride, n, u.data(), F, true, 0, F);
  for (size_t k = 0; k < g.size(); ++k) g[k] = swiglu(g[k], u[k], limit, 1.0f);
  lin(pool_, down, g.data(), F, n, out.p, out.stride, true, 0, down.rows);
}

template <class Take>
void CpuBackend::routed_terms(ExpertTensors t, const ExpertSource& src, uint32_t layer,
                              std::span<const ExpertTriple> triples, float limit, CMat x, Take&& take) const {
  const size_t H = x.width, F = t.gate->rows;
  // Activations are quantized once per token for every expert that uses them.
  const ActRows xg = quantize_rows(t.gate->act(), x.p, x.stride, x.n, H);
  const bool same = t.up->act() == t.gate->act();
  const ActRows xu = same ? ActRows{} : quantize_rows(t.up->act(), x.p, x.stride, x.n, H);
  const ActRows& xu_ref = same ? xg : xu;
  std::vector<float> eg, eu, ed;
  std::vector<const uint8_t*> ag, au, ad;
  for (size_t b = 0; b < triples.size();) {
    size_t e_end = b;
    while (e_end < triples.size() && triples[e_end].expert == triples[b].expert) ++e_end;
    const ExpertWeights ew = src.get(layer, triples[b].expert);
    Weight Wg = *t.gate, Wu = *t.up, Wd = *t.down;
    Wg.data = ew.gate;
    Wu.data = ew.up;
    Wd.data = ew.down;
    const size_t ne = e_end - b;
    ag.resize(ne);
    au.resize(ne);
    for (size_t j = 0; j < ne; ++j) {
      ag[j] = xg.row(triples[b + j].token);
      au[j] = xu_ref.row(triples[b + j].token);
    }
    eg.resize(ne * F);
    eu.resize(ne * F);
    matmul(pool_, Wg, ag, eg.data(), F, true, 0, F);
    matmul(pool_, Wu, au, eu.data(), F, true, 0, F);
    for (size_t j = 0; j < ne; ++j)
      for (size_t k = 0; k < F; ++k) eg[j * F + k] = swiglu(eg[j * F + k], eu[j * F + k], limit, triples[b + j].weight);
    const ActRows hq = quantize_rows(Wd.act(), eg.data(), F, ne, F);
    ad.resize(ne);
    for (size_t j = 0; j < ne; ++j) ad[j] = hq.row(j);
    ed.resize(ne * H);
    matmul(pool_, Wd, ad, ed.data(), H, true, 0, H);
    for (size_t j = 0; j < ne; ++j) take(b + j, ed.data() + j * H);
    b = e_end;
  }
}

void CpuBackend::routed_ffn(ExpertTensors t, const ExpertSource& src, uint32_t layer,
                            std::span<const ExpertTriple> triples, float limit, CMat x, Mat routed) const {
  const size_t H = x.width;
  routed_terms(t, src, layer, triples, limit, x, [&](size_t j, const float* d) {
    float* ri = routed.row(triples[j].token);
    for (size_t k = 0; k < H; ++k) ri[k] += d[k];
  });
}

void CpuBackend::routed_ffn_rows(ExpertTensors t, const ExpertSource& src, uint32_t layer,
                                 std::span<const ExpertTriple> triples, float limit, CMat x, Mat rows) const {
  if (rows.n != triples.size() || rows.width != x.width) throw Error("routed_ffn_rows: shapes differ");
  routed_terms(t, src, layer, triples, limit, x,
               [&](size_t j, const float* d) { std::copy(d, d + x.width, rows.row(j)); });
}

}  // namespace sluice
