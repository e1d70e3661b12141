// The Vulkan backend's class and what its files share (the constants, the small structs its
// members pass around). Internal: only the backend's own files (src/backend/vulkan_*.cpp) include
// it, and only where SLUICE_HAVE_VULKAN is set (CMakeLists.txt sets it on vulkan_*.cpp).
#pragma once
#if SLUICE_HAVE_VULKAN
#include <vulkan/vulkan.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <map>
#include <tuple>
#include <utility>

#include "backend/cpu_backend.h"
#include "backend/cpu_linear.h"
#include "backend/device_rows.h"
#include "backend/expert_split.h"
#include "backend/held_chunk.h"
#include "backend/live_tensors.h"
#include "backend/routed_terms.h"
#include "backend/swiglu.h"
#include "backend/vulkan_backend.h"
#include "backend/vulkan_device.h"
#include "backend/vulkan_shaders.h"
#include "kernels/exp_f32.h"
#include "kernels/fp.h"
#include "kernels/iq_tables.h"
#include "kernels/numerics.h"
#include "util/error.h"
#include "util/format_bytes.h"

namespace sluice::vk_backend {

using vk::check;
using vk::describe;
using vk::instance;
using vk::kGroup;
using vk::kOpShaders;
using vk::kQuantShaderCount;
using vk::kQuantShaders;
using vk::LinearBuilds;
using vk::QuantShader;
using vk::result_name;
using vk::Spirv;


// The most rows one query of the device's attention attends (attention.comp kMaxRows: its scores
// in workgroup memory); a query with more runs on the CPU. The published model's is 640.
constexpr uint32_t kAttentionRows = 2048;
// --gpu-kv auto on a card with memory of its own: the rows one sequence of the published model
// reads a step (40 layers x (128 window + 512 selected) x 1 KiB) twice over, or an eighth of the
// device budget where that is less.
constexpr uint64_t kGpuKvAutoBytes = 64ull << 20;
// The indexer's head_dim at most (index_scores.comp kMaxDim: an invocation holds one key).
constexpr uint32_t kIndexMaxDim = 256;
// GpuIndexer::Auto scores on a GPU when a call's work (queries x visible keys x heads x head_dim
// multiply-adds) is at least this: below it the extra round trip costs more than the CPU's scoring.
constexpr uint64_t kIndexDeviceMacs = 1ull << 24;
// Tokens a subgroup of a quantized linear takes together (CMakeLists.txt SLUICE_GPU_TOKEN_TILE,
// the shaders' TOKENS).
constexpr uint32_t kTokenTile = SLUICE_GPU_TOKEN_TILE;
// Tokens and rows a workgroup of a GEMM build computes (CMakeLists.txt SLUICE_GPU_GEMM_TILE;
// linear_common.glsl TOKENS and GEMM_ROWS), and the workgroup memory its tile takes: a block of
// each row and token, each in its size in words plus two (linear_common.glsl W_WORDS, A_WORDS).
constexpr uint32_t kGemmTile = SLUICE_GPU_GEMM_TILE;
constexpr uint32_t kGemmRows = 64;
// The float formats' GEMM build (linear_float.comp FLOAT_GEMM TR, TT): rows and tokens of a tile.
constexpr uint32_t kFloatTileRows = 8, kFloatTileTokens = 8;
inline uint64_t gemm_shared_bytes(GgmlType t) {
  const TypeTraits& w = type_traits(t);
  const uint64_t a_block = activation_bytes(w.act, w.block_elems);
  return 4 * (kGemmRows * ((uint64_t)w.block_bytes / 4 + 2) + kGemmTile * (a_block / 4 + 2));
}
// Weights, activations, outputs, tables (linear_common.glsl), and the output buffer read only
// (the row ops' operands, rows_io.glsl).
constexpr uint32_t kBindings = 5;
constexpr uint64_t kSlabBytes = 256ull << 20;  // routed-expert slots are allocated this many bytes at a time
// Descriptor sets: the most dispatches one submission records. A fused group of routed experts
// takes five per expert (gate, up, SwiGLU, quantizer, down), 32 of them 160, beside a deferred batch.
constexpr uint32_t kSets = 192;
constexpr size_t kGroupExperts = 32;  // the most routed experts one group takes
// A dispatch that has not finished after this long means the device is gone or hung.
constexpr uint64_t kFenceTimeoutNs = 120ull * 1000 * 1000 * 1000;

struct Push {
  uint32_t rows, cols, n, row0, w_row_bytes, a_stride, kind, round_out, w_off;
  uint32_t y_off = 0, y_stride = 0;  // the linears' outputs y[y_off + t * y_stride + r]
  // The row ops' bindings 1, 4 and 2 start at these floats of their buffers (rows_io.glsl).
  uint32_t base_staged = 0, base_in = 0, base_out = 0;
};

// A storage buffer and its memory; `map` is set while the host can write it directly (the
// staging buffers, and weights in device-local memory that is host-visible).
struct Buffer {
  VkBuffer buf = VK_NULL_HANDLE;
  VkDeviceMemory mem = VK_NULL_HANDLE;
  void* map = nullptr;
  VkDeviceSize size = 0;
};

// A weight's bytes on the device as one dispatch binds them: a buffer range and its shader.
struct DeviceWeight {
  VkPipeline pipe = VK_NULL_HANDLE;
  VkBuffer buf = VK_NULL_HANDLE;
  VkDeviceSize offset = 0, range = 0;
  uint32_t kind = 0;   // linear_float's kind
  uint32_t w_off = 0;  // where the weight starts in the binding (an imported page range)
};

// One routed expert's slot: gate, up and down at slot_offset + part_off_[i] of its slab.
struct ExpertSlot {
  uint64_t source = 0;  // ExpertSource::id; 0: empty
  uint32_t layer = 0, expert = 0;
  uint64_t last_use = 0;
  // Neighbours in the order of use (indices into the slots; UINT32_MAX at the ends): the least
  // recently used slot is the list's head, found without a scan.
  uint32_t older = UINT32_MAX, newer = UINT32_MAX;
  bool hinted = false;  // filled by prefetch_experts and not used since
  uint64_t ready = 0;   // the timeline value its hint-started copy signals (0: none pending)
  uint32_t slab = 0;
  VkDeviceSize offset = 0;
};

// A copy out of a staging buffer, recorded with others (record_copies).
struct PendingCopy {
  VkBuffer dst = VK_NULL_HANDLE;
  VkBufferCopy region{};
};

// What prepare_weight leaves in Weight::device.

struct GpuWeight {
  Buffer b;
  VkPipeline pipe = VK_NULL_HANDLE;  // its type's linear shader
  uint32_t kind = 0;                 // linear_float's kind; unused by the quantized types
  uint32_t w_off = 0;                // imported: the weight's offset in its first page
  bool imported = false;             // b is the weight's own pages (freed by release_imports)
};

class VulkanBackend final : public CpuBackend {
 public:
  explicit VulkanBackend(const GpuOptions& o);

  ~VulkanBackend() override { destroy(); }

  std::string_view name() const override { return "vulkan"; }

  // Registered, so that deferred linears know their outputs' tensors are still there.
  Tensor tensor(size_t n, size_t width) const override { return LiveTensors::make(live_, n, width); }
  void sync() const override { settle(); }

  // The CPU's ops, each after the deferred linears have run (they may read what those write).
  void embed(const Weight& table, std::span<const TokenId> tokens, uint32_t copies, Mat X) const override;
  // On the device when deferred linears write the rows whole (the queries' low rank after its
  // projection): recorded in their batch, a stage after them, so a linear that reads the
  // normalized rows chains after it. Else the CPU's, once the deferred linears have run.
  void rms_norm(Mat x, const float* w, float eps) const override;
  // On the device in place when the deferred batch writes x whole (the queries, the window row,
  // the index keys, the attention's output); else the CPU's, once the batch has run.
  void rope(Mat x, uint32_t head_dim, RopeTable t, std::span<const uint64_t> pos, bool inverse) const override;
  // On the device in place when the deferred batch writes x whole (the window row after its RoPE);
  // else the CPU's, once the batch has run.
  void fake_quant(Mat x, FakeQuant kind) const override;
  // Where the deferred batch writes x whole (the window row after its fake-quant), the store waits
  // for the batch: the host converts the rows as it copies the batch's outputs out, and an
  // attention recorded meanwhile reads them where the batch holds them (defer_sparse_attention).
  // Else the CPU's, once the batch has run.
  void store_bf16(CMat x, uint16_t* dst, size_t dst_stride) const override;
  void drop_pending() const noexcept override;
  // Like store_bf16: where the deferred batch writes x whole (a KV source's latents and index keys
  // after their RoPE), the host packs the rows as it copies the batch's outputs out.
  void store_fp4(CMat x, Fp4Grid grid, uint8_t* dst) const override;
  // On the device where the deferred batch writes an addend (the shared expert's output, while the
  // CPU made the routed sums): the sum rides with the batch. Else the CPU's, after the batch only
  // when it writes one of the rows.
  void add_round(CMat a, CMat b, Mat out) const override;
  void fill_rows(Mat x, std::span<const float> row) const override;
  void gather_rows(CMat src, std::span<const uint32_t> rows, Mat dst) const override;
  void scatter_rows(CMat src, std::span<const uint32_t> rows, Mat dst) const override;
  void add_rows(CMat terms, std::span<const uint32_t> tokens, Mat out) const override;
  // The hyper-connection ops join the deferred batch (below: "Row ops in the deferred batch") when
  // their output lies in a live tensor, reading their inputs where the batch's earlier dispatches
  // write them or staged from the host now; else the CPU's, once the deferred linears have run.
  void hc_mix(const Weight& fn, const float* base, const float* scale, HcParams p, CMat X, Mat mixes) const override;
  void hc_pre_norm(CMat X, CMat pre, const float* norm_w, HcParams p, Mat y) const override;
  void hc_pre(CMat X, CMat pre, HcParams p, Mat y) const override;
  void hc_mean(CMat X, uint32_t hc, Mat y) const override;
  void hc_post(CMat F, CMat X, CMat mixes, uint32_t hc, Mat Y) const override;
  // Recorded into the deferred batch (compress_pool.comp) reading the projections where the batch
  // writes them; the carry is staged, and its update copied out with the batch. Else the CPU's.
  std::vector<uint32_t> compress_pool(CMat k, CMat g, uint32_t ratio, uint32_t p0, float* carry_k, float* carry_s,
                                      Mat latents) const override;
  // The scores on the device (index_scores.comp) where GpuOptions::indexer asks for it, recorded
  // into the deferred batch, which is then submitted (the host needs the selection to stage the
  // attention's rows), then the CPU's selection from them; else the CPU's, after the batch.
  void index_select(const IndexSelect& a, std::vector<std::vector<uint8_t>>& cand,
                    std::vector<std::vector<int32_t>>& sel) const override;
  // Recorded into the deferred batch (attention.comp) with the rows each query attends staged from
  // the host now, when the output lies in one of the backend's tensors and the rows fit; else the
  // CPU's, once the batch has run.
  void sparse_attention(const SparseAttention& a, Mat o) const override;
  // A batch's sequences as one op, so their outputs are one region: the inverse RoPE and the
  // output projection after them read it on the device. Else one by one.
  void sparse_attentions(std::span<const SparseAttention> as, std::span<const Mat> outs) const override;
  void attend_rows(const RowAttention& a, Mat o) const override;
  // Recorded into the deferred batch like the hyper-connection ops (the streams in place where the
  // batch writes them, else staged and written to a new region); else the CPU's.
  void engram_gate(Mat X, uint32_t hc, CMat kv, const float* q_norm, const float* k_norm, float eps,
                   const uint8_t* masked) const override;

  // The deferred linears submitted and their outputs written (deferred submissions below).
  void settle() const;

  void prepare_weight(Weight& w) const override;

  // embed() runs on the CPU: its tables stay out of the device budget (the published token table
  // alone is 1.32 GB of F16, the room of some 130 expert slots). hc_mix() runs on the device where
  // it has the shader (its projections, 79 MB of F16 in the published model, with it).
  void prepare_weight_for(Weight& w, WeightUse use) const override;

  void linear(const Weight& W, CMat x, Mat y, bool round, uint64_t row0) const override;

  // The calls whose weights have a copy on the device (and whose rows fit the staging buffers)
  // in one device_linears batch: as few submissions as the buffers allow, calls reading the same
  // rows in one format staging them once. The others run on the CPU first. The calls are
  // independent, so neither the order nor the batching changes a bit.
  void linears(std::span<const LinearCall> calls) const override;

  // --- Routed experts in device slots ------------------------------------------------------------
  // With expert slots (GpuOptions::expert_slots) the routed FFN runs on the device: each expert's
  // gate, up and down slices are copied into a slot the first time a layer routes to it and stay
  // there, least recently used first out, keyed by (source, layer, expert). Only the experts
  // without a slot are asked of the source (its prepare() and get()), so a slot hit reads nothing
  // from the host store or the disk. The operations are the CPU backend's routed_terms, in its
  // order (experts ascending, tokens in order, the SwiGLU and the down projection's activation
  // quantization with the CPU's bits, on the device in the group's one submission: `fused`
  // below), so the sums have its bits. Every dispatch finishes before the next
  // expert is placed, so a slot is never replaced while a submitted command still reads it.
  //
  // In place (GpuOptions::experts_in_place, a device that shares the host's memory): no slots.
  // Every expert is asked of the source, and the dispatches read its bytes where the source
  // holds them, through chunks of the source's memory mapped once (held_chunk.h). The source's
  // pointers live until its next prepare(), or until a later get() where it holds a window
  // (holds_union() false): there each expert ends its group, so its dispatches finish before
  // the next get().
  void routed_ffn(ExpertTensors t, const ExpertSource& src, uint32_t layer, std::span<const ExpertTriple> triples,
                  float limit, CMat x, Mat routed) const override;

  void routed_ffn_rows(ExpertTensors t, const ExpertSource& src, uint32_t layer, std::span<const ExpertTriple> triples,
                       float limit, CMat x, Mat rows) const override;

  // The shared expert: the CPU backend's shared_ffn, operation for operation. Gate and up go
  // into one tensor of this backend ([g | u] per token), so their batch is deferred; the SwiGLU
  // then runs on the device in that batch (swiglu.comp, the CPU's bits), and the down projection
  // chains after it: the whole expert waits for the next submission (the routed experts' first
  // group, or whatever settles). Where a step cannot run on the device (a weight the CPU runs, a
  // device without shaderFloat64), the host takes over from there, after the batch has run.
  void shared_ffn(const Weight& gate, const Weight& up, const Weight& down, float limit, CMat x,
                  Mat out) const override;

  std::vector<uint32_t> unheld_experts(const ExpertSource& src, uint32_t layer,
                                       std::vector<uint32_t> experts) const override;

  // Hint-started copies. On a device whose slots the host does not map (a card's VRAM), a miss
  // is otherwise staged and copied at the head of its group's submission, so the copy and the
  // group's projections run one after the other. Here the experts the forward pass knows (this
  // layer's) or guesses (the next layer's router on this layer's input) it will ask for, those
  // the source has in memory now (ExpertSource::at_hand), go into slots at once, through a
  // staging buffer of their own, in a submission of their own that the host does not wait for:
  // the device copies this layer's while the host records the shared expert and the routed
  // group, and the next layer's while this layer's group and the next attention run. With
  // timeline semaphores a submission that reads or writes a slot waits on the device for its
  // copy's value (touch_slot; the copies may run on a transfer queue of their own); without
  // them the first submission after it starts with a barrier that orders the copies before
  // every later read or write of the slots (submission order on the one queue). One such
  // submission at a time: a hint while the last one's copies are still in flight, or while the deferred batch
  // or the staged copies name slots, is dropped (GpuStats::expert_hints_dropped). This layer's
  // slots are marked used first, so a guess never evicts them; a guess that is wrong costs a
  // copy and a slot. Not with --cpu-experts (its cost model times each upload), not in place,
  // not where the slots are mapped (copies ahead, below, do that job there).
  bool prefetches_experts() const override {
    return slots_wanted_ != 0 && !in_place_ && !split_.active() && (!st_.weights_in_host_memory || force_staging_);
  }

  void prefetch_experts(const ExpertSource& src, uint32_t layer, ExpertTensors t, std::span<const uint32_t> now,
                        ExpertTensors next_t, std::span<const uint32_t> next) const override;

  // Before a routed call: the deferred linears wait for its first group's submission, or, where
  // the CPU runs the call, for the next one (the CPU reads x and writes out on the host: neither
  // the batch's staged inputs nor its regions are those rows), unless the call reads or adds into
  // what they write (the host does both), or the batch holds a routed group: its dispatches read
  // slots this call may replace and the source's bytes its next prepare() may move.
  void settle_for(CMat x, CMat out) const;

  // True when this layer's experts can run in the slots: slots were asked for, the three types
  // have shaders, and one expert fits the slot geometry fixed by the first call (a drafter or
  // layer with larger experts runs on the CPU, counted in experts_on_host).
  bool experts_on_device(ExpertTensors t) const;

  // An expert's three parts (gate, up, down): their bytes, and whether the device runs all three
  // (a shader for each type, each part within one binding's range).
  struct ExpertParts {
    uint64_t bytes[3] = {};
    bool shaders = true;
  };
  ExpertParts expert_parts(ExpertTensors t) const;

  // Whether such an expert goes in a slot: the slots exist and each part fits its place (mu_ held).
  bool fits_slots(const ExpertParts& p) const;

  // The routed FFN's sequence (routed_terms.h) with each expert's projections dispatched on its
  // slot; only the experts without one are asked of the source. With --cpu-experts a share of
  // those misses is not uploaded: the CPU computes them from the source's bytes while the device
  // runs the group's others (expert_split.h), with the same bits either way.
  //
  // With `sums` (routed_ffn's rows) and a call that is one group of fused experts on the device
  // (a decode step's experts), nothing is submitted: the terms go into a scratch tensor of this
  // backend, added into the sums in triple order on the device (routed_sum.comp), and the whole
  // FFN waits in the deferred batch with the shared expert for the next submission.
  template <class Take>
  void device_routed(ExpertTensors t, const ExpertSource& src, uint32_t layer, std::span<const ExpertTriple> triples,
                     float limit, CMat x, Take&& take, Mat sums = {}) const;

  // A group's fused experts into the deferred batch (mu_ held), then sums[t] += terms[j] for the
  // triples j of token t in order (routed_sum.comp): false, with nothing recorded, when the
  // batch's buffers or descriptor sets have no room for all of it (the caller submits instead).
  template <class Items, class Jobs>
  bool record_routed_sum(const Items& items, const Jobs& jobs, std::span<const ExpertTriple> triples, const Tensor& terms,
                         Mat sums, std::span<const Tensor> scratch) const;

  GpuStats stats() const;

  void release_imports() const;

  GpuCopyBandwidth copy_bandwidth(uint64_t bytes, int passes) const;

  // The device's rms_norm alone (gpu_rms_norm): the rows staged in the output buffer as a region
  // of deferred linears would be, normalized there and read back.
  void rms_norm_alone(float* x, size_t n, size_t width, const float* w, float eps) const;

  // The device's SwiGLU alone (gpu_swiglu): rows [g | u] staged in the output buffer as a region
  // of deferred linears would be, h written over g there and read back; wk (null: 1) per row.
  void swiglu_alone(float* gu, size_t n, size_t width, float limit, const float* wk) const;

  // The device's Engram gates alone (gpu_engram_gates): X [n][hc * H], kv [n][(hc + 1) * H].
  std::vector<float> engram_gates_alone(const float* X, const float* kv, size_t n, uint32_t hc, size_t H,
                                        const float* q_norm, const float* k_norm, float eps) const;

  // The indexer's scores on the device (gpu_index_scores), whatever GpuOptions::indexer says.
  // Recorded into the batch as index_select records them (the batch is not submitted first).
  std::vector<float> index_scores_alone(const IndexSelect& a, std::vector<std::vector<uint8_t>>& cand) const;

  // compress_pool on the device with the pooled values unrounded (gpu_compress_pool_unrounded).
  std::vector<uint32_t> compress_pool_unrounded(CMat k, CMat g, uint32_t ratio, uint32_t p0, float* carry_k,
                                                float* carry_s, Mat latents) const;

  // The device's exp_f32 alone (gpu_exp), in place on n values staged in the output buffer.
  void exp_alone(float* x, size_t n) const;

  // The device's quantizer alone (gpu_quantize): n rows of cols floats -> n rows of the format's
  // bytes, unpadded.
  std::vector<uint8_t> quantize_alone(ActType a, const float* x, size_t n, size_t cols) const;

 private:
  // The linear shader of a weight type (kind: linear_float's format), or none: the type has no
  // shader, or it is a float format and the device lacks shaderFloat64 (linear_float.comp).
  // Makes the pages holding [data, data + bytes) a storage buffer of the device (mu_ held): the
  // range is widened to the import alignment (whole pages of the same allocation, so mapped)
  // and the weight starts w_off bytes in. False when the driver refuses; nothing is left behind.
  bool import_pages(const uint8_t* data, uint64_t bytes, GpuWeight& g) const;

  VkPipeline pipeline_for(GgmlType type, uint32_t& kind) const;

  static int resolved(int threads) { return threads > 0 ? threads : std::max(1, (int)std::thread::hardware_concurrency()); }

  void init_objects();

  VkPipeline pipeline(Spirv spv, const char* what);

  // A weight's buffer in device-local memory: mapped when that memory is host-visible (UMA,
  // lavapipe, resizable BAR), else filled through the staging copy (upload()).
  Buffer make_weight_buffer(VkDeviceSize bytes) const;

  // Copies bytes into b: directly when it is mapped, else in chunks through the staging buffer
  // with one transfer each (mu_ held or not yet shared).
  void upload(Buffer& b, const uint8_t* src, uint64_t bytes) const { upload(b, 0, src, bytes); }
  void upload(Buffer& b, VkDeviceSize at, const uint8_t* src, uint64_t bytes) const;

  Buffer make_buffer(VkDeviceSize bytes) const {
    return make_buffer(bytes, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, true);
  }

  // A storage buffer in the first memory type with all of `flags` (mapped when `map`).
  Buffer make_buffer(VkDeviceSize bytes, VkMemoryPropertyFlags flags, bool map) const;

  void free_buffer(Buffer& b) const;

  // Grows b to hold `bytes` (never shrinks: it is reused by every call).
  void ensure(Buffer& b, VkDeviceSize bytes) const;

  // y[t * ldy + r] = row r (row0 + r of W's geometry) of the weight at `wt` dotted with the
  // activation row acts[t] (W.act() format, `stride` bytes), for r < rows; mu_ held. Tokens go
  // in groups whose activations and outputs each fit the staging buffers. Returns the device's
  // seconds (finish_submit).
  double device_linear(const DeviceWeight& wt, const Weight& W, uint64_t row0, std::span<const uint8_t* const> acts,
                     size_t stride, float* y, size_t ldy, size_t rows, bool round) const;

  static Push push_for(const DeviceWeight& wt, const Weight& W, uint64_t row0, size_t n, size_t stride, size_t rows,
                       bool round);
  static uint32_t grid_x(size_t rows) { return (uint32_t)((rows + kGroup - 1) / kGroup); }
  // What a storage binding's offset must be a multiple of.
  VkDeviceSize offset_align() const { return std::max<VkDeviceSize>(4, offset_align_); }
  VkDeviceSize aligned(VkDeviceSize b) const;
  // The activation and output buffers at their full size, from the first use on, so a deferred
  // batch's bytes never move.
  void ensure_io() const;
  // The output buffer at its full size; where it is the card's memory, its mapped mirror too.
  void ensure_out() const;
  // Where the host reads rows of the output buffer once their submission has run: the buffer
  // itself where it is mapped, else its mirror (read_back named the bytes before the submission).
  const uint8_t* rows_out() const { return static_cast<const uint8_t*>(scratch_local_ ? back_.map : out_.map); }
  // The next submission copies these bytes of the output buffer into the mirror after its
  // dispatches (nothing to do where the host maps the buffer itself).
  void read_back(VkDeviceSize off, VkDeviceSize bytes) const {
    if (scratch_local_ && bytes) readback_.push_back(VkBufferCopy{off, off, bytes});
  }
  // Host rows into the output buffer at 0 (the test hooks' inputs): a memcpy where it is
  // mapped, else through the staging buffer.
  void put_rows(const void* src, size_t bytes) const;

  // The device's quantizer of an activation format (none: the host quantizes it).
  VkPipeline quantizer(ActType a) const {
    return a == ActType::Q8_0 ? quantize_q8_0_ : a == ActType::Q8_K ? quantize_q8_k_ : VK_NULL_HANDLE;
  }
  // Invocations per row of the quantizers: Q8_0 pairs of 32-blocks, Q8_K 256-blocks.
  static uint32_t quantize_units(ActType a, size_t cols) {
    return a == ActType::Q8_0 ? (uint32_t)((cols / 32 + 1) / 2) : (uint32_t)(cols / 256);
  }
  // Bytes of one row the device quantized: the format's, padded to whole words.
  static size_t quantized_row_bytes(ActType a, size_t cols) { return (activation_bytes(a, (int64_t)cols) + 3) / 4 * 4; }
  // The device quantizes rows of `cols` floats when it has the format's quantizer and the row is
  // whole blocks.
  bool quantizes(ActType a, size_t cols) const {
    return quantizer(a) != VK_NULL_HANDLE && cols % (a == ActType::Q8_0 ? 32 : 256) == 0;
  }
  bool device_quantizes(const Weight& W) const { return quantizes(W.act(), W.cols); }
  // A float weight's linear reads its f32 rows x where a region of the deferred batch holds them
  // whole, when their start suits a binding offset (mu_ held).
  bool reads_rows_in_place(const Weight& W, CMat x) const;

  // One dispatch of a linear shader: its weight range, where its activations and outputs lie in
  // the staging buffers, its push constants and grid.
  struct Dispatch {
    DeviceWeight wt;
    VkDeviceSize act_off = 0, out_off = 0, out_bytes = 0;
    Push push{};
    uint32_t gx = 0, gy = 0;
    // An activation quantizer: reads f32 rows at act_off of the activation buffer (of the output
    // buffer with `chained`: a linear's outputs earlier in the submission) and writes their codes
    // at out_off of the activation buffer (out_bytes), for the linears after it.
    bool quantize = false, chained = false;
    // Recorded in stages, a barrier between one and the next: a dispatch reads only what
    // dispatches of earlier stages wrote.
    uint32_t stage = 1;
    // Binding 1's bytes from act_off, binding 2's from out_off (out_bytes): what the shader reads
    // and writes there, so that the bindings of dispatches in one stage are disjoint ranges, as
    // synchronization validation sees them (0: to the buffer's end).
    VkDeviceSize act_bytes = 0;
    // A row op (rows_io.glsl): binding 1 is act_bytes from act_off (none: no staged operand),
    // binding 4 the output buffer's in_bytes from in_off, read only (none: no operand there).
    bool row = false;
    VkDeviceSize in_off = 0, in_bytes = 0;
    // The attention's binding 3: the rows the device keeps (--gpu-kv), whole; else the tables.
    VkBuffer kept = VK_NULL_HANDLE;
  };

  // The bytes of n rows `stride` apart whose last is `row` bytes long, in whole words.
  static VkDeviceSize rows_span(size_t n, size_t stride, size_t row) {
    return n == 0 ? 0 : ((VkDeviceSize)(n - 1) * stride + row + 3) / 4 * 4;
  }

  // The shader and grid of a linear dispatch over `rows` outputs for n tokens: 64 outputs per
  // workgroup; for a quantized format with at least kGemmTile tokens its GEMM build (64 rows and a
  // tile of tokens per workgroup); else with the subgroup builds a row per subgroup, and with at
  // least kTokenTile tokens a tile of them per subgroup (each weight value decoded once for the
  // tile). The GEMM and subgroup builds stride over the rows, so a count capped at the device's
  // limit still covers them all.
  void shape_linear(Dispatch& d, size_t rows, size_t n) const;

  // One projection of a batch: rows of the weight at `wt` against the activation rows `acts`
  // (`stride` bytes each), written BF16-rounded to y[t * rows + r].
  struct LinearItem {
    DeviceWeight wt;
    const Weight* W = nullptr;
    std::span<const uint8_t* const> acts;
    size_t stride = 0;
    float* y = nullptr;
    size_t rows = 0;
    size_t ldy = 0;     // floats from one token's outputs to the next's (0: rows)
    uint64_t row0 = 0;  // the weight's first row
    bool round = true;  // BF16-rounded outputs
    uint64_t tensor = 0;  // the live tensor holding y (LiveTensors::holder); 0: none, never deferred
    const float* y_row = nullptr;  // with a tensor: the start of y's first row in it (y's columns from y - y_row)
    // Set: the device quantizes the f32 rows x (x_stride floats apart; acts empty) into rows of
    // `stride` bytes (W->act(), padded to whole words) in the same submission.
    const float* x = nullptr;
    size_t x_stride = 0, n_x = 0;
    // Set with x (a routed expert's down projection): x's rows are first replaced by h = swiglu(x,
    // u, glu_limit, glu_w[t]), u the same rows at glu_u (x_stride apart), on the device when both
    // are columns of one region of the same submission, else on the host before x is staged.
    float* glu_g = nullptr;  // == x
    const float* glu_u = nullptr;
    const float* glu_w = nullptr;
    float glu_limit = 0;
    // Set instead of acts (a float weight): its f32 rows x_stride apart, read where a region of the
    // submission holds them (chained), else staged from the host when the item is placed.
    const float* xf = nullptr;
    size_t y_step() const { return ldy ? ldy : rows; }
    size_t tokens() const { return x || xf ? n_x : acts.size(); }
  };

  // A linear's weight has a copy on the device, and one token's activations and outputs fit the
  // staging buffers.
  bool linear_fits(const Weight& W, CMat x, Mat y) const;

  // The items in as few submissions as the staging buffers and descriptor sets allow, each
  // submission's activations and outputs side by side (binding offsets aligned); an item reading
  // the same rows as the one before it (an expert's up after its gate) stages them once. An item
  // too large to share a submission runs alone in token groups (device_linear); mu_ held.
  // `meanwhile` (host work) runs once, while the first submission is on the device. The first
  // submission carries the deferred batch (deferred_) ahead of the items, and an item whose input
  // its linears write reads it on the device (chained, below); with `defer` the last submission
  // becomes the deferred batch instead of being submitted (no `meanwhile`, and every item's output
  // in a live tensor: LinearItem::tensor). Returns the device's seconds (finish_submit).
  double device_linears(std::span<const LinearItem> items, std::function<void()> meanwhile = {},
                        bool defer = false) const;

  // Records rms_norm on x into the deferred batch (mu_ held): false when x is not the columns of
  // a region the batch's linears write whole, or the batch has no room; the weights go into the
  // activation buffer beside its rows.
  bool defer_rms_norm(Mat x, const float* w, float eps) const;

  // --- Deferred submissions ------------------------------------------------------------------------
  // A batch of linears whose every output lies in a live tensor of this backend (the forward
  // pass's workspace) is recorded but not submitted: its activations wait in the staging buffer
  // and its dispatches in deferred_, and the next submission carries them — a later batch of
  // linears, or the first group of routed experts (the shared expert's down projection rides
  // with the routed experts' gate and up). Any other op, and sync(), submits it first (settle),
  // because the host may read what it writes; so may a linear reading a deferred output, unless it
  // is chained: its rows are the columns of one region (below) that the batch's linears write, in
  // a format the device quantizes, so its quantizer reads them on the device in the same
  // submission, a stage after them. A tensor freed before the batch ran (an eval abandoned by an
  // error) is not written (live_tensors.h). A deferred batch that fails reports the error from
  // the op that submitted it, before that op has changed anything.
  //
  // Outputs into a tensor are laid out in the output buffer as the tensor's rows (a Region: n
  // rows of the tensor's stride from y_row), so the linears writing different columns of the same
  // rows (the attention output's groups) leave the rows whole for the linear that reads them.
  struct Region {
    uint64_t tensor = 0;          // LiveTensors id
    const float* row = nullptr;   // the first row's start in the tensor
    size_t n = 0, stride = 0;     // rows, floats a row
    VkDeviceSize off = 0;         // in the output buffer
    uint32_t stage = 0;           // the latest stage writing it
    uint32_t read = 0;            // the latest stage reading it (an op rewriting it in place comes after)
    std::vector<std::pair<size_t, size_t>> cols;  // (first column, count) written
    // True when any column of [c0, c0 + w) is written.
    bool touches(size_t c0, size_t w) const {
      return std::any_of(cols.begin(), cols.end(), [&](const auto& c) { return c.first < c0 + w && c0 < c.first + c.second; });
    }
    // True when every column of [c0, c0 + w) is written.
    bool covers(size_t c0, size_t w) const {
      std::vector<std::pair<size_t, size_t>> v = cols;
      std::sort(v.begin(), v.end());
      size_t at = c0;
      for (const auto& [c, cw] : v) {
        if (c > at) break;
        at = std::max(at, c + cw);
      }
      return at >= c0 + w;
    }
  };
  struct CopyOut {  // one item's outputs: from the output buffer at `off` to y, `step` floats a token
    VkDeviceSize off = 0;
    float* y = nullptr;
    size_t n = 0, rows = 0, step = 0;
    size_t src_step = 0;  // floats from one token's outputs to the next's in the output buffer
    uint64_t tensor = 0;  // the live tensor holding y (LiveTensors); 0: not deferred, always written
    // True when the rows m (n of `width` floats, `stride` apart) share a float with y's.
    bool overlaps(CMat m) const {
      const float* m_end = m.p + (m.n - 1) * m.stride + m.width;
      if (!(m.p < y + (n - 1) * step + rows && y < m_end)) return false;
      if (m.stride != step || step == 0) return true;  // spans meet: assume they share a float
      // Same stride: views of one tensor's rows. Row and column offset of m from y.
      const ptrdiff_t d = m.p - y, s = (ptrdiff_t)step;
      const ptrdiff_t r = d >= 0 ? d / s : -((-d + s - 1) / s), c = d - r * s;  // 0 <= c < s
      const bool rows_meet = r < (ptrdiff_t)n && r + (ptrdiff_t)m.n > 0;
      // m's columns [c, c + width) (maybe running into the next row: also [c - s, ...) of it).
      auto cols_meet = [&](ptrdiff_t c0) { return c0 < (ptrdiff_t)rows && c0 + (ptrdiff_t)m.width > 0; };
      return (rows_meet && cols_meet(c)) ||
             (c + (ptrdiff_t)m.width > s && r + 1 < (ptrdiff_t)n && r + 1 + (ptrdiff_t)m.n > 0 && cols_meet(c - s));
    }
  };
  // A store_bf16 or store_fp4 waiting for the batch: n rows of `width` floats from float `place`
  // of the output buffer (src_stride floats apart, in region `region`) to dst, as BF16 values
  // dst_stride apart, or (fp4) packed rows back to back on `grid`.
  struct HostStore {
    uint16_t* dst = nullptr;
    size_t n = 0, width = 0, dst_stride = 0, src_stride = 0;
    uint32_t place = 0;
    int region = -1;
    uint8_t* fp4 = nullptr;  // set for store_fp4 (dst unused)
    Fp4Grid grid = Fp4Grid::Nvfp4;
    // True when it writes any of the `bytes` bytes from p.
    bool writes(const void* p, size_t bytes) const {
      const uint8_t* a = fp4 ? fp4 : reinterpret_cast<const uint8_t*>(dst);
      const size_t span = fp4 ? n * fp4_row_bytes(grid, width) : ((n - 1) * dst_stride + width) * sizeof(uint16_t);
      const uint8_t* b = static_cast<const uint8_t*>(p);
      return b < a + span && a < b + bytes;
    }
  };
  struct Deferred {
    std::vector<Dispatch> ds;
    std::vector<HostStore> stores;  // done after the copies out (drop_pending forgets them with the rest)
    bool reads_experts = false;     // a routed group's dispatches read expert slots or a source's bytes
    std::vector<Tensor> keep;  // this backend's scratch tensors the batch's regions name (shared_ffn)
    std::vector<CopyOut> outs;
    // A vector, not a deque (which allocates even empty, and a Deferred is made per call): a
    // pointer into it is used only before the next region is added.
    std::vector<Region> regions;
    VkDeviceSize act_used = 0, out_used = 0;
    // The region an item's output goes into with others (same tensor, rows and stride), if any:
    // the latest such, unless it has the item's columns already (rows written again: a new one).
    Region* region_of(const LinearItem& it) {
      for (auto r = regions.rbegin(); r != regions.rend(); ++r)
        if (r->tensor == it.tensor && r->row == it.y_row && r->n == it.tokens() && r->stride == it.y_step())
          return r->touches((size_t)(it.y - it.y_row), it.rows) ? nullptr : &*r;
      return nullptr;
    }
    // The region whose written columns hold x whole (a chained input: its rows or some of them
    // in order, x.p - row the offset of x's first value), if any.
    // The latest such region: ops may write rows again into a new region (output_region, a
    // linear's rows written again). A later region that wrote some of x but not all of it means
    // no region holds x as it is now.
    const Region* source_of(CMat x) const {
      if (x.n == 0) return nullptr;
      const float* const x_end = x.p + (x.n - 1) * x.stride + x.width;
      for (auto it = regions.rbegin(); it != regions.rend(); ++it) {
        const Region& r = *it;
        if (!r.row || x_end <= r.row || r.row + r.n * r.stride <= x.p) continue;  // apart
        if (x.p >= r.row && (x.stride == r.stride || x.n == 1)) {
          const size_t off = (size_t)(x.p - r.row), row = off / r.stride, c0 = off % r.stride;
          if (row + x.n <= r.n && c0 + x.width <= r.stride && r.covers(c0, x.width)) return &r;
        }
        if (x.stride != r.stride && x.n > 1) return nullptr;  // they meet, in a way not worked out here
        // Same rows apart: x's columns within a row of r.
        const ptrdiff_t d = x.p - r.row, st = (ptrdiff_t)r.stride;
        const size_t c0 = (size_t)(((d % st) + st) % st);
        if (r.touches(c0, x.width) || (c0 + x.width > r.stride && r.touches(0, c0 + x.width - r.stride))) return nullptr;
      }
      return nullptr;
    }
  };

  // Submits a batch and copies its outputs out (mu_ held).
  double submit_batch(const Deferred& sub, const std::function<void()>& meanwhile) const;

  // Submits the deferred batch, if any (mu_ held).
  void flush_deferred() const;

  // y lies in a live tensor and the batch writes its floats only within y's columns of its rows.
  bool rewritten_whole(CMat y) const;
  // True when batch `sub` writes any of a's or b's floats.
  static bool sub_writes(const Deferred& sub, CMat a, CMat b) {
    return std::any_of(sub.outs.begin(), sub.outs.end(), [&](const CopyOut& c) { return c.overlaps(a) || c.overlaps(b); });
  }
  // An item's SwiGLU on the host (LinearItem::glu_g).
  static void host_glu(const LinearItem& it) {
    swiglu_rows(it.glu_g, it.x_stride, it.glu_u, it.x_stride, it.n_x, it.W->cols, it.glu_limit, it.glu_w);
  }

  // True when the deferred batch writes any of m's floats (mu_ held).
  bool deferred_writes(CMat m) const;

  // Records the SwiGLU h = swiglu(g, u) into g in place (mu_ held), like defer_rms_norm: false
  // when g and u are not columns of one region the batch's linears write whole, or the batch has
  // no room. Weight 1 per row (the shared expert).
  bool defer_swiglu(Mat g, CMat u, float limit) const;
  // The swiglu dispatch on g and u, columns of region r's rows, a stage after r's writers.
  Dispatch swiglu_dispatch(const Region& r, CMat g, CMat u, float limit) const;

  // --- Row ops in the deferred batch ---------------------------------------------------------------
  // hc_pre, hc_post and hc_mix are recorded into the deferred batch like rms_norm and the SwiGLU, so
  // the hyper-connection steps between two sublayers ride in one submission with the linears around
  // them (the attention's grouped output before, the FFN's router after). Each reads an input where
  // the batch holds it (a region, a stage after its writers) or, for rows the host has, staged now
  // into the activation buffer; it writes a new region laid out as its output tensor's rows, copied
  // out when the batch has run. An op whose output is in no live tensor, whose input the batch
  // writes only in part, or for which the buffers or the descriptor sets have no room, runs on the
  // host after the batch instead (the callers above).
  static constexpr uint32_t kInOut = 0x80000000u;  // rows_io.glsl: the place is in the output buffer
  static constexpr uint32_t kKept = 0x40000000u;   // attention.comp: the row is in that slot of the kept rows
  static constexpr uint32_t kPacked = 0x20000000u;  // and kept as it is cached, packed on the NVFP4 grid
  // A row an attention reads, as the kept rows name it (DeviceRows): its bytes in host memory and
  // how they are read (kRawRow: BF16 values; 1 + grid: packed on that FP4 grid); `packed`: its
  // slot holds those bytes (the shader unpacks them), else its BF16 values.
  struct KeptRow {
    const uint8_t* p = nullptr;
    uint32_t bytes = 0, tag = 0;
    bool packed = false;
  };
  static constexpr uint32_t kRawRow = 0;
  struct Operand {
    uint32_t at = 0, stride = 0;  // rows_io.glsl's place of the first row, and floats a row
    uint32_t stage = 0;           // the stage that last wrote it (0: staged)
    int region = -1;              // its deferred_.regions index; -1: staged
  };
  // Where a row op reads m (mu_ held): false when the batch writes some of m but no region holds
  // it whole, or the activation buffer has no room.
  bool operand(CMat m, Operand& o) const;
  // Words (a row op's lists) into the activation buffer after the batch's other inputs (mu_
  // held): the word index of the first, UINT32_MAX when there is no room.
  uint32_t stage_words(std::span<const uint32_t> w) const;
  // Rows the same way: the float index of the first.
  uint32_t stage_rows(CMat m) const;
  // A new region for the rows y of a live tensor, copied out to y once the batch has run (mu_
  // held): its index, or -1 when y is in none, the output buffer has no room, or the batch writes
  // some of y in another way than whole columns within y's of the same rows (xin, which each
  // sublayer's collapse writes again: the earlier copy-out comes first and the new region is the
  // one later readers find, source_of; earlier readers keep reading the old one).
  int output_region(Mat y) const;
  // The region an op rewriting x in place writes: the one holding x whole, unless a store waiting
  // for the batch reads it (it would read the rewritten values).
  Region* in_place_region(CMat x) const;
  bool stored_from(int region) const {
    return std::any_of(deferred_.stores.begin(), deferred_.stores.end(), [&](const HostStore& h) { return h.region == region; });
  }
  // True when every copy-out of the batch into y's floats lies within y's columns of the same rows
  // of live tensor `held`: y written again whole leaves no older value in it (its copy-out comes
  // later).
  bool rewrites_whole(CMat y, const LiveTensors::Held& held) const;
  // The place of y's first float in its region r (in the output buffer).
  static uint32_t out_place(const Region& r, CMat y) { return (uint32_t)(r.off / sizeof(float) + (size_t)(y.p - r.row)); }
  void mark_read(const Operand& o, uint32_t stage) const;
  // What a row op touches, so that its bindings span only that (rows_io.glsl): its staged
  // operands, from `staged` (deferred_.act_used when its recording began) to the batch's end; the
  // floats [in_lo, in_hi) of the output buffer it reads; the bytes it writes there.
  struct RowSpans {
    VkDeviceSize staged = 0;
    uint64_t in_lo = UINT64_MAX, in_hi = 0;
    VkDeviceSize out_off = 0, out_bytes = 0;
  };
  RowSpans row_spans() const { return RowSpans{deferred_.act_used}; }
  static void reads_floats(RowSpans& s, uint64_t lo, uint64_t hi);
  // The floats [first, end) of the output buffer that region r spans.
  static std::pair<uint64_t, uint64_t> floats_of(const Region& r) {
    return {r.off / sizeof(float), r.off / sizeof(float) + (uint64_t)r.n * r.stride};
  }
  void reads_region(RowSpans& s, int region) const;
  void reads(RowSpans& s, const Operand& o) const { reads_region(s, o.region); }
  // A place in the output buffer (kInOut set): the region holding it; false when none does (the
  // op runs on the host).
  bool reads_place(RowSpans& s, uint32_t place) const;
  static void writes(RowSpans& s, const Region& r);

  // A row op's dispatch: binding 0 exp_f32's constants (hc_mix's), 1, 2 and 4 what it touches.
  Dispatch row_op(VkPipeline pipe, const std::array<uint32_t, sizeof(Push) / sizeof(uint32_t)>& push, uint32_t gx,
                  uint32_t gy, uint32_t stage, const RowSpans& sp) const;

  // A row op writing y into a new region a stage after what its operands wait for (mu_ held): its
  // push constants are `head` then y's place and row stride; false when y gets no region.
  bool defer_row_op(VkPipeline pipe, std::initializer_list<const Operand*> ops, Mat y, std::initializer_list<uint32_t> head,
                    uint32_t gx, RowSpans sp) const;

  // y = hc_pre(X, pre) (mu_ held); two descriptor sets are kept free for hc_pre_norm's norm.
  bool defer_hc_pre(CMat X, CMat pre, uint32_t hc, Mat y) const;

  // Y = hc_post(F, X, mixes) (mu_ held).
  bool defer_hc_post(CMat F, CMat X, CMat mixes, uint32_t hc, Mat Y) const;

  // mixes = hc_mix(X) (mu_ held): the projections by the linear_float shader (the CPU's linear,
  // unrounded) into rows of no tensor, then hc_mix.comp a stage after. The projection weight must
  // be a float format on the device (the published model's is F16).
  bool defer_hc_mix(const Weight& fn, const float* base, const float* scale, HcParams p, CMat X, Mat mixes) const;

  // X = engram_gate(X, kv) (mu_ held): in place on the region holding X, else X staged and a new
  // region for it; the norms' weights, the mask and the scalars staged beside.
  // With `gates` (tests: gpu_engram_gates) the gates alone go there, [n][hc], and X is left as it is.
  bool defer_engram_gate(Mat X, uint32_t hc, CMat kv, const float* q_norm, const float* k_norm, float eps,
                         const uint8_t* masked, Mat gates = {}) const;

  // out = add_round(a, b) (mu_ held), when the batch holds a or b: the other staged, a new region.
  bool defer_add_round(CMat a, CMat b, Mat out) const;

  // compress_pool (mu_ held): the groups the chunk completes pooled into a new region of latents'
  // rows, each group's members listed for the shader (a row of k and g, or the carry's slot for a
  // member before p0). The carry's new slots are rows of k and g: copied out with the batch where
  // the batch writes them, else now (the shader reads the old carry staged).
  // With `unrounded` (tests: gpu_compress_pool_unrounded) the latents are the pooled f32 values.
  bool defer_compress_pool(CMat k, CMat g, uint32_t ratio, uint32_t p0, float* carry_k, float* carry_s, Mat latents,
                           std::vector<uint32_t>& groups, bool unrounded = false) const;

  // fake_quant on x in place (mu_ held): x must be columns of a region the batch writes whole, in
  // whole blocks of its grid.
  bool defer_fake_quant(Mat x, FakeQuant kind) const;

  // RoPE on x in place (mu_ held): x must be columns of a region the batch writes whole; the
  // angles' cos and sin per token go in the activation buffer (rope_angles, the CPU's floats).
  bool defer_rope(Mat x, uint32_t head_dim, RopeTable t, std::span<const uint64_t> pos, bool inverse) const;

  // sparse_attention of one or more sequences' chunks as one op (mu_ held): their queries and
  // outputs must be consecutive rows (a batch's parts, in order) with the same heads and sinks.
  // The rows per query, as CpuBackend::sparse_attention lists them: the window's ascending, then
  // the selected compressed rows below the query's visible count, ascending, these unpacked to
  // BF16 (the cached values) once per chunk.
  bool defer_sparse_attention(std::span<const SparseAttention> as, std::span<const Mat> outs) const;

  // index_select with the scores on the device (mu_ held): the queries in groups whose staged
  // rows and scores fit the staging buffers, each recorded into the deferred batch
  // (defer_index_scores) and submitted with it; where the batch has no room or a pending store
  // writes keys, it is submitted first and the group runs alone. The candidate blocks and the
  // top-k are the CPU's, from the scores. False (nothing done) where the device does not score:
  // no shader, GpuIndexer says not here, a head_dim it cannot hold, keys that do not fit.
  // With `raw` (tests: gpu_index_scores) the scores are also kept there, [n][n_vis of the last
  // query], a query's keys past its own n_vis 0.
  bool device_index_select(const IndexSelect& a, std::vector<std::vector<uint8_t>>& cand,
                           std::vector<std::vector<int32_t>>& sel, std::vector<float>* raw = nullptr) const;

  // Records index_scores.comp for queries [g0, g0 + gn) into the deferred batch (mu_ held): the
  // queries and head weights read where the batch writes them or staged, the keys staged packed,
  // or where a pending store_fp4 will pack them from rows the batch holds, read there (the
  // shader puts them on the grid as the store will); the scores into rows of no tensor at `at`
  // of the output buffer, [gn][n_vis_max], read back with the batch. False when something does
  // not fit (what it staged meanwhile is left unused).
  bool defer_index_scores(const IndexSelect& a, const std::vector<std::vector<uint8_t>>& cand, uint32_t g0, uint32_t gn,
                          uint32_t n_vis_max, VkDeviceSize& at) const;

  // The store_bf16 of the deferred batch that will write row r (its start), if any.
  const HostStore* pending_store(const uint16_t* r) const;

  // Row k of an attention, in a slot of the rows the device keeps (mu_ held): true with its
  // slot, its BF16 values (`fill`, else a copy of rows[k]; a packed row its bytes) staged for a
  // copy into the slot at the head of the next submission when the slot does not hold them yet. False where the device
  // keeps no rows (or none of this width: the first attention sets it) or the batch being
  // recorded reads every slot already: the row is staged with the batch.
  bool keep_row(const KeptRow& r, uint32_t hd, uint32_t k, const std::function<void(uint32_t, uint16_t*)>& fill,
                std::span<const uint16_t* const> rows, uint32_t& slot) const;

  // Attention of the queries q (heads x head_dim each) over the rows list(i) names per query i
  // (mu_ held): an entry k < kInOut is rows[k] (`fill` writes its BF16 values; by default a copy
  // of rows[k]); an entry kInOut | place is a row of f32 values (BF16-exact) at that place of the
  // output buffer, written by stage `after` at the latest. q is read where the batch holds it or
  // staged, o is a new region. Where the device keeps rows (--gpu-kv) and `kept` names them, a
  // row is read from its slot (kKept | slot in the lists the shader reads), filled through the
  // staging buffer when it is not there yet; the others are staged into the activation buffer
  // with the lists.
  template <class List>
  bool defer_attention(CMat q, uint32_t heads, uint32_t hd, const float* sinks, Mat o,
                       std::span<const uint16_t* const> rows, List&& list, uint32_t after,
                       const std::function<void(uint32_t, uint16_t*)>& fill = {},
                       std::span<const KeptRow> kept = {}) const;

  // --- Routed experts in place ---------------------------------------------------------------------
  // A mapped chunk of a source's memory (held_chunk.h): [lo, hi) imported as `b`, lo at `at` in it;
  // b.buf null: the driver refused it (not asked again).
  struct ExpertChunk {
    Buffer b;
    VkDeviceSize at = 0;
  };

  // Where the dispatches read expert `w`'s three slices in place (mu_ held): each slice's chunk
  // of src's held memory, mapped at first use. False (the CPU runs the expert) when a slice lies
  // outside the memory the source states, is not word-aligned, or its chunk was refused.
  bool view_in_place(const ExpertSource& src, const ExpertWeights& w, const Weight* const parts[3],
                     const VkPipeline pipes[3], const uint32_t kinds[3], DeviceWeight out[3]) const;

  void release_expert_chunks() const;

  // The slots' geometry from the first layer's experts (mu_ held): each part aligned for a
  // binding offset, as many slots as GpuOptions::expert_slots asks and the device budget left
  // after the dense weights holds (GpuStats::expert_slots says how many), in slabs of at most
  // kSlabBytes so no allocation is huge. Nothing fits: slot_stride_ stays 0 and experts run on
  // the CPU.
  void make_slots(const uint64_t part[3]) const;

  using SlotKey = std::tuple<uint64_t, uint32_t, uint32_t>;  // source, layer, expert

  ExpertSlot* find_slot(uint64_t source, uint32_t layer, uint32_t expert) const;
  // A slot is found by the expert it holds (find_slot) from the time it is named until it is
  // un-named: emptied, or about to be refilled.
  void name_slot(size_t i, uint64_t source, uint32_t layer, uint32_t expert) const;
  void unname_slot(ExpertSlot& sl) const;

  // The slots in the order of their last use, a list through ExpertSlot::older/newer: a use
  // moves the slot to the newest end, so the oldest end is the least recently used slot (an
  // empty one first), and a placement costs no scan of the slots (a card holds thousands).
  void link_newest(uint32_t i) const;
  void unlink(uint32_t i) const;
  void slot_used(ExpertSlot& sl) const;

  // The least recently used slot among those last used before `floor` (an empty one first);
  // slots_.size() when there is none.
  size_t lru_slot(uint64_t floor = UINT64_MAX) const {
    return lru_oldest_ != UINT32_MAX && slots_[lru_oldest_].last_use < floor ? lru_oldest_ : slots_.size();
  }

  // Copies an expert's three slices into the least recently used slot (an empty one first).
  // Its bytes are counted in the totals and in its layer's `ls`.
  ExpertSlot* place(uint64_t source, uint32_t layer, uint32_t expert, const ExpertWeights& ew, ExpertTensors t,
                    GpuLayerStats& ls) const;

  // Staged uploads into unmapped slots (a discrete card's VRAM): the bytes go into the staging
  // buffer now and the copy is recorded at the head of the next submission (the group's gate and
  // up dispatches, behind a barrier), so the misses of a group cost no round trip of their own.
  // The slot is named now; a submission that fails un-names it (settle_uploads), so a retry
  // never finds a slot whose bytes did not arrive. Not with --cpu-experts, whose cost model
  // times each upload on its own. A part larger than the staging buffer goes up at once, in
  // chunks. Returns true when the part was staged.
  bool stage_or_upload(Buffer& b, VkDeviceSize at, const uint8_t* src, uint64_t bytes) const;

  // `bytes` written by `fill` into the staging buffer (submitted first when it is full) and their
  // copy to `at` in `dst` recorded at the head of the next submission. Each staged part starts on
  // a word, so a `fill` may write it as 16- or 32-bit values.
  void stage_copy(VkBuffer dst, VkDeviceSize at, VkDeviceSize bytes, const std::function<void(uint8_t*)>& fill) const;

  // The staged copies in a submission of their own (the staging buffer is full, or it is needed).
  void flush_uploads() const {
    submit([] {}, "uploading experts");
  }

  // One global memory barrier in the command buffer being recorded: `src` writes made
  // available to `dst` reads, from the stages of the one to those of the other.
  void barrier(VkAccessFlags src, VkAccessFlags dst, VkPipelineStageFlags src_stages, VkPipelineStageFlags dst_stages) const;

  // A command buffer reset and recording again, for one submission.
  static void begin_recording(VkCommandBuffer cb);

  // Copies out of `from`, one command for each run of copies into the same buffer (an expert's
  // three parts, side by side in its slot).
  static void record_copies(VkCommandBuffer cb, VkBuffer from, std::span<const PendingCopy> copies);

  // Records the staged copies and a barrier before the shaders read them (begin_submit).
  void record_pending_uploads() const;

  // The read-back copies after the dispatches that wrote their rows, overlapping ranges merged
  // (one copy's regions must not overlap).
  void record_read_back(std::vector<VkBufferCopy>& rb) const;

  // After the submission that carried the staged copies: done (ok), or un-name their slots.
  void settle_uploads(bool ok) const;

  // The hint-started copies' submission (prefetch_experts): true when none is in flight (it
  // finished). A failed one un-names its slots and throws.
  bool settle_hint() const;

  void unname_hinted() const;

  // A submission being recorded reads or writes slot sl: it waits for the hint copy into it.
  void touch_slot(const ExpertSlot& sl) const {
    if (sl.ready > waited_value_) wait_value_ = std::max(wait_value_, sl.ready);
  }

  DeviceWeight slot_part(const ExpertSlot& sl, int i, VkPipeline pipe, uint32_t kind) const;

  // Up to kSets dispatches, independent of each other (none reads what another writes), in one
  // submission, each with its own descriptor set; mu_ held. `meanwhile` runs on the host while
  // the device works (a throw waits for the device before it leaves). Returns the device's
  // seconds (finish_submit).
  double dispatch(std::span<const Dispatch> ds, const std::function<void()>& meanwhile = {}) const;

  // A binding's range: `bytes` from `off` of b (0: to its end). A range past the end is a slip in
  // the dispatch's making, refused before the device could read outside the buffer.
  static VkDeviceSize binding_range(const Buffer& b, VkDeviceSize off, VkDeviceSize bytes);

  // Records `cmds` into the command buffer, submits it and waits (mu_ held). The barrier at the
  // end makes transfers and shader writes visible to the host and to the next submission.
  template <class Record>
  void submit(Record&& cmds, const char* what) const {
    begin_submit(cmds, what);
    (void)finish_submit(what, false);
  }

  template <class Record>
  void begin_submit(Record&& cmds, const char* what) const {
    try {
      record_and_submit(cmds, what);
    } catch (...) {
      settle_uploads(false);
      throw;
    }
  }

  template <class Record>
  void record_and_submit(Record&& cmds, const char* what) const {
    begin_recording(cmd_);
    if (timestamps_) {
      vkCmdResetQueryPool(cmd_, timestamps_, 0, 2);
      vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, timestamps_, 0);
    }
    std::vector<VkBufferCopy> back = std::exchange(readback_, {});
    // The hint-started copies before anything in this or a later submission reads or writes
    // their slots.
    const bool after_hint = hint_barrier_;
    if (after_hint)
      barrier(VK_ACCESS_TRANSFER_WRITE_BIT, VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
              VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT);
    record_pending_uploads();
    cmds();
    record_read_back(back);
    barrier(VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT, VK_ACCESS_HOST_READ_BIT | VK_ACCESS_SHADER_READ_BIT,
            VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
            VK_PIPELINE_STAGE_HOST_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT);
    if (timestamps_) vkCmdWriteTimestamp(cmd_, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, timestamps_, 1);
    check(vkEndCommandBuffer(cmd_), "recording commands");
    VkSubmitInfo si{};
    si.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd_;
    // The hint copies into slots this submission touches (touch_slot), waited for on the device
    // before its copies and dispatches.
    const uint64_t wait = wait_value_ > waited_value_ ? wait_value_ : 0;
    const VkPipelineStageFlags wait_stages = VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT;
    VkTimelineSemaphoreSubmitInfo ts{};
    if (wait) {
      ts.sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO;
      ts.waitSemaphoreValueCount = 1;
      ts.pWaitSemaphoreValues = &wait;
      si.pNext = &ts;
      si.waitSemaphoreCount = 1;
      si.pWaitSemaphores = &timeline_;
      si.pWaitDstStageMask = &wait_stages;
    }
    if (fault_before_ && fault_before_(what)) throw lost(what, VK_ERROR_DEVICE_LOST);
    check(vkQueueSubmit(queue_, 1, &si, fence_), what);
    if (after_hint) hint_barrier_ = false;
    if (wait) {
      waited_value_ = wait;
      ++st_.hint_waits;
    }
    ++st_.submissions;
    submitted_at_ = std::chrono::steady_clock::now();
  }

  Error lost(const char* what, VkResult r) const;

  // Waits for the submission in flight and readies the fence for the next one.
  VkResult wait_fence() const;

  // Sums of device seconds, where -1 (a submission that could not be timed) spoils the sum.
  static double add_seconds(double a, double b) { return a < 0 || b < 0 ? -1 : a + b; }

  // Waits for the submission begin_submit made; returns the device's seconds by its timestamps,
  // else by the wall clock, or -1 when `overlapped` (the host worked meanwhile, so the wall time
  // says nothing of the device's).
  double finish_submit(const char* what, bool overlapped) const;

  void destroy();

  std::function<bool(const char*)> fault_, fault_before_, fault_shader_;
  VkPhysicalDevice phys_ = VK_NULL_HANDLE;
  GpuDevice info_;
  VkPhysicalDeviceMemoryProperties mem_{};
  uint32_t family_ = UINT32_MAX, local_type_ = UINT32_MAX;
  bool force_staging_ = false;
  uint64_t staging_bytes_ = kGpuStagingBytes;
  uint64_t io_limit_ = kGpuStagingBytes;  // the activation and output buffers' size, at most
  uint64_t max_range_ = 0, budget_ = 0;
  bool float64_ = false;  // shaderFloat64: the float formats' shader can run
  bool subgroup_ = false;  // the quantized linears run their subgroup build (GpuDevice::subgroup_linears)
  bool int_dot_ = false;   // the quantized linears run their integer dot product builds (GpuDevice::int_dot)
  uint32_t max_groups_x_ = 65535;  // maxComputeWorkGroupCount[0]
  bool gemm_ = true;               // GpuOptions::gemm
  bool import_ = false;   // weights are imported host pages, never copies (import_pages)
  VkDeviceSize import_align_ = 4096;  // minImportedHostPointerAlignment
  PFN_vkGetMemoryHostPointerPropertiesEXT host_ptr_props_ = nullptr;
  VkDevice dev_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  VkCommandPool cmd_pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  // prefetch_experts' own submission: its command buffer, fence and staging buffer, the slots it
  // filled while in flight, and whether the next submission still owes it the barrier.
  // Two command buffers: this layer's copies and the next layer's guesses, each signalling its
  // own timeline value, so this layer's group waits only for its own. The queue and pool are
  // the transfer family's where the device has one (else the compute queue's).
  VkCommandBuffer hint_cmd_[2] = {VK_NULL_HANDLE, VK_NULL_HANDLE};
  VkFence hint_fence_ = VK_NULL_HANDLE;
  VkQueue xfer_queue_ = VK_NULL_HANDLE;
  VkCommandPool xfer_pool_ = VK_NULL_HANDLE;
  uint32_t xfer_family_ = UINT32_MAX;
  bool timeline_ok_ = false;
  VkSemaphore timeline_ = VK_NULL_HANDLE;
  // The last value the hint submissions signalled, the most a submission being recorded must
  // wait for (the slots it touches), and the most the compute queue has waited for.
  mutable uint64_t timeline_value_ = 0, wait_value_ = 0, waited_value_ = 0;
  mutable Buffer hint_stage_;
  mutable bool hint_in_flight_ = false, hint_barrier_ = false;
  mutable std::vector<size_t> hint_slots_;
  VkQueryPool timestamps_ = VK_NULL_HANDLE;  // the start and end of each submission
  uint32_t ts_bits_ = 0;
  float ts_period_ns_ = 0;
  mutable std::chrono::steady_clock::time_point submitted_at_;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout layout_ = VK_NULL_HANDLE;
  VkDescriptorPool desc_pool_ = VK_NULL_HANDLE;
  VkDescriptorSet sets_[kSets] = {};
  VkPipeline quant_[kQuantShaderCount] = {};  // kQuantShaders' pipelines, in its order
  VkPipeline quant_tiled_[kQuantShaderCount] = {};  // their token-tile builds (subgroup_ only)
  VkPipeline quant_mm_[kQuantShaderCount] = {};     // their GEMM builds (gemm_, where the tile fits)
  VkPipeline float_ = VK_NULL_HANDLE;
  VkPipeline float_mm_ = VK_NULL_HANDLE;  // linear_float's GEMM build
  VkPipeline quantize_q8_0_ = VK_NULL_HANDLE, quantize_q8_k_ = VK_NULL_HANDLE;
  VkPipeline rms_norm_ = VK_NULL_HANDLE;  // on rows deferred linears write (rms_norm())
  VkPipeline swiglu_ = VK_NULL_HANDLE;    // on the gate and up rows deferred linears write (shared_ffn)
  VkPipeline exp_ = VK_NULL_HANDLE;       // exp_f32 alone (gpu_exp, tests)
  // The hyper-connection ops on rows a deferred batch holds or stages (hc_pre_norm, hc_post, hc_mix).
  VkPipeline hc_pre_ = VK_NULL_HANDLE, hc_post_ = VK_NULL_HANDLE, hc_mix_ = VK_NULL_HANDLE;
  VkPipeline rope_ = VK_NULL_HANDLE;       // on rows the deferred batch holds, in place
  VkPipeline engram_gate_ = VK_NULL_HANDLE;  // the Engram gate on the streams, in the deferred batch
  VkPipeline compress_ = VK_NULL_HANDLE;     // the compressor's pooling, in the deferred batch
  VkPipeline add_round_ = VK_NULL_HANDLE;    // add_round where the batch writes an addend
  VkPipeline routed_sum_ = VK_NULL_HANDLE;   // the routed experts' terms added in triple order, in the batch
  VkPipeline fake_quant_ = VK_NULL_HANDLE;   // the fake-quant grids on rows the deferred batch holds, in place
  VkPipeline attention_ = VK_NULL_HANDLE;  // sparse_attention and attend_rows over rows staged with the batch
  VkPipeline index_scores_ = VK_NULL_HANDLE;  // the indexer's scores (index_select)
  mutable GpuIndexer indexer_ = GpuIndexer::Auto;  // GpuOptions::indexer (index_scores_alone sets it for a call)
  bool host_quantize_ = false;  // GpuOptions::host_quantize
  Buffer tables_;
  // The attention rows the device keeps (--gpu-kv; none: kv_.buf null): kv_hd_ BF16 values a
  // slot, which rows they hold, and the slots whose copies wait in pending_.
  uint64_t kv_bytes_ = 0;
  mutable Buffer kv_;
  mutable uint32_t kv_hd_ = 0;
  mutable DeviceRows kv_rows_;
  mutable std::vector<uint32_t> kv_pending_;
  Buffer exp_consts_;  // exp_f32_constants(), binding 0 of swiglu

  // One queue, one command buffer and one descriptor set: linear() calls take turns (the forward
  // pass issues ops from one thread; the lock keeps a second engine on the backend safe).
  mutable std::mutex mu_;
  mutable std::deque<GpuWeight> weights_;  // stable addresses: Weight::device points here
  mutable Buffer act_, out_, stage_;
  // The output buffer is the card's memory (GpuStats::scratch_on_device): the host reads its rows
  // from back_, which the read-back copies recorded at the end of a submission fill.
  bool scratch_local_ = false;
  mutable Buffer back_;
  mutable std::vector<VkBufferCopy> readback_;  // for the next submission (read_back)
  mutable GpuStats st_;
  mutable Deferred deferred_;  // linears recorded, not yet submitted (device_linears' defer)
  const std::shared_ptr<LiveTensors> live_ = std::make_shared<LiveTensors>();  // tensor()'s

  // Routed-expert slots (make_slots): geometry, slabs, the slots and their index.
  uint64_t slots_wanted_ = 0;
  bool in_place_ = false;                  // GpuOptions::experts_in_place
  mutable bool in_place_released_ = false;  // release_imports: the sources' memory may be gone
  // In place: each source's held memory (fixed for its life), and the chunks of it mapped.
  mutable std::map<uint64_t, std::vector<ExpertSource::HeldMemory>> held_;
  mutable std::map<std::pair<uint64_t, const uint8_t*>, ExpertChunk> expert_chunks_;
  VkDeviceSize offset_align_ = 256;  // minStorageBufferOffsetAlignment
  mutable VkDeviceSize slot_stride_ = 0, part_off_[3] = {}, part_cap_[3] = {};
  mutable std::vector<Buffer> slabs_;
  mutable std::vector<ExpertSlot> slots_;
  // Staged expert uploads not yet submitted (stage_or_upload): their copies, the staging bytes
  // they use, and their slots.
  mutable std::vector<PendingCopy> pending_;
  mutable VkDeviceSize staged_used_ = 0;
  mutable std::vector<size_t> pending_slots_;
  mutable std::map<std::tuple<uint64_t, uint32_t, uint32_t>, size_t> slot_index_;
  mutable uint64_t use_clock_ = 0;
  mutable uint32_t lru_oldest_ = UINT32_MAX, lru_newest_ = UINT32_MAX;  // the ends of the slots' use order
  mutable ExpertSplit split_{0, false};  // --cpu-experts
};

}  // namespace sluice::vk_backend
#endif
