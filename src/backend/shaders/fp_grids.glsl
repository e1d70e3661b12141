// The grids of the fake quantization (kernels/numerics.cpp, numerics.md 5) on the bits: frexp's
// exponent, powers of two, E4M3 and E2M1 rounding. fake_quant.comp and index_scores.comp (which
// puts a pending key row on the MXFP4 grid as store_fp4 will) share them.
// std::frexp's exponent of a finite a > 0: a = f * 2^e, f in [0.5, 1).
int frexp_exp(float a) {
  const uint b = floatBitsToUint(a), e = (b >> 23) & 0xffu;
  if (e != 0u) return int(e) - 126;
  return findMSB(b & 0x7fffffu) - 148;  // subnormal: the leading bit sets the binade
}
// 2^k for a normal result.
float pow2(int k) { return uintBitsToFloat(uint(k + 127) << 23); }

// kernels/numerics.cpp pow2_ceil: 2^ceil(log2(a)) for a normal a > 0.
float pow2_ceil(float a) {
  const uint b = floatBitsToUint(a);
  return (b & 0x7fffffu) == 0u ? a : uintBitsToFloat(((b >> 23) + 1u) << 23);
}

// kernels/numerics.cpp e4m3_rne.
float e4m3_rne(float v) {
  if (isnan(v)) return v;
  const float a = abs(v);
  float q;
  if (a >= 448.0) {
    q = 448.0;
  } else if (a == 0.0) {
    q = 0.0;
  } else {
    const int e = max(frexp_exp(a) - 1, -6);
    // a / 2^(e-3) and back are exact (powers of two, normal results); roundEven is nearbyint's ties-to-even.
    precise float scaled = a * pow2(3 - e);
    precise float r = roundEven(scaled) * pow2(e - 3);
    q = r > 448.0 ? 448.0 : r;
  }
  return (floatBitsToUint(v) & 0x80000000u) != 0u ? -q : q;
}

// kernels/numerics.cpp e2m1_rne (e2m1_code's thresholds, midpoints to the even code).
float e2m1_rne(float v) {
  if (isnan(v)) return v;
  const float a = abs(v);
  float q;
  if (a <= 0.25) q = 0.0;
  else if (a < 0.75) q = 0.5;
  else if (a <= 1.25) q = 1.0;
  else if (a < 1.75) q = 1.5;
  else if (a <= 2.5) q = 2.0;
  else if (a < 3.5) q = 3.0;
  else if (a <= 5.0) q = 4.0;
  else q = 6.0;
  return (floatBitsToUint(v) & 0x80000000u) != 0u ? -q : q;
}
