// AVX-512 GEMMs of the FLOAT group (F32, F16, BF16 weights x F32 activations). Every (row, token)
// pair keeps its own __m512: the 16 lanes of the canonical dot (float_types.cpp), fed by the same
// fma in the same index order and reduced by the same tree, so each output has the dot's bits.
// The speed comes from the register tile: kRows rows x kTokens tokens of accumulators, so each
// converted weight vector is used kTokens times and each loaded activation vector kRows times.
// Weights are converted in registers from the file's bytes (no repacked copy). The tail (n not a
// multiple of 16) uses zero-filling masked loads: fma(0, 0, acc), the padding the scalar walks.
#include "kernels/avx512_intrinsics.h"

#include <cstddef>
#include <cstdint>

#include "kernels/gemm_float_blocked.h"

namespace sluice {
namespace {

// 4 x 6 = 24 accumulators + 4 weight vectors + 1-2 activation vectors fit the 32 zmm registers;
// per 16 elements that is 24 fma against 4 conversions and 10 loads.
constexpr int kRows = 4;
constexpr int kTokens = 6;

inline float reduce16(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

struct F32W {
  static constexpr size_t kBytes = 4;
  static __m512 load(const uint8_t* p) { return _mm512_loadu_ps(p); }
  static __m512 load_tail(const uint8_t* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};

struct F16W {
  static constexpr size_t kBytes = 2;
  static __m512 load(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 load_tail(const uint8_t* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
};

struct BF16W {
  static constexpr size_t kBytes = 2;
  static __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static __m512 load(const uint8_t* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static __m512 load_tail(const uint8_t* p, __mmask16 m) { return widen(_mm256_maskz_loadu_epi16(m, p)); }
};

// R rows (stride bytes apart) x T tokens over all n elements; y[t * ldy + r].
template <class W, int R, int T>
void tile(const uint8_t* w, size_t stride, const float* const* x, int64_t n, float* y, size_t ldy) {
  __m512 acc[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  int64_t i = 0;
  // One token (decode): a row group is a few short streams the hardware prefetcher picks up late
  // (a 4096 x 1280 F16 matrix ran at 0.7 of the read bandwidth), so the next group's bytes, which
  // follow in memory, are prefetched into L2 at the pace this group is read. More tokens hide it.
  const char* pf = reinterpret_cast<const char*>(w + (size_t)R * stride);
  for (; i + 16 <= n; i += 16) {
    if constexpr (T == 1)
#pragma GCC unroll 8
      for (int k = 0; k < R * 16 * (int)W::kBytes; k += 64) _mm_prefetch(pf + (size_t)i * W::kBytes * R + k, _MM_HINT_T1);
    __m512 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = W::load(w + (size_t)r * stride + (size_t)i * W::kBytes);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512 a = _mm512_loadu_ps(x[t] + i);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], a, acc[r][t]);
    }
  }
  if (i < n) {
    const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
    __m512 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = W::load_tail(w + (size_t)r * stride + (size_t)i * W::kBytes, m);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512 a = _mm512_maskz_loadu_ps(m, x[t] + i);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], a, acc[r][t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) y[(size_t)t * ldy + (size_t)r] = reduce16(acc[r][t]);
}

using TileFn = FloatTileFn;

template <class W, int R>
constexpr TileFn tile_for(int t) {
  return t == 1 ? tile<W, R, 1> : t == 2 ? tile<W, R, 2> : t == 3 ? tile<W, R, 3>
       : t == 4 ? tile<W, R, 4> : t == 5 ? tile<W, R, 5> : tile<W, R, 6>;
}

template <class W>
constexpr TileFn tile_for(int r, int t) {
  return r == 1 ? tile_for<W, 1>(t) : r == 2 ? tile_for<W, 2>(t) : r == 3 ? tile_for<W, 3>(t) : tile_for<W, 4>(t);
}

// The tile for a group of r rows and t tokens (gemm_float_blocked's loop; internal linkage, as
// everything here: a copy compiled with this file's ISA flags must not serve other code).
template <class W>
FloatTileFn pick(int r, int t) {
  static_assert(kRows == 4 && kTokens == 6 && kTokens <= kMaxFloatTileTokens, "tile_for dispatches up to 4 x 6");
  return tile_for<W>(r, t);
}

}  // namespace

void gemm_f32_avx512(const void* w, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                     int64_t n, float* y, size_t ldy) {
  gemm_float_blocked(pick<F32W>, kRows, kTokens, w, w_stride, nrows, acts, nacts, n, y, ldy);
}

void gemm_f16_avx512(const void* w, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                     int64_t n, float* y, size_t ldy) {
  gemm_float_blocked(pick<F16W>, kRows, kTokens, w, w_stride, nrows, acts, nacts, n, y, ldy);
}

void gemm_bf16_avx512(const void* w, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                      int64_t n, float* y, size_t ldy) {
  gemm_float_blocked(pick<BF16W>, kRows, kTokens, w, w_stride, nrows, acts, nacts, n, y, ldy);
}

}  // namespace sluice
