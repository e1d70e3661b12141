// Admission for a model file served through the expert store: the plan's expert-cache figure is
// the store's own bytes_needed() (slots, aligned windows, metadata), so what `sluice plan` prints
// is exactly what `run`/`serve` allocate. Used by the plan command and by Session.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/admission.h"
#include "storage/expert_store.h"

namespace sluice {
namespace gguf { class File; }

struct StorePlanOptions {
  PlanOptions plan;                 // ctx, chunk, threads, budget, swap; store_bytes is set here
  storage::StoreOptions store;      // policy, queue depth, direct I/O (cache size is planned)
  bool stream_experts = true;       // false: routed experts resident, counted as resident weights
};

// The plan for `f` (header only; no payload is read). With stream_experts, cache_slots is what
// the store may hold. Throws Error for invalid options or a file whose experts do not match.
Plan plan_for_file(const gguf::File& f, const StorePlanOptions& o);

// An expert server's plan (PlanOptions::expert_server): `owned[L]` routed experts of layer L,
// loaded packed (without stream_experts) or streamed through a store that holds at most them.
Plan plan_expert_server(const gguf::File& f, const StorePlanOptions& o, const std::vector<uint32_t>& owned);

// PlanOptions::overhead_bytes as plan_for_file measures it: this process's resident set now
// (/proc/self/status VmRSS), rounded up to a whole MiB. Call it once the header and tokenizer
// are open and before the weights are loaded (what plan_for_file's callers do).
uint64_t measured_process_overhead();

// Store options for an admitted plan: max_slots = cache_slots, prefetch budget sized from the
// cache (at most a layer's share, at most a quarter of the cache).
storage::StoreOptions store_options_for(const Plan& p, storage::StoreOptions base);

}  // namespace sluice
