#include "kernels/gemm_float_blocked.h"

#include <algorithm>

namespace sluice {

void gemm_float_blocked(FloatTilePick pick, int rows, int tokens, const void* w, size_t w_stride, int64_t nrows,
                        const uint8_t* const* acts, int64_t nacts, int64_t n, float* y, size_t ldy) {
  constexpr int64_t kActBlockBytes = 768 * 1024;
  const auto* wb = static_cast<const uint8_t*>(w);
  const int64_t block = std::max<int64_t>(tokens, kActBlockBytes / std::max<int64_t>(n * 4, 1) / tokens * tokens);
  for (int64_t t0 = 0; t0 < nacts; t0 += block) {
    const int64_t t1 = std::min(nacts, t0 + block);
    for (int64_t r = 0; r < nrows; r += rows) {
      const int rr = (int)std::min<int64_t>(rows, nrows - r);
      for (int64_t t = t0; t < t1; t += tokens) {
        const int tt = (int)std::min<int64_t>(tokens, t1 - t);
        const float* x[kMaxFloatTileTokens];
        for (int j = 0; j < tt; ++j) x[j] = reinterpret_cast<const float*>(acts[t + j]);
        pick(rr, tt)(wb + (size_t)r * w_stride, w_stride, x, n, y + (size_t)t * ldy + (size_t)r, ldy);
      }
    }
  }
}

}  // namespace sluice
