#include "kernels/fp4_rows.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "kernels/fp.h"
#include "kernels/numerics.h"

namespace sluice {

namespace {

float block_scale(Fp4Grid g, const float* p) { return g == Fp4Grid::Nvfp4 ? nvfp4_block_scale(p) : mxfp4_block_scale(p); }

// The scale byte of s. Nvfp4 scales lie on the E4M3 grid in [2^-9, 448], Mxfp4 scales are
// powers of two in [2^-126, 2^126] (normal floats: the exponent field is the E8M0 code), so
// both encodings are exact (tests/fp4_rows_test.cpp checks every code).
uint8_t scale_code(Fp4Grid g, float s) {
  return g == Fp4Grid::Nvfp4 ? f32_to_e4m3(s) : (uint8_t)(std::bit_cast<uint32_t>(s) >> 23);
}
uint8_t nan_scale(Fp4Grid g) { return g == Fp4Grid::Nvfp4 ? 0x7fu : 0xffu; }
float scale_value(Fp4Grid g, uint8_t code) { return g == Fp4Grid::Nvfp4 ? e4m3_to_f32(code) : e8m0_to_f32(code); }

}  // namespace

void fp4_pack_row(Fp4Grid g, const float* v, size_t n, uint8_t* out) {
  const size_t B = fp4_block(g);
  uint8_t* scales = out + n / 2;
  for (size_t b = 0; b < n; b += B) {
    const float* p = v + b;
    const float s = block_scale(g, p);
    uint8_t codes[32];
    bool nan = false;
    for (size_t i = 0; i < B; ++i) {
      const float x = p[i] / s;  // the quotient fake_quant rounds (numerics.cpp)
      nan |= std::isnan(x);
      codes[i] = nan ? 0 : e2m1_code(x);
    }
    for (size_t i = 0; i < B; i += 2) out[(b + i) / 2] = nan ? 0 : (uint8_t)(codes[i] | codes[i + 1] << 4);
    scales[b / B] = nan ? nan_scale(g) : scale_code(g, s);
  }
}

void fp4_unpack_row(Fp4Grid g, const uint8_t* in, size_t n, uint16_t* bf16) {
  const size_t B = fp4_block(g);
  const uint8_t* scales = in + n / 2;
  for (size_t b = 0; b < n; b += B) {
    // The block's 16 possible values, then one lookup per element.
    const float s = scale_value(g, scales[b / B]);
    uint16_t lut[16];
    // A NaN scale unpacks as the one quiet NaN (a NaN's sign after a multiply is not defined).
    for (uint8_t c = 0; c < 16; ++c) lut[c] = std::isnan(s) ? kBf16Nan : f32_to_bf16(e2m1_value(c) * s);
    const uint8_t* q = in + b / 2;
    uint16_t* o = bf16 + b;
    for (size_t j = 0; j < B / 2; ++j) {
      o[2 * j] = lut[q[j] & 15u];
      o[2 * j + 1] = lut[q[j] >> 4];
    }
  }
}

Fp4UnpackFn fp4_unpack_for(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return fp4_unpack_row_avx512;
    case Isa::Avx2: return fp4_unpack_row_avx2;
    default: return fp4_unpack_row;
  }
}

}  // namespace sluice
