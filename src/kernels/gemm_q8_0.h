// The Q8_0 GEMM kernels (TypeTraits::gemm_avx2 / gemm_avx512, GemmFn in kernels/types.h), one file per
// ISA (gemm_q8_0_<isa>.cpp). Each gives every (row, token) its type's scalar dot
// product bit for bit; the row tables pick them up, the backend calls them through the table.
#pragma once
#include <cstddef>
#include <cstdint>

namespace sluice::iquant {

void gemm_q8_0_avx2(const void* w, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                    int64_t n, float* y, size_t ldy);
void gemm_q8_0_avx512(const void* w, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                      int64_t n, float* y, size_t ldy);

}  // namespace sluice::iquant
