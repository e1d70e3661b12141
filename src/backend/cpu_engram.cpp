// The CPU backend's Engram gate (spec 4.5, docs/numerics.md 8): a scalar gate per stream from
// the normalized dot of the stream with its key, then the gated value added to the stream.
#include <algorithm>
#include <cmath>

#include "backend/cpu_backend.h"
#include "kernels/fp.h"
#include "kernels/numerics.h"

namespace sluice {

void CpuBackend::engram_gate(Mat X, uint32_t hc, CMat kv, const float* q_norm, const float* k_norm, float eps,
                             const uint8_t* masked) const {
  const size_t H = X.width / hc;
  const float inv_sqrt_h = (float)(1.0 / std::sqrt((double)H));
  std::vector<float> wq(H);
  for (uint32_t h = 0; h < hc; ++h) {
    // The elementwise product of the two norm weights is formed first (spec 4.5).
    for (size_t k = 0; k < H; ++k) wq[k] = q_norm[(size_t)h * H + k] * k_norm[(size_t)h * H + k];
    for (size_t i = 0; i < X.n; ++i) {
      float* x = X.row(i) + (size_t)h * H;
      const float* key = kv.row(i) + (size_t)h * H;
      const float* val = kv.row(i) + (size_t)hc * H;
      const float gate = masked && masked[i] ? 0.0f : engram_gate_value(x, key, wq.data(), H, eps, inv_sqrt_h);
      for (size_t k = 0; k < H; ++k) x[k] = round_bf16(x[k] + gate * val[k]);
    }
  }
}

}  // namespace sluice
