// The CPU backend's linear layers (docs/numerics.md 2): each activation row is quantized once
// to the weight's activation type, then dotted with weight rows by the type's kernel: the dot
// product for one token, its GEMM (which reuses each decoded weight tile across the tokens) for
// several. Threads split output rows only, and the GEMM gives every (row, token) the dot's bits,
// so no output depends on the thread count or on how many tokens share the call.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/thread_pool.h"
#include "backend/weight.h"
#include "kernels/cpu.h"

namespace sluice {

// matmul uses the weight's GEMM (when it has one) from W.gemm_min tokens on (prepare_cpu_weight
// sets it from this), and hands each thread whole tiles of kGemmRowTile rows. Measured (issue
// 11, docs/cpu-speed.md), AVX-512: the float GEMMs beat their dot loop already at one token
// (1.3-2.1x: several rows share each activation load, and one row's fma chain, which the scalar
// bits fix, no longer limits the read), and so do the quantized GEMMs with AVX-512, whose
// one-token paths read the rows in place, 16 in lock step (Q8_0 2x the dot loop in cache, Q2_K
// 1.2x, IQ2_XXS 1.15-1.2x at two threads); from two tokens every GEMM wins. AVX2 (no VNNI, no VBMI: the
// 2-bit tiles cost more to decode and to multiply) needs more tokens per tile: at two the Q2_K
// GEMM runs at 0.76x its dot loop and IQ2_XXS at 0.89x; IQ2_XXS wins from three (1.22x), Q2_K
// from four (1.18x; even at three).
size_t gemm_min_tokens(const TypeTraits& t, Isa isa);
inline constexpr size_t kGemmRowTile = 16;

// n activation rows of `cols` elements in one activation format.
struct ActRows {
  ActType type = ActType::F32;
  size_t stride = 0;  // bytes per row
  size_t n = 0;
  std::vector<uint8_t> buf;
  const uint8_t* row(size_t i) const { return buf.data() + i * stride; }
};
ActRows quantize_rows(ActType a, const float* x, size_t x_stride, size_t n, size_t cols);

// y[t * y_stride + (r - row0)] = dot(W.row(r), acts[t]) for r in [row0, row0 + nrows);
// rounded to BF16 when `round` (numerics.md 3), else kept f32 (numerics.md 2 exceptions).
void matmul(ThreadPool& pool, const Weight& W, std::span<const uint8_t* const> acts, float* y,
            size_t y_stride, bool round, uint64_t row0, uint64_t nrows);

// Quantize x (n rows, stride x_stride floats, W.cols used) and multiply by rows
// [row0, row0 + nrows) of W.
void lin(ThreadPool& pool, const Weight& W, const float* x, size_t x_stride, size_t n, float* y,
         size_t y_stride, bool round, uint64_t row0, uint64_t nrows);

}  // namespace sluice
