// Correctly rounded f32 division and square root from operations Vulkan rounds correctly (f32 and
// f64 add, subtract, multiply, comparisons): the device's own quotient or root, which Vulkan
// allows a few ulp of error, is only a candidate, and the exact remainders in double choose the
// float the CPU's IEEE operation gives. Needs shaderFloat64.

// RN(a / b) for finite b != 0 and a finite quotient: of the candidate and its three neighbours
// either side, the one with the smallest remainder |a - c * b| (c * b has 48 significant bits, the
// difference at most 50: both exact in double), ties to the even significand.
float div_rn(float a, float b) {
  if (a == 0.0) return a / b;
  const double da = double(a), db = double(b);
  const float q0 = float(da / db);
  if (isinf(q0)) return q0;
  float best = q0;
  precise double br = abs(da - double(q0) * db);
  for (int k = -3; k <= 3; ++k) {
    if (k == 0) continue;
    const float c = uintBitsToFloat(uint(int(floatBitsToUint(q0)) + k));
    if (isinf(c) || isnan(c) || sign(c) != sign(q0)) continue;
    precise double r = abs(da - double(c) * db);
    if (r < br || (r == br && (floatBitsToUint(c) & 1u) == 0u)) {
      best = c;
      br = r;
    }
  }
  return best;
}

// RN(sqrt(t)) for a normal t > 0: the float c with c * c <= t < next(c) * next(c) (squares of
// floats exact in double), then whichever of c and next(c) lies nearer, by t against the square
// of their midpoint (25 significant bits, squared exact in double; sqrt is never exactly a midpoint).
float sqrt_rn(float t) {
  const double dt = double(t);
  uint c = floatBitsToUint(sqrt(t));
  for (int i = 0; i < 8 && double(uintBitsToFloat(c)) * double(uintBitsToFloat(c)) > dt; ++i) --c;
  for (int i = 0; i < 8 && double(uintBitsToFloat(c + 1u)) * double(uintBitsToFloat(c + 1u)) <= dt; ++i) ++c;
  const double lo = double(uintBitsToFloat(c)), hi = double(uintBitsToFloat(c + 1u));
  precise double mid = (lo + hi) * 0.5;
  precise double mid2 = mid * mid;
  return dt < mid2 ? uintBitsToFloat(c) : uintBitsToFloat(c + 1u);
}
