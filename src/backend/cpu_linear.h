// The CPU backend's linear layers (docs/numerics.md 2): each activation row is quantized once
// to the weight's activation type, then dotted with weight rows by the type's kernel. Threads
// split output rows only, so every output element is one kernel call whatever the thread count
// or the number of tokens in the batch.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/thread_pool.h"
#include "backend/weight.h"

namespace sluice {

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
