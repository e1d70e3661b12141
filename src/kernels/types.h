// The kernels' type table: per tensor data type (format/tensor_type.h gives the ids and the
// block geometry), how it is decoded, filled with random valid blocks and multiplied, in the
// spirit of ggml's type_traits_cpu. Every row repeats its type's geometry from the format table
// (checked by a test, TypeTable.GeometryIsTheFormats) so a kernel reads it from one place.
// Nothing else switches on the type id.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "format/tensor_type.h"

namespace sluice {

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
// Many weight rows times many activation rows (a prefill chunk, or the tokens routed to one
// expert): y[t * ldy + r] = dot(w + r * w_stride, acts[t], n) for r < nrows, t < nacts. It must
// equal the type's DotFn bit for bit for every (r, t): the integer block sums are exact and each
// pair's float steps run in the scalar order, so only the reuse of decoded weights and loaded
// activations across the tile differs. No heap; at most kGemmStackBytes of stack.
using GemmFn = void (*)(const void* w, size_t w_stride, int64_t nrows, const uint8_t* const* acts, int64_t nacts,
                        int64_t n, float* y, size_t ldy);
inline constexpr size_t kGemmStackBytes = 64 * 1024;

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
  GemmFn gemm_avx2;  // nullptr: the backend loops over DotFn (there is no scalar GEMM: the
  GemmFn gemm_avx512;  // reference is the dot loop itself)
};

// Row for a type id, or nullptr for ids the format table does not know. A type the format
// knows but sluice has no kernels for has a row with has_kernels false (it can be sized, not
// computed with).
const TypeTraits* find_type(uint32_t id);
const TypeTraits& type_traits(GgmlType t);  // throws Error for an unknown type

// Activation-side quantization (quant-formats.md section 3). n must be a multiple of the
// activation block (32 for Q8_0, 256 for Q8_K).
size_t activation_bytes(ActType a, int64_t n);
void quantize_activation(ActType a, const float* x, void* dst, int64_t n);

}  // namespace sluice
