// <immintrin.h> for the AVX-512 kernels. GCC 12's AVX-512 headers initialise some intrinsics'
// pass-through operand from _mm512_undefined_* and then warn about it (GCC bug 105593, fixed in
// 12.3); the warning points into the header, so it is silenced around the include only.
// (gemm_q8_0, gemm_q2_k, gemm_iq2_xxs and iquant_types keep -Wmaybe-uninitialized off for their
// whole file instead.)
#pragma once
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
