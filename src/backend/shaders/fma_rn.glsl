// The CPU's fused fma (std::fma: one rounding) from exact parts, for the canonical dot
// (kernels/float_types.cpp): Vulkan lets a device run GLSL's fma as a multiply and an add
// (lavapipe does), so the product of two floats is taken exact in double, its sum with c rounded
// to odd in double (TwoSum gives the rounding error; an inexact sum with an even last bit moves one
// ulp toward it), and the conversion to float rounds to nearest. Rounding to odd at 53 >= 2 * 24 +
// 2 bits makes that one correct rounding of a * b + c (Boldo and Melquiond, "Emulation of FMA and
// correctly rounded sums: proved algorithms using rounding to odd", IEEE TC 2008). Needs
// shaderFloat64.
float fma_rn(float a, float b, float c) {
  precise double p = double(a) * double(b);  // exact: 24 + 24 significant bits
  precise double dc = double(c);
  precise double s = p + dc;
  precise double bb = s - p;
  precise double err = (p - (s - bb)) + (dc - bb);  // TwoSum: p + dc = s + err exactly
  if (err != 0.0 && !isinf(s) && !isnan(s)) {
    uvec2 u = unpackDouble2x32(s);  // x: low word
    if ((u.x & 1u) == 0u) {
      if ((err > 0.0) == (s > 0.0)) {  // one ulp away from zero
        u.x += 1u;
        if (u.x == 0u) u.y += 1u;
      } else {  // one ulp toward zero
        if (u.x == 0u) u.y -= 1u;
        u.x -= 1u;
      }
      s = packDouble2x32(u);
    }
  }
  return float(s);
}
