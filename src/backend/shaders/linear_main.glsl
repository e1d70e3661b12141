// The main of the quantized linear shaders, included last. The shader defines a block's geometry
// (BLOCK_COLS columns, W_BLOCK weight bytes, A_BLOCK activation bytes, UNITS pieces of integer
// work) and two functions:
//  - unit_sums(wo, ab, u, s): adds the exact integer sums of piece u of the block at weight byte
//    wo to s[t] for each token t of the tile, whose block starts at activation byte
//    tok[t] + ab (two sums: a format with a second one, mins or a second scale, uses .y). The
//    weight's values are decoded once for all the tile's tokens;
//  - block_term(wo, ao, s): one token's float term of the block from the sums of all its pieces.
// FINISH(v) applies a last operation to the row's sum (the IQ2 formats' 1/8).
//
// The CPU's dot of a row is sumf = sumf + term(block) in block order from 0 (docs/numerics.md
// 2), its integer sums exact. Integer addition is associative, so a block's pieces may be summed
// in any order and by any lanes; the float chain may not, so it always runs in block order:
//  - plain build: one invocation per output walks the row's blocks (64 outputs per workgroup);
//  - LINEAR_SUBGROUP build: one subgroup per row and tile of TOKENS tokens (1, or 4 for several
//    tokens: each weight byte is then read and decoded once for four of them). Its lanes take
//    SUBGROUP / UNITS blocks at a time, UNITS lanes per block (a butterfly of xor shuffles gives
//    every lane of a block its integer sums: exact in any order; lavapipe has no clustered
//    operations), each block's lanes compute its terms, and every lane then adds them to its
//    sums in block order, read from their lanes by shuffles: the CPU's sequence per output, the
//    weight bytes read by adjacent lanes together. The workgroup's subgroups take rows in turn
//    (grid-stride, so the host's group count only has to be at least one). A subgroup that is
//    not whole (a driver may split a workgroup unevenly) runs the plain sequence on its first
//    lane instead. A tile past the last token repeats the last token's row and stores nothing.
#ifndef FINISH
#define FINISH(v) (v)
#endif

float add_term(float sumf, float term) {
  precise float r = sumf + term;
  return r;
}

// The plain sequence of the tile's outputs: every piece of every block, in order.
void row_sums(uint wo, out float sumf[TOKENS]) {
  for (uint t = 0u; t < TOKENS; ++t) sumf[t] = 0.0;
  for (uint b = 0u; b < p.cols / BLOCK_COLS; ++b) {
    ivec2 s[TOKENS];
    for (uint t = 0u; t < TOKENS; ++t) s[t] = ivec2(0);
    for (uint u = 0u; u < UNITS; ++u) unit_sums(wo + b * W_BLOCK, b * A_BLOCK, u, s);
    for (uint t = 0u; t < TOKENS; ++t) sumf[t] = add_term(sumf[t], block_term(wo + b * W_BLOCK, tok[t] + b * A_BLOCK, s[t]));
  }
}

#ifndef LINEAR_SUBGROUP
void main() {
  const uint r = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (r >= p.rows || t >= p.n) return;
  tok[0] = t * p.a_stride;
  float v[TOKENS];
  row_sums(p.w_off + (p.row0 + r) * p.w_row_bytes, v);
  store_out(r, t, FINISH(v[0]));
}
#else
ivec2 cluster_sums(ivec2 s) {
  for (uint m = 1u; m < UNITS; m <<= 1) s += subgroupShuffleXor(s, m);
  return s;
}

void main() {
  const uint t0 = gl_WorkGroupID.y * TOKENS;
  const uint present = min(uint(TOKENS), p.n - t0);  // the tile's tokens that exist
  for (uint t = 0u; t < TOKENS; ++t) tok[t] = min(t0 + t, p.n - 1u) * p.a_stride;
  const uint lane = gl_SubgroupInvocationID, size = gl_SubgroupSize;
  const bool whole = subgroupBallotBitCount(subgroupBallot(true)) == size;
  const uint per_pass = size / UNITS;  // blocks the subgroup takes at a time
  const uint blocks = p.cols / BLOCK_COLS;
  for (uint r = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID; r < p.rows;
       r += gl_NumWorkGroups.x * gl_NumSubgroups) {
    const uint wo = p.w_off + (p.row0 + r) * p.w_row_bytes;
    float sumf[TOKENS];
    if (!whole) {
      if (subgroupElect()) {
        row_sums(wo, sumf);
        for (uint t = 0u; t < present; ++t) store_out(r, t0 + t, FINISH(sumf[t]));
      }
      continue;
    }
    for (uint t = 0u; t < TOKENS; ++t) sumf[t] = 0.0;
    for (uint b0 = 0u; b0 < blocks; b0 += per_pass) {
      const uint b = b0 + lane / UNITS;
      ivec2 s[TOKENS];
      for (uint t = 0u; t < TOKENS; ++t) s[t] = ivec2(0);
      if (b < blocks) unit_sums(wo + b * W_BLOCK, b * A_BLOCK, lane % UNITS, s);
      float term[TOKENS];
      for (uint t = 0u; t < TOKENS; ++t) {
        s[t] = cluster_sums(s[t]);
        term[t] = 0.0;
        if (b < blocks) term[t] = block_term(wo + b * W_BLOCK, tok[t] + b * A_BLOCK, s[t]);
      }
      const uint m = min(per_pass, blocks - b0);
      for (uint i = 0u; i < m; ++i)
        for (uint t = 0u; t < TOKENS; ++t) sumf[t] = add_term(sumf[t], subgroupShuffle(term[t], i * UNITS));
    }
    if (subgroupElect())
      for (uint t = 0u; t < present; ++t) store_out(r, t0 + t, FINISH(sumf[t]));
  }
}
#endif
