// exp on f32 with bits of its own (docs/numerics.md 4a): the same on every libm and every device.
//
// std::exp(float) is the C library's: glibc's expf is within 0.502 ulp, not correctly rounded,
// and its x86-64 build picks an FMA or a plain variant at load time, so its last bit depends on
// the library and the CPU. A device (the Vulkan backend's SwiGLU, softmaxes) cannot reproduce
// that. exp_f32 is defined by a short sequence of IEEE double operations instead: x * 64/ln2
// rounded to an integer k (ties to even) and a remainder r in [-1/2, 1/2], 2^(r/64) by a degree-4
// polynomial, times 2^((k mod 64)/64) from a table and 2^(k div 64), then one rounding to f32.
// Every constant is below (exp_f32_constants), so a device with f64 arithmetic computes the
// same bits from the same numbers. The result is within 0.5000006 ulp of exp(x) (every f32
// argument was checked once, docs/numerics.md 4a); results below 2^-126 are 0 (no subnormal, whose
// handling a device may flush), results past FLT_MAX +inf.
#pragma once
#include <cstddef>
#include <span>

namespace sluice {

// [0, 64): 2^(j/64); [64]: 64/ln 2; [65, 69): the polynomial's c1..c4 (2^(r/64) = 1 + r(c1 +
// r(c2 + r(c3 + r c4)))); all rounded to double from 60-digit values.
inline constexpr size_t kExpTable = 64, kExpInvLn2 = 64, kExpPoly = 65, kExpConstants = 69;
std::span<const double> exp_f32_constants();

float exp_f32(float x);

}  // namespace sluice
