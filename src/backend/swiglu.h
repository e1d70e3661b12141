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

}  // namespace sluice
