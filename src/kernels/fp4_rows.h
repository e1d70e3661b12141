// The 4-bit rows of the sequence state (docs/numerics.md 5).
//
// The compressed KV rows and the index keys are fake-quantized to FP4 grids before they are
// cached: a compressed row to E2M1 values with an E4M3 scale per 16 (NVFP4-like), an index key
// to E2M1 values with a power-of-two (E8M0) scale per 32 (MXFP4). Every cached value is therefore
// q * s with q one of 16 E2M1 codes and s the block's scale, and storing the code and the scale
// instead of the BF16 value loses nothing: unpacking gives back the BF16 bits of bf16(q * s),
// exactly what fake_quant_nvfp4 / fake_quant_mxfp4 (numerics.h) leave in the row, which is
// defined through these same functions. A 512-wide row takes 288 bytes instead of 1,024; a
// 128-wide index key 68 instead of 256.
//
// Row layout: n/2 bytes of codes (element 2j in the low nibble of byte j, 2j+1 in the high
// nibble; code = sign << 3 | index into {0, .5, 1, 1.5, 2, 3, 4, 6}), then one scale byte per
// block (E4M3 for Nvfp4, E8M0 for Mxfp4).
//
// The one value a code cannot hold is NaN (only broken weights produce one): a block with a NaN
// is stored with the NaN scale code and unpacks as all NaN, where the fake-quantized BF16 row had
// NaN in that element only. Either way the attention and the indexer scores it feeds are NaN.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/cpu.h"

namespace sluice {

enum class Fp4Grid : uint8_t {
  Nvfp4,  // blocks of 16, E4M3 scale: compressed KV rows
  Mxfp4,  // blocks of 32, E8M0 scale: index keys (and, unpacked, indexer queries)
};

// What a block with a NaN scale unpacks to, in every element and on every ISA.
inline constexpr uint16_t kBf16Nan = 0x7fc0;

constexpr size_t fp4_block(Fp4Grid g) { return g == Fp4Grid::Nvfp4 ? 16 : 32; }
// Bytes of one packed row of n values (n a multiple of the block).
constexpr size_t fp4_row_bytes(Fp4Grid g, size_t n) { return n / 2 + n / fp4_block(g); }

// Quantizes n floats (BF16 values) to the grid and packs them (fp4_row_bytes(g, n) bytes).
void fp4_pack_row(Fp4Grid g, const float* v, size_t n, uint8_t* out);
// The packed row's values as BF16 bits: bf16(q * s) of each element. This is the scalar
// reference; fp4_unpack_for gives the fastest implementation, equal to it bit for bit.
void fp4_unpack_row(Fp4Grid g, const uint8_t* in, size_t n, uint16_t* bf16);

using Fp4UnpackFn = void (*)(Fp4Grid g, const uint8_t* in, size_t n, uint16_t* bf16);
void fp4_unpack_row_avx2(Fp4Grid g, const uint8_t* in, size_t n, uint16_t* bf16);
void fp4_unpack_row_avx512(Fp4Grid g, const uint8_t* in, size_t n, uint16_t* bf16);
// The unpacker for the given ISA: the best at or below it.
Fp4UnpackFn fp4_unpack_for(Isa isa);

}  // namespace sluice
