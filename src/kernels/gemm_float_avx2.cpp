// AVX2 GEMMs of the FLOAT group (F32, F16, BF16 weights x F32 activations). Every (row, token)
// pair keeps the 16 lanes of the canonical dot (float_types.cpp) in two __m256 (lanes 0-7 and
// 8-15), as dot_*_avx2 do, with the same fma order and reduction tree, so each output has the
// dot's bits. A register tile of kRows rows x kTokens tokens reuses each converted weight vector
// across the tokens and each activation vector across the rows. The tail (n not a multiple of 16)
// is copied into zero-filled 16-element buffers: the zero padding the scalar walks.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/gemm_float_blocked.h"

namespace sluice {
namespace {

// 2 x 3 pairs = 12 accumulators + 2 weight vectors + 1 activation vector of the 16 ymm registers.
constexpr int kRows = 2;
constexpr int kTokens = 3;

inline float reduce16(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

struct F32W {
  static constexpr size_t kBytes = 4;
  static __m256 load8(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
};

struct F16W {
  static constexpr size_t kBytes = 2;
  static __m256 load8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
};

struct BF16W {
  static constexpr size_t kBytes = 2;
  static __m256 load8(const uint8_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
};

// One 16-element step for R x T pairs: weights at w[r] + off * kBytes, activations at x[t] + off.
template <class W, int R, int T>
inline void step(const uint8_t* const* w, const float* const* x, int64_t off, __m256 (&lo)[R][T],
                 __m256 (&hi)[R][T]) {
  {
    __m256 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = W::load8(w[r] + (size_t)off * W::kBytes);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m256 a = _mm256_loadu_ps(x[t] + off);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) lo[r][t] = _mm256_fmadd_ps(wv[r], a, lo[r][t]);
    }
  }
  __m256 wv[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) wv[r] = W::load8(w[r] + (size_t)(off + 8) * W::kBytes);
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    const __m256 a = _mm256_loadu_ps(x[t] + off + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) hi[r][t] = _mm256_fmadd_ps(wv[r], a, hi[r][t]);
  }
}

// R rows (stride bytes apart) x T tokens over all n elements; y[t * ldy + r].
template <class W, int R, int T>
void tile(const uint8_t* w, size_t stride, const float* const* x, int64_t n, float* y, size_t ldy) {
  __m256 lo[R][T], hi[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) lo[r][t] = hi[r][t] = _mm256_setzero_ps();
  const uint8_t* wr[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) wr[r] = w + (size_t)r * stride;
  int64_t i = 0;
  // One token (decode): the next row group's bytes, which follow in memory, into L2 at the pace
  // this group is read (gemm_float_avx512.cpp says why).
  const char* pf = reinterpret_cast<const char*>(w + (size_t)R * stride);
  for (; i + 16 <= n; i += 16) {
    if constexpr (T == 1)
#pragma GCC unroll 8
      for (int k = 0; k < R * 16 * (int)W::kBytes; k += 64) _mm_prefetch(pf + (size_t)i * W::kBytes * R + k, _MM_HINT_T1);
    step<W, R, T>(wr, x, i, lo, hi);
  }
  if (i < n) {
    const size_t left = (size_t)(n - i);
    alignas(32) uint8_t wpad[R][16 * W::kBytes];
    alignas(32) float xpad[T][16];
    const uint8_t* wp[R];
    const float* xp[T];
    for (int r = 0; r < R; ++r) {
      std::memset(wpad[r], 0, sizeof wpad[r]);
      std::memcpy(wpad[r], wr[r] + (size_t)i * W::kBytes, left * W::kBytes);
      wp[r] = wpad[r];
    }
    for (int t = 0; t < T; ++t) {
      std::memset(xpad[t], 0, sizeof xpad[t]);
      std::memcpy(xpad[t], x[t] + i, left * sizeof(float));
      xp[t] = xpad[t];
    }
    step<W, R, T>(wp, xp, 0, lo, hi);
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) y[(size_t)t * ldy + (size_t)r] = reduce16(lo[r][t], hi[r][t]);
}

using TileFn = FloatTileFn;

template <class W>
constexpr TileFn tile_for(int r, int t) {
  return r == 1 ? (t == 1 ? tile<W, 1, 1> : t == 2 ? tile<W, 1, 2> : tile<W, 1, 3>)
                : (t == 1 ? tile<W, 2, 1> : t == 2 ? tile<W, 2, 2> : tile<W, 2, 3>);
}

// The tile for a group of r rows and t tokens (gemm_float_blocked's loop; internal linkage, as
// everything here: a copy compiled with this file's ISA flags must not serve other code).
template <class W>
FloatTileFn pick(int r, int t) {
  static_assert(kRows == 2 && kTokens == 3 && kTokens <= kMaxFloatTileTokens, "tile_for dispatches up to 2 x 3");
  return tile_for<W>(r, t);
}

}  // namespace

void gemm_f32_avx2(const void* w, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                   int64_t n, float* y, size_t ldy) {
  gemm_float_blocked(pick<F32W>, kRows, kTokens, w, w_stride, nrows, acts, nacts, n, y, ldy);
}

void gemm_f16_avx2(const void* w, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                   int64_t n, float* y, size_t ldy) {
  gemm_float_blocked(pick<F16W>, kRows, kTokens, w, w_stride, nrows, acts, nacts, n, y, ldy);
}

void gemm_bf16_avx2(const void* w, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                    int64_t n, float* y, size_t ldy) {
  gemm_float_blocked(pick<BF16W>, kRows, kTokens, w, w_stride, nrows, acts, nacts, n, y, ldy);
}

}  // namespace sluice
