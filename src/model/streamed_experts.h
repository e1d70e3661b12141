// ExpertSource over the SSD expert store. prepare() gets a layer's distinct experts for a chunk
// (ascending); get() hands them out in that order.
//
// Windows: when the union fits what one layer may hold at once (ExpertStore::max_union_experts),
// prepare() leases all of it, as one acquire. When it does not (a long prefill chunk can route to
// every expert of a layer), the union streams through the layer's share in windows of half the
// share: window k is leased while window k + 1 is hinted (read ahead into the other half), and
// get() of the first expert past window k releases it and leases window k + 1. Every expert of
// the union is in exactly one window, so it is requested (and read, when missing) once per layer
// per chunk, and the backend still runs the experts in ascending order, so the routed sum of every
// token keeps the decode order: windows change I/O, never bits. This is what lets a prefill chunk
// be bounded by activation memory rather than by the expert cache.
//
// One StreamedExperts per Engine (the lease is per-instance state); several may share one store.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/expert_source.h"
#include "model/model.h"
#include "storage/expert_store.h"

namespace sluice {

class StreamedExperts final : public ExpertSource {
 public:
  explicit StreamedExperts(storage::ExpertStore& store) : store_(store) {}
  // Leases the first window (the whole union when it fits). Throws Error when a read fails;
  // afterwards nothing is leased and the store is usable.
  void prepare(uint32_t layer, std::span<const uint32_t> experts) const override;
  // Throws Error for an expert the last prepare() did not cover, or one asked for after a later
  // window was leased (get() must follow the ascending order).
  ExpertWeights get(uint32_t layer, uint32_t expert) const override;
  // Predicted experts of a coming layer. At most what one window may read ahead is passed on:
  // hinting more than a layer's share would evict guesses before they are used and read them twice.
  void hint(uint32_t layer, std::span<const uint32_t> experts) const override;
  std::vector<uint32_t> cached(uint32_t layer) const override { return store_.held(layer); }
  // The store's resident experts among `experts`, leased apart from prepare()'s window for the
  // call (a lookup each in the store's stats: RAM handing them to the device's tier).
  void at_hand(uint32_t layer, std::span<const uint32_t> experts, const UseExpert& use) const override;
  // The last prepare()'s union was leased at once (one window).
  bool holds_union() const override { return window_ >= order_.size(); }
  // The store's slots: a leased expert lies within one of them.
  std::vector<HeldMemory> held_memory() const override {
    return {HeldMemory{store_.slot_memory(), store_.budget().cache_bytes, store_.budget().slot_bytes}};
  }
  void release() const { lease_.release(); }
  storage::ExpertStore& store() const { return store_; }
  // The window size prepare() chose for the last layer (its union's size when it fit at once).
  size_t window() const { return window_; }

 private:
  void lease_window(size_t first) const;
  storage::ExpertStore& store_;
  mutable storage::Lease lease_;
  mutable uint32_t layer_ = 0;
  mutable std::vector<uint32_t> order_;  // the last prepare()'s union, ascending
  mutable size_t begin_ = 0, end_ = 0;   // the leased window: order_[begin_, end_)
  mutable size_t window_ = 0;
};

// Throws Error naming the file and tensor when a layer's slices in g are not the bytes of one
// expert of layers[L].experts (what `who` expects: "the model", "the drafter").
void check_expert_slices(const storage::ExpertGeometry& g, std::span<const LayerWeights> layers, const char* who);
// A store over m.file's routed experts (num_hidden_layers x n_routed_experts). Throws Error when
// the slices in the file do not match the model's expert layouts, or when the options do not fit.
std::unique_ptr<storage::ExpertStore> open_expert_store(const Model& m, storage::StoreOptions o);
// The bytes one cache slot of m's routed experts takes in such a store (what a prefetch budget
// of k experts is k times).
uint64_t expert_slot_bytes(const Model& m);

}  // namespace sluice
