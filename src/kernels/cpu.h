// Run-time choice of kernel implementation. SIMD kernels are required to give the same bits as
// the scalar reference, so the choice changes speed only, never results.
#pragma once
#include <string_view>
#include "kernels/types.h"

namespace sluice {

enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };

Isa detect_isa();                 // best ISA this CPU supports
Isa active_isa();                 // detect_isa(), capped by SLUICE_ISA=scalar|avx2|avx512
void set_active_isa(Isa isa);     // for tests and benchmarks; capped at detect_isa()
std::string_view isa_name(Isa isa);

// The dot product for type t at the given ISA (falls back to the best lower ISA available).
DotFn dot_for(const TypeTraits& t, Isa isa);
inline DotFn dot_for(const TypeTraits& t) { return dot_for(t, active_isa()); }
// The GEMM for type t at the given ISA (best lower ISA that has one), or nullptr when none.
GemmFn gemm_for(const TypeTraits& t, Isa isa);
inline GemmFn gemm_for(const TypeTraits& t) { return gemm_for(t, active_isa()); }

}  // namespace sluice
