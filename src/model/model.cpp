// Loading the resident weights of a deepseek41 GGUF (see model.h).
#include "model/model.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "backend/cpu_backend.h"
#include "model/architecture.h"
#include "model/deepseek41/load_checks.h"
#include "model/deepseek41/schema.h"
#include "model/deepseek41/engine_footprint.h"
#include "model/tensor_loader.h"
#include "util/error.h"

namespace sluice {

void Model::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

ExpertWeights ResidentExperts::get(uint32_t layer, uint32_t expert) const {
  const Layer& l = layers.at(layer);
  const ExpertLayout& g = layouts.at(layer);
  if (!index.empty()) {
    const int32_t k = index.at(layer).at(expert);
    if (k < 0)
      throw Error("routed expert " + std::to_string(expert) + " of layer " + std::to_string(layer) +
                  " is not loaded in this process (another rank owns it)");
    expert = (uint32_t)k;
  }
  return ExpertWeights{l.gate + (uint64_t)expert * g.gate_bytes, l.up + (uint64_t)expert * g.up_bytes,
                       l.down + (uint64_t)expert * g.down_bytes};
}

void ResidentExperts::at_hand(uint32_t layer, std::span<const uint32_t> experts, const UseExpert& use) const {
  if (layer >= layers.size()) return;
  for (const uint32_t e : experts)
    if (index.empty() ? e < layers[layer].count : (layer < index.size() && e < index[layer].size() && index[layer][e] >= 0))
      use(e, get(layer, e));
}

std::vector<ExpertSource::HeldMemory> ResidentExperts::held_memory() const {
  std::vector<HeldMemory> out;
  for (size_t L = 0; L < layers.size() && L < layouts.size(); ++L) {
    const Layer& l = layers[L];
    const ExpertLayout& g = layouts[L];
    const std::pair<const uint8_t*, uint64_t> parts[3] = {{l.gate, g.gate_bytes}, {l.up, g.up_bytes}, {l.down, g.down_bytes}};
    for (const auto& [p, unit] : parts)
      if (p && l.count && unit) out.push_back({p, unit * l.count, unit});
  }
  return out;
}

const ExpertSource& resident_expert_source(const Model& m) {
  if (!m.resident_experts)
    throw Error("routed experts of " + m.file.path() + " were not loaded and no expert source was given");
  return m.experts;
}

const ModelConfig& model_config(const Model& m) { return m.config; }


std::unique_ptr<Model> load_model(const std::string& gguf_path, const LoadOptions& o) {
  auto model = std::make_unique<Model>(gguf::File::open(gguf_path));
  Model& m = *model;
  const Architecture& arch = [&]() -> const Architecture& {
    try {
      return architecture_of(m.file);
    } catch (const Error& e) {
      throw Error(with_path(gguf_path, e.what()));
    }
  }();
  const SchemaReport rep = arch.validate(m.file);
  if (!rep.errors.empty()) {
    std::string msg = gguf_path + " does not match the " + std::string(arch.name) + " schema:";
    for (size_t i = 0; i < rep.errors.size() && i < 5; ++i) msg += "\n  " + rep.errors[i];
    if (rep.errors.size() > 5) msg += "\n  (" + std::to_string(rep.errors.size() - 5) + " more)";
    throw Error(msg);
  }
  m.config = arch.config(m.file, nullptr);
  m.roles = layer_roles(m.config);
  const ModelConfig& c = m.config;
  if (const std::vector<std::string> unsupported = arch.support_problems(c); !unsupported.empty())
    throw Error(gguf_path + ": " + unsupported.front());

  TensorLoader ld(m.file, m.buffers, m.loaded_bytes, o);
  m.layers.resize(c.num_hidden_layers);
  m.resident_experts = o.resident_experts;
  m.experts.layers.resize(c.num_hidden_layers);
  m.experts.layouts.resize(c.num_hidden_layers);
  if (o.experts_only) {
    // An expert server's model: the routed experts' layouts, and the owned experts' bytes.
    uint64_t total = 0;
    std::vector<std::vector<uint32_t>> mine(c.num_hidden_layers);
    if (o.resident_experts) m.experts.index.assign(c.num_hidden_layers, std::vector<int32_t>(c.n_routed_experts, -1));
    for (uint32_t L = 0; L < c.num_hidden_layers; ++L) {
      if (!o.resident_experts) continue;
      for (uint32_t e = 0; e < c.n_routed_experts; ++e)
        if (!o.owned || o.owned(L, e)) {
          m.experts.index[L][e] = (int32_t)mine[L].size();
          mine[L].push_back(e);
        }
      for (const char* part : kRoutedExpertTensors) {
        const gguf::TensorInfo& t = ld.info("blk." + std::to_string(L) + "." + part);
        total += mine[L].size() * (t.nbytes / std::max<uint64_t>(1, t.ne[2]));
      }
    }
    ld.set_total(total);
    const std::vector<uint32_t> none;
    for (uint32_t L = 0; L < c.num_hidden_layers; ++L) {
      LayerWeights& w = m.layers[L];
      load_routed_experts(ld, "blk." + std::to_string(L) + ".", w.experts, m.experts.layers[L],
                          o.resident_experts ? &mine[L] : &none);
      m.experts.layouts[L] = w.experts;
    }
    return model;
  }
  m.token_embd = ld.weight("token_embd.weight", WeightUse::Embed);
  m.output = ld.weight("output.weight");
  m.output_norm = ld.floats("output_norm.weight");
  for (uint32_t L = 0; L < c.num_hidden_layers; ++L) {
    const std::string b = "blk." + std::to_string(L) + ".";
    const LayerRole& r = m.roles[L];
    LayerWeights& w = m.layers[L];
    load_block(ld, b, w, m.experts.layers[L], o.resident_experts, /*image_bias=*/true);
    m.experts.layouts[L] = w.experts;

    if (r.is_kv_source) {
      w.comp_kv = ld.weight(b + "attn_compressor_kv.weight");
      if (r.ratio > 1) w.comp_gate = ld.weight(b + "attn_compressor_gate.weight");
      w.comp_norm = ld.floats(b + "attn_compressor_norm.weight");
      w.idx_k = ld.weight(b + "indexer.attn_k.weight");
      w.idx_k_norm = ld.floats(b + "indexer.k_norm.weight");
    }
    if (r.is_index_source) {
      w.idx_q_b = ld.weight(b + "indexer.attn_q_b.weight");
      w.idx_proj = ld.weight(b + "indexer.proj.weight");
    }
    if (r.engram_index >= 0) {
      w.engram_q_norm = ld.floats(b + "engram_q_norm.weight");
      w.engram_k_norm = ld.floats(b + "engram_k_norm.weight");
      w.engram_kv = ld.weight(b + "engram_kv.weight");
      w.engram_table = &ld.info(b + "engram_embd.weight");  // rows are read on demand (pread)
    }
  }
  return model;
}

}  // namespace sluice
