// The cache-blocked loop the float GEMMs (gemm_float_avx2.cpp, gemm_float_avx512.cpp) share:
// tokens in blocks whose activations fit about 768 KiB of the L2, so the weight rows of a row
// group, read once from memory, serve the whole block; within a block, row groups of `rows` and
// token groups of `tokens`, each given to the ISA's register tile that pick(r, t) returns for a
// group of r <= rows rows and t <= tokens tokens. Defined in a file without ISA flags: only the
// tiles are the ISA's.
#pragma once
#include <cstddef>
#include <cstdint>

namespace sluice {

// y[t * ldy + r] for r < the tile's rows, t < its tokens: the tile of w (rows w_stride apart)
// against the activations x[0..t) of n floats.
using FloatTileFn = void (*)(const uint8_t* w, size_t w_stride, const float* const* x, int64_t n, float* y,
                             size_t ldy);
using FloatTilePick = FloatTileFn (*)(int rows, int tokens);

inline constexpr int kMaxFloatTileTokens = 8;

// The GemmFn contract (kernels/types.h) with f32 activations; tokens <= kMaxFloatTileTokens.
void gemm_float_blocked(FloatTilePick pick, int rows, int tokens, const void* w, size_t w_stride, int64_t nrows,
                        const uint8_t* const* acts, int64_t nacts, int64_t n, float* y, size_t ldy);

}  // namespace sluice
