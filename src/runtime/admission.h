// Memory admission: the whole host-memory budget of an engine, computed from metadata and
// options before any large allocation, and the verdict (admit, or refuse with a breakdown).
//
// The budget is split into a mandatory part and the routed-expert cache:
//   resident weights   every tensor that is neither a routed expert nor an Engram table, as the
//                      loader allocates it (64-byte aligned buffers, decoded F32 vectors)
//   sequence state     window rings, compressed KV, index keys, compressor carry, Engram history,
//                      the engine's own figure (model/deepseek41/engine_footprint.h), per sequence
//   eval rollback point the checkpoint a multi-chunk eval() keeps of its start to roll back to
//                      (window rings, carries, Engram history: the compressed rows are append-only)
//   scratch            the engine's figure for one chunk (model/deepseek41/engine_footprint.h): activations,
//                      the chunk's new cache rows and selections, indexer scores (one query x visible
//                      rows, f32), Engram read staging, per-token vectors, logits (chunk x vocab x 4)
//   threads            stack + per-thread scratch of every compute thread
//   Engram row cache   rows kept after they are read (a chunk's read staging is part of the scratch)
//   runtime overhead   measured: the process's resident set when it plans (binary, libraries,
//                      parsed header, tokenizer, config tables), plus a per-allocation bound
//                      of the allocator's rounding for every long-lived allocation
//   prefix checkpoints the Session's checkpoints of its kept sequence (runtime/session.h): the
//                      checkpoint budget, or less when ctx checkpoints of the largest size
//                      (model/deepseek41/forward.h checkpoint_bytes + a logits row) need less
// then, from what is left,
//   bounce buffers     io_depth direct-I/O buffers of the largest expert slice + one page
//   expert cache       whole experts (gate+up+down slice of one expert in one layer, each
//                      in the io_align-aligned file window a direct read of it covers, plus a
//                      slot record), rounded down
// and refuses when the mandatory part does not fit, when one layer's share of the cache cannot
// hold one token's top_k experts, or when swap is active (unless allowed). With no --chunk, the
// chunk is the largest (up to max_chunk and ctx) whose mandatory part fits. A chunk whose
// worst-case union min(chunk x top_k, n_expert) exceeds a layer's share streams its experts
// through the share in windows (model/streamed_experts.h), so the cache does not bound it.
// The expert store (src/storage) can supply its own figure for bounce buffers + cache through
// PlanOptions::store_bytes; otherwise the formulas above are used.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/deepseek41/config.h"
#include "model/deepseek41/schema.h"
#include "model/deepseek41/engine_footprint.h"
#include "runtime/meminfo.h"

namespace sluice {
namespace gguf { class File; }

// What admission needs to know about a model file (or a config without a file).
struct ModelFootprint {
  ModelConfig config;
  uint64_t resident_bytes = 0;      // every tensor neither routed expert nor Engram table
  uint64_t resident_tensors = 0;
  uint64_t resident_loaded_bytes = 0;  // what the loader allocates for them (loaded_tensor_bytes)
  uint64_t routed_expert_bytes = 0;
  uint64_t routed_loaded_bytes = 0;    // the same for the routed tensors (--resident-experts)
  uint64_t engram_bytes = 0;
  // One expert of one layer: its slice of ffn_{gate,up,down}_exps (largest over the layers).
  uint64_t expert_gate_bytes = 0, expert_up_bytes = 0, expert_down_bytes = 0;
  uint64_t metadata_bytes = 0;      // the GGUF header region (kept parsed in memory)
  std::string source;               // file path, or "config" when built from a config
  // Where each routed tensor's experts lie, for the direct-I/O windows a slot must hold.
  struct RoutedTensor {
    int part = 0;                   // 0 gate, 1 up, 2 down
    uint64_t file_offset = 0;       // absolute; 0 from specs (tensors start on the GGUF alignment)
    uint64_t slice = 0;             // bytes of one expert
    uint64_t n_expert = 0;
  };
  std::vector<RoutedTensor> routed_tensors;

  uint64_t expert_bytes() const { return expert_gate_bytes + expert_up_bytes + expert_down_bytes; }
  uint64_t largest_expert_slice() const;
  // One slot's bytes: per part, the largest io_align-aligned file window covering one expert's
  // slice (what a direct read of it must land in), summed over gate, up and down.
  uint64_t slot_window_bytes(uint64_t io_align) const;
  uint64_t total_experts() const { return (uint64_t)config.num_hidden_layers * config.n_routed_experts; }
};
// From the schema's tensor list (no file): the byte classes of deepseek41_tensors(c).
ModelFootprint footprint_from_specs(const ModelConfig& c, const std::vector<TensorSpec>& tensors);
// From a GGUF's header only (config_from_gguf + tensor records; no payload is read). Tensors are
// classed by name like the schema does (".engram_embd." Engram, "_exps." routed expert).
ModelFootprint footprint_from_gguf(const gguf::File& f);

// Sequence state, undo copy, scratch and the loader's weight bytes come from the engine's own
// figures (model/deepseek41/engine_footprint.h: engine_footprint, sequence_state_bytes, scratch_bytes).

// The host facts admission looks at.
struct HostFacts {
  MemInfo mem;
  std::vector<SwapArea> swaps;  // active swap areas
  CgroupMemory cgroup;
  bool swap_active() const { return !swaps.empty() || mem.swap_total > 0; }
};
HostFacts read_host_facts();

// --mem-budget: "auto" or a byte size (parse_bytes).
struct BudgetSpec {
  bool is_auto = true;
  uint64_t bytes = 0;
};
BudgetSpec parse_budget(std::string_view text);
// auto = min(0.85 x MemAvailable, MemAvailable - 10% of MemTotal, 0.85 x cgroup headroom).
// Why: MemAvailable counts reclaimable page cache, which the Engram and header reads themselves
// need, and it is an estimate; other processes keep growing. 15% covers that slack, and keeping
// 10% of MemTotal available stays clear of the default thresholds of earlyoom (acts below 10%
// available) and similar OOM daemons, so admission never plans the host into them.
constexpr uint64_t kAutoBudgetPercent = 85;
constexpr uint64_t kAutoBudgetReservePercent = 10;
// floor(x * pct / 100) without overflow.
inline uint64_t percent_of(uint64_t x, uint64_t pct) { return x / 100 * pct + x % 100 * pct / 100; }
uint64_t auto_budget(const HostFacts& host);

// The Session's default byte budget for prefix checkpoints (SessionOptions::checkpoint_budget):
// ~22 checkpoints of the published model (5.2 MiB of window rings + a 0.5 MiB logits row each).
constexpr uint64_t kDefaultCheckpointBudget = 128ull << 20;

// The largest prefix checkpoint the Session keeps: a full window's checkpoint plus the f32
// logits row of a prompt's last token.
uint64_t largest_checkpoint_bytes(const ModelConfig& c);

// Where a DSpark drafter's routed experts live (PlanOptions::dspark_experts).
enum class DsparkExperts { Auto, Resident, Streamed };
// "auto", "resident", "stream" -> the enum; throws Error naming the accepted values.
DsparkExperts parse_dspark_experts(std::string_view s);

struct PlanLine {
  std::string name;
  uint64_t bytes = 0;
  std::string detail;
};

struct PlanOptions {
  uint32_t ctx = 4096;          // positions per sequence
  uint32_t sequences = 1;       // sequences held at once (each with its own state)
  uint32_t chunk = 0;           // prefill chunk; 0: the largest that fits (up to max_chunk)
  uint32_t max_chunk = 256;     // the automatic chunk is at most this (and ctx)
  int threads = 0;              // compute threads; 0: std::thread::hardware_concurrency()
  BudgetSpec budget;
  bool allow_swap = false;
  // How the store shares its slots among layers. true (the store's default, lru-per-layer):
  // each layer owns slots / n_layer of them, so one layer's union must fit that share; false
  // (lru-global): any layer may use every slot.
  bool cache_per_layer = true;
  std::string cache_policy;  // its name, for the plan's lines; empty: lru-per-layer or lru-global by the flag
  uint32_t io_depth = 8;        // expert reads in flight = bounce buffers
  uint32_t io_align = 4096;     // direct-I/O alignment (slab and buffer padding)
  uint64_t engram_cache_rows = 65536;  // per Engram table
  uint64_t max_cache_experts = 0;      // the expert cache holds at most this many (0: what the budget leaves)
  uint64_t thread_stack_bytes = 8ull << 20;
  // The runtime overhead (docs/storage.md, "Runtime overhead"): what the process holds besides
  // the lines above. overhead_bytes is measured, not guessed: plan_for_file sets it (when 0) to
  // this process's resident set when it plans, rounded up to a MiB: the binary, the libraries,
  // the parsed header, the tokenizer and config tables are all in memory by then. A plan made
  // from figures alone (no process) leaves it 0. On top, the allocator's bound per long-lived
  // allocation: glibc serves a large request by mmap rounded up to a page plus a 16 B header
  // (a heap chunk loses at most 16 B + alignment), for every weight tensor, every sequence
  // vector and the store's buffers.
  uint64_t overhead_bytes = 0;
  uint64_t allocation_slack_bytes = 4096 + 16;
  uint64_t slot_record_bytes = 256;         // per-slot table, index and LRU entries
  uint64_t checkpoint_budget = kDefaultCheckpointBudget;  // per sequence; 0: no checkpoints
  uint64_t prefix_cache_budget = 0;  // --cache-ram, shared by all sequences; 0: none
  // --kv-disk-dir: states on disk. Memory: snapshots waiting to be written (two of the largest)
  // and one being read (Plan::state_disk_queue, state_disk_read).
  bool state_disk = false;
  // --dspark: the drafter's line (weights but its routed experts + its activation tensors +
  // verify buffers, per sequence its rings, per chunk row the target's captured rows), plus its
  // routed experts: resident (dspark_expert_bytes as loaded) or streamed through a store of
  // their own (dspark_stream_bytes for dspark_stream_slots; 0: cannot stream). 0 / empty: none.
  uint64_t dspark_fixed = 0, dspark_per_sequence = 0, dspark_per_row = 0;
  uint64_t dspark_expert_bytes = 0, dspark_stream_bytes = 0;
  uint32_t dspark_stream_slots = 0;
  std::string dspark_detail;
  uint32_t dspark_block = 0;  // the drafter's block (drafts per proposal); 0: no drafter
  // --backend vulkan: the device's copies of the weights and its staging buffers, all in memory the
  // host pays for in this first slice (backend/vulkan_backend.h). 0: none.
  uint64_t device_bytes = 0;
  std::string device_detail;
  // The device's own plan (backend/gpu_budget.h gpu_device_plan): what its budget holds, shown
  // beside the host's; on a device whose memory is the host's the host lines already count it.
  std::string device_plan_title;
  std::vector<PlanLine> device_plan;
  // Host rows a device backend holds across ops for a chunk (the Vulkan backend's shared expert
  // gate and up, kept for the deferred batch that reads them on the device). Unset: none.
  std::function<uint64_t(uint32_t chunk)> device_held_bytes;
  // Auto: resident when that plan is admitted with a verify depth of at least 2; otherwise
  // streamed when that is (the plan says which and why). --dspark-experts resident|stream.
  DsparkExperts dspark_experts = DsparkExperts::Auto;
  // Routed experts split over processes (rank 0 of --fabric): the bytes one layer's exchange of a
  // chunk holds (RemoteExperts::exchange_bytes + split_moe_bytes for chunk x top_k triples).
  // Empty: none.
  std::function<uint64_t(uint32_t chunk)> fabric_bytes;
  // An expert server (a --fabric peer, runtime/expert_host.h): it holds `owned_experts` routed
  // experts (resident ones come as ModelFootprint::resident_loaded_bytes) and nothing else of
  // the model: no dense weights, sequence state, checkpoints or Engram cache. Its scratch is one
  // exchange of `chunk` rows (exchange_scratch_bytes), and its cache holds at most the owned
  // experts.
  bool expert_server = false;
  uint64_t owned_experts = 0;
  uint32_t owned_per_layer_max = 0;  // a token needs at most min(top_k, this) of a layer there
  // Hook for the expert store: its own bytes (cache of `slots` experts + bounce buffers +
  // anything else it allocates) for a cache of `slots` experts. Must be non-decreasing in
  // slots. When set, it replaces the bounce-buffer and expert-cache formulas.
  std::function<uint64_t(uint64_t slots)> store_bytes;
  // Lines the caller holds beside the engine (serve: its requests' working memory).
  std::vector<PlanLine> caller_lines;
};

// An expert server's live heap for one exchange of `rows` tokens (at most rows x top_k triples):
// the Work frame as received, the rows widened to f32, the triples, each term as computed and the
// Result frame, and the routed FFN's quantized rows and per-expert gate, up, hidden and down rows.
uint64_t exchange_scratch_bytes(const ModelConfig& c, uint64_t rows);


struct Plan {
  std::string model;
  uint32_t ctx = 0, sequences = 1, chunk = 0;
  bool chunk_auto = true;
  int threads = 1;
  uint64_t budget = 0;
  std::string budget_source;            // "--mem-budget 116GiB" / "auto: 0.85 x MemAvailable ..."
  std::vector<PlanLine> mandatory;      // everything but the expert store
  uint64_t mandatory_bytes = 0;
  uint64_t bounce_bytes = 0;            // 0 when the store's figure is used (it includes them)
  bool store_figure = false;            // bounce + cache come from PlanOptions::store_bytes
  uint64_t expert_bytes = 0;            // gate + up + down of one expert in one layer
  uint64_t slot_bytes = 0;              // aligned windows of gate, up and down + slot record
  uint64_t cache_slots = 0;
  uint64_t cache_bytes = 0;             // with the store's figure: everything the store needs
  uint64_t total_experts = 0;
  uint32_t top_k = 0, n_expert = 0;
  bool cache_per_layer = true;
  std::string cache_policy = "lru-per-layer";  // the eviction policy's name
  uint64_t union_capacity = 0;          // experts one layer can hold at once (see PlanOptions)
  uint64_t engram_cache_rows = 0;       // per Engram table, accounted (0: the model has none)
  uint64_t state_disk_queue = 0;        // --kv-disk-dir: bytes of snapshots waiting to be written
  uint64_t state_disk_read = 0;         // and of the one being read
  uint64_t chunk_union = 0;             // min(chunk x top_k, n_expert): worst-case experts of one layer
  uint32_t max_chunk_for_cache = 0;     // the largest chunk whose worst-case union is leased at once
  // --dspark: drafts one verify pass checks at most, so that its rows' worst-case expert union
  // (anchor + drafts) is leased at once like any chunk the cache holds (0: no drafter or no room).
  uint32_t dspark_verify_max = 0;
  bool dspark = false;
  bool dspark_streamed = false;     // the drafter's routed experts stream (dspark_cache_slots slots)
  uint32_t dspark_cache_slots = 0;
  uint64_t stream_window = 0;           // 0: the chunk's union fits a layer's share; else experts per window
  uint64_t unused_bytes = 0;
  bool swap_active = false;
  std::string swap_detail;
  bool admitted = false;
  std::vector<std::string> refusals;    // why not, each naming what to change
  std::vector<std::string> warnings;
  std::string device_plan_title;    // PlanOptions::device_plan: empty without a device
  std::vector<PlanLine> device_plan;

  uint64_t planned_bytes() const { return mandatory_bytes + bounce_bytes + cache_bytes; }
};

// Experts one layer can hold at once in a cache of `slots`.
inline uint64_t union_capacity(uint64_t slots, uint32_t n_layer, uint32_t n_expert, bool per_layer) {
  const uint64_t c = per_layer ? (n_layer ? slots / n_layer : 0) : slots;
  return c < n_expert ? c : n_expert;
}

// The worst-case number of distinct experts one layer of a chunk of n tokens can route to.
inline uint64_t chunk_expert_union(uint64_t n, uint32_t top_k, uint32_t n_expert) {
  const uint64_t u = n * top_k;
  return u < n_expert ? u : n_expert;
}

// Computes the plan (never allocates model memory). Throws Error for invalid options (ctx 0,
// ctx above the model's max_position_embeddings, ...); a budget that does not fit is not an
// exception but a Plan with admitted == false.
Plan make_plan(const ModelFootprint& fp, const PlanOptions& o, const HostFacts& host);

// The breakdown as an aligned text table (one line per item, verdict last) and as JSON.
std::string format_plan(const Plan& p);
nlohmann::ordered_json plan_to_json(const Plan& p);
// One line for an error message: the first refusal and what the mandatory part is made of.
std::string refusal_summary(const Plan& p);
// For run/serve: throws Error(refusal_summary) unless the plan was admitted.
void require_admitted(const Plan& p);

}  // namespace sluice
