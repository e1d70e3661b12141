// The IQ2 formats' 8-element groups (kernels/iquant_types.cpp group_dot): grid magnitudes from the
// Tables binding, signs from a 7-bit index whose 8th bit is the parity of the other seven
// (ksigns_iq2xs[i] = i | parity(i) << 7).

// Adds the exact integer dot of one group with the 8 activation codes at byte offset q8 of each
// tile token's row (linear_common.glsl tok) to sums[t]; the group's values are decoded once.
// A grid entry's 8 magnitudes are two words of bytes (grid: its word offset within Tables, 0
// iq2xxs, 512 iq2xs). A sign negates its byte as (g ^ 0xff) + 1 = 256 - g: no carry reaches
// the next byte, as every grid magnitude is at least 1.
void group_dot(uint grid, uint entry, uint sign_index, uint q8, inout int sums[TOKENS]) {
  const uint signs = sign_index | ((uint(bitCount(sign_index)) & 1u) << 7);
  for (uint half_ = 0u; half_ < 2u; ++half_) {
    const uint sb = (signs >> (4u * half_)) & 15u;
    const uint m = ((sb & 1u) | ((sb & 2u) << 7) | ((sb & 4u) << 14) | ((sb & 8u) << 21)) * 0xffu;
    const uint wv = (tables[grid + 2u * entry + half_] ^ m) + (m & 0x01010101u);
    for (uint t = 0u; t < TOKENS; ++t) sums[t] += dot4(wv, a_tok4(t, q8 + 4u * half_));
  }
}

// The IQ2 formats' last operation: the row's sum times 1/8 (kernels/iquant_types.cpp).
float iq2_finish(float sumf) {
  precise float v = 0.125 * sumf;
  return v;
}
