// A random weight for the linear-layer tests of every backend (backend_ops_test,
// vulkan_backend_test): the type's valid-block generator, bytes owned by the test.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/weight.h"
#include "format/tensor_type.h"
#include "kernels/types.h"

namespace sluice::test {

struct HostWeight {
  std::vector<uint8_t> bytes;
  Weight w;  // not prepared: the caller hands it to a backend's prepare_weight
};

inline HostWeight random_host_weight(GgmlType type, uint64_t rows, uint64_t cols, uint64_t seed, float scale = 0.5f) {
  HostWeight h;
  const TypeTraits& tt = type_traits(type);
  h.w.type = type;
  h.w.traits = &tt;
  h.w.rows = rows;
  h.w.cols = cols;
  h.w.row_bytes = row_bytes(type, (int64_t)cols);
  h.bytes.resize(rows * h.w.row_bytes + 64);
  tt.random(h.bytes.data(), (int64_t)(rows * cols / (uint64_t)tt.block_elems), seed, scale);
  h.w.data = h.bytes.data();
  return h;
}

}  // namespace sluice::test
