// Filling and comparing backend tensors in the op tests (vulkan_hc_ops_test, vulkan_attention_test).
#pragma once
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "kernels/fp.h"

namespace sluice::test {

// n BF16-exact values: uniform in (-spread, spread) times 2^e, e uniform in [-binades, binades].
inline std::vector<float> bf16_randoms(std::mt19937_64& rng, size_t n, float spread, int binades) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-binades, binades);
  std::vector<float> v(n);
  for (float& x : v) x = round_bf16(u(rng) * spread * std::ldexp(1.0f, ex(rng)));
  return v;
}

// t's rows = v's values, row by row.
inline void fill(const Tensor& t, const std::vector<float>& v) {
  for (size_t i = 0; i < t.n(); ++i) std::memcpy(t.m().row(i), v.data() + i * t.width(), t.width() * sizeof(float));
}

// The first float where a and b differ in their bits, or -1.
inline long first_difference(const Tensor& a, const Tensor& b) {
  for (size_t i = 0; i < a.n() * a.width(); ++i)
    if (std::memcmp(a.c().p + i, b.c().p + i, sizeof(float)) != 0) return (long)i;
  return -1;
}

}  // namespace sluice::test
