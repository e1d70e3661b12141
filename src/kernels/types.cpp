#include "kernels/types.h"

#include <cstring>
#include <string>
#include <vector>

#include "kernels/groups.h"
#include "util/error.h"

namespace sluice {
namespace {

struct Table {
  std::vector<TypeTraits> rows;
  Table() {
    for (auto group : {float_type_rows(), kquant_type_rows(), iquant_type_rows()})
      for (const auto& r : group) rows.push_back(r);
    // Types sluice can size (so it can read and validate any GGUF) but has no kernels for.
    for (uint32_t id = 0; id <= (uint32_t)GgmlType::ENGRAM_ROW; ++id) {
      const TypeInfo* f = find_type_info(id);
      if (!f) continue;
      bool present = false;
      for (const auto& x : rows) present |= x.type == f->type;
      if (!present)
        rows.push_back(TypeTraits{f->type, f->name, f->block_elems, f->block_bytes, ActType::F32, false, nullptr,
                                  nullptr, nullptr, nullptr, nullptr, nullptr, nullptr});
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
