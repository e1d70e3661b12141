// An independent reference forward pass of DeepSeek-V4.1 (spec deepseek-v41.md sections 3-4,
// precision points of docs/numerics.md), written to be read in one sitting and checked line by
// line against the spec. It shares only the GGUF reader, the scalar dequantizers and the fp.h
// conversions with the engine: hyperparameters are read from the metadata keys here, layer
// roles are derived here, every linear is an f64 sum of dequantized weights, and nothing is
// threaded, vectorised or batched. One position at a time; the whole history is kept (no rings).
//
// Mimic mode quantizes each linear's activation the way the engine does (numerics.md section 2:
// Q8_0 reference rule for weights with 32/64/128-element blocks, Q8_K for 256-element blocks,
// none for F32/F16/BF16) with its own plain code, so that engine and reference then differ only
// by accumulation order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sluice::reference {

struct Options {
  bool mimic = false;
};

// What one position produces; the shapes follow the engine's TokenTrace.
struct TokenResult {
  std::vector<float> logits;                         // [vocab]
  std::vector<std::vector<uint64_t>> engram_rows;    // [engram layer][columns]
  std::vector<std::vector<uint32_t>> experts;        // [layer][k], selection order (descending biased score)
  std::vector<std::vector<float>> expert_weights;    // [layer][k]
  std::vector<std::vector<int32_t>> selected_rows;   // [layer] ascending; empty unless index source
  std::vector<std::vector<float>> captured;          // [layer][hidden] mean of the streams entering it
};

// Hyperparameters as read from the GGUF (only what the forward pass needs).
struct Hparams {
  uint32_t n_vocab = 0, n_embd = 0, n_layer = 0, n_head = 0, head_dim = 0, rope_dim = 0;
  uint32_t q_rank = 0, o_rank = 0, o_groups = 0, n_ff = 0, n_expert = 0, n_expert_used = 0;
  uint32_t window = 0, hc = 0, sinkhorn_iters = 0;
  uint32_t idx_heads = 0, idx_head_dim = 0, idx_topk = 0;
  uint32_t cand_layer = 0, cand_blocks = 0, cand_block_size = 0;
  std::vector<uint32_t> ratios, kv_sources, index_sources, engram_layers;
  double rope_theta = 0, compress_theta = 0;
  double yarn_factor = 0, yarn_beta_fast = 0, yarn_beta_slow = 0, yarn_orig_ctx = 0;
  float eps = 0, hc_eps = 0, swiglu_limit = 0, route_scale = 0;
  // Engram hashing.
  uint32_t eg_heads = 0, eg_head_dim = 0, eg_orders = 0;  // orders = max_ngram - 1
  uint64_t eg_pad = 0;
  std::vector<uint32_t> eg_token_map;
  std::vector<uint64_t> eg_primes;       // per Engram layer: orders * heads
  std::vector<uint64_t> eg_multipliers;  // per Engram layer: orders + 1
};

// One layer's routing decision (spec 3.6, num §7).
struct Routing {
  std::vector<uint32_t> experts;   // [k] selection order: descending biased score, ties to the lower id
  std::vector<float> weights;      // [k]
  std::vector<double> biased;      // [n_expert] selection scores sqrt(softplus(logit)) + exp_probs_b
};

class Forward {
 public:
  explicit Forward(const std::string& gguf_path, Options o = {});
  ~Forward();
  Forward(const Forward&) = delete;
  Forward& operator=(const Forward&) = delete;

  const Hparams& hparams() const;
  uint32_t position() const;                 // position the next step() evaluates
  TokenResult step(uint32_t token);          // evaluates one token and appends it to the history
  // The router of `layer` on a given FFN input f_in (the RMS-normed collapsed stream), with this
  // reference's own weights and f64 math: what step() decides for that layer given that input.
  Routing route(uint32_t layer, const std::vector<double>& f_in) const;

  // The stored history, for comparisons with the engine's caches (and for overwriting them
  // with the engine's rows, so that one position's comparison does not inherit the rounding
  // flips of earlier ones). nullptr when the row does not exist.
  std::vector<double>* window_row(uint32_t layer, uint32_t position);     // window KV
  std::vector<double>* compressed_row(uint32_t layer, uint32_t group);    // KV-source layers
  std::vector<double>* index_key(uint32_t layer, uint32_t group);         // KV-source layers

 private:
  friend class Drafter;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The DSpark drafter (spec 6.3) beside a reference target, from a support GGUF: the same plain
// f64 loops, its own reading of the support file's keys, the whole history of committed ring
// entries. Rows each query attends: the entries of the last `window` committed positions in
// ring-slot order (slot = position mod window, [OFF] get_dspark_topk_idxs), then the block's keys.
struct DraftResult {
  std::vector<uint32_t> drafts;                      // [block]
  std::vector<std::vector<float>> logits;            // [block][vocab], Markov bias included
  std::vector<float> confidence;                     // [block]
  std::vector<std::vector<std::vector<uint32_t>>> experts;  // [stage][row]
};
class Drafter {
 public:
  Drafter(const Forward& target, const std::string& support_path);
  ~Drafter();
  Drafter(const Drafter&) = delete;
  Drafter& operator=(const Drafter&) = delete;
  const std::vector<uint32_t>& target_layers() const;
  // The next position's captured rows (target layers' captures, concatenated).
  void commit(const std::vector<double>& hidden);
  // The ring entry of stage s at position p (nullptr when not committed), for comparisons.
  std::vector<double>* entry(uint32_t stage, uint32_t position);
  DraftResult propose(uint32_t anchor) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Pieces exposed for hand checks.

// hc_mixes' Sinkhorn part (spec 3.2): row softmax + eps, column normalisation, then
// `iters - 1` rounds of row and column normalisation. logits is [n][n], row = source stream.
std::vector<double> sinkhorn(const std::vector<double>& logits, int n, int iters, double eps);

// Engram row ids of one token (spec 4.3) given the compressed ids ids[0] = current,
// ids[1..orders] = previous tokens newest first, already padded.
std::vector<uint64_t> engram_hash(const Hparams& hp, size_t engram_index, const std::vector<uint64_t>& ids);

// Mimic-mode activation quantizers (num §1-2), in place: each value becomes its dequantized
// Q8_0 (reference rule, blocks of 32) or Q8_K (blocks of 256) value.
void q8_0_roundtrip(std::vector<double>& x);
void q8_k_roundtrip(std::vector<double>& x);

// Fake-quantization grids of numerics.md section 5 (in place; values are BF16 already).
void fake_quant_fp8(std::vector<double>& v);     // E4M3, blocks of 32, power-of-2 scales
void fake_quant_nvfp4(std::vector<double>& v);   // E2M1, blocks of 16, E4M3 scales
void fake_quant_mxfp4(std::vector<double>& v);   // E2M1, blocks of 32, power-of-2 scales
float e4m3_round(float x);                      // nearest E4M3 value, ties to the even code, saturating
float e2m1_round(float x);                      // nearest E2M1 value, ties to the even code, saturating

}  // namespace sluice::reference
