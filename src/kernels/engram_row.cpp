#include "kernels/engram_row.h"

#include <string>

#include "kernels/fp.h"
#include "util/error.h"

namespace sluice {
namespace {
void check_head_dim(int head_dim) {
  if (head_dim <= 0 || head_dim % kEngramBlock != 0)
    throw Error("Engram head_dim " + std::to_string(head_dim) + " is not a positive multiple of 32");
}
}  // namespace

float engram_value(uint8_t code, uint8_t scale) {
  // The product is exact except in the f32 subnormal range; the spec's formula rounds it to f32
  // and then to bf16, and so do we (the SIMD kernels use the same two steps).
  return round_bf16(e4m3_to_f32(code) * e8m0_to_f32(scale));
}

bool engram_row_valid(const uint8_t* row, int head_dim) {
  check_head_dim(head_dim);
  for (int i = 0; i < head_dim; ++i)
    if (e4m3_is_nan(row[i])) return false;
  for (int k = 0; k < head_dim / kEngramBlock; ++k)
    if (e8m0_is_nan(row[head_dim + k])) return false;
  return true;
}

void engram_dequant_row(const uint8_t* row, int head_dim, float* out) {
  check_head_dim(head_dim);
  const uint8_t* scales = row + head_dim;
  for (int i = 0; i < head_dim; ++i) out[i] = engram_value(row[i], scales[i / kEngramBlock]);
}

}  // namespace sluice
