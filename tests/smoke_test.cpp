#include <gtest/gtest.h>
#include "kernels/fp.h"
TEST(Smoke, Bf16RoundTrip) { EXPECT_EQ(sluice::round_bf16(1.0f), 1.0f); }
