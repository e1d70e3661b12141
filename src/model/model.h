// The resident weights of a deepseek41 GGUF, as the forward pass consumes them. Tensors are read
// once with pread into owned, 64-byte-aligned memory; the Engram tables are never read here (the
// forward pass reads their rows on demand, model/deepseek41/engram.h). Small F32 vectors are decoded to
// float vectors.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "backend/backend.h"
#include "backend/expert_source.h"
#include "backend/weight.h"
#include "model/deepseek41/config.h"

namespace sluice {

// Geometry of one layer's routed expert tensors (the bytes come from an ExpertSource).
struct ExpertLayout {
  Weight gate, up, down;  // data == nullptr; rows/cols/type of ONE expert
  uint64_t gate_bytes = 0, up_bytes = 0, down_bytes = 0;  // bytes of one expert in each tensor
};

struct LayerWeights {
  Weight hc_attn_fn, hc_ffn_fn;
  std::vector<float> hc_attn_base, hc_attn_scale, hc_ffn_base, hc_ffn_scale;
  std::vector<float> attn_norm, ffn_norm, attn_sinks, q_a_norm, kv_norm;
  Weight q_a, q_b, kv, out_a, out_b;
  Weight gate_inp;
  std::vector<float> exp_bias, exp_bias_vl;
  Weight gate_sh, up_sh, down_sh;
  ExpertLayout experts;
  // KV source
  Weight comp_kv, comp_gate;
  std::vector<float> comp_norm, idx_k_norm;
  Weight idx_k;
  // index source
  Weight idx_q_b, idx_proj;
  // Engram (before this layer)
  std::vector<float> engram_q_norm, engram_k_norm;  // [hc][hidden]
  Weight engram_kv;
  const gguf::TensorInfo* engram_table = nullptr;
};

class ResidentExperts final : public ExpertSource {
 public:
  ResidentExperts() = default;
  struct Layer {
    const uint8_t* gate = nullptr;
    const uint8_t* up = nullptr;
    const uint8_t* down = nullptr;
    uint32_t count = 0;  // experts loaded, back to back in each tensor
  };
  std::vector<Layer> layers;
  std::vector<ExpertLayout> layouts;
  // Only some experts loaded (LoadOptions::owned): per layer, expert id -> its place among the
  // loaded ones, -1 for one not loaded. Empty: every expert, in id order.
  std::vector<std::vector<int32_t>> index;
  // Throws Error for an expert that was not loaded.
  ExpertWeights get(uint32_t layer, uint32_t expert) const override;
  bool holds_union() const override { return true; }
  // Every loaded expert is at hand.
  void at_hand(uint32_t layer, std::span<const uint32_t> experts, const UseExpert& use) const override;
  // Each loaded layer's three tensors, one expert's slice per unit.
  std::vector<HeldMemory> held_memory() const override;
};

class Model {
 public:
  gguf::File file;
  ModelConfig config;
  std::vector<LayerRole> roles;
  Weight token_embd, output;
  std::vector<float> output_norm;
  std::vector<LayerWeights> layers;
  bool resident_experts = false;
  ResidentExperts experts;

  explicit Model(gguf::File f) : file(std::move(f)) {}
  struct FreeDeleter { void operator()(uint8_t* p) const; };
  std::vector<std::unique_ptr<uint8_t, FreeDeleter>> buffers;  // owned tensor bytes
  // Bytes the loader allocated for resident weights (buffers + decoded F32 vectors), each
  // tensor counted as loaded_tensor_bytes (model/deepseek41/engine_footprint.h) would.
  uint64_t loaded_bytes = 0;
};

const ExpertSource& resident_expert_source(const Model& m);  // throws if experts not resident

struct LoadOptions {
  // false: routed expert tensors are not read (an ExpertSource must then be given to Engine).
  bool resident_experts = true;
  // Called as resident bytes are read: (done, total). May be empty.
  std::function<void(uint64_t done, uint64_t total)> progress;
  // Prepares each weight for the backend that will run it (Backend::prepare_weight); null: the
  // CPU backend's preparation. Must outlive the Model.
  const Backend* backend = nullptr;
  // An expert server (a --fabric peer, runtime/expert_host.h): no dense tensor is read, only the
  // routed experts' layouts and, with resident_experts, the bytes of the experts `owned` accepts
  // (every expert when it is empty), packed.
  bool experts_only = false;
  std::function<bool(uint32_t layer, uint32_t expert)> owned;
};

// Weights loaded from a GGUF (resident, owned memory). Engram tables stay on disk.
// Throws Error when the file does not match the deepseek41 schema or uses unsupported settings.
std::unique_ptr<Model> load_model(const std::string& gguf_path, const LoadOptions& o = {});
const ModelConfig& model_config(const Model&);

}  // namespace sluice
