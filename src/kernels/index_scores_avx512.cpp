// AVX-512 VNNI form of index_scores_int: bit-identical to the scalar reference.
//
// Keys go in tiles of 16, one per 32-bit lane: a key's 128 codes become bytes m + 12 (unsigned,
// 0..24) and group i of 4 consecutive elements sits in lane j of tile row i, so one vpdpbusd with a
// query's 4 signed m bytes broadcast adds 4 products to each of 16 keys. The accumulator starts at
// the query block's -12 * sum m, which takes the offset back out: D_b exactly. Then per block the
// scale product, the block sum, relu, the head weight and the head sum run as the reference's f32
// ops, lane-wise.
#include "kernels/avx512_intrinsics.h"

#include <algorithm>
#include <cstring>

#include "kernels/fp4_rows.h"
#include "kernels/index_scores.h"

namespace sluice {

namespace {

constexpr uint32_t kLanes = 16, kBlock = 32;

struct Tile {
  alignas(64) uint32_t g[kIndexMaxHeadDim / 4][kLanes];  // [group of 4 elements][key]
  alignas(64) float sk[kIndexMaxHeadDim / kBlock][kLanes];
};

// Lane j of the tile from one key: codes to m + 12, scales to 2^x (0 for an all-zero block).
// Returns index_key_exact(q, key), from the same pass (the lane is garbage when false).
bool load_key(Tile& t, uint32_t j, const uint8_t* key, uint32_t nb, const IndexQuery& q) {
  const __m128i lut = _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
  const __m128i low = _mm_set1_epi8(0x0f), mag = _mm_set1_epi8(0x77);
  int32_t kmin = 1000, kmax = -1000;
  bool nan = false;
  for (uint32_t b = 0; b < nb; ++b) {  // a block of 32 is 16 bytes of codes
    const __m128i c = _mm_loadu_si128((const __m128i*)(key + b * kBlock / 2));
    const __m128i lo = _mm_and_si128(c, low), hi = _mm_and_si128(_mm_srli_epi16(c, 4), low);
    alignas(16) uint32_t v[8];
    _mm_store_si128((__m128i*)v, _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi)));
    _mm_store_si128((__m128i*)(v + 4), _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi)));
    for (uint32_t d = 0; d < 8; ++d) t.g[b * 8 + d][j] = v[d];
    const uint8_t code = key[nb * kBlock / 2 + b];
    nan |= code == 0xff;
    const int32_t x = (int32_t)code - 128;
    float s = 0.0f;
    if (!_mm_testz_si128(c, mag)) {
      kmin = std::min(kmin, x);
      kmax = std::max(kmax, x);
      const uint32_t bits = x >= -126 ? (uint32_t)(x + 127) << 23 : 1u << (x + 149);  // 2^x, exact
      std::memcpy(&s, &bits, 4);
    }
    t.sk[b][j] = s;
  }
  return !nan && index_exponents_exact(q, kmin, kmax);
}

void clear_lane(Tile& t, uint32_t j, uint32_t nb) {
  for (uint32_t i = 0; i < nb * 8; ++i) t.g[i][j] = 0x0c0c0c0cu;  // m = 0
  for (uint32_t b = 0; b < nb; ++b) t.sk[b][j] = 0.0f;
}

// The 16 lanes' scores. NB blocks per head; two heads at a time keep 2 x NB dot chains in flight.
template <uint32_t NB>
__m512 score_tile(const IndexQuery& q, const Tile& t) {
  const uint32_t hd = NB * kBlock;
  __m512 acc = _mm512_setzero_ps();
  const __m512 zero = _mm512_setzero_ps();
  auto head_dot = [&](const __m512i* d, uint32_t h) {
    __m512 dot = zero;
    for (uint32_t b = 0; b < NB; ++b) {
      const __m512 s = _mm512_mul_ps(_mm512_load_ps(t.sk[b]), _mm512_set1_ps(q.scale[(size_t)h * NB + b]));
      dot = _mm512_add_ps(dot, _mm512_mul_ps(_mm512_cvtepi32_ps(d[b]), s));
    }
    return dot;
  };
  auto accumulate = [&](__m512 dot, uint32_t h) {
    acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_max_ps(dot, zero), _mm512_set1_ps(q.w[h])));
  };
  uint32_t h = 0;
  for (; h + 2 <= q.heads; h += 2) {
    __m512i d0[NB], d1[NB];
    const int32_t* m0 = (const int32_t*)(q.m.data() + (size_t)h * hd);
    const int32_t* m1 = (const int32_t*)(q.m.data() + (size_t)(h + 1) * hd);
    for (uint32_t b = 0; b < NB; ++b) {
      d0[b] = _mm512_set1_epi32(q.bias[(size_t)h * NB + b]);
      d1[b] = _mm512_set1_epi32(q.bias[(size_t)(h + 1) * NB + b]);
    }
    for (uint32_t g = 0; g < 8; ++g)
      for (uint32_t b = 0; b < NB; ++b) {
        const __m512i k = _mm512_load_si512((const void*)t.g[b * 8 + g]);
        d0[b] = _mm512_dpbusd_epi32(d0[b], k, _mm512_set1_epi32(m0[b * 8 + g]));
        d1[b] = _mm512_dpbusd_epi32(d1[b], k, _mm512_set1_epi32(m1[b * 8 + g]));
      }
    accumulate(head_dot(d0, h), h);
    accumulate(head_dot(d1, h + 1), h + 1);
  }
  for (; h < q.heads; ++h) {
    __m512i d0[NB];
    const int32_t* m0 = (const int32_t*)(q.m.data() + (size_t)h * hd);
    for (uint32_t b = 0; b < NB; ++b) d0[b] = _mm512_set1_epi32(q.bias[(size_t)h * NB + b]);
    for (uint32_t g = 0; g < 8; ++g)
      for (uint32_t b = 0; b < NB; ++b)
        d0[b] = _mm512_dpbusd_epi32(d0[b], _mm512_load_si512((const void*)t.g[b * 8 + g]), _mm512_set1_epi32(m0[b * 8 + g]));
    accumulate(head_dot(d0, h), h);
  }
  return acc;
}

template <uint32_t NB>
size_t scores_nb(const IndexQuery& q, const uint8_t* keys, size_t n, float* scores, uint32_t* fallback) {
  const size_t rb = fp4_row_bytes(Fp4Grid::Mxfp4, NB * kBlock);
  Tile t;
  size_t fb = 0;
  for (size_t j0 = 0; j0 < n; j0 += kLanes) {
    const uint32_t cnt = (uint32_t)std::min<size_t>(kLanes, n - j0);
    __mmask16 store = 0;
    for (uint32_t j = 0; j < kLanes; ++j) {
      const uint8_t* key = j < cnt ? keys + (j0 + j) * rb : nullptr;
      if (key && load_key(t, j, key, NB, q)) {
        store = (__mmask16)(store | 1u << j);
      } else {
        if (j < cnt) fallback[fb++] = (uint32_t)(j0 + j);
        clear_lane(t, j, NB);
      }
    }
    _mm512_mask_storeu_ps(scores + j0, store, score_tile<NB>(q, t));
  }
  return fb;
}

}  // namespace

size_t index_scores_int_avx512(const IndexQuery& q, const uint8_t* keys, size_t n, float* scores,
                               uint32_t* fallback) {
  switch (q.blocks) {
    case 1: return scores_nb<1>(q, keys, n, scores, fallback);
    case 2: return scores_nb<2>(q, keys, n, scores, fallback);
    case 3: return scores_nb<3>(q, keys, n, scores, fallback);
    case 4: return scores_nb<4>(q, keys, n, scores, fallback);
    case 5: return scores_nb<5>(q, keys, n, scores, fallback);
    case 6: return scores_nb<6>(q, keys, n, scores, fallback);
    case 7: return scores_nb<7>(q, keys, n, scores, fallback);
    default: return scores_nb<8>(q, keys, n, scores, fallback);
  }
}

}  // namespace sluice
