// The Vulkan backend (issue 12; docs/backends.md "The Vulkan backend"). It is the CPU backend
// with the forward's work moved to a Vulkan device, with the CPU's bits: weights of every type
// the CPU computes (the float formats where the device has shaderFloat64; not Q8_K, an
// activation format) are uploaded or imported once at load (prepare_weight); the linears, the
// routed experts (from slots, or in place) and the row ops on rows the batch holds (norms, hc
// mixes, rope, fake-quant grids, the attention, the compressor's pooling, the Engram gate, the
// indexer's scores) are recorded as compute dispatches and submitted together when the host
// needs a result. What the device cannot run (a weight it cannot hold, rows only the host has,
// the indexer's top-k, embeddings) runs on the CPU backend it extends.
//
// Nothing here includes vulkan.h: a build without libvulkan-dev and glslc compiles the same
// interface, and its functions say that Vulkan is not built in.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/gpu_budget.h"
#include "backend/backend.h"
#include "kernels/types.h"

namespace sluice {


// One Vulkan physical device, as `sluice devices` lists it.
struct GpuDevice {
  uint32_t index = 0;
  std::string name;
  std::string driver;   // driver name and info where the device reports them
  std::string kind;     // integrated, discrete, virtual, cpu, other
  uint32_t api_major = 0, api_minor = 0;
  bool uma = false;     // integrated GPU or CPU device: device memory is host memory (counted once)
  std::vector<GpuHeap> heaps;
  uint32_t subgroup_size = 0;
  // The quantized linears can run a subgroup per output (shaders/linear_main.glsl): compute
  // shaders have ballots and shuffles, and subgroups of 8 to 64 lanes divide 64. GpuLinears::Auto
  // uses it on a GPU, not on a CPU device (docs/backends.md: lavapipe runs the plain build faster).
  bool subgroup_linears = false;
  // The quantized linears can use the device's packed 4x8-bit integer dot product
  // (VK_KHR_shader_integer_dot_product and its shaderIntegerDotProduct feature), and the driver
  // says it is accelerated (integerDotProduct4x8BitPackedSignedAccelerated: an instruction of the
  // hardware, not a sequence of multiplies). GpuIntDot::Auto uses it when both hold.
  bool int_dot = false, int_dot_accelerated = false;
  bool host_import = false;  // VK_EXT_external_memory_host: host memory usable as device memory
  // A queue family for transfers only (DMA engines beside the compute units), and timeline
  // semaphores (Vulkan 1.2): with both, hint-started expert copies overlap the compute queue.
  bool transfer_queue = false, timeline = false;
  uint32_t transfer_family = UINT32_MAX;  // the first such queue family (with transfer_queue)
  uint64_t max_storage_buffer = 0;  // maxStorageBufferRange: the largest weight one binding can hold
  uint32_t max_workgroup_memory = 0;  // maxComputeSharedMemorySize: room for a GEMM build's tile
};

// What ran where, for summaries and tests.
// The routed-expert slot tier of one layer (by layer index; a drafter's stages count under theirs).
struct GpuLayerStats {
  uint64_t hits = 0, misses = 0, on_cpu = 0;  // as GpuStats' expert_hits, expert_misses, expert_on_cpu
  uint64_t upload_bytes = 0;
  uint64_t upload_ns = 0;  // time the misses took to copy in (the host waits for it)
  uint64_t in_place = 0;   // as GpuStats::expert_in_place
};

struct GpuStats {
  uint64_t weights_on_device = 0, bytes_on_device = 0;
  uint64_t weights_on_host = 0;  // weights linear() runs on the CPU (type without a shader, or too large)
  uint64_t linear_on_device = 0, linear_on_host = 0;  // linear() calls
  uint64_t submissions = 0;  // command buffers submitted (each waited on): the host-device round trips
  // Linear inputs (one per batch and activation format) the device quantized from f32 rows
  // (Q8_0, Q8_K where it has shaderFloat64; else, and with GpuOptions::host_quantize, the host did).
  uint64_t inputs_quantized_on_device = 0;
  uint64_t inputs_chained = 0;  // of them, read on the device from linears earlier in the submission
  uint64_t ops_on_device = 0;   // ops other than linears run on the device (rms_norm on deferred rows)
  uint64_t index_on_device = 0;  // index_select calls (groups of queries) scored on the device
  uint64_t attention_on_host = 0;  // sparse_attention calls (a sequence's chunk) run on the CPU
  // The quantized linears ran their subgroup build (a subgroup per output) rather than an
  // invocation per output; the device's subgroup size.
  bool subgroup_linears = false;
  uint32_t subgroup_size = 0;
  bool int_dot = false;  // their builds with the device's integer dot product (GpuOptions::int_dot)
  // The formats with a GEMM build on this device (GpuOptions::gemm: the quantized ones whose tile
  // fits its workgroup memory, the float ones where it has shaderFloat64), and the linear
  // dispatches that ran one.
  uint32_t gemm_formats = 0;
  uint32_t gemm_tile = 0;  // tokens a GEMM workgroup takes
  uint64_t gemm_dispatches = 0;
  uint64_t device_budget = 0;    // bytes of weights the device may hold (GpuOptions::weight_budget)
  std::string budget_why;        // how device_budget was chosen (gpu_weight_budget)
  // On a card with memory of its own, the rows the deferred batch's ops write and read (the
  // output buffer) are the card's, and the host reads what it needs of them through a copy into
  // a mapped buffer of the same size: their bytes come out of --gpu-mem before the weights', and
  // device_budget is what is left (gpu_device_plan). 0 / false where the output buffer is
  // host-visible memory the host maps (an integrated GPU or a CPU device).
  bool scratch_on_device = false;
  uint64_t scratch_bytes = 0;
  // Attention rows kept on the device (GpuOptions::kv_bytes): its bytes, the slots they make (from
  // the first attention's head_dim) and the host's copies of their rows; the rows read from a slot
  // (hits), copied into one (misses, and their bytes), and staged with their batch instead (the
  // batch read every slot, or a head_dim other than the slots').
  uint64_t kv_bytes = 0, kv_slots = 0, kv_host_bytes = 0;
  uint64_t kv_hits = 0, kv_misses = 0, kv_upload_bytes = 0, kv_staged = 0;
  uint64_t device_total = 0;  // --gpu-mem or auto, before the scratch was taken off
  std::string device;         // the device's name
  uint64_t bytes_read_back = 0;  // copied from device rows into the mapped buffer for the host
  // The weight copies live in memory the host pays for: an integrated GPU or a CPU device (one
  // pool, counted once, in the host's plan), or a device with no device-local memory type.
  bool weights_in_host_memory = true;
  uint64_t staged_uploads = 0;   // weights copied through the staging buffer (not host-visible)
  // An integrated GPU or CPU device with VK_EXT_external_memory_host uses the loaded weights'
  // own pages (imported, no copy: the host's memory, counted once in its plan); the budget
  // still bounds them, and a weight whose import the driver refuses runs on the CPU.
  bool imports_host_memory = false;
  uint64_t weights_imported = 0, bytes_imported = 0;
  uint64_t imports_refused = 0;  // weights whose pages the driver would not import (run on the CPU)
  // Routed experts in device slots (GpuOptions::expert_slots): the slots made and their bytes
  // each (gate + up + down, aligned), lookups that found the expert in a slot and those that
  // copied it in from the host store, the bytes copied; experts that ran on the CPU instead.
  uint64_t expert_slots = 0, expert_slot_bytes = 0;
  uint64_t expert_hits = 0, expert_misses = 0, expert_upload_bytes = 0;
  uint64_t expert_uploads_ahead = 0;  // misses copied into mapped slots while the device ran the group before
  // Hint-started copies into unmapped slots (Backend::prefetch_experts): whether the backend
  // makes them (they have a staging buffer of their own), the experts copied, those of them
  // their layer's routed op then used (each also counted as a miss), the hints dropped (the
  // last one's copies still in flight, or slots named by work not yet submitted), and their
  // submissions (counted in `submissions` too; nobody waits for them).
  bool hint_staging = false;
  uint64_t expert_uploads_hinted = 0, expert_hints_used = 0, expert_hints_dropped = 0, hint_submissions = 0;
  // Where they run: a queue family of their own for transfers (a discrete card's DMA engines),
  // ordered by a timeline semaphore (Vulkan 1.2; else by a barrier on the one queue), and the
  // submissions that waited on the device for one of their copies.
  bool transfer_queue = false, timeline_semaphores = false;
  uint64_t hint_waits = 0;
  uint64_t expert_calls_on_host = 0;  // routed-FFN calls run on the CPU although slots were asked for
  // --cpu-experts: misses the CPU computed from the host store's memory (not uploaded), and the
  // split's per-expert costs as last measured (seconds; 0: not measured; expert_split.h).
  uint64_t expert_on_cpu = 0;
  double split_upload_s = 0, split_device_s = 0, split_cpu_s = 0;
  std::vector<GpuLayerStats> expert_layers;  // the slot tier per layer (run --expert-stats)
  // The slot tier's stall: the time the host spent copying misses in, over every layer.
  uint64_t expert_upload_ns() const {
    uint64_t ns = 0;
    for (const GpuLayerStats& l : expert_layers) ns += l.upload_ns;
    return ns;
  }
  bool expert_slots_refused = false;  // slots were asked for but the device budget held none
  // --gpu-experts in-place (GpuOptions::experts_in_place): expert runs on the device from the
  // source's own memory, the chunks of it mapped (imported once each, the host's memory: nothing
  // charged to the device budget) and their bytes, and expert runs left to the CPU because the
  // source states no memory, a slice lies outside it or is not word-aligned, or the driver
  // refused a chunk.
  bool experts_in_place = false;
  std::string experts_auto;  // GpuOptions::experts_auto: how --gpu-experts auto chose
  uint64_t expert_in_place = 0, expert_chunks_mapped = 0, expert_bytes_mapped = 0;
  uint64_t expert_in_place_refused = 0;
};

// linear() moves activations in and outputs out through two buffers of at most this many bytes
// each (a call whose tokens do not fit runs in groups), and weights that device memory cannot map
// go up through a third: the plan charges kGpuStagingBuffers of them.
inline constexpr uint64_t kGpuStagingBytes = 16ull << 20;
inline constexpr uint64_t kGpuStagingBuffers = 3;
// With routed-expert slots, a layer's experts run in groups whose float intermediates (gate, up
// and down outputs) stay within this many bytes (one expert may exceed it alone, as on the CPU);
// the plan charges twice it for them and their quantized rows.
inline constexpr uint64_t kGpuExpertGroupBytes = kGpuStagingBytes / 2;

// How the quantized linear shaders spread their work (docs/backends.md "A subgroup per output"):
// an invocation per output (Plain), or a subgroup per output and per row and tile of tokens
// (Subgroup: a device without GpuDevice::subgroup_linears is refused, naming why); Auto: Subgroup
// where the device has it and is a GPU, else Plain.
enum class GpuLinears { Auto, Plain, Subgroup };

// Where index_select scores the keys (--gpu-indexer): on the device (index_scores.comp, then the
// CPU's top-k from the scores; the CPU's bits), on the CPU, or Auto: on a GPU when a call's work
// is large enough to pay for the round trip it adds (long contexts, prefill chunks), else the CPU.
enum class GpuIndexer { Auto, Device, Cpu };
bool auto_subgroup_linears(const GpuDevice& d);

// Whether the quantized linears' builds dot four codes at a time with the device's integer dot
// product (--gpu-int-dot; shaders/linear_common.glsl dot4): On (a device without it is refused,
// naming why), Off, or Auto: where the device has it and says it is accelerated. Exact integer
// sums either way, so the same bits.
enum class GpuIntDot { Auto, On, Off };
bool auto_int_dot(const GpuDevice& d);

// What --gpu-experts auto (the default) runs the routed experts with on device d, and why: on a
// card with memory of its own (discrete, virtual or other), slots, up to `max_slots`, as many as
// the device budget holds after the dense weights (the backend makes fewer when fewer fit); on an
// integrated GPU that imports host memory, in place (no copies); on an integrated GPU that cannot
// import, none (a slot would copy what the host store holds in the same memory); on a CPU device,
// none (the CPU backend runs them on the same cores without the dispatch overhead).
struct GpuExpertsChoice {
  uint64_t slots = 0;
  bool in_place = false;
  std::string why;
};
GpuExpertsChoice auto_gpu_experts(const GpuDevice& d, uint64_t max_slots);

struct GpuOptions {
  uint32_t device = 0;
  int threads = 0;               // the CPU backend's threads (0: all cores)
  // Bytes of device memory used at most (--gpu-mem): the mandatory part first (the batch's rows
  // where they are the card's: GpuStats::scratch_bytes), the weights and slots in what is left
  // (gpu_device_plan); 0: auto (gpu_budget.h: half of what the largest device-local heap has free
  // on an integrated or CPU device, whose memory is the host's too, 80% on a discrete card; free
  // by VK_EXT_memory_budget where the driver has it).
  uint64_t weight_budget = 0;
  // Tests: asked after each submission has run; true reports it as a lost device would be reported.
  // `what` names the submission ("a linear dispatch", "uploading a weight").
  std::function<bool(const char* what)> fault;
  // Tests: asked before each submission reaches the queue; true fails it as a lost device
  // would, before anything in it ran.
  std::function<bool(const char* what)> fault_before_submit;
  // Tests: asked before each shader's pipeline is built (`what` names the shader); true fails
  // it as a driver that runs out of memory building it would.
  std::function<bool(const char* what)> fault_shader;
  // Tests: weights go through the staging copy even where device memory can be mapped, in
  // chunks of this many bytes (0: kGpuStagingBytes).
  bool force_staging = false;
  // Tests: the host quantizes every linear's activations and runs every rms_norm, as for a device
  // without shaderFloat64.
  bool host_quantize = false;
  // How the quantized linears run (--gpu-linears); the same bits either way.
  GpuLinears linears = GpuLinears::Auto;
  // --gpu-gemm on|off: calls of at least the GEMM tile's 16 tokens (prefill) run the GEMM build
  // (shaders/linear_main.glsl: a workgroup per 64 rows and tile of tokens, the blocks staged in
  // workgroup memory) for each format whose tile fits the device's workgroup memory; off: the
  // build --gpu-linears chose. The same bits either way.
  bool gemm = true;
  GpuIntDot int_dot = GpuIntDot::Auto;  // --gpu-int-dot; the same bits either way
  // Copy the weights even where the device could import their pages (tests; force_staging too).
  bool no_import = false;
  // Routed-expert slots on the device (--gpu-experts N): the routed FFN runs there, each expert
  // copied into a slot when first routed to and kept, least recently used out. 0: the routed
  // experts run on the CPU. Fewer are made when the device budget left after the dense weights
  // holds fewer (GpuStats::expert_slots).
  uint64_t expert_slots = 0;
  // --cpu-experts F|auto: of each layer's slot misses, the share the CPU computes from host
  // memory while the device runs the rest (expert_split.h); auto chooses it from measured costs.
  double cpu_experts = 0;
  bool cpu_experts_auto = false;
  // --gpu-experts in-place: on a device that shares the host's memory and imports it
  // (GpuStats::imports_host_memory), the routed FFN runs on the device straight from the expert
  // source's memory (ExpertSource::held_memory, mapped once in chunks): no slots, no copies. An
  // expert the source cannot show that way runs on the CPU. Refused with expert_slots, with
  // cpu_experts, and on any other device (make_vulkan_backend throws naming why).
  bool experts_in_place = false;
  // Set when --gpu-experts auto chose the two above: "auto: " and auto_gpu_experts' why, which the
  // backend keeps for summaries (GpuStats::experts_auto).
  std::string experts_auto;
  uint64_t staging_bytes = 0;
  // Tests: at most this many workgroups in x per dispatch of the subgroup and GEMM builds (0: the
  // device's maxComputeWorkGroupCount[0]), so their rows-in-turn loops take several turns.
  uint32_t max_groups_x = 0;
  // Tests: the activation and output staging buffers hold at most this many bytes (0:
  // kGpuStagingBytes), so batches split and large calls run in token groups.
  uint64_t io_staging_bytes = 0;
  // Tests: the deferred batch's rows in device memory the host does not map, read back through
  // a copy into a mapped buffer, as on a card with memory of its own (GpuStats::scratch_on_device),
  // on a device whose memory could be mapped.
  bool scratch_on_device = false;
  GpuIndexer indexer = GpuIndexer::Auto;  // --gpu-indexer
  // --gpu-kv B|auto|off: bytes of device memory for the attention rows it keeps between steps
  // (backend/device_rows.h: window rows as BF16, compressed rows packed, named by their host bytes
  // and read again only while those are unchanged), out of --gpu-mem as sequence state; as many
  // bytes of host memory hold the copies a lookup compares. Auto: 64 MiB (an eighth of the budget where
  // that is less) where the batch's rows are the card's (GpuStats::scratch_on_device), none where
  // its memory is the host's.
  uint64_t kv_bytes = 0;
  bool kv_auto = true;
  // Tests: no timeline semaphores, as on a Vulkan 1.1 device (the hint copies ordered by a
  // barrier on the compute queue).
  bool no_timeline = false;
};

// One routed-expert slot's bytes on any device: each slice aligned to 256 bytes, the largest
// minStorageBufferOffsetAlignment Vulkan allows (a device with a smaller one uses less).
inline uint64_t gpu_expert_slot_bytes(uint64_t gate, uint64_t up, uint64_t down) {
  auto a = [](uint64_t b) { return (b + 255) / 256 * 256; };
  return a(gate) + a(up) + a(down);
}

// How the quantized linears ran, for summaries: "a subgroup of S per output" or "an invocation per
// output", then whether calls of many tokens ran the GEMM build.
std::string gpu_linears_text(const GpuStats& g);

// True when this binary was built with the Vulkan backend.
bool vulkan_built();
// Every Vulkan device the loader finds. Throws Error when Vulkan is not built in or no driver
// answers (the message says which and what to install).
std::vector<GpuDevice> vulkan_devices();
// Throws Error naming the cause: not built in, no driver, no such device (with the count), no
// compute queue, a shader the driver refuses.
std::unique_ptr<Backend> make_vulkan_backend(const GpuOptions& o);
// The stats of a backend made by make_vulkan_backend; all zero for any other backend.
GpuStats gpu_stats(const Backend& b);

// Frees the device's imports of weight pages (GpuStats::imports_host_memory) once the device is
// idle; a weight whose import was released runs on the CPU from then on. Call it before the
// buffers of the models loaded with this backend are freed. Nothing for any other backend.
void release_gpu_imports(const Backend& b);

// Tests: the device's activation quantizer (Q8_0 or Q8_K) alone on n rows of `cols` floats; the
// rows in the format's bytes, to compare with the CPU's quantizer. Throws Error for a backend not
// made by make_vulkan_backend, or a device without the quantizer (no shaderFloat64).
std::vector<uint8_t> gpu_quantize(const Backend& b, ActType a, const float* x, size_t n, size_t cols);

// Tests: the device's rms_norm alone on n rows of `width` floats, in place (the CPU's bits).
// Throws Error for a backend not made by make_vulkan_backend, or a device without shaderFloat64.
void gpu_rms_norm(const Backend& b, float* x, size_t n, size_t width, const float* w, float eps);

// Tests: the device's SwiGLU alone on n rows of [g | u] (2 * width floats each): h = swiglu(g, u,
// limit, wk[row] or 1 without wk) written over g (the CPU's bits, backend/swiglu.h). Throws Error
// for a backend not made by make_vulkan_backend, or a device without shaderFloat64.
void gpu_swiglu(const Backend& b, float* gu, size_t n, size_t width, float limit, const float* wk);

// Tests: the device's exp_f32 (shaders/exp_f32.glsl) alone on n values in place (the CPU's
// exp_f32 bits, kernels/exp_f32.h). Throws Error as gpu_swiglu does.
void gpu_exp(const Backend& b, float* x, size_t n);

// Tests: the device's Engram gates alone, [n][hc] (X: [n][hc * H] streams, kv: [n][(hc + 1) * H]
// keys and value, unmasked): the scalar each stream's value is scaled by (engram_gate_value's bits,
// kernels/numerics.h), which the op's BF16 rounding mostly hides. Throws Error as gpu_swiglu does.
std::vector<float> gpu_engram_gates(const Backend& b, const float* X, const float* kv, size_t n, uint32_t hc, size_t H,
                                    const float* q_norm, const float* k_norm, float eps);

// Tests: compress_pool on the device with the latents left as the pooled f32 values (their BF16
// rounding mostly hides an ulp of the softmax and the weighted sum). Throws Error as gpu_swiglu does.
std::vector<uint32_t> gpu_compress_pool_unrounded(const Backend& b, CMat k, CMat g, uint32_t ratio, uint32_t p0,
                                                  float* carry_k, float* carry_s, Mat latents);

// Tests: the indexer's scores on the device as index_select computes them before its top-k,
// [n][(p0 + n) / ratio] (a query's keys past its own visible count 0; a consumer's unkept blocks
// -inf), whatever GpuOptions::indexer says. A candidate source's blocks are written to cand.
// Throws Error as gpu_swiglu does.
std::vector<float> gpu_index_scores(const Backend& b, const IndexSelect& a, std::vector<std::vector<uint8_t>>& cand);

// Host -> device copy rate, the path experts and weights take into device memory (PCIe on a
// discrete card, a memcpy on UMA), beside a plain host memcpy of the same bytes in the same run.
struct GpuCopyBandwidth {
  double median_gbps = 0, min_gbps = 0, max_gbps = 0;
  double memcpy_gbps = 0;  // median host memcpy, the same bytes
  bool staged = false;     // through the staging buffer (device memory not host-visible)
  uint64_t bytes = 0;
  int passes = 0;
};
// Allocates `bytes` of device memory and twice that on the host for the call's duration (the
// caller accounts for them); one untimed pass, then `passes` timed ones. Throws Error for a
// backend not made by make_vulkan_backend.
GpuCopyBandwidth measure_gpu_copy(const Backend& b, uint64_t bytes, int passes);

}  // namespace sluice
