// The scan of a top-k selection (numerics.cpp top_indices): the indices, ascending, of the scores
// at or above a threshold that are not -inf and not NaN. Both forms write the same indices.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cpu.h"

namespace sluice {

// Writes to out (room for n) and returns the count. t = -inf collects every selectable score.
using TopkCollectFn = size_t (*)(const float* s, size_t n, float t, int32_t* out);
size_t topk_collect(const float* s, size_t n, float t, int32_t* out);  // the scalar reference
size_t topk_collect_avx512(const float* s, size_t n, float t, int32_t* out);
TopkCollectFn topk_collect_for(Isa isa);

}  // namespace sluice
