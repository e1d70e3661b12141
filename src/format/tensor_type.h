// Tensor data types as a file stores them: ggml's type ids and each type's block geometry
// (elements and bytes per block). This is all the format layer needs to size and validate any
// tensor of any GGUF; how a type is decoded or multiplied is the kernels' business
// (kernels/types.h adds those traits per type, like ggml's type_traits vs type_traits_cpu).
#pragma once
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

struct TypeInfo {
  GgmlType type;
  std::string_view name;
  int block_elems;  // elements per block
  int block_bytes;  // bytes per block
};

// Row for a type id, or nullptr for unknown / removed ids (4, 5, 31-33, 36-38, >= 43 ...).
const TypeInfo* find_type_info(uint32_t id);
const TypeInfo& type_info(GgmlType t);  // throws Error for an unknown type
std::optional<GgmlType> type_from_name(std::string_view name);

// Bytes of a row of n elements; throws Error if n is not a whole number of blocks.
uint64_t row_bytes(GgmlType t, uint64_t n);

}  // namespace sluice
