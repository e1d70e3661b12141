#include "backend/vulkan_backend.h"

#include "util/error.h"
#include "util/format_bytes.h"

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
#include "backend/vulkan_device.h"
#include "backend/vulkan_shaders.h"
#include "kernels/exp_f32.h"
#include "kernels/fp.h"
#include "kernels/iq_tables.h"
#include "kernels/numerics.h"
#endif

namespace sluice {

#if SLUICE_HAVE_VULKAN

namespace {

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
uint64_t gemm_shared_bytes(GgmlType t) {
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
  explicit VulkanBackend(const GpuOptions& o) : CpuBackend(resolved(o.threads)), fault_(o.fault), fault_before_(o.fault_before_submit), fault_shader_(o.fault_shader) {
    const std::vector<VkPhysicalDevice> devs = instance().devices();
    if (devs.empty()) throw Error("vulkan: the driver lists no device");
    if (o.device >= devs.size())
      throw Error("vulkan: no device " + std::to_string(o.device) + " (there " +
                  (devs.size() == 1 ? std::string("is 1 device: 0") : "are " + std::to_string(devs.size()) +
                                                                         " devices: 0.." + std::to_string(devs.size() - 1)) +
                  "; `sluice devices` lists them)");
    phys_ = devs[o.device];
    info_ = describe(phys_, o.device);
    max_range_ = info_.max_storage_buffer;

    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(phys_, &nq, nullptr);
    std::vector<VkQueueFamilyProperties> qf(nq);
    vkGetPhysicalDeviceQueueFamilyProperties(phys_, &nq, qf.data());
    family_ = UINT32_MAX;
    for (uint32_t i = 0; i < nq && family_ == UINT32_MAX; ++i)
      if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) family_ = i;
    if (family_ == UINT32_MAX) throw Error("vulkan: device " + info_.name + " has no compute queue");

    vkGetPhysicalDeviceMemoryProperties(phys_, &mem_);
    // The staging buffers need host-visible, coherent memory (make_buffer); a device without it
    // is refused here rather than at the first linear().
    const VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    bool have_host = false;
    for (uint32_t i = 0; i < mem_.memoryTypeCount; ++i) have_host |= (mem_.memoryTypes[i].propertyFlags & host) == host;
    if (!have_host) throw Error("vulkan: device " + info_.name + " has no host-visible coherent memory");
    for (uint32_t i = 0; i < mem_.memoryTypeCount && local_type_ == UINT32_MAX; ++i)
      if (mem_.memoryTypes[i].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) local_type_ = i;
    st_.weights_in_host_memory = info_.uma || local_type_ == UINT32_MAX;
    const GpuWeightBudget wb = gpu_weight_budget(info_.heaps, st_.weights_in_host_memory, o.weight_budget, info_.name);
    io_limit_ = std::min<uint64_t>(info_.max_storage_buffer, o.io_staging_bytes ? o.io_staging_bytes : kGpuStagingBytes);
    // A card with memory of its own keeps the batch's rows there (the shaders chain through them
    // many times a layer; PCIe or BAR reads of host memory would carry every one) and copies out
    // only what the host reads. Its bytes come first out of the device's budget.
    scratch_local_ = local_type_ != UINT32_MAX && (!st_.weights_in_host_memory || o.scratch_on_device);
    GpuDeviceNeeds needs;
    needs.scratch = scratch_local_ ? io_limit_ : 0;
    // The attention rows it keeps (--gpu-kv; auto: some where the batch's rows are the card's, so
    // a step's rows need not cross again) are the sequence state it holds.
    kv_bytes_ = o.kv_auto ? (scratch_local_ ? std::min<uint64_t>({kGpuKvAutoBytes, wb.bytes / 8, max_range_}) : 0) : o.kv_bytes;
    if (kv_bytes_ > max_range_)  // one binding holds them all
      throw Error("vulkan: --gpu-kv " + format_bytes(kv_bytes_) + " is more than device " + info_.name +
                  " binds at once (" + format_bytes(max_range_) + ")");
    needs.sequence_state = kv_bytes_;
    const GpuDevicePlan dp = gpu_device_plan(wb, st_.weights_in_host_memory, needs, info_.name);  // throws: no room
    budget_ = dp.for_weights;
    st_.device_total = wb.bytes;
    st_.device = info_.name;
    st_.device_budget = budget_;
    st_.budget_why = wb.why;
    st_.scratch_on_device = scratch_local_;
    st_.scratch_bytes = needs.scratch;
    st_.kv_bytes = kv_bytes_;
    force_staging_ = o.force_staging;
    host_quantize_ = o.host_quantize;
    slots_wanted_ = o.expert_slots;
    split_ = ExpertSplit(std::clamp(o.cpu_experts, 0.0, 1.0), o.cpu_experts_auto);
    indexer_ = o.indexer;
    st_.gemm_tile = kGemmTile;
    // Timestamps measure the device's part of the expert split (auto); without them the wall
    // time of a submission the CPU did not overlap stands in.
    ts_bits_ = qf[family_].timestampValidBits;
    {
      VkPhysicalDeviceProperties props;
      vkGetPhysicalDeviceProperties(phys_, &props);
      offset_align_ = props.limits.minStorageBufferOffsetAlignment;
      if (props.limits.maxPerStageDescriptorStorageBuffers < kBindings)
        throw Error("vulkan: device " + info_.name + " lets a shader bind " +
                    std::to_string(props.limits.maxPerStageDescriptorStorageBuffers) + " storage buffers; sluice's take " +
                    std::to_string(kBindings));
      ts_period_ns_ = props.limits.timestampPeriod;
      max_groups_x_ = props.limits.maxComputeWorkGroupCount[0];
      if (o.max_groups_x) max_groups_x_ = std::min(max_groups_x_, o.max_groups_x);
    }
    gemm_ = o.gemm;
    if (o.linears == GpuLinears::Subgroup && !info_.subgroup_linears)
      throw Error("vulkan: device " + info_.name + " cannot run the linears a subgroup per output (it needs ballots "
                  "and shuffles in compute shaders and subgroups of 8 to 64 lanes; it has " +
                  std::to_string(info_.subgroup_size) + "); use --gpu-linears plain or auto");
    subgroup_ = o.linears == GpuLinears::Subgroup || (o.linears == GpuLinears::Auto && auto_subgroup_linears(info_));
    st_.subgroup_linears = subgroup_;
    if (o.int_dot == GpuIntDot::On && !info_.int_dot)
      throw Error("vulkan: device " + info_.name + " has no integer dot product (VK_KHR_shader_integer_dot_product "
                  "with its shaderIntegerDotProduct feature); use --gpu-int-dot off or auto");
    int_dot_ = o.int_dot == GpuIntDot::On || (o.int_dot == GpuIntDot::Auto && auto_int_dot(info_));
    st_.int_dot = int_dot_;
    st_.subgroup_size = info_.subgroup_size;
    staging_bytes_ = o.staging_bytes ? o.staging_bytes : kGpuStagingBytes;

    const float prio = 1.0f;
    VkDeviceQueueCreateInfo qci[2]{};
    qci[0].sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO;
    qci[0].queueFamilyIndex = family_;
    qci[0].queueCount = 1;
    qci[0].pQueuePriorities = &prio;
    // Timeline semaphores (Vulkan 1.2): the hint-started copies signal one, and a submission
    // that touches a slot they fill waits for its value. With them, the copies go on a queue
    // family of their own where the device has one for transfers only (a discrete card's DMA
    // engines), so they overlap the compute queue's work; else on the compute queue.
    VkPhysicalDeviceTimelineSemaphoreFeatures tl{};
    tl.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES;
    timeline_ok_ = info_.timeline && !o.no_timeline;  // describe() asked the device
    xfer_family_ = timeline_ok_ && info_.transfer_queue ? info_.transfer_family : family_;
    qci[1] = qci[0];
    qci[1].queueFamilyIndex = xfer_family_;
    st_.timeline_semaphores = timeline_ok_;
    st_.transfer_queue = xfer_family_ != family_;
    // The float linear shader computes the CPU's fused fma exactly with doubles (linear_float.comp).
    VkPhysicalDeviceFeatures have{};
    vkGetPhysicalDeviceFeatures(phys_, &have);
    float64_ = have.shaderFloat64 == VK_TRUE;
    VkPhysicalDeviceFeatures enable{};
    enable.shaderFloat64 = have.shaderFloat64;
    // On an integrated GPU or CPU device the weights' own pages can be the device's
    // (VK_EXT_external_memory_host): no copy, and the host's plan counts them once.
    import_ = info_.uma && info_.host_import && !o.no_import && !o.force_staging;
    in_place_ = o.experts_in_place;
    if (in_place_) {
      if (o.expert_slots) throw Error("vulkan: routed experts go either in slots or in place, not both");
      if (o.cpu_experts > 0 || o.cpu_experts_auto)
        throw Error("vulkan: --cpu-experts shares out slot misses, and in-place experts are never copied");
      if (!import_)
        throw Error("vulkan: --gpu-experts in-place runs experts from the host's memory, which " + info_.name +
                    (!info_.uma ? " cannot use in place: it is a " + info_.kind + " device with memory of its own (use --gpu-experts N)"
                     : !info_.host_import ? " cannot import: the driver lacks VK_EXT_external_memory_host"
                                          : " is told not to import here (staging or no-import forced)"));
    }
    st_.experts_in_place = in_place_;
    st_.hint_staging = prefetches_experts();
    st_.experts_auto = o.experts_auto;
    std::vector<const char*> exts;
    if (import_) exts.push_back(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
    VkDeviceCreateInfo dci{};
    dci.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO;
    dci.queueCreateInfoCount = xfer_family_ != family_ ? 2 : 1;
    dci.pQueueCreateInfos = qci;
    // The feature structs the device is created with, each linked in front of the last.
    void* chain = nullptr;
    tl.timelineSemaphore = timeline_ok_ ? VK_TRUE : VK_FALSE;
    if (timeline_ok_) {
      tl.pNext = chain;
      chain = &tl;
    }
    // The integer dot product's builds declare SPV_KHR_integer_dot_product, which the device
    // takes with its extension (promoted to Vulkan 1.3, where naming it is still valid).
    VkPhysicalDeviceShaderIntegerDotProductFeaturesKHR dot{};
    dot.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES_KHR;
    if (int_dot_) {
      exts.push_back(VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
      dot.shaderIntegerDotProduct = VK_TRUE;
      dot.pNext = chain;
      chain = &dot;
    }
    dci.pNext = chain;
    dci.pEnabledFeatures = &enable;
    dci.enabledExtensionCount = (uint32_t)exts.size();
    dci.ppEnabledExtensionNames = exts.empty() ? nullptr : exts.data();
    check(vkCreateDevice(phys_, &dci, nullptr, &dev_), "creating the device");
    if (import_) {
      host_ptr_props_ = reinterpret_cast<PFN_vkGetMemoryHostPointerPropertiesEXT>(
          vkGetDeviceProcAddr(dev_, "vkGetMemoryHostPointerPropertiesEXT"));
      VkPhysicalDeviceExternalMemoryHostPropertiesEXT hp{};
      hp.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT;
      vk::query_properties(phys_, hp);
      import_align_ = std::max<VkDeviceSize>(hp.minImportedHostPointerAlignment, 4);
      import_ = host_ptr_props_ != nullptr;
      if (!import_ && in_place_) {
        destroy();
        throw Error("vulkan: --gpu-experts in-place: " + info_.name + " gives no vkGetMemoryHostPointerPropertiesEXT");
      }
    }
    st_.imports_host_memory = import_;
    try {
      init_objects();
    } catch (...) {
      destroy();
      throw;
    }
  }

  ~VulkanBackend() override { destroy(); }

  std::string_view name() const override { return "vulkan"; }

  // Registered, so that deferred linears know their outputs' tensors are still there.
  Tensor tensor(size_t n, size_t width) const override { return LiveTensors::make(live_, n, width); }
  void sync() const override { settle(); }

  // The CPU's ops, each after the deferred linears have run (they may read what those write).
  void embed(const Weight& table, std::span<const TokenId> tokens, uint32_t copies, Mat X) const override {
    settle();
    CpuBackend::embed(table, tokens, copies, X);
  }
  // On the device when deferred linears write the rows whole (the queries' low rank after its
  // projection): recorded in their batch, a stage after them, so a linear that reads the
  // normalized rows chains after it. Else the CPU's, once the deferred linears have run.
  void rms_norm(Mat x, const float* w, float eps) const override {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (defer_rms_norm(x, w, eps)) return;
      flush_deferred();
    }
    CpuBackend::rms_norm(x, w, eps);
  }
  // On the device in place when the deferred batch writes x whole (the queries, the window row,
  // the index keys, the attention's output); else the CPU's, once the batch has run.
  void rope(Mat x, uint32_t head_dim, RopeTable t, std::span<const uint64_t> pos, bool inverse) const override {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (defer_rope(x, head_dim, t, pos, inverse)) return;
      flush_deferred();
    }
    CpuBackend::rope(x, head_dim, t, pos, inverse);
  }
  // On the device in place when the deferred batch writes x whole (the window row after its RoPE);
  // else the CPU's, once the batch has run.
  void fake_quant(Mat x, FakeQuant kind) const override {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (defer_fake_quant(x, kind)) return;
      flush_deferred();
    }
    CpuBackend::fake_quant(x, kind);
  }
  // Where the deferred batch writes x whole (the window row after its fake-quant), the store waits
  // for the batch: the host converts the rows as it copies the batch's outputs out, and an
  // attention recorded meanwhile reads them where the batch holds them (defer_sparse_attention).
  // Else the CPU's, once the batch has run.
  void store_bf16(CMat x, uint16_t* dst, size_t dst_stride) const override {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (const Region* r = x.n && x.width ? deferred_.source_of(x) : nullptr) {
        deferred_.stores.push_back(
            HostStore{dst, x.n, x.width, dst_stride, r->stride, out_place(*r, x), (int)(r - deferred_.regions.data())});
        return;
      }
      flush_deferred();
    }
    CpuBackend::store_bf16(x, dst, dst_stride);
  }
  void drop_pending() const noexcept override {
    const std::lock_guard<std::mutex> lk(mu_);
    deferred_ = Deferred{};
  }
  // Like store_bf16: where the deferred batch writes x whole (a KV source's latents and index keys
  // after their RoPE), the host packs the rows as it copies the batch's outputs out.
  void store_fp4(CMat x, Fp4Grid grid, uint8_t* dst) const override {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (const Region* r = x.n && x.width ? deferred_.source_of(x) : nullptr) {
        HostStore h{nullptr, x.n, x.width, 0, r->stride, out_place(*r, x), (int)(r - deferred_.regions.data())};
        h.fp4 = dst;
        h.grid = grid;
        deferred_.stores.push_back(h);
        return;
      }
      flush_deferred();
    }
    CpuBackend::store_fp4(x, grid, dst);
  }
  // On the device where the deferred batch writes an addend (the shared expert's output, while the
  // CPU made the routed sums): the sum rides with the batch. Else the CPU's, after the batch only
  // when it writes one of the rows.
  void add_round(CMat a, CMat b, Mat out) const override {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (defer_add_round(a, b, out)) return;
      if (deferred_writes(a) || deferred_writes(b) || deferred_writes(out)) flush_deferred();
    }
    CpuBackend::add_round(a, b, out);
  }
  void fill_rows(Mat x, std::span<const float> row) const override {
    settle();
    CpuBackend::fill_rows(x, row);
  }
  void gather_rows(CMat src, std::span<const uint32_t> rows, Mat dst) const override {
    settle();
    CpuBackend::gather_rows(src, rows, dst);
  }
  void scatter_rows(CMat src, std::span<const uint32_t> rows, Mat dst) const override {
    settle();
    CpuBackend::scatter_rows(src, rows, dst);
  }
  void add_rows(CMat terms, std::span<const uint32_t> tokens, Mat out) const override {
    settle();
    CpuBackend::add_rows(terms, tokens, out);
  }
  // The hyper-connection ops join the deferred batch (below: "Row ops in the deferred batch") when
  // their output lies in a live tensor, reading their inputs where the batch's earlier dispatches
  // write them or staged from the host now; else the CPU's, once the deferred linears have run.
  void hc_mix(const Weight& fn, const float* base, const float* scale, HcParams p, CMat X, Mat mixes) const override {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (defer_hc_mix(fn, base, scale, p, X, mixes)) return;
      flush_deferred();
    }
    CpuBackend::hc_mix(fn, base, scale, p, X, mixes);
  }
  void hc_pre_norm(CMat X, CMat pre, const float* norm_w, HcParams p, Mat y) const override {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (defer_hc_pre(X, pre, p.hc, y)) {
        // The norm a stage after, in place; where the batch has no room for it, the host's.
        if (defer_rms_norm(y, norm_w, p.norm_eps)) return;
        flush_deferred();
        CpuBackend::rms_norm(y, norm_w, p.norm_eps);
        return;
      }
      flush_deferred();
    }
    CpuBackend::hc_pre_norm(X, pre, norm_w, p, y);
  }
  void hc_pre(CMat X, CMat pre, HcParams p, Mat y) const override {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (defer_hc_pre(X, pre, p.hc, y)) return;
      flush_deferred();
    }
    CpuBackend::hc_pre(X, pre, p, y);
  }
  void hc_mean(CMat X, uint32_t hc, Mat y) const override {
    settle();
    CpuBackend::hc_mean(X, hc, y);
  }
  void hc_post(CMat F, CMat X, CMat mixes, uint32_t hc, Mat Y) const override {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (defer_hc_post(F, X, mixes, hc, Y)) return;
      flush_deferred();
    }
    CpuBackend::hc_post(F, X, mixes, hc, Y);
  }
  // Recorded into the deferred batch (compress_pool.comp) reading the projections where the batch
  // writes them; the carry is staged, and its update copied out with the batch. Else the CPU's.
  std::vector<uint32_t> compress_pool(CMat k, CMat g, uint32_t ratio, uint32_t p0, float* carry_k, float* carry_s,
                                      Mat latents) const override {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      std::vector<uint32_t> groups;
      if (defer_compress_pool(k, g, ratio, p0, carry_k, carry_s, latents, groups)) return groups;
      flush_deferred();
    }
    return CpuBackend::compress_pool(k, g, ratio, p0, carry_k, carry_s, latents);
  }
  // The scores on the device (index_scores.comp) where GpuOptions::indexer asks for it, recorded
  // into the deferred batch, which is then submitted (the host needs the selection to stage the
  // attention's rows), then the CPU's selection from them; else the CPU's, after the batch.
  void index_select(const IndexSelect& a, std::vector<std::vector<uint8_t>>& cand,
                    std::vector<std::vector<int32_t>>& sel) const override {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (device_index_select(a, cand, sel)) return;
      flush_deferred();
    }
    CpuBackend::index_select(a, cand, sel);
  }
  // Recorded into the deferred batch (attention.comp) with the rows each query attends staged from
  // the host now, when the output lies in one of the backend's tensors and the rows fit; else the
  // CPU's, once the batch has run.
  void sparse_attention(const SparseAttention& a, Mat o) const override {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (defer_sparse_attention(std::span(&a, 1), std::span(&o, 1))) return;
      flush_deferred();
      ++st_.attention_on_host;
    }
    CpuBackend::sparse_attention(a, o);
  }
  // A batch's sequences as one op, so their outputs are one region: the inverse RoPE and the
  // output projection after them read it on the device. Else one by one.
  void sparse_attentions(std::span<const SparseAttention> as, std::span<const Mat> outs) const override {
    if (as.size() > 1) {
      const std::lock_guard<std::mutex> lk(mu_);
      if (defer_sparse_attention(as, outs)) return;
    }
    Backend::sparse_attentions(as, outs);
  }
  void attend_rows(const RowAttention& a, Mat o) const override {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      std::vector<uint32_t> one(a.rows.size());
      for (uint32_t k = 0; k < one.size(); ++k) one[k] = k;
      if (defer_attention(a.q, a.heads, a.head_dim, a.sinks, o, a.rows, [&](uint32_t) -> const std::vector<uint32_t>& { return one; }, 0))
        return;
      flush_deferred();
    }
    CpuBackend::attend_rows(a, o);
  }
  // Recorded into the deferred batch like the hyper-connection ops (the streams in place where the
  // batch writes them, else staged and written to a new region); else the CPU's.
  void engram_gate(Mat X, uint32_t hc, CMat kv, const float* q_norm, const float* k_norm, float eps,
                   const uint8_t* masked) const override {
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (defer_engram_gate(X, hc, kv, q_norm, k_norm, eps, masked)) return;
      flush_deferred();
    }
    CpuBackend::engram_gate(X, hc, kv, q_norm, k_norm, eps, masked);
  }

  // The deferred linears submitted and their outputs written (deferred submissions below).
  void settle() const {
    const std::lock_guard<std::mutex> lk(mu_);
    flush_deferred();
  }

  void prepare_weight(Weight& w) const override {
    CpuBackend::prepare_weight(w);  // the CPU path stays ready: other ops and fallbacks use it
    uint32_t kind = 0;
    const VkPipeline pipe = pipeline_for(w.type, kind);
    const uint64_t bytes = w.rows * w.row_bytes;
    const std::lock_guard<std::mutex> lk(mu_);
    if (!pipe || !w.data || bytes == 0 || bytes > max_range_ ||
        st_.bytes_on_device + st_.bytes_imported + bytes > budget_) {
      ++st_.weights_on_host;
      return;
    }
    if (import_) {
      // The weight's own pages, or the CPU: the plan counted no copy (imports_host_memory).
      GpuWeight g;
      if (!import_pages(w.data, bytes, g)) {
        ++st_.weights_on_host;
        ++st_.imports_refused;
        return;
      }
      g.kind = kind;
      g.pipe = pipe;
      g.imported = true;
      w.device = &weights_.emplace_back(g);
      ++st_.weights_on_device;
      ++st_.weights_imported;
      st_.bytes_imported += bytes;
      return;
    }
    GpuWeight& g = weights_.emplace_back();
    try {
      g.b = make_weight_buffer(bytes);
      upload(g.b, w.data, bytes);
    } catch (...) {
      free_buffer(g.b);
      weights_.pop_back();
      throw;
    }
    g.kind = kind;
    g.pipe = pipe;
    w.device = &g;
    ++st_.weights_on_device;
    st_.bytes_on_device += bytes;
  }

  // embed() runs on the CPU: its tables stay out of the device budget (the published token table
  // alone is 1.32 GB of F16, the room of some 130 expert slots). hc_mix() runs on the device where
  // it has the shader (its projections, 79 MB of F16 in the published model, with it).
  void prepare_weight_for(Weight& w, WeightUse use) const override {
    if (use == WeightUse::Linear || (use == WeightUse::HcMix && hc_mix_ != VK_NULL_HANDLE))
      prepare_weight(w);
    else
      CpuBackend::prepare_weight(w);
  }

  void linear(const Weight& W, CMat x, Mat y, bool round, uint64_t row0) const override {
    const LinearCall c{&W, x, y, round, row0};
    linears(std::span<const LinearCall>(&c, 1));
  }

  // The calls whose weights have a copy on the device (and whose rows fit the staging buffers)
  // in one device_linears batch: as few submissions as the buffers allow, calls reading the same
  // rows in one format staging them once. The others run on the CPU first. The calls are
  // independent, so neither the order nor the batching changes a bit.
  void linears(std::span<const LinearCall> calls) const override {
    struct Quantized {  // one input's activation rows in one format
      const float* p;
      size_t n, stride, width;
      ActType type;
      ActRows acts;
      std::vector<const uint8_t*> rows;
    };
    // Inputs are read now (staged or quantized on the host): a call reading what deferred
    // linears write, unless it chains after them, submits them first; so does one writing some of
    // what they write other than whole (rows written again whole go into a new region: readers
    // before read the old one, region_of), and one the CPU runs.
    // A float weight reads its f32 rows where a region of the deferred batch holds them (in_place).
    std::vector<char> in_place(calls.size(), 0);
    {
      const std::lock_guard<std::mutex> lk(mu_);
      if (std::any_of(calls.begin(), calls.end(), [&](const LinearCall& c) {
            return !linear_fits(*c.W, c.x, c.y) || (deferred_writes(c.y) && !rewritten_whole(c.y)) ||
                   (deferred_writes(c.x) && !((device_quantizes(*c.W) || reads_rows_in_place(*c.W, c.x)) &&
                                              deferred_.source_of(c.x)));
          }))
        flush_deferred();
      for (size_t i = 0; i < calls.size(); ++i)
        in_place[i] = linear_fits(*calls[i].W, calls[i].x, calls[i].y) && reads_rows_in_place(*calls[i].W, calls[i].x);
    }
    std::vector<Quantized> quantized;
    quantized.reserve(calls.size());  // items point into it: never reallocated
    std::vector<LinearItem> items;
    uint64_t on_host = 0;
    bool defer = true;  // every output in a live tensor: the batch may wait for the next submission
    for (size_t ci = 0; ci < calls.size(); ++ci) {
      const LinearCall& c = calls[ci];
      const Weight& W = *c.W;
      if (!linear_fits(W, c.x, c.y)) {
        ++on_host;
        CpuBackend::linear(W, c.x, c.y, c.round, c.row0);
        continue;
      }
      if (c.x.width != W.cols)
        throw Error("linear: " + std::to_string(c.x.width) + " inputs for a weight of " + std::to_string(W.cols) + " columns");
      if (c.row0 + c.y.width > W.rows)
        throw Error("linear: rows " + std::to_string(c.row0) + ".." + std::to_string(c.row0 + c.y.width) +
                    " of a weight of " + std::to_string(W.rows));
      const ActType type = W.act();
      const GpuWeight& gw = *static_cast<const GpuWeight*>(W.device);
      // A live tensor's rows from their start: y is the columns from c0 of n of them.
      const LiveTensors::Held held = live_->holder(c.y.p, (c.y.n - 1) * c.y.stride + c.y.width);
      const size_t c0 = held.id ? (size_t)(c.y.p - held.start) % c.y.stride : 0;
      const uint64_t tensor = held.id && c0 + c.y.width <= c.y.stride ? held.id : 0;
      const float* y_row = c.y.p - c0;
      defer = defer && tensor != 0;
      // Rows the device reads from f32: in place where the batch holds them (a float weight; the
      // stride is set where the item is placed), or quantized there.
      if (in_place[ci] || device_quantizes(W)) {
        LinearItem it{DeviceWeight{gw.pipe, gw.b.buf, 0, gw.b.size, gw.kind, gw.w_off}, &W, {},
                      in_place[ci] ? 0 : quantized_row_bytes(type, W.cols), c.y.p, c.y.width, c.y.stride, c.row0, c.round,
                      tensor, y_row};
        (in_place[ci] ? it.xf : it.x) = c.x.p;
        it.x_stride = c.x.stride;
        it.n_x = c.x.n;
        items.push_back(it);
        continue;
      }
      auto q = std::find_if(quantized.begin(), quantized.end(), [&](const Quantized& z) {
        return z.p == c.x.p && z.n == c.x.n && z.stride == c.x.stride && z.width == c.x.width && z.type == type;
      });
      if (q == quantized.end()) {
        Quantized& z = quantized.emplace_back(
            Quantized{c.x.p, c.x.n, c.x.stride, c.x.width, type, quantize_rows(type, c.x.p, c.x.stride, c.x.n, W.cols), {}});
        for (size_t t = 0; t < c.x.n; ++t) z.rows.push_back(z.acts.row(t));
        q = std::prev(quantized.end());
      }
      items.push_back({DeviceWeight{gw.pipe, gw.b.buf, 0, gw.b.size, gw.kind, gw.w_off}, &W, q->rows, q->acts.stride, c.y.p,
                       c.y.width, c.y.stride, c.row0, c.round, tensor, y_row});
    }
    const std::lock_guard<std::mutex> lk(mu_);
    st_.linear_on_host += on_host;
    if (!items.empty()) device_linears(items, {}, defer);
    st_.linear_on_device += items.size();
  }

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
                  float limit, CMat x, Mat routed) const override {
    const bool device = experts_on_device(t);
    settle_for(x, routed);
    if (!device) return CpuBackend::routed_ffn(t, src, layer, triples, limit, x, routed);
    const size_t H = x.width;
    device_routed(
        t, src, layer, triples, limit, x,
        [&](size_t j, const float* d) {
          float* ri = routed.row(triples[j].token);
          for (size_t k = 0; k < H; ++k) ri[k] += d[k];
        },
        routed);
  }

  void routed_ffn_rows(ExpertTensors t, const ExpertSource& src, uint32_t layer, std::span<const ExpertTriple> triples,
                       float limit, CMat x, Mat rows) const override {
    const bool device = experts_on_device(t);
    settle_for(x, rows);
    if (!device) return CpuBackend::routed_ffn_rows(t, src, layer, triples, limit, x, rows);
    if (rows.n != triples.size() || rows.width != x.width) throw Error("routed_ffn_rows: shapes differ");
    device_routed(t, src, layer, triples, limit, x,
                  [&](size_t j, const float* d) { std::copy(d, d + x.width, rows.row(j)); });
  }

  // The shared expert: the CPU backend's shared_ffn, operation for operation. Gate and up go
  // into one tensor of this backend ([g | u] per token), so their batch is deferred; the SwiGLU
  // then runs on the device in that batch (swiglu.comp, the CPU's bits), and the down projection
  // chains after it: the whole expert waits for the next submission (the routed experts' first
  // group, or whatever settles). Where a step cannot run on the device (a weight the CPU runs, a
  // device without shaderFloat64), the host takes over from there, after the batch has run.
  void shared_ffn(const Weight& gate, const Weight& up, const Weight& down, float limit, CMat x,
                  Mat out) const override {
    const size_t n = x.n, F = gate.rows;
    const Tensor gu = tensor(n, 2 * F);
    const Mat g = gu.m().cols(0, F), u = gu.m().cols(F, F);
    const LinearCall gate_up[2] = {{&gate, x, g, true, 0}, {&up, x, u, true, 0}};
    linears(gate_up);
    {
      const std::lock_guard<std::mutex> lk(mu_);
      // The batch reads and writes gu's rows on the device: it keeps the tensor (its address is
      // not reused while a deferred region names it).
      if (defer_swiglu(g, u, limit)) {
        deferred_.keep.push_back(gu);
      } else {
        flush_deferred();
        swiglu_rows(g.p, g.stride, u.p, u.stride, n, F, limit, nullptr);
      }
    }
    linear(down, g, out, true, 0);
  }

  std::vector<uint32_t> unheld_experts(const ExpertSource& src, uint32_t layer,
                                       std::vector<uint32_t> experts) const override {
    if (slots_wanted_ == 0) return experts;
    const std::lock_guard<std::mutex> lk(mu_);
    std::erase_if(experts, [&](uint32_t e) { return find_slot(src.id, layer, e) != nullptr; });
    return experts;
  }

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
                        ExpertTensors next_t, std::span<const uint32_t> next) const override {
    if (!prefetches_experts()) return;
    const std::lock_guard<std::mutex> lk(mu_);
    if (slot_stride_ == 0 || std::any_of(slabs_.begin(), slabs_.end(), [](const Buffer& b) { return b.map != nullptr; }))
      return;
    const uint64_t floor = use_clock_ + 1;  // slots used from here on are this call's
    for (const uint32_t e : now)
      if (ExpertSlot* sl = find_slot(src.id, layer, e)) slot_used(*sl);
    // Staged copies of kept attention rows name no expert slot (pending_slots_ lists those that do).
    if (!settle_hint() || deferred_.reads_experts || !pending_slots_.empty()) {
      ++st_.expert_hints_dropped;
      return;
    }
    ensure(hint_stage_, staging_bytes_);
    VkDeviceSize used = 0;
    std::vector<PendingCopy> copies[2];  // this layer's, the next layer's guesses
    auto take = [&](uint32_t L, std::span<const uint32_t> experts, ExpertTensors et, int batch) {
      if (!et.gate || !et.up || !et.down) return;
      const ExpertParts parts = expert_parts(et);
      if (!fits_slots(parts)) return;  // its routed op runs elsewhere
      const uint64_t* const bytes = parts.bytes;
      std::vector<uint32_t> want;
      for (const uint32_t e : experts)
        if (!find_slot(src.id, L, e)) want.push_back(e);
      if (want.empty()) return;
      if (st_.expert_layers.size() <= L) st_.expert_layers.resize(L + 1);
      GpuLayerStats& ls = st_.expert_layers[L];
      src.at_hand(L, want, [&](uint32_t e, const ExpertWeights& ew) {
        if (find_slot(src.id, L, e)) return;
        VkDeviceSize need = 0;
        for (int i = 0; i < 3; ++i) need += (bytes[i] + 3) / 4 * 4;
        if (used + need > hint_stage_.size) return;  // the rest wait for their turn
        const size_t victim = lru_slot(floor);
        if (victim == slots_.size()) return;  // every slot is this call's
        ExpertSlot& sl = slots_[victim];
        unname_slot(sl);
        const uint8_t* from[3] = {ew.gate, ew.up, ew.down};
        for (int i = 0; i < 3; ++i) {
          std::memcpy(static_cast<uint8_t*>(hint_stage_.map) + used, from[i], bytes[i]);
          copies[batch].push_back({slabs_[sl.slab].buf, VkBufferCopy{used, sl.offset + part_off_[i], bytes[i]}});
          used += (bytes[i] + 3) / 4 * 4;
          st_.expert_upload_bytes += bytes[i];
          ls.upload_bytes += bytes[i];
        }
        name_slot(victim, src.id, L, e);
        sl.hinted = true;
        sl.ready = timeline_ok_ ? timeline_value_ + 1 + (uint64_t)batch : 0;
        slot_used(sl);
        hint_slots_.push_back(victim);
        ++st_.expert_uploads_hinted;
      });
    };
    const char* const what = "copying hinted experts";
    // Slots are named as their bytes are staged: anything that throws before the submission is
    // on the queue (a source that fails, a refused submission) un-names them.
    try {
      take(layer, now, t, 0);
      take(layer + 1, next, next_t, 1);
      if (copies[0].empty() && copies[1].empty()) return;
      // Two batches in one submission, each signalling its own value (timeline_value_ + 1 and
      // + 2, whether or not it has copies), the fence after both.
      VkSubmitInfo si[2]{};
      VkTimelineSemaphoreSubmitInfo ts[2]{};
      uint64_t values[2] = {timeline_value_ + 1, timeline_value_ + 2};
      for (int b = 0; b < 2; ++b) {
        VkCommandBuffer cb = hint_cmd_[b];
        begin_recording(cb);
        record_copies(cb, hint_stage_.buf, copies[b]);
        check(vkEndCommandBuffer(cb), "recording commands");
        si[b].sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
        si[b].commandBufferCount = 1;
        si[b].pCommandBuffers = &hint_cmd_[b];
        if (timeline_ok_) {
          ts[b].sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO;
          ts[b].signalSemaphoreValueCount = 1;
          ts[b].pSignalSemaphoreValues = &values[b];
          si[b].pNext = &ts[b];
          si[b].signalSemaphoreCount = 1;
          si[b].pSignalSemaphores = &timeline_;
        }
      }
      if (fault_before_ && fault_before_(what)) throw lost(what, VK_ERROR_DEVICE_LOST);
      check(vkQueueSubmit(xfer_queue_, 2, si, hint_fence_), what);
      if (timeline_ok_) timeline_value_ += 2;
    } catch (...) {
      unname_hinted();
      throw;
    }
    ++st_.submissions;
    ++st_.hint_submissions;
    hint_in_flight_ = true;
    hint_barrier_ = !timeline_ok_;  // with a timeline, the submissions touching the slots wait for it
  }

  // Before a routed call: the deferred linears wait for its first group's submission, or, where
  // the CPU runs the call, for the next one (the CPU reads x and writes out on the host: neither
  // the batch's staged inputs nor its regions are those rows), unless the call reads or adds into
  // what they write (the host does both), or the batch holds a routed group: its dispatches read
  // slots this call may replace and the source's bytes its next prepare() may move.
  void settle_for(CMat x, CMat out) const {
    const std::lock_guard<std::mutex> lk(mu_);
    if (deferred_.reads_experts || deferred_writes(x) || deferred_writes(out)) flush_deferred();
  }

  // True when this layer's experts can run in the slots: slots were asked for, the three types
  // have shaders, and one expert fits the slot geometry fixed by the first call (a drafter or
  // layer with larger experts runs on the CPU, counted in experts_on_host).
  bool experts_on_device(ExpertTensors t) const {
    if (slots_wanted_ == 0 && !in_place_) return false;
    const ExpertParts parts = expert_parts(t);
    const std::lock_guard<std::mutex> lk(mu_);
    bool fits = false;
    if (in_place_) {
      fits = parts.shaders && !in_place_released_;
    } else {
      if (parts.shaders && slot_stride_ == 0 && !st_.expert_slots_refused) make_slots(parts.bytes);
      fits = fits_slots(parts);
    }
    if (!fits) ++st_.expert_calls_on_host;
    return fits;
  }

  // An expert's three parts (gate, up, down): their bytes, and whether the device runs all three
  // (a shader for each type, each part within one binding's range).
  struct ExpertParts {
    uint64_t bytes[3] = {};
    bool shaders = true;
  };
  ExpertParts expert_parts(ExpertTensors t) const {
    ExpertParts p;
    uint32_t kind = 0;
    int i = 0;
    for (const Weight* w : {t.gate, t.up, t.down}) {
      p.bytes[i++] = w->rows * w->row_bytes;
      p.shaders &= pipeline_for(w->type, kind) != VK_NULL_HANDLE && w->rows * w->row_bytes <= max_range_;
    }
    return p;
  }

  // Whether such an expert goes in a slot: the slots exist and each part fits its place (mu_ held).
  bool fits_slots(const ExpertParts& p) const {
    return p.shaders && slot_stride_ != 0 && p.bytes[0] <= part_cap_[0] && p.bytes[1] <= part_cap_[1] &&
           p.bytes[2] <= part_cap_[2];
  }

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
                     float limit, CMat x, Take&& take, Mat sums = {}) const {
    const Weight* parts[3] = {t.gate, t.up, t.down};
    VkPipeline pipes[3];
    uint32_t kinds[3] = {};
    for (int i = 0; i < 3; ++i) pipes[i] = pipeline_for(parts[i]->type, kinds[i]);
    const std::lock_guard<std::mutex> lk(mu_);
    // The experts with a slot are marked used now, so placing the others (least recently used
    // out) never evicts one of them before its turn. With fewer slots than the call's experts
    // that cannot be avoided, and every expert is asked of the source.
    const std::vector<uint32_t> used = experts_of(triples);
    std::vector<uint32_t> missing;
    for (const uint32_t e : used) {
      if (ExpertSlot* sl = find_slot(src.id, layer, e)) slot_used(*sl);
      else missing.push_back(e);
    }
    const std::vector<uint32_t> on_cpu =
        split_.active() ? ExpertSplit::pick(triples, missing, split_.cpu_count(used.size() - missing.size(), missing.size()))
                        : std::vector<uint32_t>{};
    // Copies ahead: where the slots are mapped (an integrated GPU, a card with resizable BAR, a
    // CPU device) a copy into a slot is the host's memcpy, so while the device runs a group the
    // host copies in the next group's misses. Only when every expert of the call has a slot (a
    // copy ahead then evicts nothing the call still needs, and nothing a submitted command reads:
    // this call's slots are the most recently used) and the source holds its union (asking for a
    // later expert first must not move it on).
    std::vector<uint32_t> ahead;  // misses the device will run, ascending; copied in early or at their turn
    if (slots_.size() >= used.size() && src.holds_union() &&
        std::all_of(slabs_.begin(), slabs_.end(), [](const Buffer& b) { return b.map != nullptr; }))
      for (const uint32_t e : missing)
        if (!std::binary_search(on_cpu.begin(), on_cpu.end(), e)) ahead.push_back(e);
    size_t ahead_next = 0;          // ahead[ahead_next..] are not in a slot yet
    std::vector<uint32_t> early;    // copied in ahead of their turn (ascending)
    if (used.size() > slots_.size()) missing = used;
    if (!missing.empty()) src.prepare(layer, missing);
    // A CPU expert keeps the source's pointers until its group is done: where a windowed source
    // may move on at the next get(), it is the last of its group.
    const bool ends_group = !src.holds_union();
    // Groups of experts no larger than the slots (placing one never evicts another of its
    // group) or than a submission's descriptor sets allow: one round trip per group (two where
    // the SwiGLU runs on the host).
    const ExpertGrouping grouping{in_place_ ? kGroupExperts : std::max<size_t>(1, std::min<size_t>(slots_.size(), kGroupExperts)),
                                  std::min<uint64_t>(kGpuExpertGroupBytes, io_limit_ / 2)};
    if (st_.expert_layers.size() <= layer) st_.expert_layers.resize(layer + 1);
    GpuLayerStats& ls = st_.expert_layers[layer];
    struct Handle {
      bool on_device = false;  // false: the CPU runs it from `host`
      DeviceWeight part[3]{};  // gate, up, down where the dispatches read them
      ExpertWeights host{};
      bool ends_group = false;
      bool fused = false;  // on the device, SwiGLU and down projection in the gate-and-up submission
    };
    // An expert on the device runs whole in one submission (routed_terms.h `fused`): gate and up
    // into one scratch tensor [g | u] per token, the SwiGLU with its tokens' routing weights a
    // stage after them (swiglu.comp), the down projection's activations quantized from it and the
    // down projection, chained, as the shared expert's are. Where the device cannot (no
    // shaderFloat64, a down projection whose activations it does not quantize), the SwiGLU and
    // the quantization run on the host between two submissions.
    const size_t F = t.gate->rows;
    const bool fuse = swiglu_ != VK_NULL_HANDLE && quantizes(t.down->act(), F);
    std::vector<Tensor> scratch;  // the fused experts' [g | u] rows, until their submission has run
    using Job = ExpertJob<Handle>;
    using clock = std::chrono::steady_clock;
    std::vector<LinearItem> items;
    double cpu_s = 0, dev_s = 0;  // the group's CPU experts and device submissions, both phases
    size_t n_cpu = 0, n_dev = 0;
    // Copies expert e into a slot (a miss), counted for its layer and the split's cost model.
    auto copy_in = [&](uint32_t e) {
      const auto t0 = clock::now();
      ExpertSlot* sl = place(src.id, layer, e, src.get(layer, e), t, ls);
      slot_used(*sl);
      const auto took = clock::now() - t0;
      split_.upload_took(std::chrono::duration<double>(took).count(), 1);
      ls.upload_ns += (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(took).count();
      return sl;
    };
    // While the device runs a group: the next group's worth of misses copied in.
    auto copy_ahead = [&] {
      for (size_t k = 0; k < grouping.max_experts && ahead_next < ahead.size(); ++k, ++ahead_next) {
        copy_in(ahead[ahead_next]);
        early.push_back(ahead[ahead_next]);
        ++st_.expert_uploads_ahead;
      }
    };
    // A phase's experts without a slot, computed by the CPU from the source's bytes.
    auto run_cpu_jobs = [&](std::span<const Job> jobs, bool down) {
      const auto t0 = clock::now();
      for (const Job& j : jobs) {
        if (j.h.on_device) continue;
        if (down) {
          expert_projection(*parts[2], j.h.host.down, j.down_acts, j.down_y);
        } else {
          expert_projection(*parts[0], j.h.host.gate, j.acts[0], j.y[0]);
          expert_projection(*parts[1], j.h.host.up, j.acts[1], j.y[1]);
        }
      }
      cpu_s += std::chrono::duration<double>(clock::now() - t0).count();
    };
    // The terms summed on the device (above): decided when the group's handles are known.
    bool summed = false;
    Tensor terms;  // [triples][H], a fused expert's rows from its first triple's
    const bool may_sum = sums.p && routed_sum_ != VK_NULL_HANDLE && !split_.active() && sums.n != 0 &&
                         live_->holder(sums.p, (sums.n - 1) * sums.stride + sums.width).id;
    // One phase of a group: the device's projections submitted, the CPU's computed meanwhile.
    auto phase = [&](std::span<Job> jobs, bool down) {
      items.clear();
      scratch.clear();
      size_t covered = 0;
      for (const Job& j : jobs) covered += j.n;
      const bool sum_here = !down && may_sum && covered == triples.size() &&
                            std::all_of(jobs.begin(), jobs.end(), [](const Job& j) { return j.h.on_device && j.h.fused; });
      if (sum_here) terms = tensor(triples.size(), x.width);
      size_t first = 0;  // the job's first triple
      for (const Job& j : jobs) {
        const size_t j_first = first;
        first += j.n;
        if (!j.h.on_device || (down && j.h.fused)) continue;
        if (down) {
          items.push_back({j.h.part[2], parts[2], j.down_acts, j.down_stride, j.down_y, parts[2]->rows});
        } else if (!j.h.fused) {
          for (int p = 0; p < 2; ++p)
            items.push_back({j.h.part[p], parts[p], j.acts[p], j.strides[p], j.y[p], parts[p]->rows});
        } else {
          float* gu = scratch.emplace_back(tensor(j.n, 2 * F)).m().p;
          const uint64_t id = live_->holder(gu, j.n * 2 * F).id;
          for (int p = 0; p < 2; ++p)
            items.push_back({j.h.part[p], parts[p], j.acts[p], j.strides[p], gu + p * F, F, 2 * F, 0, true, id, gu});
          LinearItem d{j.h.part[2], parts[2], {}, quantized_row_bytes(parts[2]->act(), F), j.down_y, parts[2]->rows};
          if (sum_here) {  // into the terms tensor, so the batch may keep it
            d.y = terms.m().row(j_first);
            d.y_row = d.y;
            d.tensor = live_->holder(d.y, j.n * x.width).id;
          }
          d.x = gu;
          d.x_stride = 2 * F;
          d.n_x = j.n;
          d.glu_g = gu;
          d.glu_u = gu + F;
          d.glu_w = j.weights.data();
          d.glu_limit = limit;
          items.push_back(d);
        }
      }
      std::function<void()> meanwhile;
      const bool cpu_jobs = std::any_of(jobs.begin(), jobs.end(), [](const Job& j) { return !j.h.on_device; });
      if (cpu_jobs || (!down && ahead_next < ahead.size()))
        meanwhile = [&, cpu_jobs, down] {
          if (cpu_jobs) run_cpu_jobs(jobs, down);
          if (!down) copy_ahead();
        };
      if (sum_here && record_routed_sum(items, jobs, triples, terms, sums, scratch)) {
        summed = true;
        return;
      }
      dev_s = add_seconds(dev_s, device_linears(items, std::move(meanwhile)));
      if (sum_here) {  // no room to keep them in the batch: the terms go to routed_terms' rows after all
        size_t at = 0;
        for (const Job& j : jobs) {
          std::memcpy(j.down_y, terms.c().row(at), j.n * x.width * sizeof(float));
          at += j.n;
        }
      }
    };
    sluice::routed_terms(
        t, triples, limit, x, grouping,
        [&](uint32_t e) {
          Handle h;
          if (in_place_) {
            h.host = src.get(layer, e);
            h.ends_group = ends_group;
            h.on_device = view_in_place(src, h.host, parts, pipes, kinds, h.part);
            h.fused = h.on_device && fuse;
            ++(h.on_device ? st_.expert_in_place : st_.expert_in_place_refused);
            ++(h.on_device ? ls.in_place : ls.on_cpu);
            ++(h.on_device ? n_dev : n_cpu);
            return h;
          }
          if (std::binary_search(on_cpu.begin(), on_cpu.end(), e)) {
            h.host = src.get(layer, e);
            h.ends_group = ends_group;
            ++st_.expert_on_cpu;
            ++ls.on_cpu;
            ++n_cpu;
            return h;
          }
          ExpertSlot* slot = find_slot(src.id, layer, e);
          const bool copied_early = std::binary_search(early.begin(), early.end(), e);
          // A slot a hint filled counts as the miss it was, copied ahead of its turn.
          if (slot && !copied_early && !slot->hinted) {
            ++st_.expert_hits;
            ++ls.hits;
          } else {
            if (!slot) slot = copy_in(e);
            if (slot->hinted) ++st_.expert_hints_used;
            slot->hinted = false;
            ++st_.expert_misses;
            ++ls.misses;
          }
          // Its turn has come: no copy ahead of it is left to make.
          while (ahead_next < ahead.size() && ahead[ahead_next] <= e) ++ahead_next;
          slot_used(*slot);
          h.on_device = true;
          h.fused = fuse;
          for (int p = 0; p < 3; ++p) h.part[p] = slot_part(*slot, p, pipes[p], kinds[p]);
          ++n_dev;
          return h;
        },
        [&](std::span<Job> jobs) {
          dev_s = cpu_s = 0;
          phase(jobs, false);
        },
        [&](std::span<Job> jobs) {
          if (summed) return;
          phase(jobs, true);
          if (n_dev) split_.device_took(dev_s, n_dev);
          if (n_cpu) split_.cpu_took(cpu_s, n_cpu);
          n_dev = n_cpu = 0;
        },
        [&](size_t j, const float* d) {
          if (!summed) take(j, d);
        });
    st_.split_upload_s = split_.costs().upload;
    st_.split_device_s = split_.costs().device;
    st_.split_cpu_s = split_.costs().cpu;
  }

  // A group's fused experts into the deferred batch (mu_ held), then sums[t] += terms[j] for the
  // triples j of token t in order (routed_sum.comp): false, with nothing recorded, when the
  // batch's buffers or descriptor sets have no room for all of it (the caller submits instead).
  template <class Items, class Jobs>
  bool record_routed_sum(const Items& items, const Jobs& jobs, std::span<const ExpertTriple> triples, const Tensor& terms,
                         Mat sums, std::span<const Tensor> scratch) const {
    const size_t H = terms.width(), n = sums.n;
    // Room: the items alone in one submission (device_linears would split them otherwise), the
    // sum's lists and a region of the sums' rows.
    const size_t words = 2 * n + triples.size();
    VkDeviceSize act = aligned(words * 4) + aligned((VkDeviceSize)n * sums.width * sizeof(float)), out = 0;
    for (const auto& it : items) {
      act += aligned((VkDeviceSize)it.tokens() * (it.xf ? it.W->cols * sizeof(float) : it.stride)) +
             (it.x ? aligned((VkDeviceSize)it.tokens() * it.W->cols * sizeof(float)) : 0) + aligned(it.tokens() * sizeof(float));
      out += aligned((VkDeviceSize)it.tokens() * it.y_step() * sizeof(float));
    }
    out += aligned((VkDeviceSize)n * sums.stride * sizeof(float));
    if (deferred_.ds.size() + 3 * items.size() + 1 > kSets || deferred_.act_used + act > io_limit_ ||
        deferred_.out_used + out > io_limit_)
      return false;
    device_linears(items, {}, /*defer=*/true);
    deferred_.reads_experts = true;
    for (const Tensor& gu : scratch) deferred_.keep.push_back(gu);  // the batch reads and writes them
    // Each term row's place: the region the expert's down projection writes.
    std::vector<uint32_t> place(triples.size());
    std::vector<const Region*> term_regions;
    uint32_t after = 0;
    size_t first = 0;
    for (const auto& j : jobs) {
      const Region* r = deferred_.source_of(CMat{terms.c().row(first), j.n, H, H});
      if (!r) throw Error("routed experts: the device's terms are in no region of the batch");  // device_linears placed them
      for (size_t k = 0; k < j.n; ++k) place[first + k] = kInOut | (out_place(*r, CMat{terms.c().row(first + k), 1, H, H}));
      after = std::max(after, r->stage);
      term_regions.push_back(r);
      first += j.n;
    }
    // [first, count per token][triple ids' places], in triple order per token.
    std::vector<std::vector<uint32_t>> per(n);
    for (size_t j = 0; j < triples.size(); ++j) per[triples[j].token].push_back(place[j]);
    std::vector<uint32_t> lists(2 * n);
    for (size_t t = 0; t < n; ++t) {
      lists[2 * t] = (uint32_t)lists.size();
      lists[2 * t + 1] = (uint32_t)per[t].size();
      lists.insert(lists.end(), per[t].begin(), per[t].end());
    }
    RowSpans sp = row_spans();
    for (const Region* tr : term_regions) reads_region(sp, (int)(tr - deferred_.regions.data()));
    Operand s;
    const uint32_t at = stage_words(lists);
    if (at == UINT32_MAX || !operand(sums, s)) throw Error("routed experts: no room for the sums in the batch");
    const int yr = output_region(sums);
    if (yr < 0) throw Error("routed experts: no room for the sums in the batch");
    deferred_.keep.push_back(terms);
    Region& r = deferred_.regions[(size_t)yr];
    const uint32_t stage = std::max(after, s.stage) + 1;
    reads(sp, s);
    writes(sp, r);
    deferred_.ds.push_back(row_op(routed_sum_,
                                  {(uint32_t)n, (uint32_t)sums.width, s.at, s.stride, at, out_place(r, sums), (uint32_t)r.stride},
                                  grid_x(sums.width), (uint32_t)n, stage, sp));
    r.stage = stage;
    mark_read(s, stage);
    return true;
  }

  GpuStats stats() const {
    const std::lock_guard<std::mutex> lk(mu_);
    return st_;
  }

  void release_imports() const {
    const std::lock_guard<std::mutex> lk(mu_);
    flush_deferred();  // its dispatches may read the imports
    vkDeviceWaitIdle(dev_);
    for (GpuWeight& g : weights_)
      if (g.imported) {
        free_buffer(g.b);
        g.imported = false;
      }
    release_expert_chunks();
    in_place_released_ = true;  // the sources' memory may go now: later routed calls run on the CPU
  }

  GpuCopyBandwidth copy_bandwidth(uint64_t bytes, int passes) const {
    GpuCopyBandwidth r;
    r.bytes = bytes = std::max<uint64_t>(bytes, 4096);
    r.passes = passes = std::max(passes, 1);
    std::vector<uint8_t> src(bytes), dst(bytes);
    for (uint64_t i = 0; i < bytes; i += 4096) src[i] = (uint8_t)(i >> 12);
    using clock = std::chrono::steady_clock;
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::vector<double> copy, plain;
    const std::lock_guard<std::mutex> lk(mu_);
    Buffer b = make_weight_buffer(bytes);
    try {
      r.staged = b.map == nullptr;
      for (int i = 0; i <= passes; ++i) {  // pass 0 untimed: first touch of the pages
        const auto t0 = clock::now();
        upload(b, src.data(), bytes);
        const auto t1 = clock::now();
        std::memcpy(dst.data(), src.data(), bytes);
        const auto t2 = clock::now();
        if (i == 0) continue;
        copy.push_back((double)bytes / std::chrono::duration<double>(t1 - t0).count() / 1e9);
        plain.push_back((double)bytes / std::chrono::duration<double>(t2 - t1).count() / 1e9);
      }
    } catch (...) {
      free_buffer(b);
      throw;
    }
    free_buffer(b);
    if (r.staged) st_.staged_uploads -= (uint64_t)passes + 1;  // not weights
    r.median_gbps = median(copy);
    r.min_gbps = *std::min_element(copy.begin(), copy.end());
    r.max_gbps = *std::max_element(copy.begin(), copy.end());
    r.memcpy_gbps = median(plain);
    return r;
  }

  // The device's rms_norm alone (gpu_rms_norm): the rows staged in the output buffer as a region
  // of deferred linears would be, normalized there and read back.
  void rms_norm_alone(float* x, size_t n, size_t width, const float* w, float eps) const {
    const std::lock_guard<std::mutex> lk(mu_);
    flush_deferred();
    if (rms_norm_ == VK_NULL_HANDLE) throw Error("gpu_rms_norm: the device has no rms_norm shader (no shaderFloat64)");
    ensure_io();
    if (n * width * sizeof(float) > out_.size || width * sizeof(float) > act_.size)
      throw Error("gpu_rms_norm: the rows do not fit the staging buffers");
    put_rows(x, n * width * sizeof(float));
    std::memcpy(act_.map, w, width * sizeof(float));
    Dispatch d{DeviceWeight{rms_norm_, act_.buf, 0, aligned(width * sizeof(float)), 0, 0}, 0, 0,
               (VkDeviceSize)(n * width * sizeof(float)),
               Push{(uint32_t)n, (uint32_t)width, 0, (uint32_t)width, std::bit_cast<uint32_t>(eps), 0, 0, 0, 0},
               (uint32_t)n, 1};
    read_back(0, n * width * sizeof(float));
    (void)dispatch(std::span<const Dispatch>(&d, 1));
    std::memcpy(x, rows_out(), n * width * sizeof(float));
  }

  // The device's SwiGLU alone (gpu_swiglu): rows [g | u] staged in the output buffer as a region
  // of deferred linears would be, h written over g there and read back; wk (null: 1) per row.
  void swiglu_alone(float* gu, size_t n, size_t width, float limit, const float* wk) const {
    const std::lock_guard<std::mutex> lk(mu_);
    flush_deferred();
    if (swiglu_ == VK_NULL_HANDLE) throw Error("gpu_swiglu: the device has no swiglu shader (no shaderFloat64)");
    ensure_io();
    if (n * 2 * width * sizeof(float) > out_.size || n * sizeof(float) > act_.size)
      throw Error("gpu_swiglu: the rows do not fit the staging buffers");
    put_rows(gu, n * 2 * width * sizeof(float));
    if (wk) std::memcpy(act_.map, wk, n * sizeof(float));
    const Region r{0, gu, n, 2 * width, 0, 0, 0, {}};
    Dispatch d = swiglu_dispatch(r, CMat{gu, n, width, 2 * width}, CMat{gu + width, n, width, 2 * width}, limit);
    d.push.kind = wk ? 1 : 0;  // the shader's row_weights
    read_back(0, n * 2 * width * sizeof(float));
    (void)dispatch(std::span<const Dispatch>(&d, 1));
    std::memcpy(gu, rows_out(), n * 2 * width * sizeof(float));
  }

  // The device's Engram gates alone (gpu_engram_gates): X [n][hc * H], kv [n][(hc + 1) * H].
  std::vector<float> engram_gates_alone(const float* X, const float* kv, size_t n, uint32_t hc, size_t H,
                                        const float* q_norm, const float* k_norm, float eps) const {
    const Tensor xt = tensor(n, hc * H), kt = tensor(n, (hc + 1) * H), gt = tensor(n, hc);
    std::memcpy(xt.m().p, X, xt.bytes());
    std::memcpy(kt.m().p, kv, kt.bytes());
    const std::lock_guard<std::mutex> lk(mu_);
    flush_deferred();
    if (!defer_engram_gate(xt.m(), hc, kt.c(), q_norm, k_norm, eps, nullptr, gt.m()))
      throw Error("gpu_engram_gates: the device has no engram_gate shader (no shaderFloat64) or the rows do not fit");
    flush_deferred();
    return std::vector<float>(gt.c().p, gt.c().p + n * hc);
  }

  // The indexer's scores on the device (gpu_index_scores), whatever GpuOptions::indexer says.
  // Recorded into the batch as index_select records them (the batch is not submitted first).
  std::vector<float> index_scores_alone(const IndexSelect& a, std::vector<std::vector<uint8_t>>& cand) const {
    const std::lock_guard<std::mutex> lk(mu_);
    const GpuIndexer was = std::exchange(indexer_, GpuIndexer::Device);
    std::vector<std::vector<int32_t>> sel;
    std::vector<float> raw;
    const bool ok = device_index_select(a, cand, sel, &raw);
    indexer_ = was;
    if (!ok) throw Error("gpu_index_scores: the device has no index_scores shader (no shaderFloat64) or the keys do not fit");
    return raw;
  }

  // compress_pool on the device with the pooled values unrounded (gpu_compress_pool_unrounded).
  std::vector<uint32_t> compress_pool_unrounded(CMat k, CMat g, uint32_t ratio, uint32_t p0, float* carry_k,
                                                float* carry_s, Mat latents) const {
    const std::lock_guard<std::mutex> lk(mu_);
    flush_deferred();
    std::vector<uint32_t> groups;
    if (!defer_compress_pool(k, g, ratio, p0, carry_k, carry_s, latents, groups, true))
      throw Error("gpu_compress_pool_unrounded: the device has no compress_pool shader (no shaderFloat64) or the rows do not fit");
    flush_deferred();
    return groups;
  }

  // The device's exp_f32 alone (gpu_exp), in place on n values staged in the output buffer.
  void exp_alone(float* x, size_t n) const {
    const std::lock_guard<std::mutex> lk(mu_);
    flush_deferred();
    if (exp_ == VK_NULL_HANDLE) throw Error("gpu_exp: the device has no exp_f32 shader (no shaderFloat64)");
    ensure_io();  // both: every binding names a buffer (binding 1, unread here, the activations')
    if (n * sizeof(float) > out_.size) throw Error("gpu_exp: the values do not fit the staging buffer");
    put_rows(x, n * sizeof(float));
    const uint32_t groups = grid_x(n), gx = std::min<uint32_t>(groups, 32768);
    Dispatch d{DeviceWeight{exp_, exp_consts_.buf, 0, exp_consts_.size, 0, 0}, 0, 0, (VkDeviceSize)(n * sizeof(float)),
               Push{(uint32_t)n, 0, 0, 0, 0, 0, 0, 0, 0}, gx, (groups + gx - 1) / gx};
    read_back(0, n * sizeof(float));
    (void)dispatch(std::span<const Dispatch>(&d, 1));
    std::memcpy(x, rows_out(), n * sizeof(float));
  }

  // The device's quantizer alone (gpu_quantize): n rows of cols floats -> n rows of the format's
  // bytes, unpadded.
  std::vector<uint8_t> quantize_alone(ActType a, const float* x, size_t n, size_t cols) const {
    const std::lock_guard<std::mutex> lk(mu_);
    flush_deferred();
    if (!quantizes(a, cols))
      throw Error("gpu_quantize: the device has no quantizer for this format or row length");
    const size_t stride = quantized_row_bytes(a, cols), row = activation_bytes(a, (int64_t)cols);
    const VkDeviceSize f = aligned((VkDeviceSize)n * cols * sizeof(float));
    ensure(act_, io_limit_);
    if (f + n * stride > act_.size) throw Error("gpu_quantize: the rows do not fit the staging buffer");
    std::memcpy(act_.map, x, n * cols * sizeof(float));
    const uint32_t units = quantize_units(a, cols);
    Dispatch q{DeviceWeight{quantizer(a), tables_.buf, 0, tables_.size, 0, 0}, 0, f, (VkDeviceSize)(n * stride),
               Push{units, (uint32_t)cols, (uint32_t)n, 0, (uint32_t)cols, (uint32_t)stride, 0, 0, 0}, grid_x(units),
               (uint32_t)n};
    q.quantize = true;
    q.act_bytes = rows_span(n, cols * sizeof(float), cols * sizeof(float));
    (void)dispatch(std::span<const Dispatch>(&q, 1));
    std::vector<uint8_t> out(n * row);
    for (size_t t = 0; t < n; ++t) std::memcpy(out.data() + t * row, static_cast<const uint8_t*>(act_.map) + f + t * stride, row);
    return out;
  }

 private:
  // The linear shader of a weight type (kind: linear_float's format), or none: the type has no
  // shader, or it is a float format and the device lacks shaderFloat64 (linear_float.comp).
  // Makes the pages holding [data, data + bytes) a storage buffer of the device (mu_ held): the
  // range is widened to the import alignment (whole pages of the same allocation, so mapped)
  // and the weight starts w_off bytes in. False when the driver refuses; nothing is left behind.
  bool import_pages(const uint8_t* data, uint64_t bytes, GpuWeight& g) const {
    const uintptr_t p = reinterpret_cast<uintptr_t>(data), a = (uintptr_t)import_align_;
    const uintptr_t base = p / a * a, end = (p + bytes + a - 1) / a * a;
    const VkDeviceSize len = end - base;
    if (len > max_range_ || (p - base) % 4 != 0) return false;  // the shaders read words
    void* host = reinterpret_cast<void*>(base);
    VkMemoryHostPointerPropertiesEXT hp{};
    hp.sType = VK_STRUCTURE_TYPE_MEMORY_HOST_POINTER_PROPERTIES_EXT;
    if (host_ptr_props_(dev_, VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT, host, &hp) != VK_SUCCESS) return false;
    VkExternalMemoryBufferCreateInfo eb{};
    eb.sType = VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO;
    eb.handleTypes = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
    VkBufferCreateInfo bi{};
    bi.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    bi.pNext = &eb;
    bi.size = len;
    bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
    bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    Buffer out;
    if (vkCreateBuffer(dev_, &bi, nullptr, &out.buf) != VK_SUCCESS) return false;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev_, out.buf, &req);
    uint32_t type = UINT32_MAX;
    for (uint32_t i = 0; i < mem_.memoryTypeCount && type == UINT32_MAX; ++i)
      if (req.memoryTypeBits & hp.memoryTypeBits & (1u << i)) type = i;
    VkImportMemoryHostPointerInfoEXT imp{};
    imp.sType = VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT;
    imp.handleType = VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT;
    imp.pHostPointer = host;
    VkMemoryAllocateInfo ai{};
    ai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    ai.pNext = &imp;
    ai.allocationSize = len;
    ai.memoryTypeIndex = type;
    if (type == UINT32_MAX || req.size > len || vkAllocateMemory(dev_, &ai, nullptr, &out.mem) != VK_SUCCESS ||
        vkBindBufferMemory(dev_, out.buf, out.mem, 0) != VK_SUCCESS) {
      free_buffer(out);
      return false;
    }
    out.size = len;
    g.b = out;
    g.w_off = (uint32_t)(p - base);
    return true;
  }

  VkPipeline pipeline_for(GgmlType type, uint32_t& kind) const {
    switch (type) {
      case GgmlType::F32: kind = 0; return float_;
      case GgmlType::F16: kind = 1; return float_;
      case GgmlType::BF16: kind = 2; return float_;
      default: break;
    }
    for (size_t i = 0; i < kQuantShaderCount; ++i)
      if (kQuantShaders[i].type == type) return quant_[i];
    return VK_NULL_HANDLE;
  }

  static int resolved(int threads) { return threads > 0 ? threads : std::max(1, (int)std::thread::hardware_concurrency()); }

  void init_objects() {
    vkGetDeviceQueue(dev_, family_, 0, &queue_);
    VkCommandPoolCreateInfo pci{};
    pci.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pci.queueFamilyIndex = family_;
    check(vkCreateCommandPool(dev_, &pci, nullptr, &cmd_pool_), "creating a command pool");
    VkCommandBufferAllocateInfo cai{};
    cai.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    cai.commandPool = cmd_pool_;
    cai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cai.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(dev_, &cai, &cmd_), "allocating a command buffer");
    if (xfer_family_ != family_) {
      vkGetDeviceQueue(dev_, xfer_family_, 0, &xfer_queue_);
      pci.queueFamilyIndex = xfer_family_;
      check(vkCreateCommandPool(dev_, &pci, nullptr, &xfer_pool_), "creating a command pool");
      cai.commandPool = xfer_pool_;
    } else {
      xfer_queue_ = queue_;
    }
    cai.commandBufferCount = 2;
    check(vkAllocateCommandBuffers(dev_, &cai, hint_cmd_), "allocating a command buffer");
    if (timeline_ok_) {
      VkSemaphoreTypeCreateInfo ty{};
      ty.sType = VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO;
      ty.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
      VkSemaphoreCreateInfo sci{};
      sci.sType = VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO;
      sci.pNext = &ty;
      check(vkCreateSemaphore(dev_, &sci, nullptr, &timeline_), "creating a semaphore");
    }
    VkFenceCreateInfo fci{};
    fci.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    check(vkCreateFence(dev_, &fci, nullptr, &fence_), "creating a fence");
    check(vkCreateFence(dev_, &fci, nullptr, &hint_fence_), "creating a fence");
    if (ts_bits_ != 0 && ts_period_ns_ > 0) {
      VkQueryPoolCreateInfo qp{};
      qp.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO;
      qp.queryType = VK_QUERY_TYPE_TIMESTAMP;
      qp.queryCount = 2;
      if (vkCreateQueryPool(dev_, &qp, nullptr, &timestamps_) != VK_SUCCESS) timestamps_ = VK_NULL_HANDLE;
    }

    VkDescriptorSetLayoutBinding b[kBindings]{};
    for (uint32_t i = 0; i < kBindings; ++i) {
      b[i].binding = i;
      b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      b[i].descriptorCount = 1;
      b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
    }
    VkDescriptorSetLayoutCreateInfo dl{};
    dl.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO;
    dl.bindingCount = kBindings;
    dl.pBindings = b;
    check(vkCreateDescriptorSetLayout(dev_, &dl, nullptr, &set_layout_), "creating a descriptor set layout");
    VkPushConstantRange pr{VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(Push)};
    VkPipelineLayoutCreateInfo pl{};
    pl.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO;
    pl.setLayoutCount = 1;
    pl.pSetLayouts = &set_layout_;
    pl.pushConstantRangeCount = 1;
    pl.pPushConstantRanges = &pr;
    check(vkCreatePipelineLayout(dev_, &pl, nullptr, &layout_), "creating a pipeline layout");
    // A set per dispatch of one submission (a group of experts' projections).
    VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kSets * kBindings};
    VkDescriptorPoolCreateInfo dp{};
    dp.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO;
    dp.maxSets = kSets;
    dp.poolSizeCount = 1;
    dp.pPoolSizes = &ps;
    check(vkCreateDescriptorPool(dev_, &dp, nullptr, &desc_pool_), "creating a descriptor pool");
    VkDescriptorSetAllocateInfo da{};
    da.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO;
    da.descriptorPool = desc_pool_;
    const std::vector<VkDescriptorSetLayout> layouts(kSets, set_layout_);
    da.descriptorSetCount = kSets;
    da.pSetLayouts = layouts.data();
    check(vkAllocateDescriptorSets(dev_, &da, sets_), "allocating descriptor sets");
    for (size_t i = 0; i < kQuantShaderCount; ++i) {
      const QuantShader& q = kQuantShaders[i];
      const LinearBuilds& b = int_dot_ ? q.dot : q.scalar;
      quant_[i] = pipeline(subgroup_ ? b.sg : b.plain, q.name);
      if (subgroup_) quant_tiled_[i] = pipeline(b.sgt, q.name);
      // A format whose GEMM tile does not fit the device's workgroup memory keeps the build above.
      if (gemm_ && gemm_shared_bytes(q.type) <= info_.max_workgroup_memory) {
        quant_mm_[i] = pipeline(b.mm, q.name);
        ++st_.gemm_formats;
      }
    }
    if (float64_) float_ = pipeline(kOpShaders.linear_float, "linear_float");
    if (float64_ && gemm_) {
      float_mm_ = pipeline(kOpShaders.linear_float_mm, "linear_float_mm");
      st_.gemm_formats += 3;  // F32, F16, BF16
    }
    // The activation quantizers divide exactly with doubles (quantize_common.glsl); without them
    // the host quantizes.
    if (float64_ && !host_quantize_) {
      quantize_q8_0_ = pipeline(kOpShaders.quantize_q8_0, "quantize_q8_0");
      quantize_q8_k_ = pipeline(kOpShaders.quantize_q8_k, "quantize_q8_k");
      rms_norm_ = pipeline(kOpShaders.rms_norm, "rms_norm");
      swiglu_ = pipeline(kOpShaders.swiglu, "swiglu");
      exp_ = pipeline(kOpShaders.exp_f32, "exp_f32");
      hc_pre_ = pipeline(kOpShaders.hc_pre, "hc_pre");
      hc_post_ = pipeline(kOpShaders.hc_post, "hc_post");
      hc_mix_ = pipeline(kOpShaders.hc_mix, "hc_mix");
      rope_ = pipeline(kOpShaders.rope, "rope");
      engram_gate_ = pipeline(kOpShaders.engram_gate, "engram_gate");
      compress_ = pipeline(kOpShaders.compress_pool, "compress_pool");
      add_round_ = pipeline(kOpShaders.add_round, "add_round");
      routed_sum_ = pipeline(kOpShaders.routed_sum, "routed_sum");
      fake_quant_ = pipeline(kOpShaders.fake_quant, "fake_quant");
      index_scores_ = pipeline(kOpShaders.index_scores, "index_scores");
      // Its scores live in workgroup memory (attention.comp kMaxRows floats).
      if (info_.max_workgroup_memory >= kAttentionRows * sizeof(float) + 16)
        attention_ = pipeline(kOpShaders.attention, "attention");
      // exp_f32's constants (kernels/exp_f32.h), which the shaders' exp reads (exp_f32.glsl).
      const std::span<const double> ec = exp_f32_constants();
      exp_consts_ = make_buffer(ec.size_bytes());
      std::memcpy(exp_consts_.map, ec.data(), ec.size_bytes());
    }
    if (kv_bytes_ && attention_)
      kv_ = local_type_ != UINT32_MAX ? make_buffer(kv_bytes_, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, false)
                                      : make_buffer(kv_bytes_);
    // The IQ2 grids, read by linear_iq2_xxs / linear_iq2_xs (shaders/linear_common.glsl Tables).
    tables_ = make_buffer(sizeof iq2xxs_grid + sizeof iq2xs_grid);
    std::memcpy(tables_.map, iq2xxs_grid, sizeof iq2xxs_grid);
    std::memcpy(static_cast<uint8_t*>(tables_.map) + sizeof iq2xxs_grid, iq2xs_grid, sizeof iq2xs_grid);
  }

  VkPipeline pipeline(Spirv spv, const char* what) {
    VkShaderModuleCreateInfo sm{};
    sm.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO;
    sm.codeSize = spv.bytes;
    sm.pCode = spv.code;
    VkShaderModule mod = VK_NULL_HANDLE;
    VkResult r = vkCreateShaderModule(dev_, &sm, nullptr, &mod);
    if (r != VK_SUCCESS) throw Error(std::string("vulkan: the driver refused shader ") + what + ": " + result_name(r));
    VkComputePipelineCreateInfo ci{};
    ci.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO;
    ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    ci.stage.module = mod;
    ci.stage.pName = "main";
    ci.layout = layout_;
    VkPipeline p = VK_NULL_HANDLE;
    r = fault_shader_ && fault_shader_(what) ? VK_ERROR_OUT_OF_DEVICE_MEMORY
                                             : vkCreateComputePipelines(dev_, VK_NULL_HANDLE, 1, &ci, nullptr, &p);
    vkDestroyShaderModule(dev_, mod, nullptr);
    if (r != VK_SUCCESS) throw Error(std::string("vulkan: the driver could not build shader ") + what + ": " + result_name(r));
    return p;
  }

  // A weight's buffer in device-local memory: mapped when that memory is host-visible (UMA,
  // lavapipe, resizable BAR), else filled through the staging copy (upload()).
  Buffer make_weight_buffer(VkDeviceSize bytes) const {
    if (local_type_ == UINT32_MAX) return make_buffer(bytes);
    const VkMemoryPropertyFlags mapped = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                         VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    if (!force_staging_) {
      try {
        return make_buffer(bytes, mapped, true);
      } catch (const Error&) {
        // No such type, or its heap is full (a 256 MiB BAR window): the unmapped kind below.
      }
    }
    return make_buffer(bytes, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, false);
  }

  // Copies bytes into b: directly when it is mapped, else in chunks through the staging buffer
  // with one transfer each (mu_ held or not yet shared).
  void upload(Buffer& b, const uint8_t* src, uint64_t bytes) const { upload(b, 0, src, bytes); }
  void upload(Buffer& b, VkDeviceSize at, const uint8_t* src, uint64_t bytes) const {
    if (b.map) {
      std::memcpy(static_cast<uint8_t*>(b.map) + at, src, bytes);
      return;
    }
    if (!pending_.empty()) flush_uploads();  // the staging buffer holds their bytes
    ensure(stage_, std::min<uint64_t>(bytes, staging_bytes_));
    for (uint64_t off = 0; off < bytes; off += staging_bytes_) {
      const uint64_t n = std::min<uint64_t>(staging_bytes_, bytes - off);
      std::memcpy(stage_.map, src + off, n);
      VkBufferCopy region{0, at + off, n};
      submit([&] { vkCmdCopyBuffer(cmd_, stage_.buf, b.buf, 1, &region); }, "uploading a weight");
    }
    ++st_.staged_uploads;
  }

  Buffer make_buffer(VkDeviceSize bytes) const {
    return make_buffer(bytes, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, true);
  }

  // A storage buffer in the first memory type with all of `flags` (mapped when `map`).
  Buffer make_buffer(VkDeviceSize bytes, VkMemoryPropertyFlags flags, bool map) const {
    Buffer out;
    // Whole words: the shaders read bytes out of uint words, and a word past the binding's end
    // would be out of bounds (a 34-byte Q8_0 row's last two codes share its last word).
    out.size = std::max<VkDeviceSize>((bytes + 3) / 4 * 4, 16);
    VkBufferCreateInfo bi{};
    bi.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO;
    bi.size = out.size;
    bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    // Two queue families (the hint copies' transfer queue): every buffer is theirs together.
    const uint32_t families[2] = {family_, xfer_family_};
    const bool two = xfer_family_ != family_ && xfer_family_ != UINT32_MAX;
    bi.sharingMode = two ? VK_SHARING_MODE_CONCURRENT : VK_SHARING_MODE_EXCLUSIVE;
    if (two) {
      bi.queueFamilyIndexCount = 2;
      bi.pQueueFamilyIndices = families;
    }
    check(vkCreateBuffer(dev_, &bi, nullptr, &out.buf), "creating a buffer");
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev_, out.buf, &req);
    uint32_t type = UINT32_MAX;
    for (uint32_t i = 0; i < mem_.memoryTypeCount && type == UINT32_MAX; ++i)
      if ((req.memoryTypeBits & (1u << i)) && (mem_.memoryTypes[i].propertyFlags & flags) == flags) type = i;
    if (type == UINT32_MAX) {
      vkDestroyBuffer(dev_, out.buf, nullptr);
      throw Error("vulkan: no memory type for a storage buffer with flags " + std::to_string(flags));
    }
    VkMemoryAllocateInfo ai{};
    ai.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO;
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = type;
    VkResult r = vkAllocateMemory(dev_, &ai, nullptr, &out.mem);
    if (r == VK_SUCCESS) r = vkBindBufferMemory(dev_, out.buf, out.mem, 0);
    if (r == VK_SUCCESS && map) r = vkMapMemory(dev_, out.mem, 0, VK_WHOLE_SIZE, 0, &out.map);
    if (r != VK_SUCCESS) {
      free_buffer(out);
      throw Error("vulkan: allocating " + std::to_string(bytes) + " bytes failed: " + result_name(r));
    }
    if (out.map) std::memset(out.map, 0, out.size);
    return out;
  }

  void free_buffer(Buffer& b) const {
    if (b.map) vkUnmapMemory(dev_, b.mem);
    if (b.buf) vkDestroyBuffer(dev_, b.buf, nullptr);
    if (b.mem) vkFreeMemory(dev_, b.mem, nullptr);
    b = Buffer{};
  }

  // Grows b to hold `bytes` (never shrinks: it is reused by every call).
  void ensure(Buffer& b, VkDeviceSize bytes) const {
    if (b.size >= bytes) return;
    free_buffer(b);
    b = make_buffer(bytes);
  }

  // y[t * ldy + r] = row r (row0 + r of W's geometry) of the weight at `wt` dotted with the
  // activation row acts[t] (W.act() format, `stride` bytes), for r < rows; mu_ held. Tokens go
  // in groups whose activations and outputs each fit the staging buffers. Returns the device's
  // seconds (finish_submit).
  double device_linear(const DeviceWeight& wt, const Weight& W, uint64_t row0, std::span<const uint8_t* const> acts,
                     size_t stride, float* y, size_t ldy, size_t rows, bool round) const {
    const uint64_t limit = io_limit_;
    const uint64_t out_row = (uint64_t)rows * sizeof(float);
    const uint64_t per_group = std::max<uint64_t>(1, std::min(limit / out_row, limit / stride));
    double s = 0;
    for (size_t t0 = 0; t0 < acts.size(); t0 += per_group) {
      const size_t n = (size_t)std::min<uint64_t>(per_group, acts.size() - t0);
      ensure(act_, (VkDeviceSize)n * stride);
      ensure_out();
      for (size_t t = 0; t < n; ++t) std::memcpy(static_cast<uint8_t*>(act_.map) + t * stride, acts[t0 + t], stride);
      Dispatch d{wt, 0, 0, (VkDeviceSize)n * out_row, push_for(wt, W, row0, n, stride, rows, round)};
      d.act_bytes = rows_span(n, stride, stride);
      shape_linear(d, rows, n);
      read_back(0, (VkDeviceSize)n * out_row);
      s = add_seconds(s, dispatch(std::span<const Dispatch>(&d, 1)));
      const float* out = reinterpret_cast<const float*>(rows_out());
      for (size_t t = 0; t < n; ++t) std::memcpy(y + (t0 + t) * ldy, out + t * rows, out_row);
    }
    return s;
  }

  static Push push_for(const DeviceWeight& wt, const Weight& W, uint64_t row0, size_t n, size_t stride, size_t rows,
                       bool round) {
    return Push{(uint32_t)rows, (uint32_t)W.cols, (uint32_t)n, (uint32_t)row0, (uint32_t)W.row_bytes,
                (uint32_t)stride, wt.kind, round ? 1u : 0u, wt.w_off, 0, (uint32_t)rows};
  }
  static uint32_t grid_x(size_t rows) { return (uint32_t)((rows + kGroup - 1) / kGroup); }
  // What a storage binding's offset must be a multiple of.
  VkDeviceSize offset_align() const { return std::max<VkDeviceSize>(4, offset_align_); }
  VkDeviceSize aligned(VkDeviceSize b) const {
    const VkDeviceSize a = offset_align();
    return (b + a - 1) / a * a;
  }
  // The activation and output buffers at their full size, from the first use on, so a deferred
  // batch's bytes never move.
  void ensure_io() const {
    ensure(act_, io_limit_);
    ensure_out();
  }
  // The output buffer at its full size; where it is the card's memory, its mapped mirror too.
  void ensure_out() const {
    if (out_.size >= io_limit_) return;
    free_buffer(out_);
    if (!scratch_local_) {
      out_ = make_buffer(io_limit_);
      return;
    }
    out_ = make_buffer(io_limit_, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, false);
    ensure(back_, io_limit_);
  }
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
  void put_rows(const void* src, size_t bytes) const {
    if (out_.map) std::memcpy(out_.map, src, bytes);
    else upload(out_, 0, static_cast<const uint8_t*>(src), bytes);
  }

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
  bool reads_rows_in_place(const Weight& W, CMat x) const {
    const Region* r = W.device && float_ ? deferred_.source_of(x) : nullptr;
    return r && static_cast<const GpuWeight*>(W.device)->pipe == float_ &&
           (r->off + (VkDeviceSize)(x.p - r->row) * sizeof(float)) % offset_align() == 0;
  }

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
  void shape_linear(Dispatch& d, size_t rows, size_t n) const {
    d.gx = grid_x(rows);
    d.gy = (uint32_t)n;
    if (d.wt.pipe == float_) {  // an invocation per output; from a GEMM tile of tokens on, its GEMM build
      if (n < kGemmTile || !float_mm_) return;
      d.wt.pipe = float_mm_;
      d.gx = (uint32_t)std::min<uint64_t>((rows + kFloatTileRows - 1) / kFloatTileRows, max_groups_x_);
      d.gy = (uint32_t)((n + kFloatTileTokens - 1) / kFloatTileTokens);
      ++st_.gemm_dispatches;
      return;
    }
    const size_t i = (size_t)(std::find(quant_, quant_ + kQuantShaderCount, d.wt.pipe) - quant_);
    if (i == kQuantShaderCount) return;
    if (n >= kGemmTile && quant_mm_[i]) {
      d.wt.pipe = quant_mm_[i];
      d.gx = (uint32_t)std::min<uint64_t>((rows + kGemmRows - 1) / kGemmRows, max_groups_x_);
      d.gy = (uint32_t)((n + kGemmTile - 1) / kGemmTile);
      ++st_.gemm_dispatches;
      return;
    }
    if (!subgroup_) return;
    const uint64_t per = kGroup / info_.subgroup_size;
    d.gx = (uint32_t)std::min<uint64_t>((rows + per - 1) / per, max_groups_x_);
    if (n < kTokenTile) return;
    d.wt.pipe = quant_tiled_[i];
    d.gy = (uint32_t)((n + kTokenTile - 1) / kTokenTile);
  }

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
  bool linear_fits(const Weight& W, CMat x, Mat y) const {
    return W.device && static_cast<const GpuWeight*>(W.device)->b.buf && x.n != 0 && y.width != 0 &&
           (uint64_t)y.width * sizeof(float) <= io_limit_ && activation_bytes(W.act(), (int64_t)W.cols) <= io_limit_;
  }

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
                        bool defer = false) const {
    const uint64_t limit = io_limit_;
    ensure_io();
    double s = 0;
    for (size_t i = 0; i < items.size();) {
      Deferred sub = std::exchange(deferred_, Deferred{});
      const size_t carried = sub.ds.size();
      uint8_t* const abuf = static_cast<uint8_t*>(act_.map);
      VkDeviceSize last_act = 0;  // where the item before (in this submission) reads its codes
      uint32_t last_stage = 1;    // and the stage of its linear
      size_t k = i;
      for (; k < items.size(); ++k) {
        const LinearItem& it = items[k];
        const size_t n = it.tokens();
        const LinearItem* prev = k > i ? &items[k - 1] : nullptr;
        const bool reuse = prev && !it.xf && !prev->xf && n == prev->tokens() && it.stride == prev->stride &&
                           (it.x ? it.x == prev->x && it.x_stride == prev->x_stride && it.W->act() == prev->W->act()
                                 : !prev->x && it.acts.data() == prev->acts.data());
        const bool quantize = it.x && !reuse;
        const Region* from = quantize ? sub.source_of(CMat{it.x, n, it.W->cols, it.x_stride}) : nullptr;
        const size_t cols = it.W->cols;
        // A SwiGLU before the quantizer: on the device when g and u are this submission's, else
        // on the host, once their writers have run (submitted first when they are in this one).
        const bool glu = quantize && it.glu_g;
        bool glu_host = false;
        if (glu && (!from || sub.source_of(CMat{it.glu_u, n, cols, it.x_stride}) != from || swiglu_ == VK_NULL_HANDLE)) {
          if (k > i && sub_writes(sub, CMat{it.x, n, cols, it.x_stride}, CMat{it.glu_u, n, cols, it.x_stride})) break;
          from = nullptr;
          glu_host = true;  // once the item has room below (a retry must not apply it twice)
        }
        const bool glu_device = glu && from;
        const VkDeviceSize wb = glu_device ? aligned((VkDeviceSize)n * sizeof(float)) : 0;
        const VkDeviceSize f = quantize && !from ? aligned((VkDeviceSize)n * cols * sizeof(float)) : 0;
        // A float weight's rows: in a region of this submission, else staged (cols floats a token).
        const Region* rows_at = it.xf ? sub.source_of(CMat{it.xf, n, cols, it.x_stride}) : nullptr;
        const size_t stride = !it.xf ? it.stride : rows_at ? rows_at->stride * sizeof(float) : cols * sizeof(float);
        const VkDeviceSize a = reuse || rows_at ? 0 : aligned((VkDeviceSize)n * stride);
        // The output: a region of the deferred batch laid out as the tensor's rows (a new one, or
        // the one another item writes other columns of), else n rows of its own.
        Region* into = it.tensor ? sub.region_of(it) : nullptr;
        const VkDeviceSize o = into ? 0
                               : aligned((VkDeviceSize)n * (it.tensor ? it.y_step() : it.rows) * sizeof(float));
        if (sub.ds.size() + (quantize ? 2 : 1) + (glu_device ? 1 : 0) > kSets || sub.act_used + wb + f + a > limit ||
            sub.out_used + o > limit)
          break;
        uint32_t stage = reuse ? last_stage : 1;
        if (glu_host) host_glu(it);
        if (glu_device) {  // the routing weights beside the rows' codes, the SwiGLU a stage after g and u
          std::memcpy(abuf + sub.act_used, it.glu_w, n * sizeof(float));
          Region* r = const_cast<Region*>(from);
          Dispatch sw = swiglu_dispatch(*r, CMat{it.x, n, cols, it.x_stride}, CMat{it.glu_u, n, cols, it.x_stride},
                                        it.glu_limit);
          sw.act_off = sub.act_used;
          sw.push.kind = 1;  // the shader's row_weights
          r->stage = sw.stage;
          sub.ds.push_back(sw);
          sub.act_used += wb;
          ++st_.ops_on_device;
        }
        if (quantize) {  // the f32 rows (staged now, or a region of this submission), then their codes after them
          if (!from)
            for (size_t t = 0; t < n; ++t)
              std::memcpy(abuf + sub.act_used + t * cols * sizeof(float), it.x + t * it.x_stride, cols * sizeof(float));
          const uint32_t units = quantize_units(it.W->act(), cols);
          Dispatch q{DeviceWeight{quantizer(it.W->act()), tables_.buf, 0, tables_.size, 0, 0},
                     from ? from->off : sub.act_used, sub.act_used + f, (VkDeviceSize)n * it.stride,
                     Push{units, (uint32_t)cols, (uint32_t)n, from ? (uint32_t)(it.x - from->row) : 0u,
                          (uint32_t)(from ? from->stride : cols), (uint32_t)it.stride, 0, 0, 0},
                     grid_x(units), (uint32_t)n};
          q.quantize = true;
          q.chained = from != nullptr;
          q.act_bytes = from ? rows_span(n, from->stride * sizeof(float), (size_t)(it.x - from->row + cols) * sizeof(float))
                             : rows_span(n, cols * sizeof(float), cols * sizeof(float));
          q.stage = from ? from->stage + 1 : 0;
          if (from) const_cast<Region*>(from)->read = std::max(from->read, q.stage);
          stage = q.stage + 1;
          sub.ds.push_back(q);
          ++st_.inputs_quantized_on_device;
          if (from) ++st_.inputs_chained;
          last_act = sub.act_used + f;
        } else if (rows_at) {
          last_act = rows_at->off + (VkDeviceSize)(it.xf - rows_at->row) * sizeof(float);
          stage = rows_at->stage + 1;
          const_cast<Region*>(rows_at)->read = std::max(rows_at->read, stage);
        } else if (it.xf) {
          for (size_t t = 0; t < n; ++t)
            std::memcpy(abuf + sub.act_used + t * stride, it.xf + t * it.x_stride, cols * sizeof(float));
          last_act = sub.act_used;
        } else if (!reuse) {
          for (size_t t = 0; t < n; ++t) std::memcpy(abuf + sub.act_used + t * it.stride, it.acts[t], it.stride);
          last_act = sub.act_used;
        }
        sub.act_used += f + a;
        Dispatch d{it.wt, last_act, 0, 0, push_for(it.wt, *it.W, it.row0, n, stride, it.rows, it.round)};
        d.chained = rows_at != nullptr;
        d.act_bytes = rows_span(n, stride, it.xf ? cols * sizeof(float) : stride);
        shape_linear(d, it.rows, n);
        d.stage = last_stage = stage;
        if (it.tensor) {
          if (!into) {
            sub.regions.push_back(Region{it.tensor, it.y_row, n, it.y_step(), sub.out_used, 0, 0, {}});
            into = &sub.regions.back();
            sub.out_used += o;
          }
          const size_t c0 = (size_t)(it.y - it.y_row);
          d.out_off = into->off;
          d.out_bytes = (VkDeviceSize)n * into->stride * sizeof(float);
          d.push.y_off = (uint32_t)c0;
          d.push.y_stride = (uint32_t)into->stride;
          into->stage = std::max(into->stage, stage);
          into->cols.emplace_back(c0, it.rows);
          sub.outs.push_back({into->off + c0 * sizeof(float), it.y, n, it.rows, it.y_step(), into->stride, it.tensor});
        } else {
          d.out_off = sub.out_used;
          d.out_bytes = (VkDeviceSize)n * it.rows * sizeof(float);
          sub.outs.push_back({sub.out_used, it.y, n, it.rows, it.y_step(), it.rows, 0});
          sub.out_used += o;
        }
        sub.ds.push_back(d);
      }
      if (k == i) {
        if (carried) {  // the deferred batch leaves no room: it goes first, alone
          s = add_seconds(s, submit_batch(sub, {}));
          continue;
        }
        if (meanwhile) std::exchange(meanwhile, nullptr)();  // alone, in token groups
        const LinearItem& it = items[i];
        if (it.glu_g) host_glu(it);  // what it reads ran in the submissions before
        if (const float* xs = it.x ? it.x : it.xf) {  // too large to share a submission: the host quantizes, as for any such call
          const ActRows r = quantize_rows(it.W->act(), xs, it.x_stride, it.n_x, it.W->cols);
          std::vector<const uint8_t*> rows(it.n_x);
          for (size_t t = 0; t < it.n_x; ++t) rows[t] = r.row(t);
          s = add_seconds(s, device_linear(it.wt, *it.W, it.row0, rows, r.stride, it.y, it.y_step(), it.rows, it.round));
        } else {
          s = add_seconds(s, device_linear(it.wt, *it.W, it.row0, it.acts, it.stride, it.y, it.y_step(), it.rows, it.round));
        }
        ++i;
        continue;
      }
      i = k;
      if (defer && i == items.size() && !meanwhile) {
        deferred_ = std::move(sub);
        break;
      }
      s = add_seconds(s, submit_batch(sub, std::exchange(meanwhile, nullptr)));
    }
    if (meanwhile) meanwhile();
    return s;
  }

  // Records rms_norm on x into the deferred batch (mu_ held): false when x is not the columns of
  // a region the batch's linears write whole, or the batch has no room; the weights go into the
  // activation buffer beside its rows.
  bool defer_rms_norm(Mat x, const float* w, float eps) const {
    if (rms_norm_ == VK_NULL_HANDLE || x.n == 0 || x.width == 0 || deferred_.ds.size() >= kSets) return false;
    Region* r = in_place_region(x);
    const VkDeviceSize wb = aligned((VkDeviceSize)x.width * sizeof(float));
    if (!r || deferred_.act_used + wb > io_limit_) return false;
    std::memcpy(static_cast<uint8_t*>(act_.map) + deferred_.act_used, w, x.width * sizeof(float));
    Dispatch d{DeviceWeight{rms_norm_, act_.buf, deferred_.act_used, wb, 0, 0}, 0, r->off,
               (VkDeviceSize)r->n * r->stride * sizeof(float),
               Push{(uint32_t)x.n, (uint32_t)x.width, (uint32_t)(x.p - r->row), (uint32_t)r->stride,
                    std::bit_cast<uint32_t>(eps), 0, 0, 0, 0},
               (uint32_t)x.n, 1};
    d.stage = std::max(r->stage, r->read) + 1;
    r->stage = d.stage;  // readers of the rows come after it
    deferred_.act_used += wb;
    deferred_.ds.push_back(d);
    ++st_.ops_on_device;
    return true;
  }

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
  double submit_batch(const Deferred& sub, const std::function<void()>& meanwhile) const {
    if (scratch_local_) {  // what the host reads below, and nothing else, crosses to it
      for (const HostStore& h : sub.stores)
        if (h.n) read_back(h.place * sizeof(float), ((h.n - 1) * h.src_stride + h.width) * sizeof(float));
      for (const CopyOut& c : sub.outs)
        if (c.n) read_back(c.off, ((c.n - 1) * c.src_step + c.rows) * sizeof(float));
    }
    double s = 0;
    // The kept rows this batch reads may be given to others once it is on its way (submitted and
    // waited for, or failed).
    struct NextBatch {
      DeviceRows& r;
      ~NextBatch() { r.next_batch(); }
    } next{kv_rows_};
    if (!sub.ds.empty()) s = dispatch(sub.ds, meanwhile);
    else if (!readback_.empty()) submit([] {}, "reading back rows");
    const uint8_t* out = rows_out();
    for (const HostStore& h : sub.stores) {
      const float* src = reinterpret_cast<const float*>(out) + h.place;
      if (h.fp4) {  // the CPU's packing (CpuBackend::store_fp4), so its bits
        const size_t rb = fp4_row_bytes(h.grid, h.width);
        for (size_t t = 0; t < h.n; ++t) fp4_pack_row(h.grid, src + t * h.src_stride, h.width, h.fp4 + t * rb);
        continue;
      }
      for (size_t t = 0; t < h.n; ++t)
        for (size_t k = 0; k < h.width; ++k) h.dst[t * h.dst_stride + k] = f32_to_bf16(src[t * h.src_stride + k]);
    }
    const std::unique_lock<std::mutex> lk = live_->lock();  // no deferred target is freed meanwhile
    for (const CopyOut& c : sub.outs) {
      if (c.tensor && !live_->alive(c.tensor)) continue;
      if (c.step == c.rows && c.src_step == c.rows) {
        std::memcpy(c.y, out + c.off, c.n * c.rows * sizeof(float));
        continue;
      }
      for (size_t t = 0; t < c.n; ++t)
        std::memcpy(c.y + t * c.step, out + c.off + t * c.src_step * sizeof(float), c.rows * sizeof(float));
    }
    return s;
  }

  // Submits the deferred batch, if any (mu_ held).
  void flush_deferred() const {
    if (deferred_.ds.empty() && deferred_.stores.empty() && deferred_.outs.empty()) return;
    const Deferred sub = std::exchange(deferred_, Deferred{});
    (void)submit_batch(sub, {});
  }

  // y lies in a live tensor and the batch writes its floats only within y's columns of its rows.
  bool rewritten_whole(CMat y) const {
    const LiveTensors::Held held = live_->holder(y.p, (y.n - 1) * y.stride + y.width);
    return held.id && (size_t)(y.p - held.start) % y.stride + y.width <= y.stride && rewrites_whole(y, held);
  }
  // True when batch `sub` writes any of a's or b's floats.
  static bool sub_writes(const Deferred& sub, CMat a, CMat b) {
    return std::any_of(sub.outs.begin(), sub.outs.end(), [&](const CopyOut& c) { return c.overlaps(a) || c.overlaps(b); });
  }
  // An item's SwiGLU on the host (LinearItem::glu_g).
  static void host_glu(const LinearItem& it) {
    swiglu_rows(it.glu_g, it.x_stride, it.glu_u, it.x_stride, it.n_x, it.W->cols, it.glu_limit, it.glu_w);
  }

  // True when the deferred batch writes any of m's floats (mu_ held).
  bool deferred_writes(CMat m) const {
    if (m.n == 0 || m.width == 0) return false;
    return std::any_of(deferred_.outs.begin(), deferred_.outs.end(), [&](const CopyOut& c) { return c.overlaps(m); });
  }

  // Records the SwiGLU h = swiglu(g, u) into g in place (mu_ held), like defer_rms_norm: false
  // when g and u are not columns of one region the batch's linears write whole, or the batch has
  // no room. Weight 1 per row (the shared expert).
  bool defer_swiglu(Mat g, CMat u, float limit) const {
    if (swiglu_ == VK_NULL_HANDLE || g.n == 0 || g.width == 0 || deferred_.ds.size() >= kSets) return false;
    Region* r = const_cast<Region*>(deferred_.source_of(g));
    if (!r || deferred_.source_of(u) != r || u.width != g.width) return false;
    deferred_.ds.push_back(swiglu_dispatch(*r, g, u, limit));
    r->stage = deferred_.ds.back().stage;  // readers of h come after it
    ++st_.ops_on_device;
    return true;
  }
  // The swiglu dispatch on g and u, columns of region r's rows, a stage after r's writers.
  Dispatch swiglu_dispatch(const Region& r, CMat g, CMat u, float limit) const {
    Dispatch d{DeviceWeight{swiglu_, exp_consts_.buf, 0, exp_consts_.size, 0, 0}, 0, r.off,
               (VkDeviceSize)r.n * r.stride * sizeof(float),
               Push{(uint32_t)g.n, (uint32_t)g.width, (uint32_t)(g.p - r.row), (uint32_t)r.stride,
                    std::bit_cast<uint32_t>(limit), (uint32_t)(u.p - r.row), 0, 0, 0},
               grid_x(g.width), (uint32_t)g.n};
    d.stage = std::max(r.stage, r.read) + 1;
    d.act_bytes = rows_span(g.n, sizeof(float), sizeof(float));  // the row weights, when the shader reads them
    return d;
  }

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
  bool operand(CMat m, Operand& o) const {
    if (const Region* r = deferred_.source_of(m)) {
      o = Operand{kInOut | out_place(*r, m), (uint32_t)r->stride, r->stage, (int)(r - deferred_.regions.data())};
      return true;
    }
    if (deferred_writes(m)) return false;
    const uint32_t at = stage_rows(m);
    if (at == UINT32_MAX) return false;
    o = Operand{at, (uint32_t)m.width, 0, -1};
    return true;
  }
  // Words (a row op's lists) into the activation buffer after the batch's other inputs (mu_
  // held): the word index of the first, UINT32_MAX when there is no room.
  uint32_t stage_words(std::span<const uint32_t> w) const {
    ensure_io();
    const VkDeviceSize b = aligned((VkDeviceSize)w.size_bytes());
    if (deferred_.act_used + b > io_limit_) return UINT32_MAX;
    std::memcpy(static_cast<uint8_t*>(act_.map) + deferred_.act_used, w.data(), w.size_bytes());
    const uint32_t at = (uint32_t)(deferred_.act_used / sizeof(float));
    deferred_.act_used += b;
    return at;
  }
  // Rows the same way: the float index of the first.
  uint32_t stage_rows(CMat m) const {
    ensure_io();
    const VkDeviceSize b = aligned((VkDeviceSize)m.n * m.width * sizeof(float));
    if (deferred_.act_used + b > io_limit_) return UINT32_MAX;
    uint8_t* const a = static_cast<uint8_t*>(act_.map) + deferred_.act_used;
    for (size_t t = 0; t < m.n; ++t) std::memcpy(a + t * m.width * sizeof(float), m.row(t), m.width * sizeof(float));
    const uint32_t at = (uint32_t)(deferred_.act_used / sizeof(float));
    deferred_.act_used += b;
    return at;
  }
  // A new region for the rows y of a live tensor, copied out to y once the batch has run (mu_
  // held): its index, or -1 when y is in none, the output buffer has no room, or the batch writes
  // some of y in another way than whole columns within y's of the same rows (xin, which each
  // sublayer's collapse writes again: the earlier copy-out comes first and the new region is the
  // one later readers find, source_of; earlier readers keep reading the old one).
  int output_region(Mat y) const {
    const LiveTensors::Held held = live_->holder(y.p, (y.n - 1) * y.stride + y.width);
    if (!held.id) return -1;
    ensure_io();
    const size_t c0 = (size_t)(y.p - held.start) % y.stride;
    const VkDeviceSize o = aligned((VkDeviceSize)y.n * y.stride * sizeof(float));
    if (c0 + y.width > y.stride || !rewrites_whole(y, held) || deferred_.out_used + o > io_limit_) return -1;
    deferred_.regions.push_back(Region{held.id, y.p - c0, y.n, y.stride, deferred_.out_used, 0, 0, {{c0, y.width}}});
    deferred_.outs.push_back({deferred_.out_used + c0 * sizeof(float), y.p, y.n, y.width, y.stride, y.stride, held.id});
    deferred_.out_used += o;
    return (int)deferred_.regions.size() - 1;
  }
  // The region an op rewriting x in place writes: the one holding x whole, unless a store waiting
  // for the batch reads it (it would read the rewritten values).
  Region* in_place_region(CMat x) const {
    Region* r = const_cast<Region*>(deferred_.source_of(x));
    return r && !stored_from((int)(r - deferred_.regions.data())) ? r : nullptr;
  }
  bool stored_from(int region) const {
    return std::any_of(deferred_.stores.begin(), deferred_.stores.end(), [&](const HostStore& h) { return h.region == region; });
  }
  // True when every copy-out of the batch into y's floats lies within y's columns of the same rows
  // of live tensor `held`: y written again whole leaves no older value in it (its copy-out comes
  // later).
  bool rewrites_whole(CMat y, const LiveTensors::Held& held) const {
    const size_t c0 = (size_t)(y.p - held.start) % y.stride;
    const float* const y0 = y.p - c0;  // y's first row's start
    return std::all_of(deferred_.outs.begin(), deferred_.outs.end(), [&](const CopyOut& c) {
      if (!c.overlaps(y)) return true;
      const ptrdiff_t d = c.y - y0;
      return c.tensor == held.id && c.step == y.stride && c.n == y.n && d >= (ptrdiff_t)c0 &&
             (size_t)d + c.rows <= c0 + y.width;
    });
  }
  // The place of y's first float in its region r (in the output buffer).
  static uint32_t out_place(const Region& r, CMat y) { return (uint32_t)(r.off / sizeof(float) + (size_t)(y.p - r.row)); }
  void mark_read(const Operand& o, uint32_t stage) const {
    if (o.region < 0) return;
    Region& r = deferred_.regions[(size_t)o.region];
    r.read = std::max(r.read, stage);
  }
  // What a row op touches, so that its bindings span only that (rows_io.glsl): its staged
  // operands, from `staged` (deferred_.act_used when its recording began) to the batch's end; the
  // floats [in_lo, in_hi) of the output buffer it reads; the bytes it writes there.
  struct RowSpans {
    VkDeviceSize staged = 0;
    uint64_t in_lo = UINT64_MAX, in_hi = 0;
    VkDeviceSize out_off = 0, out_bytes = 0;
  };
  RowSpans row_spans() const { return RowSpans{deferred_.act_used}; }
  static void reads_floats(RowSpans& s, uint64_t lo, uint64_t hi) {
    s.in_lo = std::min(s.in_lo, lo);
    s.in_hi = std::max(s.in_hi, hi);
  }
  // The floats [first, end) of the output buffer that region r spans.
  static std::pair<uint64_t, uint64_t> floats_of(const Region& r) {
    return {r.off / sizeof(float), r.off / sizeof(float) + (uint64_t)r.n * r.stride};
  }
  void reads_region(RowSpans& s, int region) const {
    if (region < 0) return;
    const auto [lo, hi] = floats_of(deferred_.regions[(size_t)region]);
    reads_floats(s, lo, hi);
  }
  void reads(RowSpans& s, const Operand& o) const { reads_region(s, o.region); }
  // A place in the output buffer (kInOut set): the region holding it; false when none does (the
  // op runs on the host).
  bool reads_place(RowSpans& s, uint32_t place) const {
    const uint64_t f = place & ~kInOut;
    for (const Region& r : deferred_.regions) {
      const auto [lo, hi] = floats_of(r);
      if (f >= lo && f < hi) {
        reads_floats(s, lo, hi);
        return true;
      }
    }
    return false;
  }
  static void writes(RowSpans& s, const Region& r) {
    s.out_off = r.off;
    s.out_bytes = (VkDeviceSize)r.n * r.stride * sizeof(float);
  }

  // A row op's dispatch: binding 0 exp_f32's constants (hc_mix's), 1, 2 and 4 what it touches.
  Dispatch row_op(VkPipeline pipe, const std::array<uint32_t, sizeof(Push) / sizeof(uint32_t)>& push, uint32_t gx,
                  uint32_t gy, uint32_t stage, const RowSpans& sp) const {
    Dispatch d{DeviceWeight{pipe, exp_consts_.buf, 0, exp_consts_.size, 0, 0}, 0, 0, 0, std::bit_cast<Push>(push), gx, gy};
    d.stage = stage;
    d.row = true;
    d.act_off = sp.staged;
    d.act_bytes = deferred_.act_used - sp.staged;
    d.out_off = sp.out_off;
    d.out_bytes = (sp.out_bytes + 3) / 4 * 4;
    if (sp.in_hi > sp.in_lo) {
      d.in_off = sp.in_lo * sizeof(float) / offset_align() * offset_align();
      d.in_bytes = sp.in_hi * sizeof(float) - d.in_off;
    }
    d.push.base_staged = (uint32_t)(d.act_off / sizeof(float));
    d.push.base_in = (uint32_t)(d.in_off / sizeof(float));
    d.push.base_out = (uint32_t)(d.out_off / sizeof(float));
    ++st_.ops_on_device;
    return d;
  }

  // A row op writing y into a new region a stage after what its operands wait for (mu_ held): its
  // push constants are `head` then y's place and row stride; false when y gets no region.
  bool defer_row_op(VkPipeline pipe, std::initializer_list<const Operand*> ops, Mat y, std::initializer_list<uint32_t> head,
                    uint32_t gx, RowSpans sp) const {
    const int yr = output_region(y);
    if (yr < 0) return false;
    Region& r = deferred_.regions[(size_t)yr];
    uint32_t stage = 0;
    for (const Operand* o : ops) stage = std::max(stage, o->stage);
    ++stage;
    std::array<uint32_t, sizeof(Push) / sizeof(uint32_t)> push{};
    std::copy(head.begin(), head.end(), push.begin());
    push[head.size()] = out_place(r, y);
    push[head.size() + 1] = (uint32_t)r.stride;
    for (const Operand* o : ops) reads(sp, *o);
    writes(sp, r);
    deferred_.ds.push_back(row_op(pipe, push, gx, (uint32_t)y.n, stage, sp));
    r.stage = stage;
    for (const Operand* o : ops) mark_read(*o, stage);
    return true;
  }

  // y = hc_pre(X, pre) (mu_ held); two descriptor sets are kept free for hc_pre_norm's norm.
  bool defer_hc_pre(CMat X, CMat pre, uint32_t hc, Mat y) const {
    const size_t H = y.width, n = y.n;
    if (hc_pre_ == VK_NULL_HANDLE || n == 0 || H == 0 || hc == 0 || X.n != n || pre.n != n || X.width != hc * H ||
        pre.width < hc || deferred_.ds.size() + 2 > kSets)
      return false;
    const RowSpans sp = row_spans();
    Operand x, w;
    if (!operand(X, x) || !operand(pre.cols(0, hc), w)) return false;
    return defer_row_op(hc_pre_, {&x, &w}, y, {(uint32_t)n, (uint32_t)H, hc, x.at, x.stride, w.at, w.stride}, grid_x(H), sp);
  }

  // Y = hc_post(F, X, mixes) (mu_ held).
  bool defer_hc_post(CMat F, CMat X, CMat mixes, uint32_t hc, Mat Y) const {
    const size_t H = F.width, n = Y.n, nmix = hc_mix_width(hc);
    if (hc_post_ == VK_NULL_HANDLE || n == 0 || H == 0 || hc == 0 || F.n != n || X.n != n || mixes.n != n ||
        X.width != hc * H || Y.width != hc * H || mixes.width < nmix || deferred_.ds.size() + 1 > kSets)
      return false;
    const RowSpans sp = row_spans();
    Operand f, x, m;
    if (!operand(F, f) || !operand(X, x) || !operand(mixes.cols(0, nmix), m)) return false;
    return defer_row_op(hc_post_, {&f, &x, &m}, Y,
                        {(uint32_t)n, (uint32_t)H, hc, f.at, f.stride, x.at, x.stride, m.at, m.stride}, grid_x(H), sp);
  }

  // mixes = hc_mix(X) (mu_ held): the projections by the linear_float shader (the CPU's linear,
  // unrounded) into rows of no tensor, then hc_mix.comp a stage after. The projection weight must
  // be a float format on the device (the published model's is F16).
  bool defer_hc_mix(const Weight& fn, const float* base, const float* scale, HcParams p, CMat X, Mat mixes) const {
    const size_t n = X.n, nmix = fn.rows;
    if (hc_mix_ == VK_NULL_HANDLE || n == 0 || p.hc == 0 || p.hc > 8 || nmix != hc_mix_width(p.hc) || mixes.n != n ||
        mixes.width < nmix || X.width != fn.cols || !linear_fits(fn, X, mixes) ||
        static_cast<const GpuWeight*>(fn.device)->pipe != float_ || deferred_.ds.size() + 2 > kSets)
      return false;
    const GpuWeight& gw = *static_cast<const GpuWeight*>(fn.device);
    RowSpans sp = row_spans();
    Operand x;
    if (!operand(X, x)) return false;
    // The linear binds X's rows at an offset: a region's must suit one (a whole tensor's rows do).
    const VkDeviceSize x_off = (VkDeviceSize)(x.at & ~kInOut) * sizeof(float);
    if (x_off % offset_align() != 0) return false;
    std::vector<float> prm(base, base + nmix);
    prm.insert(prm.end(), scale, scale + 3);
    prm.push_back(p.hc_eps);
    prm.push_back(p.norm_eps);
    const uint32_t pa = stage_rows(CMat{prm.data(), 1, prm.size(), prm.size()});
    const VkDeviceSize rb = aligned((VkDeviceSize)n * nmix * sizeof(float)), raw_off = deferred_.out_used;
    if (pa == UINT32_MAX || raw_off + rb > io_limit_) return false;
    deferred_.out_used += rb;
    const int mr = output_region(mixes.cols(0, nmix));
    if (mr < 0) return false;
    const DeviceWeight wt{float_, gw.b.buf, 0, gw.b.size, gw.kind, gw.w_off};
    Dispatch lin{wt, x_off, raw_off, rb, push_for(wt, fn, 0, n, (size_t)x.stride * sizeof(float), nmix, false)};
    lin.chained = x.region >= 0;
    lin.act_bytes = rows_span(n, (size_t)x.stride * sizeof(float), X.width * sizeof(float));
    shape_linear(lin, nmix, n);
    lin.stage = x.stage + 1;
    deferred_.ds.push_back(lin);
    ++st_.linear_on_device;
    Region& r = deferred_.regions[(size_t)mr];
    const uint32_t stage = lin.stage + 1;
    reads(sp, x);
    reads_floats(sp, raw_off / sizeof(float), (raw_off + rb) / sizeof(float));
    writes(sp, r);
    deferred_.ds.push_back(row_op(hc_mix_,
                                  {(uint32_t)n, (uint32_t)X.width, p.hc, p.sinkhorn_iters, kInOut | (uint32_t)(raw_off / sizeof(float)),
                                   (uint32_t)nmix, x.at, x.stride, pa, out_place(r, mixes), (uint32_t)r.stride},
                                  (uint32_t)((n + kGroup - 1) / kGroup), 1, stage, sp));
    r.stage = stage;
    mark_read(x, stage);
    return true;
  }

  // X = engram_gate(X, kv) (mu_ held): in place on the region holding X, else X staged and a new
  // region for it; the norms' weights, the mask and the scalars staged beside.
  // With `gates` (tests: gpu_engram_gates) the gates alone go there, [n][hc], and X is left as it is.
  bool defer_engram_gate(Mat X, uint32_t hc, CMat kv, const float* q_norm, const float* k_norm, float eps,
                         const uint8_t* masked, Mat gates = {}) const {
    const size_t n = X.n, H = hc ? X.width / hc : 0;
    if (engram_gate_ == VK_NULL_HANDLE || n == 0 || H == 0 || X.width != hc * H || kv.n != n || kv.width < (hc + 1) * H ||
        deferred_.ds.size() + 1 > kSets)
      return false;
    RowSpans sp = row_spans();
    Operand x, k;
    if (!operand(X, x) || !operand(kv.cols(0, (hc + 1) * H), k)) return false;
    std::vector<float> prm;
    prm.reserve(3 + 2 * hc * H + n);
    prm.push_back((float)(1.0 / std::sqrt((double)H)));  // the CPU's inv_sqrt_h
    prm.push_back(eps);
    prm.push_back(masked ? 1.0f : 0.0f);
    prm.insert(prm.end(), q_norm, q_norm + hc * H);
    prm.insert(prm.end(), k_norm, k_norm + hc * H);
    for (size_t i = 0; i < n; ++i) prm.push_back(masked && masked[i] ? 1.0f : 0.0f);
    const uint32_t pa = stage_rows(CMat{prm.data(), 1, prm.size(), prm.size()});
    if (pa == UINT32_MAX) return false;
    // In place on its region (a stage after its last reader), or a new one.
    int yr = gates.p ? output_region(gates) : x.region >= 0 && !stored_from(x.region) ? x.region : -1;
    if (yr < 0 && (yr = output_region(X)) < 0) return false;
    Region& r = deferred_.regions[(size_t)yr];
    const uint32_t stage = std::max({x.stage, k.stage, r.read}) + 1;
    reads(sp, x);
    reads(sp, k);
    writes(sp, r);
    deferred_.ds.push_back(row_op(engram_gate_,
                                  {(uint32_t)n, (uint32_t)H, hc, x.at, x.stride, k.at, k.stride, pa,
                                   gates.p ? out_place(r, gates) : out_place(r, X), (uint32_t)r.stride, gates.p ? 1u : 0u},
                                  hc, (uint32_t)n, stage, sp));
    r.stage = stage;
    mark_read(k, stage);
    return true;
  }

  // out = add_round(a, b) (mu_ held), when the batch holds a or b: the other staged, a new region.
  bool defer_add_round(CMat a, CMat b, Mat out) const {
    const size_t n = out.n, w = out.width;
    if (add_round_ == VK_NULL_HANDLE || n == 0 || w == 0 || a.n != n || b.n != n || a.width != w || b.width != w ||
        (!deferred_.source_of(a) && !deferred_.source_of(b)) || deferred_.ds.size() + 1 > kSets)
      return false;
    const RowSpans sp = row_spans();
    Operand oa, ob;
    if (!operand(a, oa) || !operand(b, ob)) return false;
    return defer_row_op(add_round_, {&oa, &ob}, out, {(uint32_t)n, (uint32_t)w, oa.at, oa.stride, ob.at, ob.stride},
                        grid_x(w), sp);
  }

  // compress_pool (mu_ held): the groups the chunk completes pooled into a new region of latents'
  // rows, each group's members listed for the shader (a row of k and g, or the carry's slot for a
  // member before p0). The carry's new slots are rows of k and g: copied out with the batch where
  // the batch writes them, else now (the shader reads the old carry staged).
  // With `unrounded` (tests: gpu_compress_pool_unrounded) the latents are the pooled f32 values.
  bool defer_compress_pool(CMat k, CMat g, uint32_t ratio, uint32_t p0, float* carry_k, float* carry_s, Mat latents,
                           std::vector<uint32_t>& groups, bool unrounded = false) const {
    const size_t n = k.n, hd = k.width;
    if (compress_ == VK_NULL_HANDLE || n == 0 || hd == 0 || ratio == 0 || (ratio > 1 && (g.n != n || g.width != hd)) ||
        latents.width != hd || deferred_.ds.size() + 1 > kSets)
      return false;
    const size_t cw = (size_t)(ratio - 1) * hd;  // floats of each carry
    // A carry the batch still writes (a second chunk of the sequence in one batch) is not staged.
    if (ratio > 1 && (deferred_writes(CMat{carry_k, 1, cw, cw}) || deferred_writes(CMat{carry_s, 1, cw, cw})))
      return false;
    RowSpans sp = row_spans();
    Operand ko, go;
    if (!operand(k, ko) || (ratio > 1 && !operand(g, go))) return false;
    std::vector<uint32_t> done;  // the chunk's rows completing a group
    bool reads_carry = false;
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t t = p0 + i;
      if (ratio > 1 && t % ratio + 1 < ratio) continue;
      done.push_back(i);
      reads_carry = reads_carry || i + 1 < ratio;
    }
    const uint32_t G = (uint32_t)done.size();
    if (G > latents.n) return false;
    uint32_t ck = 0, cs = 0;
    if (reads_carry) {
      ck = stage_rows(CMat{carry_k, 1, cw, cw});
      cs = stage_rows(CMat{carry_s, 1, cw, cw});
      if (ck == UINT32_MAX || cs == UINT32_MAX) return false;
    }
    // Per group, per member in position order: (k place, s place).
    std::vector<uint32_t> members;
    members.reserve((size_t)G * 2 * ratio);
    for (const uint32_t i : done)
      for (uint32_t a = 0; a < ratio; ++a) {
        const bool carried = i + a + 1 < ratio;  // position p0 + i - (ratio - 1) + a is before p0
        const uint32_t row = i + a + 1 - ratio;
        members.push_back(carried ? ck + a * (uint32_t)hd : ko.at + row * ko.stride);
        members.push_back(ratio == 1 ? 0u : carried ? cs + a * (uint32_t)hd : go.at + row * go.stride);
      }
    const uint32_t m_at = G ? stage_words(members) : 0;
    if (m_at == UINT32_MAX) return false;
    // The open group's members become the carry (the latest row of each slot).
    std::vector<int64_t> last(ratio > 1 ? ratio - 1 : 0, -1);
    for (uint32_t i = 0; i < n && ratio > 1; ++i)
      if ((p0 + i) % ratio + 1 < ratio) last[(p0 + i) % ratio] = i;
    if (G) {
      const int yr = output_region(latents.rows(0, G));
      if (yr < 0) return false;
      Region& r = deferred_.regions[(size_t)yr];
      const uint32_t stage = std::max(ko.stage, go.stage) + 1;
      reads(sp, ko);
      reads(sp, go);
      writes(sp, r);
      deferred_.ds.push_back(row_op(compress_, {G, (uint32_t)hd, ratio, m_at, out_place(r, latents), (uint32_t)r.stride, unrounded ? 1u : 0u},
                                    grid_x(hd), G, stage, sp));
      r.stage = stage;
      mark_read(ko, stage);
      mark_read(go, stage);
    }
    for (uint32_t j = 0; j < last.size(); ++j) {
      if (last[j] < 0) continue;
      const uint32_t i = (uint32_t)last[j];
      for (const auto& [o, src, dst] : {std::tuple{ko, k, carry_k}, std::tuple{go, g, carry_s}}) {
        float* const d = dst + (size_t)j * hd;
        if (o.region < 0) {
          std::memcpy(d, src.row(i), hd * sizeof(float));
          continue;
        }
        const uint32_t place = (o.at & ~kInOut) + i * o.stride;
        deferred_.outs.push_back({(VkDeviceSize)place * sizeof(float), d, 1, hd, hd, hd, 0});
      }
    }
    groups.clear();
    for (const uint32_t i : done) groups.push_back((p0 + i) / ratio);
    return true;
  }

  // fake_quant on x in place (mu_ held): x must be columns of a region the batch writes whole, in
  // whole blocks of its grid.
  bool defer_fake_quant(Mat x, FakeQuant kind) const {
    const size_t block = kind == FakeQuant::Nvfp4 ? 16 : 32;
    if (fake_quant_ == VK_NULL_HANDLE || x.n == 0 || x.width == 0 || x.width % block != 0 || deferred_.ds.size() + 1 > kSets)
      return false;
    Region* r = in_place_region(x);
    if (!r) return false;
    const uint32_t stage = std::max(r->stage, r->read) + 1;
    const uint32_t k = kind == FakeQuant::Fp8Window ? 0u : kind == FakeQuant::Nvfp4 ? 1u : 2u;
    RowSpans sp = row_spans();
    writes(sp, *r);  // its binding 2 is the region: x's place counted from the region's start
    deferred_.ds.push_back(row_op(fake_quant_,
                                  {(uint32_t)x.n, (uint32_t)x.width, (uint32_t)(x.p - r->row), (uint32_t)r->stride, k},
                                  (uint32_t)((x.width / block + kGroup - 1) / kGroup), (uint32_t)x.n, stage, sp));
    r->stage = stage;
    return true;
  }

  // RoPE on x in place (mu_ held): x must be columns of a region the batch writes whole; the
  // angles' cos and sin per token go in the activation buffer (rope_angles, the CPU's floats).
  bool defer_rope(Mat x, uint32_t head_dim, RopeTable t, std::span<const uint64_t> pos, bool inverse) const {
    const size_t n = x.n, half = t.pairs;
    if (rope_ == VK_NULL_HANDLE || n == 0 || half == 0 || head_dim == 0 || x.width % head_dim != 0 || 2 * half > head_dim ||
        pos.size() < n || deferred_.ds.size() + 1 > kSets)
      return false;
    Region* r = in_place_region(x);
    if (!r) return false;
    RowSpans sp = row_spans();
    const std::span<const double> freqs(t.freqs, t.pairs);
    std::vector<float> tab(n * 2 * half);
    for (size_t i = 0; i < n; ++i) {
      const RopeAngles a = rope_angles(freqs, pos[i]);
      std::copy(a.cos.begin(), a.cos.end(), tab.begin() + (ptrdiff_t)(i * 2 * half));
      std::copy(a.sin.begin(), a.sin.end(), tab.begin() + (ptrdiff_t)(i * 2 * half + half));
    }
    const uint32_t at = stage_rows(CMat{tab.data(), 1, tab.size(), tab.size()});
    if (at == UINT32_MAX) return false;
    const uint32_t heads = (uint32_t)(x.width / head_dim), stage = std::max(r->stage, r->read) + 1;
    writes(sp, *r);
    deferred_.ds.push_back(row_op(rope_,
                                  {(uint32_t)n, (uint32_t)half, head_dim, heads, out_place(*r, x), (uint32_t)r->stride, at,
                                   inverse ? 1u : 0u},
                                  (uint32_t)((heads * half + kGroup - 1) / kGroup), (uint32_t)n, stage, sp));
    r->stage = stage;
    return true;
  }

  // sparse_attention of one or more sequences' chunks as one op (mu_ held): their queries and
  // outputs must be consecutive rows (a batch's parts, in order) with the same heads and sinks.
  // The rows per query, as CpuBackend::sparse_attention lists them: the window's ascending, then
  // the selected compressed rows below the query's visible count, ascending, these unpacked to
  // BF16 (the cached values) once per chunk.
  bool defer_sparse_attention(std::span<const SparseAttention> as, std::span<const Mat> outs) const {
    if (attention_ == VK_NULL_HANDLE || as.empty() || as.size() != outs.size()) return false;
    const SparseAttention& a0 = as[0];
    size_t n_all = 0;
    for (size_t k = 0; k < as.size(); ++k) {
      const SparseAttention& a = as[k];
      if (a.q.n == 0 || outs[k].n != a.q.n || a.heads != a0.heads || a.head_dim != a0.head_dim || a.sinks != a0.sinks ||
          a.q.p != a0.q.p + n_all * a0.q.stride || a.q.stride != a0.q.stride || a.q.width != a0.q.width ||
          outs[k].p != outs[0].p + n_all * outs[0].stride || outs[k].stride != outs[0].stride || outs[k].width != outs[0].width)
        return false;
      n_all += a.q.n;
    }
    const uint32_t hd = a0.head_dim;
    std::vector<const uint16_t*> rows;            // distinct rows, in first-use order (null: a compressed one)
    std::vector<const uint8_t*> packed;           // a compressed row's bytes, by its index in rows (else null)
    std::vector<Fp4Grid> grids;                   // and its grid
    std::vector<KeptRow> kept;                    // what names each row among the kept ones (DeviceRows)
    std::vector<std::vector<uint32_t>> lists(n_all);  // per query, indices into rows
    uint32_t after = 0;              // the stage after which the batch's rows read here are written
    std::vector<int> read;           // and their regions
    size_t q0 = 0;                   // the part's first query among all
    for (const SparseAttention& a : as) {
      const uint32_t n = (uint32_t)a.q.n, W = a.window.window;
      std::map<const uint16_t*, uint32_t> window_ids;
      std::map<int32_t, uint32_t> comp_ids;
      for (uint32_t i = 0; i < n; ++i) {
        std::vector<uint32_t>& list = lists[q0 + i];
        const uint32_t t = a.p0 + i;
        for (uint32_t p = t + 1 > W ? t + 1 - W : 0; p <= t; ++p) {
          const uint16_t* r = a.window.row(p);
          // A row a store_bf16 of this batch will write (the chunk's new window rows): read where
          // the batch holds it (its values are BF16 already, so the same).
          if (const HostStore* h = pending_store(r)) {
            const size_t j = (size_t)(r - h->dst) / h->dst_stride;
            list.push_back(kInOut | (uint32_t)(h->place + j * h->src_stride));
            after = std::max(after, deferred_.regions[(size_t)h->region].stage);
            read.push_back(h->region);
            continue;
          }
          auto [it, fresh] = window_ids.emplace(r, (uint32_t)rows.size());
          if (fresh) {
            rows.push_back(r);
            packed.push_back(nullptr);
            grids.push_back(a.comp.grid);
            kept.push_back({reinterpret_cast<const uint8_t*>(r), (uint32_t)hd * 2, kRawRow});
          }
          list.push_back(it->second);
        }
        if (!a.sel) continue;
        const uint32_t n_vis = (t + 1) / a.comp_ratio;
        for (int32_t g : (*a.sel)[i]) {
          if ((uint32_t)g >= n_vis) continue;
          auto [it, fresh] = comp_ids.emplace(g, (uint32_t)rows.size());
          if (fresh) {
            const uint8_t* b = a.comp.row((uint32_t)g);
            // A compressed row a store_fp4 of this batch writes (a KV source's fresh rows) is read on the host.
            if (std::any_of(deferred_.stores.begin(), deferred_.stores.end(),
                            [&](const HostStore& h) { return h.fp4 && h.writes(b, a.comp.row_bytes()); }))
              return false;
            rows.push_back(nullptr);
            packed.push_back(b);
            grids.push_back(a.comp.grid);
            // Kept packed where the shader unpacks them (NVFP4, the compressed rows' grid): a
            // quarter of the bytes to copy and to hold, and nothing for the host to unpack.
            kept.push_back({b, (uint32_t)a.comp.row_bytes(), 1u + (uint32_t)a.comp.grid, a.comp.grid == Fp4Grid::Nvfp4});
          }
          list.push_back(it->second);
        }
      }
      q0 += n;
    }
    const CMat q{a0.q.p, n_all, a0.q.width, a0.q.stride};
    const Mat o{outs[0].p, n_all, outs[0].width, outs[0].stride};
    const size_t at = deferred_.ds.size();
    if (!defer_attention(q, a0.heads, hd, a0.sinks, o, rows, [&](uint32_t i) -> const std::vector<uint32_t>& { return lists[i]; },
                         after, [&](uint32_t k, uint16_t* dst) {
                           if (packed[k]) fp4_unpacker()(grids[k], packed[k], hd, dst);
                           else std::memcpy(dst, rows[k], hd * sizeof(uint16_t));
                         }, kept))
      return false;
    const uint32_t stage = deferred_.ds[at].stage;
    for (const int r : read) deferred_.regions[(size_t)r].read = std::max(deferred_.regions[(size_t)r].read, stage);
    return true;
  }

  // index_select with the scores on the device (mu_ held): the queries in groups whose staged
  // rows and scores fit the staging buffers, each recorded into the deferred batch
  // (defer_index_scores) and submitted with it; where the batch has no room or a pending store
  // writes keys, it is submitted first and the group runs alone. The candidate blocks and the
  // top-k are the CPU's, from the scores. False (nothing done) where the device does not score:
  // no shader, GpuIndexer says not here, a head_dim it cannot hold, keys that do not fit.
  // With `raw` (tests: gpu_index_scores) the scores are also kept there, [n][n_vis of the last
  // query], a query's keys past its own n_vis 0.
  bool device_index_select(const IndexSelect& a, std::vector<std::vector<uint8_t>>& cand,
                           std::vector<std::vector<int32_t>>& sel, std::vector<float>* raw = nullptr) const {
    const uint32_t n = (uint32_t)a.q.n, heads = a.heads, hd = a.head_dim;
    if (index_scores_ == VK_NULL_HANDLE || indexer_ == GpuIndexer::Cpu || n == 0 || heads == 0 || hd == 0 ||
        hd % 32 != 0 || hd > kIndexMaxDim || a.ratio == 0 || a.keys.grid != Fp4Grid::Mxfp4 ||
        a.q.width < (size_t)heads * hd || a.w.n != n || a.w.width < heads || (a.candidate_consumer && a.block == 0) ||
        ((a.candidate_source || a.candidate_consumer) && cand.size() < n))
      return false;
    const uint32_t n_vis_max = (a.p0 + n) / a.ratio;
    if (n_vis_max == 0) return false;  // nothing to score: the CPU's empty selections
    if (indexer_ == GpuIndexer::Auto &&
        (info_.kind == "cpu" || (uint64_t)n * n_vis_max * heads * hd < kIndexDeviceMacs))
      return false;
    const uint32_t units = a.candidate_consumer ? (n_vis_max + a.block - 1) / a.block : 0;
    // What one group stages (the keys, the shape, per query its queries, weights and kept blocks,
    // each part aligned) and writes (its scores) must fit the empty staging buffers.
    const VkDeviceSize keys = aligned((VkDeviceSize)n_vis_max * fp4_row_bytes(Fp4Grid::Mxfp4, hd));
    const VkDeviceSize per_query = ((VkDeviceSize)heads * hd + heads + units) * 4, fixed = keys + 5 * offset_align();
    const VkDeviceSize scores_row = (VkDeviceSize)n_vis_max * sizeof(float);
    ensure_io();
    if (fixed + per_query > io_limit_ || scores_row + offset_align() > io_limit_ || (n_vis_max + 63) / 64 > max_groups_x_)
      return false;
    const uint32_t group = (uint32_t)std::min<VkDeviceSize>(
        {n, (io_limit_ - fixed) / per_query, (io_limit_ - offset_align()) / scores_row});
    std::vector<float> scores;
    sel.assign(n, {});
    if (raw) raw->assign((size_t)n * n_vis_max, 0.0f);
    for (uint32_t g0 = 0; g0 < n; g0 += group) {
      const uint32_t gn = std::min(group, n - g0);
      VkDeviceSize at = 0;
      if (!defer_index_scores(a, cand, g0, gn, n_vis_max, at)) {
        flush_deferred();
        if (!defer_index_scores(a, cand, g0, gn, n_vis_max, at)) {
          if (g0 == 0) return false;
          throw Error("vulkan: the indexer's queries " + std::to_string(g0) + ".. did not fit the staging buffers");
        }
      }
      flush_deferred();
      ++st_.index_on_device;
      const float* const out = reinterpret_cast<const float*>(rows_out() + at);
      for (uint32_t t = 0; t < gn; ++t) {
        const uint32_t i = g0 + t, n_vis = (a.p0 + i + 1) / a.ratio;
        scores.assign(out + (size_t)t * n_vis_max, out + (size_t)t * n_vis_max + n_vis);
        if (raw) std::copy(scores.begin(), scores.end(), raw->begin() + (ptrdiff_t)i * n_vis_max);
        if (a.candidate_source) cand[i] = candidate_blocks(scores, n_vis, a.block, a.keep_blocks);
        sel[i] = topk_ascending(scores, a.topk);
      }
    }
    return true;
  }

  // Records index_scores.comp for queries [g0, g0 + gn) into the deferred batch (mu_ held): the
  // queries and head weights read where the batch writes them or staged, the keys staged packed,
  // or where a pending store_fp4 will pack them from rows the batch holds, read there (the
  // shader puts them on the grid as the store will); the scores into rows of no tensor at `at`
  // of the output buffer, [gn][n_vis_max], read back with the batch. False when something does
  // not fit (what it staged meanwhile is left unused).
  bool defer_index_scores(const IndexSelect& a, const std::vector<std::vector<uint8_t>>& cand, uint32_t g0, uint32_t gn,
                          uint32_t n_vis_max, VkDeviceSize& at) const {
    const uint32_t heads = a.heads, hd = a.head_dim;
    const size_t rb = fp4_row_bytes(Fp4Grid::Mxfp4, hd);
    if (deferred_.ds.size() + 1 > kSets) return false;
    const uint32_t first = std::min(a.keys.first, n_vis_max);
    RowSpans sp = row_spans();
    // Keys a pending store writes: per key, the place of its f32 row (kInOut | place) or ~0u.
    std::vector<uint32_t> pend;
    uint32_t after = 0;
    std::vector<int> read;
    for (const HostStore& h : deferred_.stores) {
      if (!h.fp4 || !((first && h.writes(a.keys.row(0), first * rb)) ||
                      (n_vis_max > first && h.writes(a.keys.row(first), (n_vis_max - first) * rb))))
        continue;
      if (h.grid != Fp4Grid::Mxfp4 || h.width != hd) return false;  // not rows of these keys' shape
      if (pend.empty()) pend.assign(n_vis_max, 0xffffffffu);
      // The visible keys are two runs of packed rows (from row 0 and from row `first`); the
      // store's rows meet each run in one range of keys, found by arithmetic on the addresses.
      const uintptr_t s0 = reinterpret_cast<uintptr_t>(h.fp4), s1 = s0 + h.n * rb;
      for (const auto& [j0, j1] : {std::pair<uint32_t, uint32_t>{0, first}, {first, n_vis_max}}) {
        if (j1 <= j0) continue;
        const uintptr_t b0 = reinterpret_cast<uintptr_t>(a.keys.row(j0)), b1 = b0 + (uintptr_t)(j1 - j0) * rb;
        const uintptr_t lo = std::max(b0, s0), hi = std::min(b1, s1);
        if (lo >= hi) continue;
        if ((b0 > s0 ? b0 - s0 : s0 - b0) % rb != 0) return false;  // straddles rows: not worked out here
        for (uint32_t j = j0 + (uint32_t)((lo - b0) / rb), end = j0 + (uint32_t)((hi - b0) / rb); j < end; ++j)
          pend[j] = kInOut | (uint32_t)(h.place + (b0 + (uintptr_t)(j - j0) * rb - s0) / rb * h.src_stride);
      }
      after = std::max(after, deferred_.regions[(size_t)h.region].stage);
      read.push_back(h.region);
    }
    const VkDeviceSize out_bytes = aligned((VkDeviceSize)gn * n_vis_max * sizeof(float));
    if (deferred_.out_used + out_bytes > io_limit_) return false;
    Operand q, w;
    if (!operand(CMat{a.q.row(g0), gn, (size_t)heads * hd, a.q.stride}, q) ||
        !operand(CMat{a.w.row(g0), gn, heads, a.w.stride}, w))
      return false;
    const uint32_t units = a.candidate_consumer ? (n_vis_max + a.block - 1) / a.block : 0;
    const uint32_t pend_at = pend.empty() ? 0xffffffffu : stage_words(pend);
    if (pend_at == UINT32_MAX && !pend.empty()) return false;
    const std::array<uint32_t, 8> shape = {a.p0 + g0, a.ratio, a.candidate_consumer ? a.block : 1u, units,
                                           std::bit_cast<uint32_t>(a.denom), heads, hd, pend_at};
    const uint32_t h_at = stage_words(shape);
    uint32_t m_at = 0xffffffffu;
    if (a.candidate_consumer) {
      std::vector<uint32_t> m((size_t)gn * units, 0);
      for (uint32_t t = 0; t < gn; ++t) {
        const std::vector<uint8_t>& keep = cand[g0 + t];
        for (uint32_t u = 0; u < units && u < keep.size(); ++u) m[(size_t)t * units + u] = keep[u] ? 1u : 0u;
      }
      m_at = stage_words(m);
      if (m_at == UINT32_MAX) return false;
    }
    const VkDeviceSize kb = aligned((VkDeviceSize)n_vis_max * rb);
    if (h_at == UINT32_MAX || deferred_.act_used + kb > io_limit_) return false;
    const VkDeviceSize k_at = deferred_.act_used;
    uint8_t* const keys = static_cast<uint8_t*>(act_.map) + k_at;
    if (first) std::memcpy(keys, a.keys.row(0), first * rb);
    if (n_vis_max > first) std::memcpy(keys + first * rb, a.keys.row(first), (n_vis_max - first) * rb);
    deferred_.act_used += kb;
    at = deferred_.out_used;
    deferred_.out_used += out_bytes;
    const uint32_t stage = std::max({q.stage, w.stage, after}) + 1;
    for (const int r : read) {
      deferred_.regions[(size_t)r].read = std::max(deferred_.regions[(size_t)r].read, stage);
      reads_region(sp, r);
    }
    reads(sp, q);
    reads(sp, w);
    sp.out_off = at;
    sp.out_bytes = out_bytes;
    deferred_.ds.push_back(row_op(index_scores_,
                                  {gn, h_at, q.at, q.stride, w.at, w.stride, (uint32_t)k_at, (uint32_t)rb, m_at,
                                   (uint32_t)(at / sizeof(float)), n_vis_max},
                                  (n_vis_max + 63) / 64, gn, stage, sp));
    mark_read(q, stage);
    mark_read(w, stage);
    read_back(at, out_bytes);
    return true;
  }

  // The store_bf16 of the deferred batch that will write row r (its start), if any.
  const HostStore* pending_store(const uint16_t* r) const {
    for (const HostStore& h : deferred_.stores) {
      if (h.fp4 || r < h.dst || r >= h.dst + h.n * h.dst_stride) continue;
      const size_t off = (size_t)(r - h.dst);
      if (off % h.dst_stride == 0) return &h;
    }
    return nullptr;
  }

  // Row k of an attention, in a slot of the rows the device keeps (mu_ held): true with its
  // slot, its BF16 values (`fill`, else a copy of rows[k]; a packed row its bytes) staged for a
  // copy into the slot at the head of the next submission when the slot does not hold them yet. False where the device
  // keeps no rows (or none of this width: the first attention sets it) or the batch being
  // recorded reads every slot already: the row is staged with the batch.
  bool keep_row(const KeptRow& r, uint32_t hd, uint32_t k, const std::function<void(uint32_t, uint16_t*)>& fill,
                std::span<const uint16_t* const> rows, uint32_t& slot) const {
    if (!kv_.buf) return false;
    const VkDeviceSize bytes = (VkDeviceSize)hd * sizeof(uint16_t);
    if (kv_hd_ == 0 && bytes <= staging_bytes_ && kv_.size / bytes > 0) {
      kv_hd_ = hd;
      kv_rows_ = DeviceRows(kv_.size / bytes, bytes);
      st_.kv_slots = kv_rows_.slots();
      st_.kv_host_bytes = kv_rows_.host_bytes();
    }
    DeviceRows::Found f;
    if (hd != kv_hd_ || !kv_rows_.find({r.p, r.bytes}, r.tag, f)) {
      ++st_.kv_staged;
      return false;
    }
    slot = f.slot;
    if (f.hit) {
      ++st_.kv_hits;
      return true;
    }
    const VkDeviceSize up = r.packed ? r.bytes : bytes;
    stage_copy(kv_.buf, (VkDeviceSize)slot * bytes, up, [&](uint8_t* dst) {
      if (r.packed)
        std::memcpy(dst, r.p, r.bytes);
      else if (fill)
        fill(k, reinterpret_cast<uint16_t*>(dst));
      else
        std::memcpy(dst, rows[k], bytes);
    });
    kv_pending_.push_back(slot);
    ++st_.kv_misses;
    st_.kv_upload_bytes += up;
    return true;
  }

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
                       std::span<const KeptRow> kept = {}) const {
    const size_t n = q.n;
    if (attention_ == VK_NULL_HANDLE || n == 0 || heads == 0 || hd == 0 || hd % 2 != 0 || o.n != n ||
        q.width != (size_t)heads * hd || o.width != q.width || deferred_.ds.size() + 1 > kSets)
      return false;
    size_t ids = 0;
    uint32_t in_lo = UINT32_MAX, in_hi = 0;  // the rows it reads in the output buffer: their lowest and highest places
    for (uint32_t i = 0; i < n; ++i) {
      const std::vector<uint32_t>& l = list(i);
      if (l.size() > kAttentionRows) return false;
      ids += l.size();
      for (const uint32_t e : l)
        if (e & kInOut) {
          in_lo = std::min(in_lo, e);
          in_hi = std::max(in_hi, e);
        }
    }
    // [scale][sinks][first, count per query][ids], then the rows.
    const size_t words = 1 + heads + 2 * n + ids;
    const VkDeviceSize lb = aligned(words * 4);
    RowSpans sp = row_spans();
    Operand x;
    if (!operand(q, x)) return false;
    // Each row's id in the lists: its slot (a kept row) or its place among the staged ones.
    std::vector<uint32_t> id(rows.size());
    uint32_t staged = 0;
    for (uint32_t k = 0; k < rows.size(); ++k) {
      uint32_t slot = 0;
      id[k] = k < kept.size() && keep_row(kept[k], hd, k, fill, rows, slot) ? kKept | (kept[k].packed ? kPacked : 0) | slot
                                                                            : staged++;
    }
    const VkDeviceSize rb = aligned((VkDeviceSize)staged * hd * sizeof(uint16_t));
    if (deferred_.act_used + lb + rb > io_limit_) return false;
    // The regions holding the lowest and the highest, and what lies between.
    if (in_hi && (!reads_place(sp, in_lo) || !reads_place(sp, in_hi))) return false;
    const int yr = output_region(o);
    if (yr < 0) return false;
    uint8_t* const abuf = static_cast<uint8_t*>(act_.map);
    uint32_t* const w = reinterpret_cast<uint32_t*>(abuf + deferred_.act_used);
    const uint32_t list_at = (uint32_t)(deferred_.act_used / 4), kv_at = (uint32_t)((deferred_.act_used + lb) / 4);
    w[0] = std::bit_cast<uint32_t>((float)(1.0 / std::sqrt((double)hd)));  // the CPU's scale
    for (uint32_t h = 0; h < heads; ++h) w[1 + h] = std::bit_cast<uint32_t>(sinks[h]);
    uint32_t first = 0;
    for (uint32_t i = 0; i < n; ++i) {
      const std::vector<uint32_t>& l = list(i);
      w[1 + heads + 2 * i] = first;
      w[1 + heads + 2 * i + 1] = (uint32_t)l.size();
      for (size_t j = 0; j < l.size(); ++j) w[1 + heads + 2 * n + first + j] = l[j] & kInOut ? l[j] : id[l[j]];
      first += (uint32_t)l.size();
    }
    uint16_t* const kv = reinterpret_cast<uint16_t*>(abuf + deferred_.act_used + lb);
    for (uint32_t k = 0; k < rows.size(); ++k) {
      if (id[k] & kKept) continue;
      uint16_t* const dst = kv + (size_t)id[k] * hd;
      if (fill)
        fill(k, dst);
      else
        std::memcpy(dst, rows[k], hd * sizeof(uint16_t));
    }
    deferred_.act_used += lb + rb;
    Region& r = deferred_.regions[(size_t)yr];
    const uint32_t stage = std::max(x.stage, after) + 1;
    reads(sp, x);
    writes(sp, r);
    deferred_.ds.push_back(row_op(attention_,
                                  {(uint32_t)n, heads, hd, x.at, x.stride, kv_at, list_at, out_place(r, o), (uint32_t)r.stride},
                                  heads, (uint32_t)n, stage, sp));
    if (kv_.buf) deferred_.ds.back().kept = kv_.buf;
    r.stage = stage;
    mark_read(x, stage);
    return true;
  }

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
                     const VkPipeline pipes[3], const uint32_t kinds[3], DeviceWeight out[3]) const {
    auto held = held_.find(src.id);
    if (held == held_.end()) held = held_.emplace(src.id, src.held_memory()).first;
    const uint8_t* p[3] = {w.gate, w.up, w.down};
    // A chunk and the pages around it within one binding (the import widens it to whole pages).
    const uint64_t max_chunk = max_range_ > 2 * import_align_ ? max_range_ - 2 * import_align_ : 0;
    const VkDeviceSize align = offset_align();
    for (int i = 0; i < 3; ++i) {
      const uint64_t bytes = parts[i]->rows * parts[i]->row_bytes;
      const HeldChunk c = held_chunk(held->second, p[i], bytes, max_chunk);
      if (!c.lo || reinterpret_cast<uintptr_t>(p[i]) % 4 != 0) return false;
      auto it = expert_chunks_.find({src.id, c.lo});
      if (it == expert_chunks_.end()) {
        GpuWeight g;
        ExpertChunk ch;
        if (import_pages(c.lo, (uint64_t)(c.hi - c.lo), g)) {
          ch.b = g.b;
          ch.at = g.w_off;
          ++st_.expert_chunks_mapped;
          st_.expert_bytes_mapped += g.b.size;
        }
        it = expert_chunks_.emplace(std::make_pair(src.id, c.lo), ch).first;
      }
      const ExpertChunk& ch = it->second;
      if (!ch.b.buf) return false;
      const VkDeviceSize rel = ch.at + (VkDeviceSize)(p[i] - c.lo), off = rel / align * align;
      out[i] = DeviceWeight{pipes[i], ch.b.buf, off, std::min<VkDeviceSize>(ch.b.size - off, (rel - off + bytes + 3) / 4 * 4),
                            kinds[i], (uint32_t)(rel - off)};
    }
    return true;
  }

  void release_expert_chunks() const {
    for (auto& [key, ch] : expert_chunks_) free_buffer(ch.b);
    expert_chunks_.clear();
    held_.clear();
  }

  // The slots' geometry from the first layer's experts (mu_ held): each part aligned for a
  // binding offset, as many slots as GpuOptions::expert_slots asks and the device budget left
  // after the dense weights holds (GpuStats::expert_slots says how many), in slabs of at most
  // kSlabBytes so no allocation is huge. Nothing fits: slot_stride_ stays 0 and experts run on
  // the CPU.
  void make_slots(const uint64_t part[3]) const {
    const VkDeviceSize align = offset_align();
    VkDeviceSize off = 0;
    for (int i = 0; i < 3; ++i) {
      part_off_[i] = off;
      part_cap_[i] = (part[i] + align - 1) / align * align;
      off += part_cap_[i];
    }
    const uint64_t held = st_.bytes_on_device + st_.bytes_imported;
    const uint64_t left = budget_ > held ? budget_ - held : 0;
    const uint64_t n = std::min<uint64_t>(slots_wanted_, left / off);
    if (n == 0) {
      st_.expert_slots_refused = true;
      return;
    }
    const uint64_t per_slab = std::max<uint64_t>(1, kSlabBytes / off);
    for (uint64_t made = 0; made < n; made += per_slab) {
      const uint64_t k = std::min(per_slab, n - made);
      slabs_.push_back(make_weight_buffer(k * off));
      for (uint64_t j = 0; j < k; ++j) {
        ExpertSlot sl;
        sl.slab = (uint32_t)(slabs_.size() - 1);
        sl.offset = j * off;
        slots_.push_back(sl);
        link_newest((uint32_t)(slots_.size() - 1));  // empty slots go first, in their order
      }
      st_.bytes_on_device += k * off;
    }
    slot_stride_ = off;
    st_.expert_slots = n;
    st_.expert_slot_bytes = off;
  }

  using SlotKey = std::tuple<uint64_t, uint32_t, uint32_t>;  // source, layer, expert

  ExpertSlot* find_slot(uint64_t source, uint32_t layer, uint32_t expert) const {
    const auto it = slot_index_.find(SlotKey{source, layer, expert});
    return it == slot_index_.end() ? nullptr : &slots_[it->second];
  }
  // A slot is found by the expert it holds (find_slot) from the time it is named until it is
  // un-named: emptied, or about to be refilled.
  void name_slot(size_t i, uint64_t source, uint32_t layer, uint32_t expert) const {
    ExpertSlot& sl = slots_[i];
    sl.source = source;
    sl.layer = layer;
    sl.expert = expert;
    slot_index_[SlotKey{source, layer, expert}] = i;
  }
  void unname_slot(ExpertSlot& sl) const {
    if (sl.source) slot_index_.erase(SlotKey{sl.source, sl.layer, sl.expert});
    sl.source = 0;
  }

  // The slots in the order of their last use, a list through ExpertSlot::older/newer: a use
  // moves the slot to the newest end, so the oldest end is the least recently used slot (an
  // empty one first), and a placement costs no scan of the slots (a card holds thousands).
  void link_newest(uint32_t i) const {
    slots_[i].older = lru_newest_;
    slots_[i].newer = UINT32_MAX;
    (lru_newest_ == UINT32_MAX ? lru_oldest_ : slots_[lru_newest_].newer) = i;
    lru_newest_ = i;
  }
  void unlink(uint32_t i) const {
    ExpertSlot& sl = slots_[i];
    (sl.older == UINT32_MAX ? lru_oldest_ : slots_[sl.older].newer) = sl.newer;
    (sl.newer == UINT32_MAX ? lru_newest_ : slots_[sl.newer].older) = sl.older;
  }
  void slot_used(ExpertSlot& sl) const {
    sl.last_use = ++use_clock_;
    const uint32_t i = (uint32_t)(&sl - slots_.data());
    unlink(i);
    link_newest(i);
  }

  // The least recently used slot among those last used before `floor` (an empty one first);
  // slots_.size() when there is none.
  size_t lru_slot(uint64_t floor = UINT64_MAX) const {
    return lru_oldest_ != UINT32_MAX && slots_[lru_oldest_].last_use < floor ? lru_oldest_ : slots_.size();
  }

  // Copies an expert's three slices into the least recently used slot (an empty one first).
  // Its bytes are counted in the totals and in its layer's `ls`.
  ExpertSlot* place(uint64_t source, uint32_t layer, uint32_t expert, const ExpertWeights& ew, ExpertTensors t,
                    GpuLayerStats& ls) const {
    const size_t victim = lru_slot();
    ExpertSlot& sl = slots_[victim];
    unname_slot(sl);  // an upload that throws leaves the slot empty, never half-filled and named
    sl.hinted = false;
    touch_slot(sl);  // a hint's copy into it before this one's
    sl.ready = 0;
    const uint8_t* src[3] = {ew.gate, ew.up, ew.down};
    const Weight* w[3] = {t.gate, t.up, t.down};
    bool staged = false;
    for (int i = 0; i < 3; ++i) {
      const uint64_t bytes = w[i]->rows * w[i]->row_bytes;
      staged |= stage_or_upload(slabs_[sl.slab], sl.offset + part_off_[i], src[i], bytes);
      st_.expert_upload_bytes += bytes;
      ls.upload_bytes += bytes;
    }
    name_slot(victim, source, layer, expert);
    if (staged) pending_slots_.push_back(victim);
    return &sl;
  }

  // Staged uploads into unmapped slots (a discrete card's VRAM): the bytes go into the staging
  // buffer now and the copy is recorded at the head of the next submission (the group's gate and
  // up dispatches, behind a barrier), so the misses of a group cost no round trip of their own.
  // The slot is named now; a submission that fails un-names it (settle_uploads), so a retry
  // never finds a slot whose bytes did not arrive. Not with --cpu-experts, whose cost model
  // times each upload on its own. A part larger than the staging buffer goes up at once, in
  // chunks. Returns true when the part was staged.
  bool stage_or_upload(Buffer& b, VkDeviceSize at, const uint8_t* src, uint64_t bytes) const {
    if (b.map || split_.active() || bytes > staging_bytes_) {
      upload(b, at, src, bytes);
      return false;
    }
    stage_copy(b.buf, at, bytes, [&](uint8_t* dst) { std::memcpy(dst, src, bytes); });
    ++st_.staged_uploads;
    return true;
  }

  // `bytes` written by `fill` into the staging buffer (submitted first when it is full) and their
  // copy to `at` in `dst` recorded at the head of the next submission. Each staged part starts on
  // a word, so a `fill` may write it as 16- or 32-bit values.
  void stage_copy(VkBuffer dst, VkDeviceSize at, VkDeviceSize bytes, const std::function<void(uint8_t*)>& fill) const {
    const VkDeviceSize room = (bytes + 3) / 4 * 4;
    if (staged_used_ + room > staging_bytes_) flush_uploads();
    if (staged_used_ == 0) ensure(stage_, staging_bytes_);  // never regrown while copies are pending
    fill(static_cast<uint8_t*>(stage_.map) + staged_used_);
    pending_.push_back({dst, VkBufferCopy{staged_used_, at, bytes}});
    staged_used_ += room;
  }

  // The staged copies in a submission of their own (the staging buffer is full, or it is needed).
  void flush_uploads() const {
    submit([] {}, "uploading experts");
  }

  // One global memory barrier in the command buffer being recorded: `src` writes made
  // available to `dst` reads, from the stages of the one to those of the other.
  void barrier(VkAccessFlags src, VkAccessFlags dst, VkPipelineStageFlags src_stages, VkPipelineStageFlags dst_stages) const {
    VkMemoryBarrier mb{};
    mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    mb.srcAccessMask = src;
    mb.dstAccessMask = dst;
    vkCmdPipelineBarrier(cmd_, src_stages, dst_stages, 0, 1, &mb, 0, nullptr, 0, nullptr);
  }

  // A command buffer reset and recording again, for one submission.
  static void begin_recording(VkCommandBuffer cb) {
    check(vkResetCommandBuffer(cb, 0), "resetting the command buffer");
    VkCommandBufferBeginInfo begin{};
    begin.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    check(vkBeginCommandBuffer(cb, &begin), "recording commands");
  }

  // Copies out of `from`, one command for each run of copies into the same buffer (an expert's
  // three parts, side by side in its slot).
  static void record_copies(VkCommandBuffer cb, VkBuffer from, std::span<const PendingCopy> copies) {
    std::vector<VkBufferCopy> regions;
    for (size_t i = 0; i < copies.size();) {
      regions.clear();
      size_t j = i;
      for (; j < copies.size() && copies[j].dst == copies[i].dst; ++j) regions.push_back(copies[j].region);
      vkCmdCopyBuffer(cb, from, copies[i].dst, (uint32_t)regions.size(), regions.data());
      i = j;
    }
  }

  // Records the staged copies and a barrier before the shaders read them (begin_submit).
  void record_pending_uploads() const {
    if (pending_.empty()) return;
    record_copies(cmd_, stage_.buf, pending_);
    barrier(VK_ACCESS_TRANSFER_WRITE_BIT, VK_ACCESS_SHADER_READ_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
            VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT);
  }

  // The read-back copies after the dispatches that wrote their rows, overlapping ranges merged
  // (one copy's regions must not overlap).
  void record_read_back(std::vector<VkBufferCopy>& rb) const {
    if (rb.empty()) return;
    std::sort(rb.begin(), rb.end(), [](const VkBufferCopy& a, const VkBufferCopy& b) { return a.srcOffset < b.srcOffset; });
    size_t m = 0;
    for (size_t i = 1; i < rb.size(); ++i) {
      VkBufferCopy& last = rb[m];
      if (rb[i].srcOffset <= last.srcOffset + last.size)
        last.size = std::max(last.size, rb[i].srcOffset + rb[i].size - last.srcOffset);
      else
        rb[++m] = rb[i];
    }
    rb.resize(m + 1);
    barrier(VK_ACCESS_SHADER_WRITE_BIT, VK_ACCESS_TRANSFER_READ_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
            VK_PIPELINE_STAGE_TRANSFER_BIT);
    vkCmdCopyBuffer(cmd_, out_.buf, back_.buf, (uint32_t)rb.size(), rb.data());
    for (const VkBufferCopy& c : rb) st_.bytes_read_back += c.size;
  }

  // After the submission that carried the staged copies: done (ok), or un-name their slots.
  void settle_uploads(bool ok) const {
    if (!ok) {
      for (const size_t i : pending_slots_) unname_slot(slots_[i]);
      for (const uint32_t i : kv_pending_) kv_rows_.forget(i);
    }
    kv_pending_.clear();
    pending_.clear();
    pending_slots_.clear();
    staged_used_ = 0;
  }

  // The hint-started copies' submission (prefetch_experts): true when none is in flight (it
  // finished). A failed one un-names its slots and throws.
  bool settle_hint() const {
    if (!hint_in_flight_) return true;
    VkResult r = vkGetFenceStatus(dev_, hint_fence_);
    if (r == VK_NOT_READY) return false;
    if (r == VK_SUCCESS) r = vkResetFences(dev_, 1, &hint_fence_);
    hint_in_flight_ = false;
    if (r != VK_SUCCESS) {
      unname_hinted();
      throw lost("copying hinted experts", r);
    }
    hint_slots_.clear();
    return true;
  }

  void unname_hinted() const {
    for (const size_t i : hint_slots_) {
      ExpertSlot& sl = slots_[i];
      if (sl.hinted) {
        unname_slot(sl);
        sl.ready = 0;  // a value that may never be signalled: nothing waits for it
      }
      sl.hinted = false;
    }
    hint_slots_.clear();
  }

  // A submission being recorded reads or writes slot sl: it waits for the hint copy into it.
  void touch_slot(const ExpertSlot& sl) const {
    if (sl.ready > waited_value_) wait_value_ = std::max(wait_value_, sl.ready);
  }

  DeviceWeight slot_part(const ExpertSlot& sl, int i, VkPipeline pipe, uint32_t kind) const {
    touch_slot(sl);
    return DeviceWeight{pipe, slabs_[sl.slab].buf, sl.offset + part_off_[i], part_cap_[i], kind, 0};
  }

  // Up to kSets dispatches, independent of each other (none reads what another writes), in one
  // submission, each with its own descriptor set; mu_ held. `meanwhile` runs on the host while
  // the device works (a throw waits for the device before it leaves). Returns the device's
  // seconds (finish_submit).
  double dispatch(std::span<const Dispatch> ds, const std::function<void()>& meanwhile = {}) const {
    if (ds.empty() || ds.size() > kSets) {
      readback_.clear();
      throw Error("vulkan: a submission takes 1 to " + std::to_string(kSets) + " dispatches");
    }
    std::vector<VkDescriptorBufferInfo> bi(ds.size() * kBindings);
    std::vector<VkWriteDescriptorSet> wr(ds.size() * kBindings);
    for (size_t d = 0; d < ds.size(); ++d) {
      const Dispatch& x = ds[d];
      bi[d * kBindings + 0] = {x.wt.buf, x.wt.offset, x.wt.range};
      const Buffer& in = x.chained ? out_ : act_;
      const Buffer& out = x.quantize ? act_ : out_;
      try {
        // A binding the shader does not reach names the tables, which nothing writes.
        if (x.row && x.act_bytes == 0)
          bi[d * kBindings + 1] = {tables_.buf, 0, VK_WHOLE_SIZE};
        else
          bi[d * kBindings + 1] = {in.buf, x.act_off, binding_range(in, x.act_off, x.act_bytes)};
        bi[d * kBindings + 2] = {out.buf, x.out_off, binding_range(out, x.out_off, x.out_bytes)};
        if (x.in_bytes)
          bi[d * kBindings + 4] = {out_.buf, x.in_off, binding_range(out_, x.in_off, x.in_bytes)};
        else
          bi[d * kBindings + 4] = {tables_.buf, 0, VK_WHOLE_SIZE};
      } catch (...) {
        readback_.clear();
        throw;
      }
      bi[d * kBindings + 3] = {x.kept ? x.kept : tables_.buf, 0, VK_WHOLE_SIZE};
      for (uint32_t i = 0; i < kBindings; ++i) {
        VkWriteDescriptorSet& w = wr[d * kBindings + i];
        w.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
        w.dstSet = sets_[d];
        w.dstBinding = i;
        w.descriptorCount = 1;
        w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        w.pBufferInfo = &bi[d * kBindings + i];
      }
    }
    vkUpdateDescriptorSets(dev_, (uint32_t)wr.size(), wr.data(), 0, nullptr);
    const char* what = meanwhile          ? "a batch of linear dispatches beside the CPU's experts"
                       : !pending_slots_.empty() ? "expert uploads and a batch of linear dispatches"
                       : !kv_pending_.empty()    ? "attention-row copies and a batch of linear dispatches"
                       : ds.size() == 1    ? "a linear dispatch"
                                           : "a batch of linear dispatches";
    begin_submit(
        [&] {
          // Stage by stage, a barrier between: a quantizer before the linears reading its codes,
          // a chained quantizer after the linears whose outputs it reads.
          uint32_t last = 0;
          for (const Dispatch& d : ds) last = std::max(last, d.stage);
          bool first = true;
          for (uint32_t stage = 0; stage <= last; ++stage) {
            bool any = false;
            for (size_t d = 0; d < ds.size(); ++d) {
              if (ds[d].stage != stage) continue;
              if (!any && !first)
                barrier(VK_ACCESS_SHADER_WRITE_BIT, VK_ACCESS_SHADER_READ_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                        VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT);
              any = true;
              vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, ds[d].wt.pipe);
              vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, layout_, 0, 1, &sets_[d], 0, nullptr);
              vkCmdPushConstants(cmd_, layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(Push), &ds[d].push);
              vkCmdDispatch(cmd_, ds[d].gx, ds[d].gy, 1);
            }
            first = first && !any;
          }
        },
        what);
    if (meanwhile) {
      try {
        meanwhile();
      } catch (...) {
        (void)wait_fence();  // the submission reads buffers the caller may free once this throws
        settle_uploads(false);
        throw;
      }
    }
    return finish_submit(what, (bool)meanwhile);
  }

  // A binding's range: `bytes` from `off` of b (0: to its end). A range past the end is a slip in
  // the dispatch's making, refused before the device could read outside the buffer.
  static VkDeviceSize binding_range(const Buffer& b, VkDeviceSize off, VkDeviceSize bytes) {
    if (bytes == 0) return VK_WHOLE_SIZE;
    if (off > b.size || bytes > b.size - off)
      throw Error("vulkan: a dispatch's binding of " + std::to_string(bytes) + " bytes at " + std::to_string(off) +
                  " passes the end of its " + std::to_string(b.size) + "-byte buffer");
    return bytes;
  }

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

  Error lost(const char* what, VkResult r) const {
    return Error(std::string("vulkan: ") + what + " on " + info_.name + " did not finish: " + result_name(r) +
                 " (the sequence is left as it was)");
  }

  // Waits for the submission in flight and readies the fence for the next one.
  VkResult wait_fence() const {
    const VkResult r = vkWaitForFences(dev_, 1, &fence_, VK_TRUE, kFenceTimeoutNs);
    return r == VK_SUCCESS ? vkResetFences(dev_, 1, &fence_) : r;
  }

  // Sums of device seconds, where -1 (a submission that could not be timed) spoils the sum.
  static double add_seconds(double a, double b) { return a < 0 || b < 0 ? -1 : a + b; }

  // Waits for the submission begin_submit made; returns the device's seconds by its timestamps,
  // else by the wall clock, or -1 when `overlapped` (the host worked meanwhile, so the wall time
  // says nothing of the device's).
  double finish_submit(const char* what, bool overlapped) const {
    VkResult r = wait_fence();
    if (r == VK_SUCCESS && fault_ && fault_(what)) r = VK_ERROR_DEVICE_LOST;
    settle_uploads(r == VK_SUCCESS);
    if (r != VK_SUCCESS) throw lost(what, r);
    double s = -1;
    uint64_t t[2] = {0, 0};
    if (timestamps_ && vkGetQueryPoolResults(dev_, timestamps_, 0, 2, sizeof t, t, sizeof(uint64_t),
                                             VK_QUERY_RESULT_64_BIT) == VK_SUCCESS) {
      const uint64_t mask = ts_bits_ >= 64 ? ~0ull : (1ull << ts_bits_) - 1;
      s = (double)(((t[1] & mask) - (t[0] & mask)) & mask) * ts_period_ns_ * 1e-9;
    } else if (!overlapped) {
      s = std::chrono::duration<double>(std::chrono::steady_clock::now() - submitted_at_).count();
    }
    return s;
  }

  void destroy() {
    if (!dev_) return;
    vkDeviceWaitIdle(dev_);
    for (GpuWeight& g : weights_) free_buffer(g.b);
    for (Buffer& b : slabs_) free_buffer(b);
    release_expert_chunks();
    free_buffer(act_);
    free_buffer(out_);
    free_buffer(back_);
    free_buffer(stage_);
    free_buffer(hint_stage_);
    free_buffer(tables_);
    free_buffer(exp_consts_);
    free_buffer(kv_);
    for (VkPipeline& q : quant_)
      if (q) vkDestroyPipeline(dev_, q, nullptr);
    for (VkPipeline& q : quant_tiled_)
      if (q) vkDestroyPipeline(dev_, q, nullptr);
    for (VkPipeline& q : quant_mm_)
      if (q) vkDestroyPipeline(dev_, q, nullptr);
    for (VkPipeline p : {float_, float_mm_, quantize_q8_0_, quantize_q8_k_, rms_norm_, swiglu_, exp_, hc_pre_, hc_post_, hc_mix_, rope_, attention_, engram_gate_, fake_quant_, compress_, add_round_, routed_sum_, index_scores_})
      if (p) vkDestroyPipeline(dev_, p, nullptr);
    if (desc_pool_) vkDestroyDescriptorPool(dev_, desc_pool_, nullptr);
    if (layout_) vkDestroyPipelineLayout(dev_, layout_, nullptr);
    if (set_layout_) vkDestroyDescriptorSetLayout(dev_, set_layout_, nullptr);
    if (fence_) vkDestroyFence(dev_, fence_, nullptr);
    if (hint_fence_) vkDestroyFence(dev_, hint_fence_, nullptr);
    if (timeline_) vkDestroySemaphore(dev_, timeline_, nullptr);
    if (xfer_pool_) vkDestroyCommandPool(dev_, xfer_pool_, nullptr);
    if (timestamps_) vkDestroyQueryPool(dev_, timestamps_, nullptr);
    if (cmd_pool_) vkDestroyCommandPool(dev_, cmd_pool_, nullptr);
    vkDestroyDevice(dev_, nullptr);
    dev_ = VK_NULL_HANDLE;
  }

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

}  // namespace

bool vulkan_built() { return true; }

std::vector<GpuDevice> vulkan_devices() {
  std::vector<GpuDevice> out;
  const std::vector<VkPhysicalDevice> devs = instance().devices();
  for (uint32_t i = 0; i < devs.size(); ++i) out.push_back(describe(devs[i], i));
  return out;
}

std::unique_ptr<Backend> make_vulkan_backend(const GpuOptions& o) { return std::make_unique<VulkanBackend>(o); }

GpuStats gpu_stats(const Backend& b) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  return v ? v->stats() : GpuStats{};
}

void release_gpu_imports(const Backend& b) {
  if (const auto* v = dynamic_cast<const VulkanBackend*>(&b)) v->release_imports();
}

void gpu_swiglu(const Backend& b, float* gu, size_t n, size_t width, float limit, const float* wk) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("gpu_swiglu: not a Vulkan backend");
  v->swiglu_alone(gu, n, width, limit, wk);
}

void gpu_exp(const Backend& b, float* x, size_t n) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("gpu_exp: not a Vulkan backend");
  v->exp_alone(x, n);
}

std::vector<float> gpu_engram_gates(const Backend& b, const float* X, const float* kv, size_t n, uint32_t hc, size_t H,
                                    const float* q_norm, const float* k_norm, float eps) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("gpu_engram_gates: not a Vulkan backend");
  return v->engram_gates_alone(X, kv, n, hc, H, q_norm, k_norm, eps);
}

std::vector<uint32_t> gpu_compress_pool_unrounded(const Backend& b, CMat k, CMat g, uint32_t ratio, uint32_t p0,
                                                  float* carry_k, float* carry_s, Mat latents) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("gpu_compress_pool_unrounded: not a Vulkan backend");
  return v->compress_pool_unrounded(k, g, ratio, p0, carry_k, carry_s, latents);
}

std::vector<float> gpu_index_scores(const Backend& b, const IndexSelect& a, std::vector<std::vector<uint8_t>>& cand) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("gpu_index_scores: not a Vulkan backend");
  return v->index_scores_alone(a, cand);
}

void gpu_rms_norm(const Backend& b, float* x, size_t n, size_t width, const float* w, float eps) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("gpu_rms_norm: not a Vulkan backend");
  v->rms_norm_alone(x, n, width, w, eps);
}

std::vector<uint8_t> gpu_quantize(const Backend& b, ActType a, const float* x, size_t n, size_t cols) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("gpu_quantize: not a Vulkan backend");
  return v->quantize_alone(a, x, n, cols);
}

GpuCopyBandwidth measure_gpu_copy(const Backend& b, uint64_t bytes, int passes) {
  const auto* v = dynamic_cast<const VulkanBackend*>(&b);
  if (!v) throw Error("measure_gpu_copy: not a Vulkan backend");
  return v->copy_bandwidth(bytes, passes);
}

#else  // no Vulkan in this build

namespace {
[[noreturn]] void not_built() {
  throw Error("this sluice was built without the Vulkan backend (install libvulkan-dev and glslc, then rebuild; "
              "scripts/setup does)");
}
}  // namespace

bool vulkan_built() { return false; }
std::vector<GpuDevice> vulkan_devices() { not_built(); }
std::unique_ptr<Backend> make_vulkan_backend(const GpuOptions&) { not_built(); }
GpuStats gpu_stats(const Backend&) { return {}; }
GpuCopyBandwidth measure_gpu_copy(const Backend&, uint64_t, int) { not_built(); }
std::vector<uint8_t> gpu_quantize(const Backend&, ActType, const float*, size_t, size_t) { not_built(); }
void gpu_rms_norm(const Backend&, float*, size_t, size_t, const float*, float) { not_built(); }
void gpu_swiglu(const Backend&, float*, size_t, size_t, float, const float*) { not_built(); }
void gpu_exp(const Backend&, float*, size_t) { not_built(); }
std::vector<float> gpu_engram_gates(const Backend&, const float*, const float*, size_t, uint32_t, size_t, const float*,
                                    const float*, float) {
  not_built();
}
std::vector<uint32_t> gpu_compress_pool_unrounded(const Backend&, CMat, CMat, uint32_t, uint32_t, float*, float*, Mat) {
  not_built();
}
std::vector<float> gpu_index_scores(const Backend&, const IndexSelect&, std::vector<std::vector<uint8_t>>&) { not_built(); }
void release_gpu_imports(const Backend&) {}

#endif

bool auto_subgroup_linears(const GpuDevice& d) { return d.subgroup_linears && d.kind != "cpu"; }
bool auto_int_dot(const GpuDevice& d) { return d.int_dot && d.int_dot_accelerated; }

GpuExpertsChoice auto_gpu_experts(const GpuDevice& d, uint64_t max_slots) {
  GpuExpertsChoice c;
  if (d.kind == "cpu") {
    c.why = "a CPU device: the CPU backend runs the routed experts on the same cores";
  } else if (!d.uma) {
    c.slots = max_slots;
    c.why = "a " + d.kind + " device with memory of its own: slots, as many as the device budget holds";
  } else if (d.host_import) {
    c.in_place = true;
    c.why = "an integrated GPU that imports host memory: in place, no copies";
  } else {
    c.why = "an integrated GPU without VK_EXT_external_memory_host: slots would copy what the host store holds";
  }
  return c;
}

std::string gpu_linears_text(const GpuStats& g) {
  return (g.subgroup_linears ? "a subgroup of " + std::to_string(g.subgroup_size) + " per output"
                             : std::string("an invocation per output")) +
         (g.int_dot ? ", the device's integer dot product" : "") +
         (g.gemm_formats ? ", prefill GEMM tiles of " + std::to_string(g.gemm_tile) + " tokens" : std::string(", no GEMM"));
}

}  // namespace sluice
