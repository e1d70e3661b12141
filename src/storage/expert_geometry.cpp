// Expert slice geometry and aligned windows (see expert_geometry.h).
#include "storage/expert_geometry.h"

#include <algorithm>

#include "util/error.h"

namespace sluice::storage {

const char* part_tensor_suffix(uint32_t part) {
  static const char* names[kParts] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
  return part < kParts ? names[part] : "?";
}

Window ExpertGeometry::window(uint32_t layer, uint32_t part, uint32_t expert) const {
  const ExpertTensor& t = layers.at(layer).at(part);
  Window w;
  w.slice_bytes = t.slice;
  w.slice_offset = t.file_offset + (uint64_t)expert * t.slice;
  w.begin = w.slice_offset / kIoAlign * kIoAlign;
  w.end = gguf::align_up(w.slice_offset + t.slice, kIoAlign);
  return w;
}

uint64_t ExpertGeometry::load_bytes(uint32_t layer, uint32_t expert) const {
  uint64_t total = 0;
  for (uint32_t p = 0; p < kParts; ++p) {
    const Window w = window(layer, p, expert);
    total += std::min(w.end, std::max(file_size, w.begin)) - w.begin;
  }
  return total;
}

ExpertGeometry expert_geometry(const gguf::File& f, uint32_t n_layer, uint32_t n_expert, std::string_view prefix) {
  if (n_layer == 0 || n_expert == 0) throw Error("expert store: n_layer and n_expert must be positive");
  ExpertGeometry g;
  g.path = f.path();
  g.file_size = f.file_size();
  g.n_layer = n_layer;
  g.n_expert = n_expert;
  g.layers.resize(n_layer);
  for (uint32_t L = 0; L < n_layer; ++L) {
    for (uint32_t p = 0; p < kParts; ++p) {
      const std::string name = std::string(prefix) + std::to_string(L) + "." + part_tensor_suffix(p);
      const gguf::TensorInfo* t = f.find_tensor(name);
      if (!t) throw Error(f.path() + ": routed expert tensor " + name + " is missing");
      if (t->n_dims == 0 || t->ne[t->n_dims - 1] != n_expert || t->nbytes % n_expert != 0 || t->nbytes == 0)
        throw Error(f.path() + ": tensor " + name + " does not hold " + std::to_string(n_expert) +
                    " equal expert slices (last dimension " + std::to_string(t->n_dims ? t->ne[t->n_dims - 1] : 0) +
                    ", " + std::to_string(t->nbytes) + " bytes)");
      if (t->file_offset > g.file_size || t->nbytes > g.file_size - t->file_offset)
        throw Error(f.path() + ": tensor " + name + " lies outside the file");
      g.layers[L][p] = ExpertTensor{name, t->file_offset, t->nbytes, t->nbytes / n_expert};
    }
  }
  return g;
}

SlotLayout slot_layout(const ExpertGeometry& g) {
  SlotLayout s;
  for (uint32_t L = 0; L < g.n_layer; ++L)
    for (uint32_t p = 0; p < kParts; ++p)
      for (uint32_t e = 0; e < g.n_expert; ++e)
        s.region_bytes[p] = std::max(s.region_bytes[p], g.window(L, p, e).bytes());
  uint64_t off = 0;
  for (uint32_t p = 0; p < kParts; ++p) {
    s.region_offset[p] = off;
    off += s.region_bytes[p];
  }
  s.slot_bytes = off;
  return s;
}

}  // namespace sluice::storage
