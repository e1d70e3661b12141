// The quantized-format table: one row per tensor data type (ggml numbering), in the spirit of
// ggml's type traits. Everything that needs to know a format's geometry or how to decode it
// goes through this table; nothing else switches on the type id.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace sluice {

// Numeric ids are ggml's (quant-formats.md section 0). ENGRAM_ROW is sluice's own id for the
// Engram row format (head_dim E4M3 codes followed by head_dim/32 E8M0 scales); it never
// appears in a GGUF (the tables are stored as I8 [row_bytes, rows]).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41, Q2_0 = 42,
  ENGRAM_ROW = 1000,
};

// The activation format a weight type's dot product consumes (F32 activations are converted
// once per row with quantize_activation and reused for every weight row).
enum class ActType : uint8_t { F32, Q8_0, Q8_K };

// Weight-row x activation-row dot product over n elements (n a multiple of block_elems).
using DotFn = float (*)(const void* weights, const void* act, int64_t n);
// Decode n elements (a multiple of block_elems) to f32.
using DequantFn = void (*)(const void* src, float* dst, int64_t n);
// Fill nblocks valid blocks: finite scales, values of magnitude about `scale` (the rms of the
// decoded elements is within a small factor of it), deterministic in `seed`.
using RandomFn = void (*)(void* dst, int64_t nblocks, uint64_t seed, float scale);

struct TypeTraits {
  GgmlType type;
  std::string_view name;
  int block_elems;   // elements per block
  int block_bytes;   // bytes per block
  ActType act;       // what the dot product consumes
  bool has_kernels;  // false: a known GGUF type sluice can size but not compute with
  DequantFn dequant;
  RandomFn random;
  DotFn dot_scalar;  // the reference: defines the result bit for bit
  DotFn dot_avx2;    // nullptr when there is none; must equal dot_scalar bit for bit
  DotFn dot_avx512;
};

// Row for a ggml type id, or nullptr for unknown / removed ids (4, 5, 31-33, 36-38, >= 43 ...).
const TypeTraits* find_type(uint32_t id);
const TypeTraits& type_traits(GgmlType t);  // throws Error for an unknown type
std::optional<GgmlType> type_from_name(std::string_view name);

// Bytes of a row of n elements; throws Error if n is not a whole number of blocks.
uint64_t row_bytes(GgmlType t, uint64_t n);

// Activation-side quantization (quant-formats.md section 3). n must be a multiple of the
// activation block (32 for Q8_0, 256 for Q8_K).
size_t activation_bytes(ActType a, int64_t n);
void quantize_activation(ActType a, const float* x, void* dst, int64_t n);

}  // namespace sluice
