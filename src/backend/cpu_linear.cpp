#include "backend/cpu_linear.h"

#include <algorithm>

#include "kernels/fp.h"

namespace sluice {

size_t gemm_min_tokens(const TypeTraits& t, Isa isa) {
  if (t.act == ActType::F32) return 1;
  // Their GEMMs' one-token paths read the rows in place, 16 at a time.
  if (isa >= Isa::Avx512 && (t.type == GgmlType::Q8_0 || t.type == GgmlType::Q2_K || t.type == GgmlType::IQ2_XXS))
    return 1;
  if (isa < Isa::Avx512 && t.type == GgmlType::Q2_K) return 4;
  if (isa < Isa::Avx512 && t.type == GgmlType::IQ2_XXS) return 3;
  return 2;
}

ActRows quantize_rows(ActType a, const float* x, size_t x_stride, size_t n, size_t cols) {
  ActRows r;
  r.type = a;
  r.stride = activation_bytes(a, (int64_t)cols);
  r.n = n;
  r.buf.resize(r.stride * n);
  for (size_t t = 0; t < n; ++t) quantize_activation(a, x + t * x_stride, r.buf.data() + t * r.stride, (int64_t)cols);
  return r;
}

void matmul(ThreadPool& pool, const Weight& W, std::span<const uint8_t* const> acts, float* y,
            size_t y_stride, bool round, uint64_t row0, uint64_t nrows) {
  const size_t n = acts.size();
  if (n == 0 || nrows == 0) return;
  const int64_t cols = (int64_t)W.cols;
  if (W.gemm && n >= W.gemm_min) {
    // Threads take whole tiles of kGemmRowTile rows so that no kernel call gets a ragged tile
    // except the last; the kernel gives each (row, token) the dot product's bits.
    const size_t tiles = (nrows + kGemmRowTile - 1) / kGemmRowTile;
    auto tile_body = [&](size_t b, size_t e) {
      const size_t r0 = b * kGemmRowTile, r1 = std::min<size_t>(nrows, e * kGemmRowTile);
      float* yt = y + r0;
      W.gemm(W.row(row0 + r0), W.row_bytes, (int64_t)(r1 - r0), acts.data(), (int64_t)n, cols, yt, y_stride);
      if (round)
        for (size_t t = 0; t < n; ++t)
          for (size_t r = 0; r < r1 - r0; ++r) yt[t * y_stride + r] = round_bf16(yt[t * y_stride + r]);
    };
    const size_t work_per_tile = (size_t)cols * n * kGemmRowTile;
    pool.parallel_for(tiles, tile_body, std::max<size_t>(1, (size_t)(1u << 16) / std::max<size_t>(1, work_per_tile)));
    return;
  }
  // Rows outer, tokens inner: each weight row is read once per batch.
  auto body = [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) {
      const uint8_t* wr = W.row(row0 + r);
      for (size_t t = 0; t < n; ++t) {
        const float v = W.dot(wr, acts[t], cols);
        y[t * y_stride + r] = round ? round_bf16(v) : v;
      }
    }
  };
  // Small products are not worth a thread hand-off.
  const size_t work_per_row = (size_t)cols * n;
  const size_t min_rows = std::max<size_t>(1, (size_t)(1u << 16) / std::max<size_t>(1, work_per_row));
  pool.parallel_for((size_t)nrows, body, min_rows);
}

void lin(ThreadPool& pool, const Weight& W, const float* x, size_t x_stride, size_t n, float* y,
         size_t y_stride, bool round, uint64_t row0, uint64_t nrows) {
  const ActRows a = quantize_rows(W.act(), x, x_stride, n, W.cols);
  std::vector<const uint8_t*> ptrs(n);
  for (size_t t = 0; t < n; ++t) ptrs[t] = a.row(t);
  matmul(pool, W, ptrs, y, y_stride, round, row0, nrows);
}

}  // namespace sluice
