// The seam between the forward pass and the hardware. The forward pass (src/model/deepseek41/forward*.cpp)
// says what to compute as a sequence of these ops; a Backend decides how and where. An op is
// here because a backend must implement it as one unit: a GPU runs each without a round trip,
// and the CPU backend's loops are the scalar-defined reference (docs/numerics.md) that every
// other backend is held to within its stated tolerance (docs/backends.md).
//
// Data: activations live in Tensors the backend allocates (f32 rows). Their memory is
// host-visible: the forward pass reads it only where the model needs a decision on the host
// (routing, the names shown to a TensorObserver) and after sync(): a backend may hold work back
// until then (the Vulkan backend defers linears into its own tensors until an op or sync() may
// read them; every op it runs on the host submits them first). Cached KV rows are BF16 bits
// addressed through WindowRows / CacheRows. Weights are prepared once at load time
// (prepare_weight), so a backend may repack or upload them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "backend/expert_source.h"
#include "backend/weight.h"
#include "kernels/fp4_rows.h"
#include "util/token_id.h"

namespace sluice {

// A view of n rows of `width` floats, row i at p + i * stride.
struct Mat {
  float* p = nullptr;
  size_t n = 0, width = 0, stride = 0;
  float* row(size_t i) const { return p + i * stride; }
  // Columns [c0, c0 + w) of every row.
  Mat cols(size_t c0, size_t w) const { return Mat{p + c0, n, w, stride}; }
  Mat rows(size_t r0, size_t k) const { return Mat{p + r0 * stride, k, width, stride}; }
};
struct CMat {
  const float* p = nullptr;
  size_t n = 0, width = 0, stride = 0;
  CMat() = default;
  CMat(const float* p_, size_t n_, size_t width_, size_t stride_) : p(p_), n(n_), width(width_), stride(stride_) {}
  CMat(const Mat& m) : p(m.p), n(m.n), width(m.width), stride(m.stride) {}  // NOLINT: a view may be read
  const float* row(size_t i) const { return p + i * stride; }
  CMat cols(size_t c0, size_t w) const { return CMat{p + c0, n, w, stride}; }
  CMat rows(size_t r0, size_t k) const { return CMat{p + r0 * stride, k, width, stride}; }
  bool empty() const { return p == nullptr; }
};

// f32 [n][width] owned by the backend that allocated it (zero-filled).
class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<float[]> mem, size_t n, size_t width) : mem_(std::move(mem)), n_(n), width_(width) {}
  Mat m() const { return Mat{mem_.get(), n_, width_, width_}; }
  CMat c() const { return m(); }
  size_t n() const { return n_; }
  size_t width() const { return width_; }
  size_t bytes() const { return n_ * width_ * sizeof(float); }

 private:
  std::shared_ptr<float[]> mem_;
  size_t n_ = 0, width_ = 0;
};

// Packed 4-bit rows of one compressed stream (kernels/fp4_rows.h: `width` values per row on
// `grid`): rows [0, first) are committed (old), rows from `first` on were produced by the
// current chunk (fresh).
struct CacheRows {
  const uint8_t* old = nullptr;
  const uint8_t* fresh = nullptr;
  uint32_t first = 0, width = 0;
  Fp4Grid grid = Fp4Grid::Nvfp4;
  size_t row_bytes() const { return fp4_row_bytes(grid, width); }
  const uint8_t* row(uint32_t g) const {
    return g < first ? old + (size_t)g * row_bytes() : fresh + (size_t)(g - first) * row_bytes();
  }
};

// The raw sliding window of one layer: positions before p0 are in the committed ring
// (row = position mod window), positions from p0 on are the chunk's new rows.
struct WindowRows {
  const uint16_t* ring = nullptr;
  const uint16_t* fresh = nullptr;
  uint32_t window = 0, p0 = 0, width = 0;
  const uint16_t* row(uint32_t pos) const {
    return pos < p0 ? ring + (size_t)(pos % window) * width : fresh + (size_t)(pos - p0) * width;
  }
};

// The RoPE frequency table of one layer (rope_dim / 2 doubles).
struct RopeTable {
  const double* freqs = nullptr;
  size_t pairs = 0;
};

enum class FakeQuant : uint8_t { Fp8Window, Nvfp4, Mxfp4 };  // numerics.md 5

// The op that reads a weight (Backend::prepare_weight_for): linear (the FFNs through it), embed
// (the token table, a drafter's Markov table), or hc_mix (the hyper-connection projections).
enum class WeightUse : uint8_t { Linear, Embed, HcMix };

struct HcParams {
  uint32_t hc = 4, sinkhorn_iters = 20;
  float hc_eps = 1e-6f, norm_eps = 1e-6f;
};
// A mixes row of hc_mix: [pre: hc][post: hc][comb: hc x hc, comb[i*hc + j]: stream i -> j].
inline size_t hc_mix_width(uint32_t hc) { return (size_t)hc * (2 + hc); }

// The indexer of one index-source layer for a chunk (spec 3.4.3, numerics.md 6).
struct IndexSelect {
  CMat q;                     // [n][heads * head_dim], RoPE'd and fake-quantized
  CMat w;                     // [n][heads] head weights bf16(x . proj), before the 1/sqrt scale
  uint32_t heads = 0, head_dim = 0;
  float denom = 1.0f;         // w' = w / denom
  CacheRows keys;             // the KV source's index keys
  uint32_t ratio = 1, p0 = 0; // token i sees (p0 + i + 1) / ratio rows
  uint32_t topk = 0;
  // Candidate pool: the source layer publishes per-token block masks, consumers search them.
  bool candidate_source = false, candidate_consumer = false;
  uint32_t block = 1, keep_blocks = 0;
};

// Sparse attention with sinks for a chunk (spec 3.4.4, numerics.md 6): token i attends its
// window rows ascending, then (when sel is set) the selected compressed rows below its visible
// count, ascending.
struct SparseAttention {
  CMat q;                     // [n][heads * head_dim]
  uint32_t heads = 0, head_dim = 0, p0 = 0;
  WindowRows window;
  CacheRows comp;             // unused when sel == nullptr
  uint32_t comp_ratio = 1;    // token i sees (p0 + i + 1) / comp_ratio compressed rows
  const std::vector<std::vector<int32_t>>* sel = nullptr;  // [n] ascending row ids
  const float* sinks = nullptr;  // [heads]
};

// Attention of every query row over one list of BF16 rows (keys = values, one shared KV head),
// with a per-head sink: the DSpark drafter's block, whose queries all see the same rows (its
// ring and the block's own keys, in both directions; spec 6.3). Same math as sparse_attention
// for a query that selected exactly these rows in this order.
struct RowAttention {
  CMat q;                     // [n][heads * head_dim]
  uint32_t heads = 0, head_dim = 0;
  std::span<const uint16_t* const> rows;
  const float* sinks = nullptr;  // [heads]
};

// One routed (token, expert, weight) assignment; an op's list is sorted by expert, then token.
struct ExpertTriple {
  uint32_t expert = 0, token = 0;
  float weight = 0.0f;
};
// One layer's routed expert tensors: the geometry of ONE expert (data == nullptr); the bytes
// come from the ExpertSource.
struct ExpertTensors {
  const Weight* gate = nullptr;
  const Weight* up = nullptr;
  const Weight* down = nullptr;
};

// One linear of a batch (Backend::linears): linear(*W, x, y, round, row0).
struct LinearCall {
  const Weight* W = nullptr;
  CMat x;
  Mat y;
  bool round = true;
  uint64_t row0 = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // --- memory ---------------------------------------------------------------------------------
  // Called once per weight as the model is loaded.
  virtual void prepare_weight(Weight& w) const = 0;
  // The same for a weight the loader says which op reads (WeightUse): a backend that runs other ops
  // than linear on the host keeps their weights there (a device copy no dispatch would read).
  virtual void prepare_weight_for(Weight& w, WeightUse use) const {
    (void)use;
    prepare_weight(w);
  }
  virtual Tensor tensor(size_t n, size_t width) const = 0;
  // Waits until every op issued so far has finished and its outputs are host-visible.
  virtual void sync() const = 0;
  // Forgets the ops issued since the last sync() that have not run yet (a backend that holds work
  // back): an eval abandoned by an error calls it before the memory those ops would write goes.
  virtual void drop_pending() const noexcept {}

  // --- linear algebra -------------------------------------------------------------------------
  // y[t][r] = dot(W.row(row0 + r), x[t]) for r < y.width, rounded to BF16 when `round`
  // (numerics.md 2-3). x.width == W.cols.
  virtual void linear(const Weight& W, CMat x, Mat y, bool round, uint64_t row0 = 0) const = 0;
  // Linears none of which reads what another writes (the projections of one input, the groups of
  // a grouped output), each as linear() would compute it: a GPU runs them in one submission
  // instead of one round trip each.
  virtual void linears(std::span<const LinearCall> calls) const {
    for (const LinearCall& c : calls) linear(*c.W, c.x, c.y, c.round, c.row0);
  }
  // Token rows of an embedding table, decoded and rounded to BF16, `copies` times per row (spec 3.1).
  virtual void embed(const Weight& table, std::span<const TokenId> tokens, uint32_t copies, Mat X) const = 0;

  // --- elementwise / per row ------------------------------------------------------------------
  // Row-wise y = bf16((x * rms(x)) * w) in place (numerics.md 4).
  virtual void rms_norm(Mat x, const float* w, float eps) const = 0;
  // RoPE on every head of width head_dim of row i at position pos[i] (numerics.md 4).
  virtual void rope(Mat x, uint32_t head_dim, RopeTable t, std::span<const uint64_t> pos, bool inverse) const = 0;
  virtual void fake_quant(Mat x, FakeQuant kind) const = 0;
  // dst row i = BF16 bits of x row i (x is BF16-exact, so this is lossless). Like a tensor, dst
  // may be written only when the ops before have run: the caller reads it after sync() or through
  // a backend op (sparse_attention's window), and keeps it until then (drop_pending).
  virtual void store_bf16(CMat x, uint16_t* dst, size_t dst_stride) const = 0;
  // dst row i (fp4_row_bytes(grid, x.width) bytes each, back to back) = x row i fake-quantized
  // to `grid` and packed (fp4_pack_row): the cached form of compressed rows and index keys.
  virtual void store_fp4(CMat x, Fp4Grid grid, uint8_t* dst) const = 0;
  // out = bf16(a + b).
  virtual void add_round(CMat a, CMat b, Mat out) const = 0;
  // Every row of x = row (width x.width).
  virtual void fill_rows(Mat x, std::span<const float> row) const = 0;
  // dst row i = src row rows[i] (dst.width == src.width; dst.n == rows.size()).
  virtual void gather_rows(CMat src, std::span<const uint32_t> rows, Mat dst) const = 0;
  // dst row rows[i] = src row i (src.n == rows.size()).
  virtual void scatter_rows(CMat src, std::span<const uint32_t> rows, Mat dst) const = 0;
  // out row tokens[j] += terms row j, f32, for j in order (terms.n == tokens.size()).
  virtual void add_rows(CMat terms, std::span<const uint32_t> tokens, Mat out) const = 0;

  // --- hyper-connections (spec 3.2) -----------------------------------------------------------
  // Mixes of every token: the projections of the flattened streams X (f32, scaled by their rms
  // factor), then pre/post/Sinkhorn comb. mixes: [n][hc_mix_width(hc)].
  virtual void hc_mix(const Weight& fn, const float* base, const float* scale, HcParams p, CMat X,
                      Mat mixes) const = 0;
  // y = rms_norm(hc_pre(X, pre)): collapse the hc streams with per-token weights pre [n][hc].
  virtual void hc_pre_norm(CMat X, CMat pre, const float* norm_w, HcParams p, Mat y) const = 0;
  // y = hc_pre(X, pre) without the norm (the DSpark head's h, spec 6.3 step 6).
  virtual void hc_pre(CMat X, CMat pre, HcParams p, Mat y) const = 0;
  // y = bf16((X[0] + ... + X[hc-1]) / hc), f32 sums in stream order: the plain mean of the
  // streams a DSpark drafter captures (spec 6.3 step 1). y.width = the hidden size.
  virtual void hc_mean(CMat X, uint32_t hc, Mat y) const = 0;
  // Y[j] = bf16(post[j] * F + sum_i comb[i][j] * X[i]) per token.
  virtual void hc_post(CMat F, CMat X, CMat mixes, uint32_t hc, Mat Y) const = 0;

  // --- attention (spec 3.4) -------------------------------------------------------------------
  // Compressor pooling of a KV-source layer: projections k, g (g empty for ratio 1) of tokens at
  // positions p0..; complete groups become rows bf16(pooled) of `latents` (returned: the group
  // index of each row), open ones are kept in the carry ([ratio - 1][width] each, updated).
  virtual std::vector<uint32_t> compress_pool(CMat k, CMat g, uint32_t ratio, uint32_t p0, float* carry_k,
                                              float* carry_s, Mat latents) const = 0;
  // Index scores of every visible row, the candidate pool, and the top-k rows of each token
  // (ascending). cand: [n] block masks, written by a candidate source, read by a consumer.
  virtual void index_select(const IndexSelect& a, std::vector<std::vector<uint8_t>>& cand,
                            std::vector<std::vector<int32_t>>& sel) const = 0;
  virtual void sparse_attention(const SparseAttention& a, Mat o) const = 0;
  // The attentions of a batch's sequences, as sparse_attention on each: their queries and outputs
  // are consecutive rows of the pass's tensors, in order (a GPU records them as one op).
  virtual void sparse_attentions(std::span<const SparseAttention> as, std::span<const Mat> outs) const {
    for (size_t k = 0; k < as.size(); ++k) sparse_attention(as[k], outs[k]);
  }
  virtual void attend_rows(const RowAttention& a, Mat o) const = 0;

  // --- feed-forward (spec 3.6) ----------------------------------------------------------------
  // out = down(swiglu(gate x, up x)) with the clamped SwiGLU, weight 1, rounded to BF16.
  virtual void shared_ffn(const Weight& gate, const Weight& up, const Weight& down, float limit, CMat x,
                          Mat out) const = 0;
  // routed[t] += sum over triples (e, t, w) of down_e(swiglu_w(gate_e x_t, up_e x_t)), in
  // triple order (ascending expert), f32. The expert bytes come from src.get(layer, e), which
  // the caller has prepared.
  // Of `experts` (ascending), those a routed op would read from src: a backend holding copies of
  // its own (the Vulkan backend's expert slots) leaves out the ones it holds, so read-ahead hints
  // do not fetch them. Only an estimate for hints: the routed ops decide again when they run.
  virtual std::vector<uint32_t> unheld_experts(const ExpertSource& src, uint32_t layer,
                                               std::vector<uint32_t> experts) const {
    (void)src;
    (void)layer;
    return experts;
  }
  // Experts the forward pass knows or guesses a routed op of `layer` will ask for, told as early
  // as it can: `now` this layer's (certain), `next` the next layer's router's guess. A backend
  // with copies of its own may start copying the ones it lacks from what src has at hand
  // (ExpertSource::at_hand) while other work runs; a wrong guess costs a copy and a slot, never a
  // result. prefetches_experts() says whether the forward pass should make the guess for it.
  virtual bool prefetches_experts() const { return false; }
  // t, next_t: the two layers' expert tensors (geometry only, as routed_ffn's).
  virtual void prefetch_experts(const ExpertSource& src, uint32_t layer, ExpertTensors t,
                                std::span<const uint32_t> now, ExpertTensors next_t,
                                std::span<const uint32_t> next) const {
    (void)src;
    (void)layer;
    (void)t;
    (void)now;
    (void)next_t;
    (void)next;
  }
  // Both routed ops call src.prepare(layer, ...) themselves with the experts they read from it.
  virtual void routed_ffn(ExpertTensors t, const ExpertSource& src, uint32_t layer,
                          std::span<const ExpertTriple> triples, float limit, CMat x, Mat routed) const = 0;
  // rows[j] = the term routed_ffn adds for triple j, f32 (rows.n == triples.size()): for callers
  // that add the terms themselves, with terms other processes computed (expert parallelism), in
  // the same order, so add_rows over all of them gives routed_ffn's bits.
  virtual void routed_ffn_rows(ExpertTensors t, const ExpertSource& src, uint32_t layer,
                               std::span<const ExpertTriple> triples, float limit, CMat x, Mat rows) const = 0;

  // --- Engram (spec 4.5) ----------------------------------------------------------------------
  // X[t][h] = bf16(X + gate * value) for the hc streams of each token; the key of stream h is
  // kv[t][h], the value kv[t][hc]; masked tokens (may be null) have gate 0.
  virtual void engram_gate(Mat X, uint32_t hc, CMat kv, const float* q_norm, const float* k_norm, float eps,
                           const uint8_t* masked) const = 0;
};

}  // namespace sluice
