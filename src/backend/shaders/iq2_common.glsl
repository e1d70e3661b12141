// The IQ2 formats' 8-element groups (kernels/iquant_types.cpp group_dot): grid magnitudes from the
// Tables binding, signs from a 7-bit index whose 8th bit is the parity of the other seven
// (ksigns_iq2xs[i] = i | parity(i) << 7).

// Byte j of grid entry `entry` (word offset of the grid within Tables: 0 iq2xxs, 512 iq2xs).
int grid_byte(uint grid, uint entry, uint j) {
  return int((tables[grid + 2u * entry + (j >> 2)] >> ((j & 3u) << 3)) & 0xffu);
}

// Adds the exact integer dot of one group with the 8 activation codes at byte offset q8 of each
// tile token's row (linear_common.glsl tok) to sums[t]; the group's values are decoded once.
void group_dot(uint grid, uint entry, uint sign_index, uint q8, inout int sums[TOKENS]) {
  const uint signs = sign_index | ((uint(bitCount(sign_index)) & 1u) << 7);
  for (uint j = 0u; j < 8u; ++j) {
    const int g = grid_byte(grid, entry, j);
    const int wv = ((signs >> j) & 1u) != 0u ? -g : g;
    for (uint t = 0u; t < TOKENS; ++t) sums[t] += wv * a_tok(t, q8 + j);
  }
}

// The IQ2 formats' last operation: the row's sum times 1/8 (kernels/iquant_types.cpp).
float iq2_finish(float sumf) {
  precise float v = 0.125 * sumf;
  return v;
}
