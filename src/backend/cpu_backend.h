// The CPU backend: the scalar-defined kernels (src/kernels) run on a ThreadPool. Threads split
// output rows (or tokens x heads) only, so every output element is computed by one thread
// with the same code whatever the thread count: results are bit-identical for any --threads.
#pragma once
#include "backend/backend.h"
#include "backend/thread_pool.h"
#include "kernels/index_scores.h"

namespace sluice {

// What the CPU backend prepares for a weight: the type's traits and its dot kernel for this
// CPU (no repacking yet). Usable without a CpuBackend (loading before an Engine exists).
void prepare_cpu_weight(Weight& w);

// sparse_attention unpacks the selected compressed rows of this many queries at a time: its
// buffer holds at most kAttentionGroup x index_topk rows (engine_footprint.cpp counts it).
inline constexpr uint32_t kAttentionGroup = 8;

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(int threads);
  std::string_view name() const override { return "cpu"; }
  int threads() const { return pool_.size(); }

  void prepare_weight(Weight& w) const override;
  Tensor tensor(size_t n, size_t width) const override;
  void sync() const override {}

  void linear(const Weight& W, CMat x, Mat y, bool round, uint64_t row0) const override;
  void embed(const Weight& table, std::span<const TokenId> tokens, uint32_t copies, Mat X) const override;
  void rms_norm(Mat x, const float* w, float eps) const override;
  void rope(Mat x, uint32_t head_dim, RopeTable t, std::span<const uint64_t> pos, bool inverse) const override;
  void fake_quant(Mat x, FakeQuant kind) const override;
  void store_bf16(CMat x, uint16_t* dst, size_t dst_stride) const override;
  void store_fp4(CMat x, Fp4Grid grid, uint8_t* dst) const override;
  void add_round(CMat a, CMat b, Mat out) const override;
  void fill_rows(Mat x, std::span<const float> row) const override;
  void gather_rows(CMat src, std::span<const uint32_t> rows, Mat dst) const override;
  void scatter_rows(CMat src, std::span<const uint32_t> rows, Mat dst) const override;
  void add_rows(CMat terms, std::span<const uint32_t> tokens, Mat out) const override;
  void hc_mix(const Weight& fn, const float* base, const float* scale, HcParams p, CMat X, Mat mixes) const override;
  void hc_pre_norm(CMat X, CMat pre, const float* norm_w, HcParams p, Mat y) const override;
  void hc_pre(CMat X, CMat pre, HcParams p, Mat y) const override;
  void hc_mean(CMat X, uint32_t hc, Mat y) const override;
  void hc_post(CMat F, CMat X, CMat mixes, uint32_t hc, Mat Y) const override;
  std::vector<uint32_t> compress_pool(CMat k, CMat g, uint32_t ratio, uint32_t p0, float* carry_k, float* carry_s,
                                      Mat latents) const override;
  void index_select(const IndexSelect& a, std::vector<std::vector<uint8_t>>& cand,
                    std::vector<std::vector<int32_t>>& sel) const override;
  void sparse_attention(const SparseAttention& a, Mat o) const override;
  void attend_rows(const RowAttention& a, Mat o) const override;
  void shared_ffn(const Weight& gate, const Weight& up, const Weight& down, float limit, CMat x,
                  Mat out) const override;
  void routed_ffn(ExpertTensors t, const ExpertSource& src, uint32_t layer, std::span<const ExpertTriple> triples,
                  float limit, CMat x, Mat routed) const override;
  void routed_ffn_rows(ExpertTensors t, const ExpertSource& src, uint32_t layer, std::span<const ExpertTriple> triples,
                       float limit, CMat x, Mat rows) const override;
  void engram_gate(Mat X, uint32_t hc, CMat kv, const float* q_norm, const float* k_norm, float eps,
                   const uint8_t* masked) const override;

 protected:
  // One projection of a routed expert (its gate, up or down weight `part` with the expert's
  // bytes `data` as the source returned them) over the activation rows: the CPU's matmul,
  // rounded to BF16, y[t * part.rows + r].
  void expert_projection(const Weight& part, const uint8_t* data, std::span<const uint8_t* const> acts,
                         float* y) const;
  // The unpacker of packed compressed rows to BF16 that sparse_attention uses (kernels/fp4_rows.h).
  Fp4UnpackFn fp4_unpacker() const { return unpack_fp4_; }

 private:
  // Each triple's term (expert output rows, f32) handed to `take(j, row)` in triple order
  // (defined and instantiated in cpu_ffn.cpp only; a template, so no call allocates).
  template <class Take>
  void routed_terms(ExpertTensors t, const ExpertSource& src, uint32_t layer, std::span<const ExpertTriple> triples,
                    float limit, CMat x, Take&& take) const;
  // Queries i0 .. i0 + gn - 1 of a, each over its rows (rows[i - i0]), every head.
  void attend_group(const SparseAttention& a, uint32_t i0, uint32_t gn,
                    const std::vector<std::vector<const uint16_t*>>& rows, float scale, Mat o) const;

  mutable ThreadPool pool_;
  DotFn dot_bf16_;  // BF16 cache rows x f32 vectors
  Fp4UnpackFn unpack_fp4_;  // packed compressed rows and index keys -> BF16
  IndexScoresFn index_scores_;  // the integer indexer (VNNI), or nullptr: the float path
};

}  // namespace sluice
