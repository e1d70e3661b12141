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
//    lane instead. A tile past the last token repeats the last token's row and stores nothing;
//  - LINEAR_GEMM build (prefill: tiles of TOKENS tokens, 16): an invocation per row of a
//    workgroup's GEMM_ROWS rows, computing the whole tile. Block by block, the workgroup stages
//    the rows' block and the tile's activation blocks in workgroup memory (each invocation
//    copies words of them: adjacent invocations read adjacent words), then every invocation
//    runs the plain sequence on its row for every token of the tile: a weight block is read from
//    memory once per 16 tokens, an activation block once per 64 rows, and each output's float
//    chain is still the CPU's. Needs no subgroup operations, only the device's workgroup memory
//    (a format whose tile does not fit stays on the build --gpu-linears chose).
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

#if defined(LINEAR_GEMM)
// Where a block starts: row rb + i's block b (bytes into Weights; one past the last row repeats
// it), and token t0 + t's (into Acts; one past the last token repeats it).
uint w_start(uint rb, uint i, uint b) { return p.w_off + (p.row0 + min(rb + i, p.rows - 1u)) * p.w_row_bytes + b * W_BLOCK; }
uint a_start(uint t0, uint t, uint b) { return min(t0 + t, p.n - 1u) * p.a_stride + b * A_BLOCK; }
// Words of a block starting at byte `start`: the last may lie past the block, never past its row.
uint block_words(uint start, uint bytes) { return ((start & 3u) + bytes + 3u) / 4u; }

void main() {
  const uint lid = gl_LocalInvocationID.x;
  const uint t0 = gl_WorkGroupID.y * TOKENS;
  const uint present = min(uint(TOKENS), p.n - t0);  // the tile's tokens that exist
  const uint blocks = p.cols / BLOCK_COLS;
  // Rows in turn (grid-stride), GEMM_ROWS per workgroup; every invocation stays for the
  // barriers, one past the last row repeating the last row's bytes.
  for (uint rb = gl_WorkGroupID.x * GEMM_ROWS; rb < p.rows; rb += gl_NumWorkGroups.x * GEMM_ROWS) {
    const uint r = rb + lid;
    float sumf[TOKENS];
    for (uint t = 0u; t < TOKENS; ++t) sumf[t] = 0.0;
    for (uint b = 0u; b < blocks; ++b) {
      // Staging: adjacent invocations copy adjacent words.
      for (uint i = lid; i < GEMM_ROWS * W_WORDS; i += GEMM_ROWS) {
        const uint start = w_start(rb, i / W_WORDS, b);
        if (i % W_WORDS < block_words(start, W_BLOCK)) sw[i] = w[(start >> 2) + i % W_WORDS];
      }
      for (uint i = lid; i < TOKENS * A_WORDS; i += GEMM_ROWS) {
        const uint start = a_start(t0, i / A_WORDS, b);
        if (i % A_WORDS < block_words(start, A_BLOCK)) sa[i] = a[(start >> 2) + i % A_WORDS];
      }
      for (uint t = 0u; t < TOKENS; ++t) tok[t] = t * A_WORDS * 4u + (a_start(t0, t, b) & 3u);
      memoryBarrierShared();
      barrier();
      const uint wo = lid * W_WORDS * 4u + (w_start(rb, lid, b) & 3u);
      ivec2 s[TOKENS];
      for (uint t = 0u; t < TOKENS; ++t) s[t] = ivec2(0);
      for (uint u = 0u; u < UNITS; ++u) unit_sums(wo, 0u, u, s);
      for (uint t = 0u; t < TOKENS; ++t) sumf[t] = add_term(sumf[t], block_term(wo, tok[t], s[t]));
      barrier();  // the next block's staging overwrites what this one read
    }
    if (r < p.rows)
      for (uint t = 0u; t < present; ++t) store_out(r, t0 + t, FINISH(sumf[t]));
  }
}
#elif !defined(LINEAR_SUBGROUP)
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
