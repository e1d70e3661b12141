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
#include "util/error.h"

namespace sluice {

void Model::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

ExpertWeights ResidentExperts::get(uint32_t layer, uint32_t expert) const {
  const Layer& l = layers.at(layer);
  const ExpertLayout& g = layouts.at(layer);
  return ExpertWeights{l.gate + (uint64_t)expert * g.gate_bytes, l.up + (uint64_t)expert * g.up_bytes,
                       l.down + (uint64_t)expert * g.down_bytes};
}

const ExpertSource& resident_expert_source(const Model& m) {
  if (!m.resident_experts)
    throw Error("routed experts of " + m.file.path() + " were not loaded and no expert source was given");
  return m.experts;
}

const ModelConfig& model_config(const Model& m) { return m.config; }

namespace {

class Loader {
 public:
  Loader(Model& m, const LoadOptions& o) : m_(m), backend_(o.backend), progress_(o.progress) {
    if (!progress_) return;
    for (const gguf::TensorInfo& t : m_.file.tensors()) {
      const bool engram = t.name.find(".engram_embd.") != std::string::npos;
      const bool routed = t.name.find("_exps.") != std::string::npos;
      if (!engram && (o.resident_experts || !routed)) total_ += t.nbytes;
    }
    progress_(0, total_);
  }

  const gguf::TensorInfo& info(const std::string& name) const {
    const gguf::TensorInfo* t = m_.file.find_tensor(name);
    if (!t) throw Error(m_.file.path() + ": tensor " + name + " is missing");
    return *t;
  }

  uint8_t* read(const gguf::TensorInfo& t) {
    // 64-byte alignment for the SIMD kernels; rounded up because aligned_alloc requires it.
    const size_t size = (size_t)aligned_tensor_bytes(t.nbytes);
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, size));
    if (!p) throw Error("out of memory loading tensor " + t.name + " (" + std::to_string(t.nbytes) + " bytes)");
    m_.buffers.emplace_back(p);
    m_.loaded_bytes += size;
    constexpr uint64_t kChunk = 64ull << 20;  // bounded single reads
    for (uint64_t off = 0; off < t.nbytes; off += kChunk) {
      const uint64_t n = std::min(kChunk, t.nbytes - off);
      m_.file.read_bytes(t, off, p + off, n);
      advance(n);
    }
    return p;
  }

  Weight view(const gguf::TensorInfo& t, const uint8_t* data) const {
    Weight w;
    w.type = t.type;
    w.traits = &type_traits(t.type);
    if (!w.traits->has_kernels) throw Error("tensor " + t.name + " has type " + std::string(w.traits->name) + ", which has no kernels");
    w.cols = t.ne[0];
    w.rows = t.ne[1] * t.ne[2] * t.ne[3];
    w.row_bytes = row_bytes(t.type, t.ne[0]);
    w.data = data;
    if (backend_)
      backend_->prepare_weight(w);
    else
      prepare_cpu_weight(w);
    return w;
  }

  Weight weight(const std::string& name) {
    const gguf::TensorInfo& t = info(name);
    return view(t, read(t));
  }

  std::vector<float> floats(const std::string& name) {
    const gguf::TensorInfo& t = info(name);
    const TypeTraits& tr = type_traits(t.type);
    std::vector<uint8_t> raw(t.nbytes);
    m_.file.read_bytes(t, 0, raw.data(), t.nbytes);
    std::vector<float> out(t.n_elements());
    tr.dequant(raw.data(), out.data(), (int64_t)out.size());
    m_.loaded_bytes += out.size() * sizeof(float);
    advance(t.nbytes);
    return out;
  }

 private:
  void advance(uint64_t n) {
    done_ += n;
    if (progress_) progress_(std::min(done_, total_), total_);
  }
  Model& m_;
  const Backend* backend_;
  const std::function<void(uint64_t, uint64_t)>& progress_;
  uint64_t done_ = 0, total_ = 0;
};

}  // namespace

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

  Loader ld(m, o);
  m.token_embd = ld.weight("token_embd.weight");
  m.output = ld.weight("output.weight");
  m.output_norm = ld.floats("output_norm.weight");
  m.layers.resize(c.num_hidden_layers);
  m.resident_experts = o.resident_experts;
  m.experts.layers.resize(c.num_hidden_layers);
  m.experts.layouts.resize(c.num_hidden_layers);
  for (uint32_t L = 0; L < c.num_hidden_layers; ++L) {
    const std::string b = "blk." + std::to_string(L) + ".";
    const LayerRole& r = m.roles[L];
    LayerWeights& w = m.layers[L];
    w.hc_attn_fn = ld.weight(b + "hc_attn_fn.weight");
    w.hc_ffn_fn = ld.weight(b + "hc_ffn_fn.weight");
    w.hc_attn_base = ld.floats(b + "hc_attn_base.weight");
    w.hc_attn_scale = ld.floats(b + "hc_attn_scale.weight");
    w.hc_ffn_base = ld.floats(b + "hc_ffn_base.weight");
    w.hc_ffn_scale = ld.floats(b + "hc_ffn_scale.weight");
    w.attn_norm = ld.floats(b + "attn_norm.weight");
    w.ffn_norm = ld.floats(b + "ffn_norm.weight");
    w.attn_sinks = ld.floats(b + "attn_sinks.weight");
    w.q_a = ld.weight(b + "attn_q_a.weight");
    w.q_a_norm = ld.floats(b + "attn_q_a_norm.weight");
    w.q_b = ld.weight(b + "attn_q_b.weight");
    w.kv = ld.weight(b + "attn_kv.weight");
    w.kv_norm = ld.floats(b + "attn_kv_a_norm.weight");
    w.out_a = ld.weight(b + "attn_output_a.weight");
    w.out_b = ld.weight(b + "attn_output_b.weight");
    w.gate_inp = ld.weight(b + "ffn_gate_inp.weight");
    w.exp_bias = ld.floats(b + "exp_probs_b.bias");
    w.exp_bias_vl = ld.floats(b + "exp_probs_b_vl.bias");
    w.gate_sh = ld.weight(b + "ffn_gate_shexp.weight");
    w.up_sh = ld.weight(b + "ffn_up_shexp.weight");
    w.down_sh = ld.weight(b + "ffn_down_shexp.weight");

    const char* names[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
    Weight* lay[3] = {&w.experts.gate, &w.experts.up, &w.experts.down};
    uint64_t* bytes[3] = {&w.experts.gate_bytes, &w.experts.up_bytes, &w.experts.down_bytes};
    const uint8_t** res[3] = {&m.experts.layers[L].gate, &m.experts.layers[L].up, &m.experts.layers[L].down};
    for (int i = 0; i < 3; ++i) {
      const gguf::TensorInfo& t = ld.info(b + names[i]);
      *lay[i] = ld.view(t, nullptr);
      lay[i]->rows = t.ne[1];  // one expert
      *bytes[i] = t.ne[1] * lay[i]->row_bytes;
      if (o.resident_experts) *res[i] = ld.read(t);
    }
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
