#include "kernels/peak_loops.h"

#include "kernels/avx512_intrinsics.h"

namespace sluice {

// Ten chains: more than latency x throughput of either instruction on current cores.
uint32_t peak_loop_vnni_avx512(size_t iters) {
  __m512i a[10];
  for (int i = 0; i < 10; ++i) a[i] = _mm512_set1_epi32(i);
  const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(5);
  for (size_t k = 0; k < iters; ++k)
    for (int i = 0; i < 10; ++i) a[i] = _mm512_dpbusd_epi32(a[i], x, y);
  uint32_t r = 0;
  for (int i = 0; i < 10; ++i) r += (uint32_t)_mm512_reduce_add_epi32(a[i]);
  return r;
}

float peak_loop_fma_avx512(size_t iters) {
  __m512 a[10];
  for (int i = 0; i < 10; ++i) a[i] = _mm512_set1_ps((float)i);
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
  for (size_t k = 0; k < iters; ++k)
    for (int i = 0; i < 10; ++i) a[i] = _mm512_fmadd_ps(a[i], x, y);
  float r = 0;
  for (int i = 0; i < 10; ++i) r += _mm512_reduce_add_ps(a[i]);
  return r;
}

}  // namespace sluice
