// exp_f32 (kernels/exp_f32.h, docs/numerics.md 4a): its constants are the values they claim, and
// its results are within 0.5000 + 2e-6 ulp of exp in double over a sweep of every range.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>

#include "kernels/exp_f32.h"

namespace sluice {
namespace {

// |got - exp(x)| in f32 ulps of the result (exp(x) in double: within a few 1e-16 relative).
double ulps_off(float x, float got) {
  const double want = std::exp((double)x);
  int e = 0;
  std::frexp(want, &e);  // want = f * 2^e, f in [0.5, 1): an f32 ulp there is 2^(e - 24)
  return std::fabs((double)got - want) / std::ldexp(1.0, e - 24);
}

TEST(ExpF32, ConstantsAreTheirValues) {
  const std::span<const double> c = exp_f32_constants();
  ASSERT_EQ(c.size(), kExpConstants);
  for (size_t j = 0; j < kExpTable; ++j)
    EXPECT_NEAR(c[j], std::exp2((double)j / 64.0), 1e-15) << "2^(" << j << "/64)";
  const double ln2 = std::log(2.0);
  EXPECT_NEAR(c[kExpInvLn2], 64.0 / ln2, 1e-13);
  double term = 1.0;
  for (size_t i = 0; i < 4; ++i) {
    term *= ln2 / 64.0 / (double)(i + 1);
    EXPECT_NEAR(c[kExpPoly + i] / term, 1.0, 1e-14) << "c" << i + 1;
  }
}

TEST(ExpF32, WithinHalfAnUlpAndABitOverEveryRange) {
  double worst = 0;
  float worst_x = 0;
  uint64_t checked = 0;
  // Every 257th f32 of each sign up to 89 (its magnitude's bit patterns in order: every binade),
  // then every f32 of [-1/64, 1/64) around the table's joints, stride 7.
  for (const float sign : {1.0f, -1.0f})
    for (uint32_t b = 0; b <= std::bit_cast<uint32_t>(89.0f); b += 257) {
      const float x = sign * std::bit_cast<float>(b);
      const float got = exp_f32(x);
      if (x < -87.33f) continue;  // the result is under 2^-126: below
      if (std::isinf(got)) {       // only where exp(x) rounds past FLT_MAX
        EXPECT_GE(std::exp((double)x), 0x1p128 - 0x1p103) << x;
        continue;
      }
      const double u = ulps_off(x, got);
      ++checked;
      if (u > worst) worst = u, worst_x = x;
    }
  for (uint32_t j = 0; j < 64; ++j)
    for (int d = -2000; d <= 2000; d += 7) {
      const float x = std::nextafter((float)(j * 0.010830424696249145), 0.0f) + (float)d * 1e-9f;
      const double u = ulps_off(x, exp_f32(x));
      ++checked;
      if (u > worst) worst = u, worst_x = x;
    }
  EXPECT_GT(checked, 8000000u);
  EXPECT_LE(worst, 0.500002) << "at x = " << worst_x;
  std::printf("exp_f32: %llu values, worst %.7f ulp at x = %.9g\n", (unsigned long long)checked, worst, (double)worst_x);
}

TEST(ExpF32, EdgesOfTheRange) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-0.0f), 1.0f);
  EXPECT_EQ(exp_f32(1.0f), (float)std::exp(1.0));
  EXPECT_EQ(exp_f32(inf), inf);
  EXPECT_EQ(exp_f32(-inf), 0.0f);
  EXPECT_TRUE(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
  // The largest finite result and the first overflow.
  const float top = 88.72283f;  // exp(top) < FLT_MAX
  EXPECT_EQ(exp_f32(top), (float)std::exp((double)top));
  EXPECT_EQ(exp_f32(88.7229f), inf);
  EXPECT_EQ(exp_f32(89.0f), inf);
  // Below 2^-126 the result is 0, never a subnormal; just above it, the normal value.
  EXPECT_EQ(exp_f32(-87.4f), 0.0f);
  EXPECT_EQ(exp_f32(-100.0f), 0.0f);
  const float low = -87.33f;
  EXPECT_GE(exp_f32(low), std::numeric_limits<float>::min());
  EXPECT_EQ(exp_f32(low), (float)std::exp((double)low));
}

}  // namespace
}  // namespace sluice
