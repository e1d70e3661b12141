// 16 scores per step: two ordered compares (false for NaN) and a compress-store of their indices.
#include "kernels/avx512_intrinsics.h"

#include <limits>

#include "kernels/topk_collect.h"

namespace sluice {

size_t topk_collect_avx512(const float* s, size_t n, float t, int32_t* out) {
  const __m512 vt = _mm512_set1_ps(t), ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512i step = _mm512_set1_epi32(16);
  __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  size_t c = 0, j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 v = _mm512_loadu_ps(s + j);
    const __mmask16 m = _mm512_cmp_ps_mask(v, vt, _CMP_GE_OQ) & _mm512_cmp_ps_mask(v, ninf, _CMP_GT_OQ);
    _mm512_mask_compressstoreu_epi32(out + c, m, idx);
    c += (size_t)__builtin_popcount(m);
    idx = _mm512_add_epi32(idx, step);
  }
  for (; j < n; ++j)
    if (s[j] >= t && s[j] > -std::numeric_limits<float>::infinity()) out[c++] = (int32_t)j;
  return c;
}

}  // namespace sluice
