// GEMM kernels of the type table (TypeTraits::gemm_*): for every type that has one and every ISA
// this CPU runs, y[t][r] must equal dot_scalar(row r, act t) bit for bit (memcmp) on random
// blocks, odd row and token counts (ragged tiles) and unaligned rows; and the CPU backend's
// matmul must give a chunk of tokens the same bits as one token at a time, on 1 and 2 threads.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu_backend.h"
#include "backend/cpu_linear.h"
#include "kernels/cpu.h"
#include "kernels/types.h"

namespace sluice {
namespace {

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<float> random_floats(size_t n, uint64_t seed, float scale) {
  std::vector<float> x(n);
  for (float& v : x) v = (float)((double)(splitmix(seed) >> 11) * 0x1p-53 * 2.0 - 1.0) * scale;
  return x;
}

std::vector<const TypeTraits*> types_with_gemm() {
  std::vector<const TypeTraits*> v;
  for (uint32_t id = 0; id < 64; ++id)
    if (const TypeTraits* t = find_type(id); t && t->has_kernels && (t->gemm_avx2 || t->gemm_avx512))
      v.push_back(t);
  return v;
}

std::vector<Isa> gemm_isas(const TypeTraits& t) {
  std::vector<Isa> v;
  if (detect_isa() >= Isa::Avx2 && t.gemm_avx2) v.push_back(Isa::Avx2);
  if (detect_isa() >= Isa::Avx512 && t.gemm_avx512) v.push_back(Isa::Avx512);
  return v;
}

// A weight of `rows` x `cols` random blocks, rows one byte apart from alignment; activations
// quantized from random floats, each row at its own odd offset.
struct Problem {
  const TypeTraits& t;
  int64_t rows, cols, tokens;
  size_t row_bytes;
  std::vector<uint8_t> w;
  std::vector<std::vector<uint8_t>> act_store;
  std::vector<const uint8_t*> acts;
  Problem(const TypeTraits& tt, int64_t r, int64_t c, int64_t n, uint64_t seed)
      : t(tt), rows(r), cols(c), tokens(n), row_bytes((size_t)(c / tt.block_elems) * (size_t)tt.block_bytes) {
    w.resize(row_bytes * (size_t)r + 1);
    t.random(w.data() + 1, (int64_t)(w.size() - 1) / t.block_bytes, seed, 0.5f);
    const size_t ab = activation_bytes(t.act, c);
    for (int64_t i = 0; i < n; ++i) {
      const std::vector<float> x = random_floats((size_t)c, seed * 977 + (uint64_t)i, i % 5 == 3 ? 1e-3f : 3.0f);
      act_store.emplace_back(ab + 16);
      quantize_activation(t.act, x.data(), act_store.back().data() + act_offset(i), c);
    }
    for (int64_t i = 0; i < n; ++i) acts.push_back(act_store[(size_t)i].data() + act_offset(i));
  }
  const uint8_t* row(int64_t r) const { return w.data() + 1 + (size_t)r * row_bytes; }
  // Quantized activation rows are bytes (any offset); f32 ones are float arrays, so they keep
  // float alignment but not vector alignment.
  size_t act_offset(int64_t i) const { return t.act == ActType::F32 ? 4 * (size_t)(1 + i % 3) : 1 + (size_t)(i % 3); }
};

TEST(Gemm, SomeTypeHasAGemmOnThisCpu) {
  if (detect_isa() < Isa::Avx2) GTEST_SKIP() << "no SIMD ISA on this CPU";
  EXPECT_FALSE(types_with_gemm().empty());
}

TEST(Gemm, EveryPairEqualsTheScalarDotBitForBit) {
  for (const TypeTraits* t : types_with_gemm()) {
    const int64_t be = t->block_elems;
    const std::vector<int64_t> col_counts = be == 1 ? std::vector<int64_t>{1, 15, 16, 17, 100, 257}
                                                    : std::vector<int64_t>{be, 3 * be, 7 * be, 41 * be};  // 41: K-chunks
    uint64_t seed = 11;
    for (Isa isa : gemm_isas(*t))
      for (int64_t cols : col_counts)
        for (int64_t rows : {1, 15, 16, 17, 33, 50})
          for (int64_t tokens : {1, 2, 3, 7, 8, 9, 17, 40}) {
            const Problem p(*t, rows, cols, tokens, ++seed);
            const size_t ldy = (size_t)rows + 3;
            std::vector<float> y(ldy * (size_t)tokens, -7.0f);
            gemm_for(*t, isa)(p.row(0), p.row_bytes, rows, p.acts.data(), tokens, cols, y.data(), ldy);
            int bad = 0;
            for (int64_t tk = 0; tk < tokens && bad < 3; ++tk) {
              for (int64_t r = 0; r < rows && bad < 3; ++r) {
                const float want = t->dot_scalar(p.row(r), p.acts[(size_t)tk], cols);
                const float got = y[(size_t)tk * ldy + (size_t)r];
                if (std::memcmp(&want, &got, 4) != 0) {
                  ++bad;
                  ADD_FAILURE() << t->name << " " << isa_name(isa) << " rows=" << rows << " cols=" << cols
                                << " tokens=" << tokens << " at (r=" << r << ", t=" << tk << "): got " << std::hexfloat
                                << got << " scalar " << want;
                }
              }
              // The padding between output rows is the caller's: the kernel must not write it.
              for (size_t r = (size_t)rows; r < ldy; ++r)
                if (y[(size_t)tk * ldy + r] != -7.0f && bad < 3) {
                  ++bad;
                  ADD_FAILURE() << t->name << " " << isa_name(isa) << " wrote past row " << rows;
                }
            }
          }
  }
}

// matmul on a chunk (GEMM) == matmul token by token (dot), for a row range that starts off a
// tile boundary, with rounding, on 1 and 2 threads.
TEST(Gemm, BackendMatmulOfAChunkEqualsTokenByToken) {
  for (const TypeTraits* t : types_with_gemm()) {
    const int64_t cols = t->block_elems == 1 ? 77 : 3 * t->block_elems;
    const int64_t rows = 70, tokens = 23;
    const Problem p(*t, rows, cols, tokens, 5);
    Weight W;
    W.type = t->type;
    W.cols = (uint64_t)cols;
    W.rows = (uint64_t)rows;
    W.row_bytes = p.row_bytes;
    W.data = p.row(0);
    prepare_cpu_weight(W);
    if (!W.gemm) continue;
    const uint64_t row0 = 5, nrows = 61;
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      for (bool round : {false, true}) {
        std::vector<float> chunk((size_t)(nrows * tokens)), single(chunk.size());
        matmul(pool, W, p.acts, chunk.data(), nrows, round, row0, nrows);
        for (int64_t tk = 0; tk < tokens; ++tk)
          matmul(pool, W, std::span<const uint8_t* const>(&p.acts[(size_t)tk], 1), single.data() + tk * nrows, nrows,
                 round, row0, nrows);
        EXPECT_EQ(std::memcmp(chunk.data(), single.data(), chunk.size() * 4), 0)
            << t->name << " threads=" << threads << " round=" << round;
      }
    }
  }
}

}  // namespace
}  // namespace sluice
