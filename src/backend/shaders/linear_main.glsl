// The main of the quantized linear shaders, included last. The shader defines a block's geometry
// (BLOCK_COLS columns, W_BLOCK weight bytes, A_BLOCK activation bytes, UNITS pieces of integer
// work), unit_sums(wo, ao, u): the exact integer sums of piece u of the block at weight byte wo and
// activation byte ao (two of them: a format with a second sum, mins or a second scale, uses .y),
// and block_term(wo, ao, s): the block's float term from the sums of all its pieces. FINISH(v)
// applies a last operation to the row's sum (the IQ2 formats' 1/8).
//
// The CPU's dot of a row is sumf = sumf + term(block) in block order from 0 (docs/numerics.md
// 2), its integer sums exact. Integer addition is associative, so a block's pieces may be summed
// in any order and by any lanes; the float chain may not, so it always runs in block order:
//  - plain build: one invocation per output walks the row's blocks (64 outputs per workgroup);
//  - LINEAR_SUBGROUP build: one subgroup per output. Its lanes take SUBGROUP / UNITS blocks at a
//    time, UNITS lanes per block (a butterfly of xor shuffles gives every lane of a block its
//    integer sums: exact in any order; lavapipe has no clustered operations),
//    each block's lanes compute its term, and every lane then adds the terms to its sumf in block
//    order, read from their lanes by shuffles: the CPU's sequence, the weight bytes read by
//    adjacent lanes together. The workgroup's subgroups take rows in turn (grid-stride, so the
//    host's group count only has to be at least one). A subgroup that is not whole (a driver may
//    split a workgroup unevenly) runs the plain sequence on its first lane instead.
#ifndef FINISH
#define FINISH(v) (v)
#endif

float add_term(float sumf, float term) {
  precise float r = sumf + term;
  return r;
}

// The plain sequence of one output: every piece of every block, in order.
float row_sum(uint wo, uint ao) {
  float sumf = 0.0;
  for (uint b = 0u; b < p.cols / BLOCK_COLS; ++b, wo += W_BLOCK, ao += A_BLOCK) {
    ivec2 s = ivec2(0);
    for (uint u = 0u; u < UNITS; ++u) s += unit_sums(wo, ao, u);
    sumf = add_term(sumf, block_term(wo, ao, s));
  }
  return sumf;
}

#ifndef LINEAR_SUBGROUP
void main() {
  const uint r = gl_GlobalInvocationID.x, t = gl_GlobalInvocationID.y;
  if (r >= p.rows || t >= p.n) return;
  const float v = row_sum(p.w_off + (p.row0 + r) * p.w_row_bytes, t * p.a_stride);
  store_out(r, t, FINISH(v));
}
#else
ivec2 cluster_sums(ivec2 s) {
  for (uint m = 1u; m < UNITS; m <<= 1) s += subgroupShuffleXor(s, m);
  return s;
}

void main() {
  const uint t = gl_WorkGroupID.y;
  const uint lane = gl_SubgroupInvocationID, size = gl_SubgroupSize;
  const bool whole = subgroupBallotBitCount(subgroupBallot(true)) == size;
  const uint per_pass = size / UNITS;  // blocks the subgroup takes at a time
  const uint blocks = p.cols / BLOCK_COLS;
  for (uint r = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID; r < p.rows;
       r += gl_NumWorkGroups.x * gl_NumSubgroups) {
    const uint wo = p.w_off + (p.row0 + r) * p.w_row_bytes, ao = t * p.a_stride;
    if (!whole) {
      if (subgroupElect()) store_out(r, t, FINISH(row_sum(wo, ao)));
      continue;
    }
    float sumf = 0.0;
    for (uint b0 = 0u; b0 < blocks; b0 += per_pass) {
      const uint b = b0 + lane / UNITS;
      ivec2 s = ivec2(0);
      if (b < blocks) s = unit_sums(wo + b * W_BLOCK, ao + b * A_BLOCK, lane % UNITS);
      s = cluster_sums(s);
      float term = 0.0;
      if (b < blocks) term = block_term(wo + b * W_BLOCK, ao + b * A_BLOCK, s);
      const uint m = min(per_pass, blocks - b0);
      for (uint i = 0u; i < m; ++i) sumf = add_term(sumf, subgroupShuffle(term, i * UNITS));
    }
    if (subgroupElect()) store_out(r, t, FINISH(sumf));
  }
}
#endif
