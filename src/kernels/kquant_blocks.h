// Byte layouts of the K-quant super-blocks (quant-formats.md 3.3, 4.2-4.6), the scale
// unpacking and the per-super-block float tails shared by the scalar reference
// (kquant_types.cpp) and the SIMD kernels (kquant_types_avx2.cpp, kquant_types_avx512.cpp).
//
// Everything here has internal linkage (static inline) on purpose: this header is compiled
// into TUs built with -mavx2 / -mavx512*. An ordinary inline function would be emitted once per
// TU and the linker would keep one copy, possibly the AVX-512 one, which the scalar path on an
// older CPU would then call. For the same reason the SIMD files decode fp16 through the
// out-of-line kquant_f16() (or F16C, f16c_load.h) instead of fp.h's inline f16_to_f32().
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace sluice::kquant {

constexpr int kQK = 256;  // elements per super-block, every type in this group

// Q8_K (activation): d float32 @0, qs int8[256] @4, bsums int16[16] @260.
namespace q8k { constexpr int kBytes = 292, kD = 0, kQs = 4, kBsums = 260; }
// Q2_K: scales[16] @0 (min << 4 | scale), qs[64] @16, d fp16 @80, dmin fp16 @82.
namespace q2k { constexpr int kBytes = 84, kScales = 0, kQs = 16, kD = 80, kDmin = 82; }
// Q3_K: hmask[32] @0, qs[64] @32, scales[12] @96 (16 packed 6-bit), d fp16 @108.
namespace q3k { constexpr int kBytes = 110, kHmask = 0, kQs = 32, kScales = 96, kD = 108; }
// Q4_K: d fp16 @0, dmin fp16 @2, scales[12] @4 (8 scales + 8 mins, 6 bits), qs[128] @16.
namespace q4k { constexpr int kBytes = 144, kD = 0, kDmin = 2, kScales = 4, kQs = 16; }
// Q6_K: ql[128] @0, qh[64] @128, scales int8[16] @192, d fp16 @208.
namespace q6k { constexpr int kBytes = 210, kQl = 0, kQh = 128, kScales = 192, kD = 208; }

// fp16 at p decoded exactly (fp.h's f16_to_f32, compiled once without ISA flags).
float kquant_f16(const uint8_t* p);

static inline float load_f32_at(const uint8_t* p) { float v; std::memcpy(&v, p, 4); return v; }
static inline int16_t load_i16_at(const uint8_t* p) { int16_t v; std::memcpy(&v, p, 2); return v; }

// Q3_K: the 16 signed 6-bit sub-block scales (-32..31) from the 12 packed bytes b (spec 4.3).
static inline void unpack_q3k_scales(const uint8_t* b, int8_t s[16]) {
  for (int i = 0; i < 16; ++i) {
    const int low4 = i < 8 ? (b[i] & 15) : (b[i - 8] >> 4);
    const int high2 = (b[8 + i % 4] >> (2 * (i / 4))) & 3;
    s[i] = (int8_t)((low4 | high2 << 4) - 32);
  }
}

// Q4_K: the 8 six-bit scales and 8 six-bit mins from the 12 packed bytes q (spec 4.4).
static inline void unpack_q4k_scales(const uint8_t* q, uint8_t sc[8], uint8_t m[8]) {
  for (int k = 0; k < 4; ++k) {
    sc[k] = q[k] & 63;
    m[k] = q[k + 4] & 63;
  }
  for (int k = 4; k < 8; ++k) {
    sc[k] = (uint8_t)((q[k + 4] & 15) | ((q[k - 4] >> 6) << 4));
    m[k] = (uint8_t)((q[k + 4] >> 4) | ((q[k] >> 6) << 4));
  }
}

// ---- The canonical dot products -------------------------------------------------------------
// sluice defines each K-quant x Q8_K dot as: per super-block, the exact integer sums (below),
// then that super-block's few float operations in the fixed order written in the *_tail
// functions, accumulated into one float `sumf` super-block by super-block, starting at 0.
// This deliberately differs from ggml's generic code for Q3_K/Q4_K/Q6_K (8 float lane sums
// reduced at the end, quant-formats.md 4.3-4.6): with a single float per super-block the SIMD
// kernels can compute the integer sums in any lane order and still give the same bits. The
// value differs from ggml's by float rounding only. Q2_K's sequence is ggml's generic one.
// Every SIMD kernel calls the same tail with the same integers, and -ffp-contract=off keeps the
// compiler from fusing any of it, so the ISA never changes a bit.
//
// Integer bounds (any byte pattern, q8 taken as full int8 -128..127, bsums as any int16):
//   Q2_K isum  <= 16 sub-blocks * 15 * 16 * 3 * 128      =   1.5e6; summs    <= 16*15*32768 = 7.9e6
//   Q3_K isum  <= 16 * 32 * 16 * 4 * 128                  =   4.2e6
//   Q4_K isum  <=  8 * 63 * 32 * 15 * 128                 =  31.0e6; sumi_min <= 16*63*32768 = 3.3e7
//   Q6_K isum  <= 16 * 128 * 16 * 32 * 128                = 134.2e6
//   Q8_K isum  <= 256 * 128 * 128                         =   4.2e6
// all far below 2^31 = 2147e6, so int32 is exact in every summation order.

// Q2_K: sumf += dall*isum - dmin*summs (spec 4.2).
static inline float q2k_tail(float sumf, float yd, float xd, float xdmin, int32_t isum, int32_t summs) {
  const float dall = yd * xd;
  const float dmin = yd * xdmin;
  return sumf + (dall * (float)isum - dmin * (float)summs);
}

// Q3_K, Q6_K: isum = sum_k s_k * sum_{e in k} q8[e]*q[e]; sumf += (d*y.d) * isum.
static inline float scaled_tail(float sumf, float yd, float xd, int32_t isum) {
  const float dd = xd * yd;
  return sumf + dd * (float)isum;
}

// Q4_K: sumf += (d*y.d)*isum - (dmin*y.d)*sumi_min.
static inline float q4k_tail(float sumf, float yd, float xd, float xdmin, int32_t isum, int32_t sumi_min) {
  const float dd = xd * yd;
  const float dm = xdmin * yd;
  return sumf + (dd * (float)isum - dm * (float)sumi_min);
}

// Q8_K x Q8_K (only for inspecting/testing Q8_K as a row type): sumf += (x.d*y.d) * isum.
static inline float q8k_tail(float sumf, float yd, float xd, int32_t isum) {
  const float dd = xd * yd;
  return sumf + dd * (float)isum;
}

// SIMD kernels (n = elements, a multiple of 256). Defined in kquant_types_avx2.cpp and
// kquant_types_avx512.cpp; only called after a run-time CPU check (cpu.h).
float dot_q8_k_avx2(const void* x, const void* y, int64_t n);
float dot_q2_k_avx2(const void* x, const void* y, int64_t n);
float dot_q3_k_avx2(const void* x, const void* y, int64_t n);
float dot_q4_k_avx2(const void* x, const void* y, int64_t n);
float dot_q6_k_avx2(const void* x, const void* y, int64_t n);
float dot_q8_k_avx512(const void* x, const void* y, int64_t n);
float dot_q2_k_avx512(const void* x, const void* y, int64_t n);
float dot_q3_k_avx512(const void* x, const void* y, int64_t n);
float dot_q4_k_avx512(const void* x, const void* y, int64_t n);
float dot_q6_k_avx512(const void* x, const void* y, int64_t n);
// GEMM (types.h GemmFn), gemm_q2_k_avx2.cpp / gemm_q2_k_avx512.cpp.
void gemm_q2_k_avx2(const void* w, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                    int64_t n, float* y, size_t ldy);
void gemm_q2_k_avx512(const void* w, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                      int64_t n, float* y, size_t ldy);
// Its one-token path (gemv_q2_k_avx512.cpp): y[r] for rows [0, nrows), same bits.
void gemv_q2_k_avx512(const void* w, size_t w_stride, int64_t nrows, const uint8_t* act, int64_t n, float* y);

}  // namespace sluice::kquant
