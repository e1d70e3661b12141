// Reading a GGUF's tensors into owned, 64-byte-aligned memory as Weights and float vectors
// (the loaders of the target model, model.cpp, and of the DSpark drafter, deepseek41/dspark_model.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu_backend.h"
#include "model/deepseek41/engine_footprint.h"
#include "model/model.h"
#include "util/error.h"

namespace sluice {

class TensorLoader {
 public:
  // Reads f's tensors into buffers, counting their bytes in loaded_bytes.
  TensorLoader(const gguf::File& f, std::vector<std::unique_ptr<uint8_t, Model::FreeDeleter>>& buffers, uint64_t& loaded_bytes,
               const LoadOptions& o)
      : file_(f), buffers_(buffers), loaded_(loaded_bytes), backend_(o.backend), progress_(o.progress) {
    if (!progress_) return;
    if (o.experts_only) return;  // the loader says how much it reads (set_total)
    for (const gguf::TensorInfo& t : file_.tensors()) {
      const bool engram = t.name.find(".engram_embd.") != std::string::npos;
      const bool routed = t.name.find("_exps.") != std::string::npos;
      if (!engram && (o.resident_experts || !routed)) total_ += t.nbytes;
    }
    progress_(0, total_);
  }

  const gguf::TensorInfo& info(const std::string& name) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    if (!t) throw Error(file_.path() + ": tensor " + name + " is missing");
    return *t;
  }

  uint8_t* read(const gguf::TensorInfo& t) {
    // 64-byte alignment for the SIMD kernels; rounded up because aligned_alloc requires it.
    const size_t size = (size_t)aligned_tensor_bytes(t.nbytes);
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, size));
    if (!p) throw Error("out of memory loading tensor " + t.name + " (" + std::to_string(t.nbytes) + " bytes)");
    buffers_.emplace_back(p);
    loaded_ += size;
    constexpr uint64_t kChunk = 64ull << 20;  // bounded single reads
    for (uint64_t off = 0; off < t.nbytes; off += kChunk) {
      const uint64_t n = std::min(kChunk, t.nbytes - off);
      file_.read_bytes(t, off, p + off, n);
      advance(n);
    }
    return p;
  }

  // The slices (`slice` bytes each) of the listed experts of a [.., .., n_expert] tensor, packed
  // in list order into one buffer.
  uint8_t* read_experts(const gguf::TensorInfo& t, uint64_t slice, const std::vector<uint32_t>& experts) {
    const size_t size = (size_t)aligned_tensor_bytes(std::max<uint64_t>(1, slice * experts.size()));
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, size));
    if (!p) throw Error("out of memory loading " + std::to_string(experts.size()) + " experts of " + t.name);
    buffers_.emplace_back(p);
    loaded_ += size;
    for (size_t i = 0; i < experts.size(); ++i) {
      file_.read_bytes(t, experts[i] * slice, p + i * slice, slice);
      advance(slice);
    }
    return p;
  }

  // The progress total when the caller reads other than the whole resident set.
  void set_total(uint64_t total) {
    total_ = total;
    if (progress_) progress_(0, total_);
  }

  // use: the op that reads the weight (Backend::prepare_weight_for).
  Weight view(const gguf::TensorInfo& t, const uint8_t* data, WeightUse use = WeightUse::Linear) const {
    Weight w;
    w.type = t.type;
    w.traits = &type_traits(t.type);
    if (!w.traits->has_kernels) throw Error("tensor " + t.name + " has type " + std::string(w.traits->name) + ", which has no kernels");
    w.cols = t.ne[0];
    w.rows = t.ne[1] * t.ne[2] * t.ne[3];
    w.row_bytes = row_bytes(t.type, t.ne[0]);
    w.data = data;
    if (backend_)
      backend_->prepare_weight_for(w, use);
    else
      prepare_cpu_weight(w);
    return w;
  }

  Weight weight(const std::string& name, WeightUse use = WeightUse::Linear) {
    const gguf::TensorInfo& t = info(name);
    return view(t, read(t), use);
  }

  std::vector<float> floats(const std::string& name) {
    const gguf::TensorInfo& t = info(name);
    const TypeTraits& tr = type_traits(t.type);
    std::vector<uint8_t> raw(t.nbytes);
    file_.read_bytes(t, 0, raw.data(), t.nbytes);
    std::vector<float> out(t.n_elements());
    tr.dequant(raw.data(), out.data(), (int64_t)out.size());
    loaded_ += out.size() * sizeof(float);
    advance(t.nbytes);
    return out;
  }

 private:
  void advance(uint64_t n) {
    done_ += n;
    if (progress_) progress_(std::min(done_, total_), total_);
  }
  const gguf::File& file_;
  std::vector<std::unique_ptr<uint8_t, Model::FreeDeleter>>& buffers_;
  uint64_t& loaded_;
  const Backend* backend_;
  const std::function<void(uint64_t, uint64_t)>& progress_;
  uint64_t done_ = 0, total_ = 0;
};


// The three routed-expert tensors of a block, in ExpertLayout's order.
inline constexpr const char* kRoutedExpertTensors[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight",
                                                         "ffn_down_exps.weight"};

// The routed experts' layout under prefix b and their bytes into `resident`: every expert (`read`
// null: the whole tensors), none (an empty list) or the listed ones, packed in list order.
void load_routed_experts(TensorLoader& ld, const std::string& b, ExpertLayout& lay, ResidentExperts::Layer& resident,
                         const std::vector<uint32_t>* read);

// One block's attention, hyper-connection, router, shared-expert and routed-expert tensors
// under prefix b ("blk.L." or "mtp.S."): the layout of the routed experts always, their bytes
// into `resident` when read_experts; exp_probs_b_vl only when image_bias.
void load_block(TensorLoader& ld, const std::string& b, LayerWeights& w, ResidentExperts::Layer& resident,
                bool read_experts, bool image_bias);

}  // namespace sluice
