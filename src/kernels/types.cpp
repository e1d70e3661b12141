#include "kernels/types.h"

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/groups.h"
#include "util/error.h"

namespace sluice {
namespace {

// Types sluice can size (so it can read and validate any GGUF) but has no kernels for.
constexpr TypeTraits size_only(GgmlType t, std::string_view name, int qk, int bytes) {
  return TypeTraits{t, name, qk, bytes, ActType::F32, false, nullptr, nullptr, nullptr, nullptr, nullptr};
}

constexpr std::array kSizeOnly = {
    size_only(GgmlType::Q4_0, "Q4_0", 32, 18),     size_only(GgmlType::Q4_1, "Q4_1", 32, 20),
    size_only(GgmlType::Q5_0, "Q5_0", 32, 22),     size_only(GgmlType::Q5_1, "Q5_1", 32, 24),
    size_only(GgmlType::Q8_1, "Q8_1", 32, 36),     size_only(GgmlType::Q5_K, "Q5_K", 256, 176),
    size_only(GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98), size_only(GgmlType::IQ1_S, "IQ1_S", 256, 50),
    size_only(GgmlType::IQ4_NL, "IQ4_NL", 32, 18), size_only(GgmlType::IQ3_S, "IQ3_S", 256, 110),
    size_only(GgmlType::IQ2_S, "IQ2_S", 256, 82),  size_only(GgmlType::IQ4_XS, "IQ4_XS", 256, 136),
    size_only(GgmlType::I8, "I8", 1, 1),           size_only(GgmlType::I16, "I16", 1, 2),
    size_only(GgmlType::I32, "I32", 1, 4),         size_only(GgmlType::I64, "I64", 1, 8),
    size_only(GgmlType::F64, "F64", 1, 8),         size_only(GgmlType::IQ1_M, "IQ1_M", 256, 56),
    size_only(GgmlType::TQ1_0, "TQ1_0", 256, 54),  size_only(GgmlType::MXFP4, "MXFP4", 32, 17),
    size_only(GgmlType::NVFP4, "NVFP4", 64, 36),   size_only(GgmlType::Q1_0, "Q1_0", 128, 18),
};

struct Table {
  std::vector<TypeTraits> rows;
  Table() {
    for (auto group : {float_type_rows(), kquant_type_rows(), iquant_type_rows()})
      for (const auto& r : group) rows.push_back(r);
    for (const auto& r : kSizeOnly) {
      bool present = false;
      for (const auto& x : rows) present |= x.type == r.type;
      if (!present) rows.push_back(r);
    }
  }
};

const Table& table() {
  static const Table t;
  return t;
}

}  // namespace

const TypeTraits* find_type(uint32_t id) {
  for (const auto& r : table().rows)
    if ((uint32_t)r.type == id) return &r;
  return nullptr;
}

const TypeTraits& type_traits(GgmlType t) {
  const TypeTraits* r = find_type((uint32_t)t);
  if (!r) throw Error("unknown tensor type id " + std::to_string((uint32_t)t));
  return *r;
}

std::optional<GgmlType> type_from_name(std::string_view name) {
  for (const auto& r : table().rows)
    if (r.name == name) return r.type;
  return std::nullopt;
}

uint64_t row_bytes(GgmlType t, uint64_t n) {
  const TypeTraits& r = type_traits(t);
  if (n % (uint64_t)r.block_elems != 0)
    throw Error("row of " + std::to_string(n) + " elements is not a whole number of " +
                std::string(r.name) + " blocks of " + std::to_string(r.block_elems));
  return n / (uint64_t)r.block_elems * (uint64_t)r.block_bytes;
}

size_t activation_bytes(ActType a, int64_t n) {
  switch (a) {
    case ActType::F32: return (size_t)n * 4;
    case ActType::Q8_0: return (size_t)(n / 32) * 34;
    case ActType::Q8_K: return (size_t)(n / 256) * 292;
  }
  return 0;
}

void quantize_activation(ActType a, const float* x, void* dst, int64_t n) {
  switch (a) {
    case ActType::F32: std::memcpy(dst, x, (size_t)n * 4); return;
    case ActType::Q8_0:
      if (n % 32) throw Error("Q8_0 activation row length " + std::to_string(n) + " is not a multiple of 32");
      quantize_row_q8_0(x, dst, n);
      return;
    case ActType::Q8_K:
      if (n % 256) throw Error("Q8_K activation row length " + std::to_string(n) + " is not a multiple of 256");
      quantize_row_q8_k(x, dst, n);
      return;
  }
}

}  // namespace sluice
