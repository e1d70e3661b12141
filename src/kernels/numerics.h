// The numeric primitives of the forward pass, each implementing one paragraph of
// docs/numerics.md (section numbers given per function). Plain functions on float spans so
// that tests can check them against hand-worked values; they define the bits the CPU backend
// computes and every other backend is measured against.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>


namespace sluice {

// --- numerics.md 4 -----------------------------------------------------------------------
float silu(float g);
float sigmoid(float x);
float softplus(float x);
// y = bf16((x * r) * w), r = 1/sqrt(mean(x^2) + eps), sequential f32 sum. y may alias x.
void rms_norm(const float* x, const float* w, float* y, size_t n, float eps);
// 1/sqrt(mean(x^2) + eps) with the sequential f32 sum used by rms_norm.
float rms_factor(const float* x, size_t n, float eps);
// The Engram gate of one stream (spec 4.5, numerics.md 8): d = (sum over k in order of (x_k *
// wq_k) * key_k) * rms_factor(x) * rms_factor(key) * inv_sqrt_h, then sigmoid(sign(d) *
// sqrt(max(|d|, 1e-6))). wq is the elementwise product of the two norms' weights.
float engram_gate_value(const float* x, const float* key, const float* wq, size_t H, float eps, float inv_sqrt_h);

// cos/sin of one position for a frequency table: c = (float)cos(pos*f), s = (float)sin(pos*f),
// angle in double.
struct RopeAngles {
  std::vector<float> cos, sin;
};
RopeAngles rope_angles(const std::vector<double>& freqs, uint64_t pos);
RopeAngles rope_angles(std::span<const double> freqs, uint64_t pos);
// Rotates the last 2*a.cos.size() dims of v (interleaved pairs) in f32, (re*c - im*s,
// re*s + im*c) (inverse: s -> -s), then rounds those dims to BF16.
void rope_apply(float* v, size_t dim, const RopeAngles& a, bool inverse = false);

// --- numerics.md 5: fake-quantization grids (input BF16 values, output bf16(q*s)) -------------
float e4m3_rne(float x);   // OCP E4M3FN round-to-nearest-even, saturating at +-448
float e2m1_rne(float x);   // nearest of {0,.5,1,1.5,2,3,4,6} (signed), ties to even code, saturating
void fake_quant_fp8_window(float* v, size_t n);    // blocks of 32, UE8M0 scale (n % 32 == 0)
void fake_quant_nvfp4(float* v, size_t n);         // blocks of 16, E4M3 scale  (n % 16 == 0)
void fake_quant_mxfp4(float* v, size_t n);         // blocks of 32, UE8M0 scale (n % 32 == 0)
// The pieces of the two FP4 grids that the packed cache rows (fp4_rows.h) share with them:
uint8_t e2m1_code(float x);              // e2m1_rne(x) as a code (x not NaN): sign << 3 | index
float e2m1_value(uint8_t code);          // code (low 4 bits) -> its signed value (8: -0)
float nvfp4_block_scale(const float* p); // s of a block of 16: e4m3_rne(max(amax, 6*2^-9) / 6)
float mxfp4_block_scale(const float* p); // s of a block of 32: 2^ceil(log2(max(amax, 6*2^-126) / 6))

// --- spec 3.2: hyper-connection mixes ---------------------------------------------------------
struct HcMix {
  std::vector<float> pre;   // [hc]
  std::vector<float> post;  // [hc]
  std::vector<float> comb;  // [hc][hc], comb[i*hc + j]: source stream i -> destination j
};
// m: the hc*(2+hc) projections of the flattened streams, already multiplied by the rms factor.
HcMix hc_mix_from_projections(const float* m, const float* base, const float* scale, uint32_t hc,
                              uint32_t sinkhorn_iters, float hc_eps);
// y = bf16(sum_h w[h] * X[h]), f32 accumulation in stream order (numerics.md 3).
void hc_pre(const float* X, const float* w, uint32_t hc, size_t n, float* y);
// Y[j] = bf16(post[j]*F + sum_i comb[i][j]*X[i]) (spec 3.2). Y must not alias X.
void hc_post(const float* F, const float* X, const HcMix& mix, uint32_t hc, size_t n, float* Y);

// --- numerics.md 6: selection ---------------------------------------------------------------
// Indices of the k largest scores (-inf and NaN never selected); order by score descending,
// ties to the lower index; the result is sorted ascending.
std::vector<int32_t> topk_ascending(std::span<const float> scores, uint32_t k);
// The selection's sample of the scores, and the heap a selection over n scores holds while it
// runs (an index per score and the sample; the engine's footprint counts it).
inline constexpr size_t kTopkSamples = 1024;
constexpr uint64_t topk_scratch_bytes(uint64_t n) { return n * 4 + kTopkSamples * 4; }
// Candidate blocks of the candidate-source layer: per-block mask (1 = kept) over
// ceil(n_vis / block) blocks.
std::vector<uint8_t> candidate_blocks(std::span<const float> scores, uint32_t n_vis,
                                      uint32_t block_size, uint32_t keep_blocks);

// --- numerics.md 7: router -------------------------------------------------------------------
struct Routing {
  std::vector<uint32_t> experts;  // selection order: descending biased score, ties to lower id
  std::vector<float> weights;     // same order
};
Routing route(std::span<const float> logits, std::span<const float> bias, uint32_t k,
              bool norm_topk_prob, float routed_scaling_factor);

// --- spec 4.3 / numerics.md 8: Engram ---------------------------------------------------------
constexpr int64_t kEngramDead = -1;
uint64_t splitmix64(uint64_t x);
// ids: the current compressed id then the previous ones, newest first (max_ngram entries,
// kEngramDead allowed). Applies the cumulative DEAD->pad rule and returns the (orders x heads)
// row ids of one Engram layer given that layer's primes and multipliers.
std::vector<uint64_t> engram_hash(std::span<const int64_t> ids, int64_t pad,
                                  std::span<const uint64_t> primes,
                                  std::span<const uint64_t> multipliers, uint32_t n_heads);
// Decodes one row (head_dim E4M3 codes + head_dim/32 E8M0 scales) to bf16(e4m3*2^(e-127)).
// Returns false on a NaN code or an E8M0 of 255.
bool engram_decode_row(const uint8_t* row, uint32_t head_dim, float* out);

}  // namespace sluice
