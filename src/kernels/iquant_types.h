// Internals shared by the iquant format group (iquant_types.cpp, iquant_types_avx2.cpp,
// iquant_types_avx512.cpp): block geometry, the canonical per-block float steps, and the SIMD
// entry points. Not part of the public kernel interface (that is types.h / the type table).
//
// sluice's canonical dot product, for every type in this group: each block first produces exact
// integer sums (any summation order gives the same integers), then the block's float operations
// run in ONE fixed sequence, written once below, accumulating block by block, in block order, into
// a single float `sumf` that starts at +0. The SIMD kernels compute the integer sums with vectors
// and then call the very same step functions, so every ISA gives the same bits. Builds use
// -ffp-contract=off, so no step is fused into an FMA behind our back.
//
// The helpers take scales already converted to float: the scalar reference converts fp16 with
// fp.h's f16_to_f32, the SIMD files with F16C (_cvtsh_ss). Both are exact for every non-NaN fp16,
// subnormals included, so they agree bit for bit; with a NaN scale the result is NaN either way but
// its payload is not promised.
#pragma once
#include <cstddef>
#include <cstdint>

namespace sluice::iquant {

// Block geometry (quant-formats.md 3.1, 3.3, 4.7, 4.8, 4.12, 4.13).
inline constexpr int kQ8_0Elems = 32, kQ8_0Bytes = 34;      // d fp16 @0, qs int8[32] @2
inline constexpr int kQ8_KElems = 256, kQ8_KBytes = 292;    // d f32 @0, qs int8[256] @4, bsums int16[16] @260
inline constexpr int kQ8_KQs = 4;
inline constexpr int kQ2_0Elems = 64, kQ2_0Bytes = 18;      // d fp16 @0, qs u8[16] @2
inline constexpr int kIq2xxsBytes = 66;                     // d fp16 @0, qs u16[32] @2
inline constexpr int kIq2xsBytes = 74;                      // d fp16 @0, qs u16[32] @2, scales u8[8] @66
inline constexpr int kIq2xsScales = 66;
inline constexpr int kTq2_0Bytes = 66;                      // qs u8[64] @0, d fp16 @64
inline constexpr int kTq2_0D = 64;

// Internal linkage on purpose: the SIMD files are compiled with ISA flags, and a shared
// (COMDAT) out-of-line copy of an inline helper built with those flags could otherwise be picked
// by the linker for the scalar file as well.
namespace {

// Q8_0 x Q8_0: the two scales are multiplied first, then the block's integer sum.
inline float step_q8_0(float sumf, int32_t sumi, float dx, float dy) {
  return sumf + (float)sumi * (dx * dy);
}

// Q2_0 x Q8_0: one Q2_0 block spans two Q8_0 activation blocks; their scaled integer sums are
// accumulated (k = 0 then 1, from +0) before the weight scale is applied.
inline float step_q2_0(float sumf, int32_t s0, int32_t s1, float dx, float dy0, float dy1) {
  float acc = 0.0f;
  acc += dy0 * (float)s0;
  acc += dy1 * (float)s1;
  return sumf + dx * acc;
}

// IQ2_XXS / IQ2_XS x Q8_K: bsum = sum over sub-blocks (or half sub-blocks) of sumi * (2s + 1).
// The common factor 1/8 of the sub-block scales is applied once, at the end (finish_iq2).
inline float step_iq2(float sumf, int32_t bsum, float dx, float dy) {
  return sumf + (dx * dy) * (float)bsum;
}
inline float finish_iq2(float sumf) { return 0.125f * sumf; }

// TQ2_0 x Q8_K.
inline float step_tq2_0(float sumf, int32_t sumi, float dx, float dy) {
  return sumf + (float)sumi * (dy * dx);
}

}  // namespace

// SIMD dot products (same signature and bits as the scalar reference in iquant_types.cpp).
float dot_q8_0_avx2(const void* x, const void* y, int64_t n);
float dot_q2_0_avx2(const void* x, const void* y, int64_t n);
float dot_iq2_xxs_avx2(const void* x, const void* y, int64_t n);
float dot_iq2_xs_avx2(const void* x, const void* y, int64_t n);
float dot_tq2_0_avx2(const void* x, const void* y, int64_t n);

float dot_q8_0_avx512(const void* x, const void* y, int64_t n);
float dot_q2_0_avx512(const void* x, const void* y, int64_t n);
float dot_iq2_xxs_avx512(const void* x, const void* y, int64_t n);
float dot_iq2_xs_avx512(const void* x, const void* y, int64_t n);
float dot_tq2_0_avx512(const void* x, const void* y, int64_t n);

// GEMM (types.h GemmFn), gemm_iq2_xxs_avx2.cpp / gemm_iq2_xxs_avx512.cpp.
void gemm_iq2_xxs_avx2(const void* w, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                       int64_t n, float* y, size_t ldy);
void gemm_iq2_xxs_avx512(const void* w, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                         int64_t n, float* y, size_t ldy);
// Its one-token path (gemv_iq2_xxs_avx512.cpp): y[r] for rows [0, nrows), same bits.
void gemv_iq2_xxs_avx512(const void* w, size_t w_stride, int64_t nrows, const uint8_t* act, int64_t n, float* y);

}  // namespace sluice::iquant
