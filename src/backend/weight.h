// A weight as the forward pass hands it to a backend: its geometry, its bytes in the file's
// format (host memory, owned by the Model) and what the backend prepared for it at load time
// (Backend::prepare_weight): the CPU backend picks the dot kernel of the type for this CPU; a
// device backend keeps its uploaded or repacked copy in `device`.
#pragma once
#include <cstdint>

#include "kernels/types.h"

namespace sluice {

// A 2-D weight: `rows` rows of `cols` elements, row r at data + r * row_bytes.
struct Weight {
  GgmlType type = GgmlType::F32;
  uint64_t cols = 0, rows = 0, row_bytes = 0;
  const uint8_t* data = nullptr;
  const TypeTraits* traits = nullptr;
  DotFn dot = nullptr;             // CPU backend: the type's kernel for this CPU
  GemmFn gemm = nullptr;           // CPU backend: its GEMM for several tokens, if the type has one
  uint32_t gemm_min = 2;           // CPU backend: the GEMM runs from this many tokens on (gemm_min_tokens)
  const void* device = nullptr;    // another backend's handle for this weight (not owned here)
  ActType act() const { return traits->act; }
  const uint8_t* row(uint64_t r) const { return data + r * row_bytes; }
  bool present() const { return data != nullptr; }
};

}  // namespace sluice
