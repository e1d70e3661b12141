// The clamped SwiGLU of the experts (spec 3.6, docs/numerics.md 7), one definition for every
// backend's FFN ops so that they compute the same bits.
#pragma once
#include <algorithm>

#include "kernels/fp.h"
#include "kernels/numerics.h"

namespace sluice {

// h = bf16(silu(min(g, lim)) * clamp(u, -lim, lim) * wk); g and u are BF16 already.
inline float swiglu(float g, float u, float lim, float wk) {
  g = std::min(g, lim);
  u = std::clamp(u, -lim, lim);
  return round_bf16((silu(g) * u) * wk);
}

// n rows: h = swiglu(g, u, lim, w[t]) written over g (w null: weight 1), `width` values a row,
// g's rows g_stride floats apart, u's u_stride. The host's SwiGLU wherever a backend runs it.
inline void swiglu_rows(float* g, size_t g_stride, const float* u, size_t u_stride, size_t n, size_t width, float lim,
                        const float* w) {
  for (size_t t = 0; t < n; ++t)
    for (size_t k = 0; k < width; ++k)
      g[t * g_stride + k] = swiglu(g[t * g_stride + k], u[t * u_stride + k], lim, w ? w[t] : 1.0f);
}

}  // namespace sluice
