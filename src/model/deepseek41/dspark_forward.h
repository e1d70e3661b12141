// The DSpark drafter's forward pass (spec 6.3-6.4) on the backend ops.
//
// DSpark drafts a block of tokens from the target's own hidden states. The target captures, at
// every position it evaluates, the mean of the hc streams entering each target layer
// (EngineOptions::capture_layers). When a position is committed, the drafter projects that row
// (main_proj + main_norm) and writes one window-KV entry per stage into the stage's ring, with
// the stage's own kv projection at RoPE theta 10000: the rings hold only committed positions, so
// the drafter never rolls back. A block is the anchor (the target's next token) followed by
// noise tokens at the next positions; each stage is a transformer block whose queries attend
// the ring plus every key of the block in both directions, then a 128-expert MoE. The last
// stage's collapsed streams go through the target's output head; a Markov bigram bias (W2 . W1[y])
// is added row by row, each row's bias keyed by the token the previous row drafted, and a
// confidence logit (w_c . [h, u]) says how likely each draft is to be accepted.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/deepseek41/dspark_model.h"
#include "model/model.h"

namespace sluice {

// A sequence's drafter state: one ring of window entries per stage (BF16 bits, row = position
// mod window) and how many positions have been committed into them.
struct DraftState {
  uint32_t committed = 0;          // positions 0 .. committed - 1 are in the rings
  std::vector<uint16_t> rings;     // [stage][window][head_dim]
  bool operator==(const DraftState&) const = default;
};

// One proposed block after the last committed position c = committed - 1.
struct DraftBlock {
  uint32_t c = 0;
  TokenId anchor = 0;
  std::vector<TokenId> drafts;                        // [block] d_1 .. d_block (positions c+2 ..)
  std::vector<float> logits;                          // [block][vocab] row j: l_j, Markov bias included
  std::vector<float> confidence;                      // [block] raw confidence logits kappa_j
  std::vector<std::vector<std::vector<uint32_t>>> experts;  // [stage][row] routed experts, selection order
};

// The drafter's activation tensors, as (rows, width) f32 shapes in the order Drafter allocates
// them, and their bytes: what the plan charges for them.
std::vector<std::pair<size_t, size_t>> drafter_tensor_shapes(const ModelConfig& target, const DsparkConfig& d);
uint64_t drafter_scratch_bytes(const ModelConfig& target, const DsparkConfig& d);
// One sequence's DraftState (stages x window x head_dim BF16).
uint64_t draft_state_bytes(const ModelConfig& target, const DsparkConfig& d);

class Drafter {
 public:
  // be must be the backend that prepared both models' weights; all must outlive this. experts:
  // where the routed experts come from; null: d's resident ones (required when d has none).
  Drafter(const Model& target, const DsparkModel& d, const Backend& be, const ExpertSource* experts = nullptr);

  const DsparkConfig& config() const { return d_.config; }
  // Floats per position of the target's capture (target layers x hidden).
  size_t capture_width() const { return (size_t)d_.config.target_layers.size() * t_.config.hidden_size; }
  DraftState new_state() const;
  // Commits positions st.committed .. st.committed + n - 1 from their captured rows (n x
  // capture_width() floats): writes their ring entries (only the last `window` of them matter).
  void commit(DraftState& st, const float* hidden, uint32_t n) const;
  // The block after the last committed position with this anchor (st.committed >= 1). Drafts
  // are the argmax of each row's logits (ties to the lowest id): the point-mass proposal of
  // spec 6.5. The target's context must allow positions up to c + block_size + 1.
  DraftBlock propose(const DraftState& st, TokenId anchor) const;

 private:
  void stage_attention(uint32_t s, const DraftState& st, uint32_t c, Mat x, Mat out) const;
  void stage_moe(uint32_t s, Mat x, Mat out, DraftBlock& b) const;
  const Model& t_;
  const DsparkModel& d_;
  const Backend& be_;
  const ExpertSource& experts_;
  std::vector<double> freqs_;  // RoPE of ratio-0 layers: theta 10000, no YaRN
  uint32_t B_, W_, hd_;
  Tensor X_, X2_, xin_, out_, A_, F_, P0_, qr_, q_, kv_, heads_, z_, router_, sh_, routed_;
  Tensor cap_, zc_, ec_, h_, hn_, lg_, u_, bias_, hu_, kappa_;
};

}  // namespace sluice
