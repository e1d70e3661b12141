// The format groups that contribute rows to the type table (types.cpp). Each group lives in
// its own files: <group>.cpp (scalar reference, random blocks, rows), <group>_avx2.cpp and
// <group>_avx512.cpp (SIMD dot products, equal to the scalar reference bit for bit).
#pragma once
#include <cstddef>
#include <span>
#include "kernels/types.h"

namespace sluice {

std::span<const TypeTraits> float_type_rows();   // F32, F16, BF16, ENGRAM_ROW   (float_types*.cpp)
std::span<const TypeTraits> kquant_type_rows();  // Q8_K, Q2_K, Q3_K, Q4_K, Q6_K (kquant_types*.cpp)
std::span<const TypeTraits> iquant_type_rows();  // Q8_0, Q2_0, IQ2_XXS, IQ2_XS, TQ2_0 (iquant_types*.cpp)

// Activation quantizers (quant-formats.md 3.1 and 3.3).
void quantize_row_q8_0(const float* x, void* dst, int64_t n);  // iquant_types.cpp
void quantize_row_q8_k(const float* x, void* dst, int64_t n);  // kquant_types.cpp

}  // namespace sluice
