// kernels/fp.h f32_to_bf16 (round to nearest even, NaN kept quiet), on the bits.
float round_bf16(float f) {
  const uint b = floatBitsToUint(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return uintBitsToFloat(((b >> 16) | 0x40u) << 16);
  return uintBitsToFloat(((b + 0x7fffu + ((b >> 16) & 1u)) >> 16) << 16);
}
