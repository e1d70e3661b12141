// kernels/numerics.cpp sigmoid, the CPU's bits: 1 / (1 + exp_f32(-x)), the division correctly
// rounded; 0 where the denominator overflows. Include exact_div.glsl and exp_f32.glsl first.
float sigmoid(float x) {
  precise float d = 1.0 + exp_f32(-x);
  return isinf(d) ? 0.0 : div_rn(1.0, d);
}
