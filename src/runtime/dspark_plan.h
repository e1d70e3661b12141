// What a DSpark drafter adds to a memory plan (spec 6; docs/dspark.md), shared by Session and
// `sluice plan --dspark`: the support file is checked against the model first, then its weights
// as loaded, activations, verify buffers, rings and captured rows become the plan's inputs.
#pragma once
#include <string>

#include "model/deepseek41/config.h"
#include "model/deepseek41/dspark_schema.h"
#include "runtime/admission.h"
#include "storage/expert_store.h"

namespace sluice {

// Fills po's dspark_* inputs for the support file at `path` beside a model of config `cfg`
// (po.ctx must be set): both ways its routed experts can live, resident and streamed through a
// store with `store`'s queue depth and I/O mode (dspark_store_options). Throws Error naming the
// path and the first field that does not fit, or a draft_max outside 2 .. the drafter's block.
// Returns the drafter's configuration.
DsparkConfig plan_dspark(const std::string& path, const ModelConfig& cfg, uint32_t draft_max, PlanOptions& po,
                         const storage::StoreOptions& store = {});

}  // namespace sluice
