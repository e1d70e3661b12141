// The K-quant super-block float tails of kernels/kquant_blocks.h, operation for operation. Every
// operand is a correctly rounded f32 add or multiply that `precise` keeps unfused and in order,
// and the integer sums are exact and below 2^24 except Q4_K's and Q6_K's bounds (kquant_blocks.h),
// whose int -> float conversion Vulkan also rounds correctly, so the bits are the CPU's as long as
// no product is an f32 denormal (a Q8_K scale of 1e-30 and smaller: docs/numerics.md).

// Q2_K: sumf + (dall * isum - dmin * summs), dall = yd * xd, dmin = yd * xdmin.
float q2k_tail(float sumf, float yd, float xd, float xdmin, int isum, int summs) {
  precise float dall = yd * xd;
  precise float dmin = yd * xdmin;
  precise float a = dall * float(isum);
  precise float b = dmin * float(summs);
  precise float t = a - b;
  precise float r = sumf + t;
  return r;
}

// Q3_K, Q6_K: sumf + (xd * yd) * isum.
float scaled_tail(float sumf, float yd, float xd, int isum) {
  precise float dd = xd * yd;
  precise float t = dd * float(isum);
  precise float r = sumf + t;
  return r;
}

// Q4_K: sumf + ((xd * yd) * isum - (xdmin * yd) * sumi_min).
float q4k_tail(float sumf, float yd, float xd, float xdmin, int isum, int sumi_min) {
  precise float dd = xd * yd;
  precise float dm = xdmin * yd;
  precise float a = dd * float(isum);
  precise float b = dm * float(sumi_min);
  precise float t = a - b;
  precise float r = sumf + t;
  return r;
}
