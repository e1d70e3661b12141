// Numeric primitives of the forward pass: the scalar definitions every backend is held to.
// Every function follows one paragraph of docs/numerics.md; the section is named next to it. Evaluation order is spelled out where it
// changes bits (the build has -ffp-contract=off, so a*b + c is two roundings).
#include "kernels/numerics.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>

#include "kernels/cpu.h"
#include "kernels/engram_row.h"
#include "kernels/exp_f32.h"
#include "kernels/fp.h"
#include "kernels/topk_collect.h"

namespace sluice {

// numerics.md 4
float silu(float g) { return g / (1.0f + exp_f32(-g)); }
float sigmoid(float x) { return 1.0f / (1.0f + exp_f32(-x)); }
float softplus(float x) { return std::max(x, 0.0f) + std::log1p(exp_f32(-std::fabs(x))); }

float rms_factor(const float* x, size_t n, float eps) {
  float ss = 0.0f;  // sequential sum (numerics.md 4)
  for (size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float mean = ss / (float)n;
  return 1.0f / std::sqrt(mean + eps);
}

float engram_gate_value(const float* x, const float* key, const float* wq, size_t H, float eps, float inv_sqrt_h) {
  float dot = 0.0f;
  for (size_t k = 0; k < H; ++k) dot += (x[k] * wq[k]) * key[k];
  dot *= rms_factor(x, H, eps);
  dot *= rms_factor(key, H, eps);
  dot *= inv_sqrt_h;
  const float sgn = dot > 0.0f ? 1.0f : (dot < 0.0f ? -1.0f : 0.0f);
  return sigmoid(sgn * std::sqrt(std::max(std::fabs(dot), 1e-6f)));
}

void rms_norm(const float* x, const float* w, float* y, size_t n, float eps) {
  const float r = rms_factor(x, n, eps);
  for (size_t i = 0; i < n; ++i) y[i] = round_bf16((x[i] * r) * w[i]);
}

RopeAngles rope_angles(const std::vector<double>& freqs, uint64_t pos) {
  return rope_angles(std::span<const double>(freqs), pos);
}

RopeAngles rope_angles(std::span<const double> freqs, uint64_t pos) {
  RopeAngles a;
  a.cos.resize(freqs.size());
  a.sin.resize(freqs.size());
  for (size_t i = 0; i < freqs.size(); ++i) {
    const double ang = (double)pos * freqs[i];
    a.cos[i] = (float)std::cos(ang);
    a.sin[i] = (float)std::sin(ang);
  }
  return a;
}

void rope_apply(float* v, size_t dim, const RopeAngles& a, bool inverse) {
  const size_t half = a.cos.size();
  float* p = v + (dim - 2 * half);
  for (size_t i = 0; i < half; ++i) {
    const float c = a.cos[i];
    const float s = inverse ? -a.sin[i] : a.sin[i];
    const float re = p[2 * i], im = p[2 * i + 1];
    p[2 * i] = round_bf16(re * c - im * s);
    p[2 * i + 1] = round_bf16(re * s + im * c);
  }
}

// numerics.md 5 ---------------------------------------------------------------------------

float e4m3_rne(float x) {
  if (std::isnan(x)) return x;
  const float ax = std::fabs(x);
  if (ax >= 448.0f) return std::copysign(448.0f, x);  // saturating: 448 is the largest finite
  int e = 0;
  std::frexp(ax, &e);                                  // ax = f * 2^e, f in [0.5, 1)
  const int exp = std::max(e - 1, -6);                 // -6: the subnormal binade shares 2^-9 steps
  const float quantum = std::ldexp(1.0f, exp - 3);     // 3 mantissa bits
  float q = std::nearbyint(ax / quantum) * quantum;    // default rounding mode: ties to even
  if (q > 448.0f) q = 448.0f;
  return std::copysign(q, x);
}

namespace {
constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
}  // namespace

uint8_t e2m1_code(float x) {
  const float a = std::fabs(x);
  // Midpoints go to the even code: codes 0,2,4,6 are 0, 1, 2, 4.
  uint8_t i;
  if (a <= 0.25f) i = 0;
  else if (a < 0.75f) i = 1;
  else if (a <= 1.25f) i = 2;
  else if (a < 1.75f) i = 3;
  else if (a <= 2.5f) i = 4;
  else if (a < 3.5f) i = 5;
  else if (a <= 5.0f) i = 6;
  else i = 7;
  return (uint8_t)((std::signbit(x) ? 8u : 0u) | i);
}

float e2m1_value(uint8_t code) { return kE2m1[code & 15u]; }

float e2m1_rne(float x) {
  if (std::isnan(x)) return x;
  return kE2m1[e2m1_code(x)];
}

namespace {

// 2^ceil(log2(x)) for x > 0, exactly (no log2 rounding): x = f*2^e with f in [0.5, 1).
float pow2_ceil(float x) {
  int e = 0;
  const float f = std::frexp(x, &e);
  return std::ldexp(1.0f, f == 0.5f ? e - 1 : e);
}

float block_amax(const float* v, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(v[i]));
  return m;
}

}  // namespace

void fake_quant_fp8_window(float* v, size_t n) {
  for (size_t b = 0; b < n; b += 32) {
    float* p = v + b;
    const float s = pow2_ceil(std::max(block_amax(p, 32), 1e-4f) / 448.0f);
    for (size_t i = 0; i < 32; ++i) {
      const float q = e4m3_rne(std::clamp(p[i] / s, -448.0f, 448.0f));
      p[i] = round_bf16(q * s);
    }
  }
}

float nvfp4_block_scale(const float* p) {
  constexpr float kMinAmax = 6.0f / 512.0f;  // 6 * 2^-9
  return e4m3_rne(std::max(block_amax(p, 16), kMinAmax) / 6.0f);
}

float mxfp4_block_scale(const float* p) {
  const float kMinAmax = std::ldexp(6.0f, -126);
  return pow2_ceil(std::max(block_amax(p, 32), kMinAmax) / 6.0f);
}

void fake_quant_nvfp4(float* v, size_t n) {
  for (size_t b = 0; b < n; b += 16) {
    float* p = v + b;
    const float s = nvfp4_block_scale(p);
    for (size_t i = 0; i < 16; ++i) p[i] = round_bf16(e2m1_rne(p[i] / s) * s);
  }
}

void fake_quant_mxfp4(float* v, size_t n) {
  for (size_t b = 0; b < n; b += 32) {
    float* p = v + b;
    const float s = mxfp4_block_scale(p);
    for (size_t i = 0; i < 32; ++i) p[i] = round_bf16(e2m1_rne(p[i] / s) * s);
  }
}

// spec 3.2 ---------------------------------------------------------------------------------

HcMix hc_mix_from_projections(const float* m, const float* base, const float* scale, uint32_t hc,
                              uint32_t sinkhorn_iters, float hc_eps) {
  HcMix r;
  r.pre.resize(hc);
  r.post.resize(hc);
  r.comb.resize((size_t)hc * hc);
  for (uint32_t h = 0; h < hc; ++h) {
    r.pre[h] = sigmoid(m[h] * scale[0] + base[h]) + hc_eps;
    r.post[h] = 2.0f * sigmoid(m[hc + h] * scale[1] + base[hc + h]);
  }
  float* C = r.comb.data();
  for (uint32_t k = 0; k < hc * hc; ++k) C[k] = m[2 * hc + k] * scale[2] + base[2 * hc + k];
  auto normalize_cols = [&] {
    for (uint32_t j = 0; j < hc; ++j) {
      float s = 0.0f;
      for (uint32_t i = 0; i < hc; ++i) s += C[i * hc + j];
      const float d = s + hc_eps;
      for (uint32_t i = 0; i < hc; ++i) C[i * hc + j] /= d;
    }
  };
  // First iteration: row softmax (max-subtracted) + eps, then columns.
  for (uint32_t i = 0; i < hc; ++i) {
    float* row = C + (size_t)i * hc;
    float mx = row[0];
    for (uint32_t j = 1; j < hc; ++j) mx = std::max(mx, row[j]);
    float s = 0.0f;
    for (uint32_t j = 0; j < hc; ++j) {
      row[j] = exp_f32(row[j] - mx);
      s += row[j];
    }
    for (uint32_t j = 0; j < hc; ++j) row[j] = row[j] / s + hc_eps;
  }
  normalize_cols();
  for (uint32_t it = 1; it < sinkhorn_iters; ++it) {
    for (uint32_t i = 0; i < hc; ++i) {
      float* row = C + (size_t)i * hc;
      float s = 0.0f;
      for (uint32_t j = 0; j < hc; ++j) s += row[j];
      const float d = s + hc_eps;
      for (uint32_t j = 0; j < hc; ++j) row[j] /= d;
    }
    normalize_cols();
  }
  return r;
}

void hc_pre(const float* X, const float* w, uint32_t hc, size_t n, float* y) {
  for (size_t k = 0; k < n; ++k) {
    float acc = 0.0f;
    for (uint32_t h = 0; h < hc; ++h) acc += w[h] * X[h * n + k];
    y[k] = round_bf16(acc);
  }
}

void hc_post(const float* F, const float* X, const HcMix& mix, uint32_t hc, size_t n, float* Y) {
  for (uint32_t j = 0; j < hc; ++j) {
    const float pj = mix.post[j];
    float* y = Y + (size_t)j * n;
    for (size_t k = 0; k < n; ++k) {
      float acc = pj * F[k];
      for (uint32_t i = 0; i < hc; ++i) acc += mix.comb[(size_t)i * hc + j] * X[(size_t)i * n + k];
      y[k] = round_bf16(acc);
    }
  }
}

// numerics.md 6 ---------------------------------------------------------------------------

namespace {

// Higher score first, then lower index: a strict total order on (score, index).
struct ByScoreThenIndex {
  std::span<const float> s;
  bool operator()(int32_t a, int32_t b) const {
    if (s[a] != s[b]) return s[a] > s[b];
    return a < b;
  }
};

// The k best of scores[0, n) by ByScoreThenIndex, ascending. A threshold from an even sample of
// the scores lets one scan (topk_collect: SIMD compare and compress) keep only the scores at or
// above it, a few times k of them; the exact order then runs on those alone. The threshold only
// decides how many are kept: when fewer than k pass it, the scan runs again with none (every
// selectable score), so the result is the plain selection's whatever the sample. An index
// buffer of n is allocated (not initialized: the scan writes what is read), and k are returned.
std::vector<int32_t> top_indices(std::span<const float> scores, size_t n, uint32_t k) {
  static const TopkCollectFn collect = topk_collect_for(active_isa());
  constexpr float kAll = -std::numeric_limits<float>::infinity();
  float t = kAll;
  if (n > 8 * (size_t)k + 1024) {
    std::vector<float> sample;
    sample.reserve(kTopkSamples);
    for (size_t i = 0; i < kTopkSamples; ++i) {
      const float v = scores[i * n / kTopkSamples];
      if (v > kAll) sample.push_back(v);  // not -inf, not NaN
    }
    // Aim at about 2k + 256 kept rows: rank r of the sample's valid scores, descending.
    const double valid = (double)n * (double)sample.size() / (double)kTopkSamples;
    const size_t r = (size_t)((2.0 * k + 256.0) / std::max(valid, 1.0) * (double)sample.size());
    if (sample.size() >= 16 && r < sample.size()) {
      std::nth_element(sample.begin(), sample.begin() + (ptrdiff_t)r, sample.end(), std::greater<float>());
      t = sample[r];
    }
  }
  const std::unique_ptr<int32_t[]> idx = std::make_unique_for_overwrite<int32_t[]>(n);
  size_t c = collect(scores.data(), n, t, idx.get());
  if (c < k && t != kAll) c = collect(scores.data(), n, kAll, idx.get());
  if (c > k) {
    std::nth_element(idx.get(), idx.get() + k, idx.get() + c, ByScoreThenIndex{scores});
    std::sort(idx.get(), idx.get() + k);
    c = k;
  }
  return std::vector<int32_t>(idx.get(), idx.get() + c);
}

}  // namespace

std::vector<int32_t> topk_ascending(std::span<const float> scores, uint32_t k) {
  return top_indices(scores, scores.size(), k);
}

std::vector<uint8_t> candidate_blocks(std::span<const float> scores, uint32_t n_vis,
                                      uint32_t block_size, uint32_t keep_blocks) {
  const uint32_t n_blocks = (n_vis + block_size - 1) / block_size;
  std::vector<float> b(n_blocks, -std::numeric_limits<float>::infinity());
  for (uint32_t j = 0; j < n_vis; ++j) b[j / block_size] = std::max(b[j / block_size], scores[j]);
  std::vector<uint8_t> keep(n_blocks, 0);
  if (n_blocks == 0) return keep;
  b[(n_vis - 1) / block_size] = std::numeric_limits<float>::infinity();  // newest row's block
  for (int32_t i : top_indices(b, n_blocks, keep_blocks)) keep[i] = 1;
  return keep;
}

// numerics.md 7 ---------------------------------------------------------------------------

Routing route(std::span<const float> logits, std::span<const float> bias, uint32_t k,
              bool norm_topk_prob, float routed_scaling_factor) {
  const size_t n = logits.size();
  std::vector<float> s(n), biased(n);
  for (size_t e = 0; e < n; ++e) {
    s[e] = std::sqrt(softplus(logits[e]));
    biased[e] = s[e] + bias[e];
  }
  std::vector<int32_t> idx(n);
  for (size_t e = 0; e < n; ++e) idx[e] = (int32_t)e;
  const size_t kk = std::min<size_t>(k, n);
  std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), ByScoreThenIndex{biased});
  Routing r;
  float sum = 0.0f;  // in selection order (torch's sum over the gathered top-k)
  for (size_t i = 0; i < kk; ++i) {
    r.experts.push_back((uint32_t)idx[i]);
    sum += s[idx[i]];
  }
  for (size_t i = 0; i < kk; ++i) {
    const float sk = s[idx[i]];
    r.weights.push_back(norm_topk_prob ? sk / (sum + 1e-20f) * routed_scaling_factor
                                       : sk * routed_scaling_factor);
  }
  return r;
}

// spec 4.3 / numerics.md 8 ------------------------------------------------------------------

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<uint64_t> engram_hash(std::span<const int64_t> ids_in, int64_t pad,
                                  std::span<const uint64_t> primes,
                                  std::span<const uint64_t> multipliers, uint32_t n_heads) {
  const size_t n = ids_in.size();
  std::vector<uint64_t> ids(n);
  bool blocked = false;  // a DEAD id blocks itself and everything older
  for (size_t j = 0; j < n; ++j) {
    blocked = blocked || ids_in[j] == kEngramDead;
    ids[j] = (uint64_t)(blocked ? pad : ids_in[j]);
  }
  std::vector<uint64_t> rows;
  rows.reserve((n - 1) * n_heads);
  uint64_t h = ids[0] * multipliers[0];  // wrapping uint64 arithmetic
  uint64_t off = 0;
  for (size_t j = 1; j < n; ++j) {
    h ^= ids[j] * multipliers[j];
    for (uint32_t head = 0; head < n_heads; ++head) {
      const uint64_t p = primes[(j - 1) * n_heads + head];
      rows.push_back(h % p + off);
      off += p;
    }
  }
  return rows;
}

bool engram_decode_row(const uint8_t* row, uint32_t head_dim, float* out) {
  const uint8_t* scales = row + head_dim;
  for (uint32_t k = 0; k < head_dim / 32; ++k)
    if (e8m0_is_nan(scales[k])) return false;
  for (uint32_t i = 0; i < head_dim; ++i) {
    if (e4m3_is_nan(row[i])) return false;
    out[i] = engram_value(row[i], scales[i / 32]);  // bf16(e4m3 * 2^(e-127))
  }
  return true;
}

}  // namespace sluice
