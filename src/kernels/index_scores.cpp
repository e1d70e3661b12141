#include "kernels/index_scores.h"

#include <algorithm>
#include <cmath>

#include "kernels/fp4_rows.h"
#include "kernels/numerics.h"

namespace sluice {

namespace {

constexpr uint32_t kBlock = 32;

// m of a key code: 2 * its E2M1 value, an integer in [-12, 12].
int32_t code_m(uint8_t c) {
  static constexpr int32_t mag[8] = {0, 1, 2, 3, 4, 6, 8, 12};
  return c & 8 ? -mag[c & 7] : mag[c & 7];
}

}  // namespace

int32_t index_span_limit(uint32_t blocks) {
  int32_t s = 0;
  while ((uint64_t)blocks * 4608u << (s + 1) <= (1u << 24)) ++s;
  return s;
}

void prepare_index_query(const float* q, const float* w_prime, uint32_t heads, uint32_t head_dim, IndexQuery& out) {
  out.heads = heads;
  out.head_dim = head_dim;
  out.blocks = head_dim / kBlock;
  out.integer = false;
  out.w.assign(w_prime, w_prime + heads);
  if (head_dim == 0 || head_dim % kBlock != 0 || head_dim > kIndexMaxHeadDim) return;
  const uint32_t nb = out.blocks;
  out.m.assign((size_t)heads * head_dim, 0);
  out.bias.assign((size_t)heads * nb, 0);
  out.scale.assign((size_t)heads * nb, 0.0f);
  out.span_limit = index_span_limit(nb);
  out.span = 0;
  int32_t xmin = 0, xmax = 0;
  bool any = false;
  for (uint32_t h = 0; h < heads; ++h) {
    int32_t hmin = 0, hmax = 0;
    bool hany = false;
    for (uint32_t b = 0; b < nb; ++b) {
      const size_t o = (size_t)h * head_dim + (size_t)b * kBlock;
      float amax = 0.0f;
      for (uint32_t i = 0; i < kBlock; ++i) {
        if (!std::isfinite(q[o + i])) return;
        amax = std::max(amax, std::fabs(q[o + i]));
      }
      if (amax == 0.0f) continue;  // an all-zero block: m = 0, scale 0
      // The finest power of two with |q| <= 12 * 2^x: if the block is not integer there, it is
      // not anywhere (a coarser step cannot help).
      int32_t x = std::ilogb(amax) - 4;
      while (std::ldexp(12.0, x) < (double)amax) ++x;
      if (x < kIndexMinExp || x > kIndexMaxExp) return;
      int32_t sum = 0;
      for (uint32_t i = 0; i < kBlock; ++i) {
        const double m = std::ldexp((double)q[o + i], -x);
        if (m != std::rint(m)) return;  // not on an MXFP4-like grid
        out.m[o + i] = (int8_t)m;
        sum += (int32_t)m;
      }
      out.bias[(size_t)h * nb + b] = -12 * sum;
      out.scale[(size_t)h * nb + b] = std::ldexp(1.0f, x);
      hmin = hany ? std::min(hmin, x) : x;
      hmax = hany ? std::max(hmax, x) : x;
      hany = true;
    }
    if (!hany) continue;
    out.span = std::max(out.span, hmax - hmin);
    xmin = any ? std::min(xmin, hmin) : hmin;
    xmax = any ? std::max(xmax, hmax) : hmax;
    any = true;
  }
  out.xmin = xmin;
  out.xmax = xmax;
  out.integer = true;
}

bool index_key_exact(const IndexQuery& q, const uint8_t* key) {
  const uint8_t* scales = key + q.head_dim / 2;
  int32_t kmin = 1000, kmax = -1000;
  for (uint32_t b = 0; b < q.blocks; ++b) {
    if (scales[b] == 0xff) return false;  // the NaN scale
    bool nonzero = false;
    for (uint32_t i = 0; i < kBlock / 2; ++i) nonzero |= (key[b * kBlock / 2 + i] & 0x77) != 0;
    if (!nonzero) continue;
    kmin = std::min(kmin, (int32_t)scales[b] - 128);
    kmax = std::max(kmax, (int32_t)scales[b] - 128);
  }
  return index_exponents_exact(q, kmin, kmax);
}

size_t index_scores_int(const IndexQuery& q, const uint8_t* keys, size_t n, float* scores, uint32_t* fallback) {
  const uint32_t hd = q.head_dim, nb = q.blocks;
  const size_t rb = fp4_row_bytes(Fp4Grid::Mxfp4, hd);
  int32_t mk[kIndexMaxHeadDim];
  float sk[kIndexMaxHeadDim / kBlock];
  size_t fb = 0;
  for (size_t j = 0; j < n; ++j) {
    const uint8_t* key = keys + j * rb;
    if (!index_key_exact(q, key)) {
      fallback[fb++] = (uint32_t)j;
      continue;
    }
    for (uint32_t i = 0; i < hd / 2; ++i) {
      mk[2 * i] = code_m(key[i] & 15u);
      mk[2 * i + 1] = code_m(key[i] >> 4);
    }
    // An all-zero block's scale plays no part (and could overflow against the query's): 0.
    for (uint32_t b = 0; b < nb; ++b) {
      bool nonzero = false;
      for (uint32_t i = 0; i < kBlock / 2; ++i) nonzero |= (key[b * kBlock / 2 + i] & 0x77) != 0;
      sk[b] = nonzero ? std::ldexp(1.0f, (int32_t)key[hd / 2 + b] - 128) : 0.0f;
    }
    float acc = 0.0f;
    for (uint32_t h = 0; h < q.heads; ++h) {
      const int8_t* mq = q.m.data() + (size_t)h * hd;
      float dot = 0.0f;
      for (uint32_t b = 0; b < nb; ++b) {
        int32_t d = 0;
        for (uint32_t i = b * kBlock; i < (b + 1) * kBlock; ++i) d += (int32_t)mq[i] * mk[i];
        // Both scales are powers of two (or the query's 0): the product and D * 2^X are exact.
        dot += (float)d * (sk[b] * q.scale[(size_t)h * nb + b]);
      }
      acc += std::max(dot, 0.0f) * q.w[h];  // the float path's ops, in its order
    }
    scores[j] = acc;
  }
  return fb;
}

IndexScoresFn index_scores_for(Isa isa) { return isa == Isa::Avx512 ? index_scores_int_avx512 : nullptr; }

}  // namespace sluice
