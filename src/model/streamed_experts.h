// ExpertSource over the SSD expert store: prepare() leases the chunk's union of experts for a
// layer (releasing the previous lease first, so the whole cache is available to it), get()
// returns pointers into the leased slots. One StreamedExperts per Engine (the lease is
// per-instance state); several may share one store.
#pragma once
#include <cstdint>
#include <memory>
#include <span>

#include "backend/expert_source.h"
#include "model/model.h"
#include "storage/expert_store.h"

namespace sluice {

class StreamedExperts final : public ExpertSource {
 public:
  explicit StreamedExperts(storage::ExpertStore& store) : store_(store) {}
  // Throws Error when the union does not fit (see ExpertStore::max_union_experts) or a read fails;
  // afterwards nothing is leased and the store is usable.
  void prepare(uint32_t layer, std::span<const uint32_t> experts) const override;
  // Throws Error for an expert the last successful prepare() did not cover.
  ExpertWeights get(uint32_t layer, uint32_t expert) const override;
  // Predicted experts of a coming layer (e.g. the next layer's router on the current hidden state).
  void hint(uint32_t layer, std::span<const uint32_t> experts) const override { store_.hint(layer, experts); }
  void release() const { lease_.release(); }
  storage::ExpertStore& store() const { return store_; }

 private:
  storage::ExpertStore& store_;
  mutable storage::Lease lease_;
};

// A store over m.file's routed experts (num_hidden_layers x n_routed_experts). Throws Error when
// the slices in the file do not match the model's expert layouts, or when the options do not fit.
std::unique_ptr<storage::ExpertStore> open_expert_store(const Model& m, storage::StoreOptions o);

}  // namespace sluice
