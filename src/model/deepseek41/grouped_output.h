// The grouped low-rank output of an attention layer (spec 3.4), shared by the model's layers and
// the DSpark drafter's stages: the heads are cut into o_groups groups, group g goes through rows
// [g * o_lora_rank, (g + 1) * o_lora_rank) of out_a into its columns of z, and out = out_b(z).
// The groups are independent linears, handed to the backend as one batch.
#pragma once
#include "backend/backend.h"
#include "model/deepseek41/config.h"
#include "model/model.h"

namespace sluice {

// o: [n][heads x head_dim] (the rotated-back heads); z: [n][o_groups x o_lora_rank] scratch.
void grouped_output(const Backend& be, const ModelConfig& c, const LayerWeights& w, CMat o, Mat z, Mat out);

}  // namespace sluice
