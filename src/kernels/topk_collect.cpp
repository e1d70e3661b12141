#include "kernels/topk_collect.h"

#include <limits>

namespace sluice {

size_t topk_collect(const float* s, size_t n, float t, int32_t* out) {
  size_t c = 0;
  for (size_t j = 0; j < n; ++j)
    if (s[j] >= t && s[j] > -std::numeric_limits<float>::infinity()) out[c++] = (int32_t)j;
  return c;
}

TopkCollectFn topk_collect_for(Isa isa) { return isa == Isa::Avx512 ? topk_collect_avx512 : topk_collect; }

}  // namespace sluice
