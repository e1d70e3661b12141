// Routed experts another process computes (expert parallelism across boxes, docs/scale-out.md).
// The forward pass hands each layer's triples of the experts it does not own to begin() before
// it computes the shared expert and its own experts, and takes their terms from finish() after:
// the other processes work while this one does. Every term is then added in the single-box
// order (ascending expert, tokens in order), so the routed sums, and the logits, have the bits
// of one process computing every expert.
#pragma once
#include <cstdint>
#include <span>

#include "backend/backend.h"

namespace sluice {

class RemoteExperts {
 public:
  virtual ~RemoteExperts() = default;
  // True when this process computes `expert` of `layer` itself.
  virtual bool local(uint32_t layer, uint32_t expert) const = 0;
  // Starts the terms of `triples` (experts that are not local, sorted by expert then token) on
  // the rows of x they name (BF16 values); returns without waiting. May throw Error.
  virtual void begin(uint32_t layer, std::span<const ExpertTriple> triples, CMat x) const = 0;
  // The terms of the last begin()'s triples: terms row j for triple j (f32, x's width). Throws
  // Error when a process does not answer in time or answers wrongly; the pass then fails as any
  // failed read does (the sequence is left as it was).
  virtual void finish(uint32_t layer, Mat terms) const = 0;
  // The most bytes this side holds during one layer's exchange of `rows` rows and `triples`
  // remote terms (frames waiting to leave, one answer as received, their bookkeeping), for
  // admission: the forward pass's own terms are split_moe_bytes (engine_footprint.h).
  virtual uint64_t exchange_bytes(uint64_t rows, uint64_t triples) const = 0;
  // Experts of `layer` (not local, ascending) the router predicts for the coming layer: the
  // processes owning them may start reading them. Advisory; returns without waiting.
  virtual void hint(uint32_t layer, std::span<const uint32_t> experts) const {
    (void)layer;
    (void)experts;
  }
};

}  // namespace sluice
