// Where each routed expert's bytes lie in a GGUF, and the aligned windows that direct I/O
// must read to get them. A layer's ffn_{gate,up,down}_exps tensors hold n_expert equal slices
// back to back: expert e of tensor T is bytes [e*slice, (e+1)*slice) of T, slice = nbytes /
// n_expert. Slices start at arbitrary offsets, so an O_DIRECT read covers the enclosing
// kIoAlign-aligned window and the slice sits at an offset inside it.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "format/gguf.h"

namespace sluice::storage {

// O_DIRECT granularity for offsets, lengths and buffer addresses. 4 KiB is a multiple of
// every common logical block size (512 and 4096), so budgets do not depend on the device.
constexpr uint64_t kIoAlign = 4096;

enum ExpertPart : uint32_t { kGate = 0, kUp = 1, kDown = 2 };
constexpr uint32_t kParts = 3;
const char* part_tensor_suffix(uint32_t part);  // "ffn_gate_exps.weight", ...

struct ExpertTensor {
  std::string name;
  uint64_t file_offset = 0;  // absolute offset of the tensor's first byte
  uint64_t nbytes = 0;
  uint64_t slice = 0;        // bytes of one expert
};

// The file range an expert's part occupies and the aligned window that contains it.
struct Window {
  uint64_t slice_offset = 0;  // absolute file offset of the slice
  uint64_t slice_bytes = 0;
  uint64_t begin = 0, end = 0;  // aligned window [begin, end); end may lie past EOF
  uint64_t bytes() const { return end - begin; }
  uint64_t head() const { return slice_offset - begin; }  // slice offset inside the window
};

struct ExpertGeometry {
  std::string path;
  uint64_t file_size = 0;
  uint32_t n_layer = 0, n_expert = 0;
  std::vector<std::array<ExpertTensor, kParts>> layers;

  Window window(uint32_t layer, uint32_t part, uint32_t expert) const;
  // Bytes one load of the expert transfers: its three windows, each clipped at end of file.
  uint64_t load_bytes(uint32_t layer, uint32_t expert) const;
};

// Geometry of <prefix>L.ffn_{gate,up,down}_exps.weight for L < n_layer ("blk." for a model's
// layers, "mtp." for a DSpark drafter's stages). Throws Error naming the tensor when one is
// missing, its last dimension is not n_expert, or it lies outside the file.
ExpertGeometry expert_geometry(const gguf::File& f, uint32_t n_layer, uint32_t n_expert, std::string_view prefix = "blk.");

// How a cache slot is carved: one aligned region per part, each large enough for that part's
// widest window in any layer (so every expert fits every slot).
struct SlotLayout {
  std::array<uint64_t, kParts> region_offset{};
  std::array<uint64_t, kParts> region_bytes{};
  uint64_t slot_bytes = 0;  // multiple of kIoAlign
};
SlotLayout slot_layout(const ExpertGeometry& g);

}  // namespace sluice::storage
