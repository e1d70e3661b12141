// The CPU backend's feed-forward ops: the shared expert and the routed experts with the
// clamped SwiGLU (spec 3.6, docs/numerics.md 7).
#include <algorithm>

#include "backend/cpu_backend.h"
#include "backend/cpu_linear.h"
#include "backend/routed_terms.h"
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
  swiglu_rows(g.data(), F, u.data(), F, n, F, limit, nullptr);
  lin(pool_, down, g.data(), F, n, out.p, out.stride, true, 0, down.rows);
}

void CpuBackend::expert_projection(const Weight& part, const uint8_t* data, std::span<const uint8_t* const> acts,
                                   float* y) const {
  Weight W = part;
  W.data = data;
  matmul(pool_, W, acts, y, W.rows, true, 0, W.rows);
}

// The CPU's projections: matmul over the expert's bytes as the source returns them. Every expert
// is prepared at once; get() is asked for each in order (a windowed source moves on).
template <class Take>
void CpuBackend::routed_terms(ExpertTensors t, const ExpertSource& src, uint32_t layer,
                              std::span<const ExpertTriple> triples, float limit, CMat x, Take&& take) const {
  src.prepare(layer, experts_of(triples));
  const Weight* parts[3] = {t.gate, t.up, t.down};
  auto project = [&](const ExpertWeights& ew, int part, std::span<const uint8_t* const> acts, float* y) {
    expert_projection(*parts[part], part == 0 ? ew.gate : part == 1 ? ew.up : ew.down, acts, y);
  };
  using Job = ExpertJob<ExpertWeights>;
  sluice::routed_terms(
      t, triples, limit, x, ExpertGrouping{}, [&](uint32_t e) { return src.get(layer, e); },
      [&](std::span<Job> jobs) {
        for (Job& j : jobs)
          for (int part = 0; part < 2; ++part) project(j.h, part, j.acts[part], j.y[part]);
      },
      [&](std::span<Job> jobs) {
        for (Job& j : jobs) project(j.h, 2, j.down_acts, j.down_y);
      },
      take);
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
