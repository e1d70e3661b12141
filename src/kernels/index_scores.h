// The lightning indexer's scores as exact integer dot products (docs/numerics.md 6).
//
// score[j] = sum_h relu(q_h . k_j) * w'_h, where every index key k_j is packed MXFP4 (E2M1 codes,
// an E8M0 scale per 32) and every query head q_h holds MXFP4-grid values too. Each block of 32 is
// an integer vector times a power of two: key value = m * 2^x with m = 2 * E2M1 in [-12, 12] and
// x = scale code - 128; a query block is decomposed the same way (prepare_index_query). So a head
// dot is sum_b D_b * 2^(xq_b + xk_b) with D_b = sum m_q * m_k an exact int32 (|D_b| <= 4,608).
//
// When is that the float path's result, bit for bit? The float path (unpack to BF16, f32 dot in
// any order, with or without FMA) computes with terms m_q m_k 2^X, each exact. All its partial
// sums are multiples of 2^Xmin no larger than 4 * 32 * 144 * 2^Xmax = 18,432 * 2^Xmax, so they are
// exact in f32's 24 bits whenever 18,432 * 2^(Xmax - Xmin) <= 2^24, i.e. the exponents of one
// head's nonzero blocks, query plus key, span at most 9 binades for a 128-wide head (and 2^Xmin is
// a normal float and 2^Xmax far from overflow). Then every order gives the exact sum, and so does
// the integer form: D_b * 2^X exact, the block values added in f32, exactly. IndexQuery::span_limit
// is that bound for the query's width (index_span_limit).
//
// The kernels check it per key against bounds of the query (the widest head span plus the key's
// span): a key that fails, or has a NaN scale, is not scored and its index is returned for the
// float path. Real keys and queries span 1-3 binades (RMS-normed vectors), so the fallback is for
// constructed cases (tests/index_scores_test.cpp builds them and shows the two forms differ there).
// After the head dots, relu, the head weight and the sum over heads are the float path's f32 ops
// in the same order, so the score is the float path's too.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu.h"

namespace sluice {

inline constexpr uint32_t kIndexMaxHeadDim = 256;
// Exponent range of the integer form: 2^X a normal float, and 18,432 * 2^X far below FLT_MAX.
inline constexpr int32_t kIndexMinExp = -126, kIndexMaxExp = 100;

// The widest exponent span (binades) of one head's nonzero blocks for which every f32 partial sum
// of a head dot of `blocks` blocks of 32 is exact: blocks * 4,608 * 2^span <= 2^24 (9 for 4 blocks).
int32_t index_span_limit(uint32_t blocks);

// One query of the indexer in integer form.
struct IndexQuery {
  uint32_t heads = 0, head_dim = 0, blocks = 0;  // blocks of 32 per head
  bool integer = false;             // every head block decomposed: the integer kernels apply
  std::vector<int8_t> m;            // [heads][head_dim] q / 2^x
  std::vector<int32_t> bias;        // [heads][blocks] -12 * sum of the block's m (the u8 offset)
  std::vector<float> scale;         // [heads][blocks] 2^x, 0 for an all-zero block
  std::vector<float> w;             // [heads] w'
  int32_t span = 0;                 // widest exponent span of one head's nonzero blocks
  int32_t span_limit = 0;           // index_span_limit(blocks)
  int32_t xmin = 0, xmax = 0;       // smallest and largest exponent of a nonzero block
};

// Decomposes q ([heads][head_dim] floats, MXFP4-grid values) with head weights w'. A block that is
// not an integer in [-12, 12] times a power of two, or a head_dim that is not a multiple of 32 up to
// kIndexMaxHeadDim, leaves integer = false (the caller takes the float path).
void prepare_index_query(const float* q, const float* w_prime, uint32_t heads, uint32_t head_dim, IndexQuery& out);

// Scores n packed keys at keys + j * fp4_row_bytes(Mxfp4, head_dim) into scores[j]. Keys the
// integer form may not match (NaN scale, exponent span or range) are skipped and their j written
// to fallback (room for n), ascending; returns how many. q.integer must hold.
using IndexScoresFn = size_t (*)(const IndexQuery& q, const uint8_t* keys, size_t n, float* scores,
                                 uint32_t* fallback);
// The scalar reference of the integer form.
size_t index_scores_int(const IndexQuery& q, const uint8_t* keys, size_t n, float* scores, uint32_t* fallback);
size_t index_scores_int_avx512(const IndexQuery& q, const uint8_t* keys, size_t n, float* scores,
                               uint32_t* fallback);
// Heap bytes of an IndexQuery's integer form (the engine's footprint counts them).
constexpr uint64_t index_query_bytes(uint32_t heads, uint32_t head_dim) {
  return (uint64_t)heads * head_dim + (uint64_t)heads * (head_dim / 32) * 8 + (uint64_t)heads * 4;
}
// The integer kernel worth using at this ISA (VNNI), or nullptr: below it the float path is faster.
IndexScoresFn index_scores_for(Isa isa);

// Whether the integer form provably equals the float path for this query and key (the check the
// kernels make).
bool index_key_exact(const IndexQuery& q, const uint8_t* key);
// The same check from a key's smallest and largest nonzero-block exponent (kmax < kmin: none).
inline bool index_exponents_exact(const IndexQuery& q, int32_t kmin, int32_t kmax) {
  if (kmax < kmin) return true;  // an all-zero key
  return q.span + (kmax - kmin) <= q.span_limit && q.xmin + kmin >= kIndexMinExp && q.xmax + kmax <= kIndexMaxExp;
}

}  // namespace sluice
