// Q2_K's and Q4_K's super-block term (kernels/kquant_blocks.h q2k_tail, q4k_tail: the same
// operations, their products written in the other order, which changes no bit):
// (d * y.d) * isum - (dmin * y.d) * mins, which the step adds to the running sum. Every step is a
// correctly rounded f32 add, multiply or int -> float conversion that `precise` keeps unfused and
// in order, so the bits are the CPU's as long as no product is an f32 denormal (a Q8_K scale of
// 1e-30 and smaller: docs/numerics.md). The other K-quants use scaled_term (linear_common.glsl).
float min_term(float yd, float xd, float xdmin, int isum, int mins) {
  precise float dd = xd * yd;
  precise float dm = xdmin * yd;
  precise float a = dd * float(isum);
  precise float b = dm * float(mins);
  precise float t = a - b;
  return t;
}
