// Engram table rows (deepseek-v41.md 4.4, quant-formats.md 2.4/2.5). A row of head_dim values is
// stored as head_dim E4M3 codes followed by head_dim/32 E8M0 scales; scale byte k covers values
// 32k .. 32k+31, and value_i = round_bf16(e4m3(code_i) * 2^(scale - 127)).
//
// In the type table this is GgmlType::ENGRAM_ROW with block_elems 32 / block_bytes 33 so that
// row_bytes() gives the right size, but the bytes are laid out per row, not per block: its
// DequantFn and DotFn take n = the whole row length (head_dim), never a fraction of a row.
//
// RandomFn convention for ENGRAM_ROW (nblocks counts 32-value blocks, 33 bytes each): when
// nblocks % 8 == 0 it writes nblocks/8 consecutive rows of head_dim 256 (the model's row);
// otherwise it writes one row of head_dim 32*nblocks. Either way it fills nblocks*33 bytes.
#pragma once
#include <cstdint>

namespace sluice {

constexpr int kEngramBlock = 32;          // values per E8M0 scale
constexpr int kEngramRandomHeadDim = 256; // row length the RandomFn uses (see above)

// Bytes of one row; head_dim must be a positive multiple of 32.
constexpr int64_t engram_row_bytes(int64_t head_dim) { return head_dim + head_dim / kEngramBlock; }

// One decoded value: round_bf16(e4m3(code) * e8m0(scale)). NaN if either byte is a NaN code.
float engram_value(uint8_t code, uint8_t scale);

// False if any code is an E4M3 NaN (0x7f, 0xff) or any scale is the E8M0 NaN (0xff).
// Throws Error if head_dim is not a positive multiple of 32.
bool engram_row_valid(const uint8_t* row, int head_dim);

// Decodes one row into out[0 .. head_dim). Invalid codes decode to NaN (check with
// engram_row_valid first). Throws Error if head_dim is not a positive multiple of 32.
void engram_dequant_row(const uint8_t* row, int head_dim, float* out);

}  // namespace sluice
