#include "runtime/admission.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include <nlohmann/json.hpp>

#include "fabric/frames.h"
#include "format/gguf.h"
#include "model/architecture.h"
#include "model/deepseek41/engram_cache.h"
#include "model/deepseek41/forward.h"
#include "runtime/state_disk.h"
#include "util/error.h"

namespace sluice {

namespace {

uint64_t align_up(uint64_t x, uint64_t a) { return a == 0 ? x : (x + a - 1) / a * a; }

uint64_t sat_sub(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

std::string num(uint64_t v) {  // 15360 -> "15,360"
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

std::string pct(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", x * 100);
  return buf;
}

ByteClass class_of_name(const std::string& name) {
  if (name.find(".engram_embd.") != std::string::npos) return ByteClass::Engram;
  if (name.find("_exps.") != std::string::npos) return ByteClass::RoutedExpert;
  return ByteClass::Resident;
}

// Slices of one expert of a routed tensor [cols, rows, n_expert]: bytes / n_expert.
void note_expert_slice(ModelFootprint& fp, const std::string& name, uint64_t bytes, uint64_t n_expert) {
  if (n_expert == 0) return;
  const uint64_t slice = bytes / n_expert;
  if (name.find("ffn_gate_exps") != std::string::npos) fp.expert_gate_bytes = std::max(fp.expert_gate_bytes, slice);
  else if (name.find("ffn_up_exps") != std::string::npos) fp.expert_up_bytes = std::max(fp.expert_up_bytes, slice);
  else if (name.find("ffn_down_exps") != std::string::npos) fp.expert_down_bytes = std::max(fp.expert_down_bytes, slice);
}

void add_tensor(ModelFootprint& fp, const std::string& name, GgmlType type, uint64_t bytes, uint64_t n_expert,
                uint64_t file_offset) {
  switch (class_of_name(name)) {
    case ByteClass::Engram: fp.engram_bytes += bytes; break;
    case ByteClass::RoutedExpert: {
      fp.routed_expert_bytes += bytes;
      fp.routed_loaded_bytes += loaded_tensor_bytes(type, bytes);
      note_expert_slice(fp, name, bytes, n_expert);
      const int part = name.find("ffn_gate_exps") != std::string::npos ? 0
                       : name.find("ffn_up_exps") != std::string::npos ? 1
                                                                        : 2;
      if (n_expert) fp.routed_tensors.push_back({part, file_offset, bytes / n_expert, n_expert});
      break;
    }
    case ByteClass::Resident:
      fp.resident_bytes += bytes;
      fp.resident_loaded_bytes += loaded_tensor_bytes(type, bytes);
      ++fp.resident_tensors;
      break;
  }
}

}  // namespace

uint64_t ModelFootprint::largest_expert_slice() const {
  return std::max({expert_gate_bytes, expert_up_bytes, expert_down_bytes});
}

uint64_t ModelFootprint::slot_window_bytes(uint64_t io_align) const {
  uint64_t part_max[3] = {0, 0, 0};
  for (const RoutedTensor& t : routed_tensors) {
    uint64_t w = 0;
    // Windows repeat with the period of the offsets mod io_align; every expert is checked anyway
    // (n_expert is small).
    for (uint64_t e = 0; e < t.n_expert; ++e) {
      const uint64_t begin = t.file_offset + e * t.slice, end = begin + t.slice;
      w = std::max(w, align_up(end, io_align) - begin / io_align * io_align);
    }
    part_max[t.part] = std::max(part_max[t.part], w);
  }
  return part_max[0] + part_max[1] + part_max[2];
}

ModelFootprint footprint_from_specs(const ModelConfig& c, const std::vector<TensorSpec>& tensors) {
  ModelFootprint fp;
  fp.config = c;
  fp.source = "config";
  for (const TensorSpec& t : tensors) add_tensor(fp, t.name, t.type, t.nbytes(), c.n_routed_experts, 0);
  return fp;
}

ModelFootprint footprint_from_gguf(const gguf::File& f) {
  ModelFootprint fp;
  fp.config = architecture_of(f).config(f, nullptr);
  fp.source = f.path();
  fp.metadata_bytes = f.data_offset();
  for (const gguf::TensorInfo& t : f.tensors()) {
    // A routed tensor's last dimension is the expert count whatever the config says.
    const uint64_t n_expert = t.n_dims >= 3 ? t.ne[2] : fp.config.n_routed_experts;
    add_tensor(fp, t.name, t.type, t.nbytes, n_expert, t.file_offset);
  }
  return fp;
}

uint64_t exchange_scratch_bytes(const ModelConfig& c, uint64_t rows) {
  const uint64_t H = c.hidden_size, F = c.moe_intermediate_size, T = rows * c.num_experts_per_tok;
  // Per row: the BF16 row (2H), as f32 (4H), its gate/up activations (at most 4H each), the
  // down output (4H); per expert row gate, up and the hidden activation (4F each) and three
  // pointers. Per triple: three 12-byte records, the term (4H) and its copy in the Result (4H).
  return rows * (18 * H + 12 * F + 24) + T * (8 * H + 36) + 2 * fabric::kHeaderBytes;
}

uint64_t largest_checkpoint_bytes(const ModelConfig& c) {
  return checkpoint_bytes(c, c.sliding_window) + (uint64_t)c.vocab_size * sizeof(float);
}

HostFacts read_host_facts() {
  HostFacts h;
  h.mem = read_meminfo();
  h.swaps = read_swaps();
  h.cgroup = read_cgroup_memory();
  return h;
}

BudgetSpec parse_budget(std::string_view text) {
  std::string t(text);
  for (char& ch : t) ch = (char)std::tolower((unsigned char)ch);
  if (t == "auto") return {};
  return BudgetSpec{false, parse_bytes(text, "--mem-budget")};
}

uint64_t auto_budget(const HostFacts& host) {
  const uint64_t avail = host.mem.available;
  uint64_t b = percent_of(avail, kAutoBudgetPercent);
  b = std::min(b, sat_sub(avail, percent_of(host.mem.total, kAutoBudgetReservePercent)));
  if (host.cgroup.limited) b = std::min(b, percent_of(host.cgroup.headroom(), kAutoBudgetPercent));
  return b;
}

namespace {

struct Eval {
  std::vector<PlanLine> mandatory;
  uint64_t mandatory_bytes = 0, bounce = 0, slot_bytes = 0, slots = 0, cache_bytes = 0;
  bool fits_mandatory = false;
};

// The expert store in what the mandatory part leaves: its bounce buffers and as many slots as
// fit (at most --cache-experts, and an expert server's owned experts).
void size_store(const ModelFootprint& fp, const PlanOptions& o, uint64_t budget, Eval& e) {
  // --cache-experts: the cache holds at most this many experts, whatever the budget leaves.
  const uint64_t held = o.expert_server ? std::min(o.owned_experts, fp.total_experts()) : fp.total_experts();
  const uint64_t slot_limit = o.max_cache_experts ? std::min<uint64_t>(held, o.max_cache_experts) : held;
  e.slot_bytes = fp.slot_window_bytes(o.io_align) + o.slot_record_bytes;
  const uint64_t avail = sat_sub(budget, e.mandatory_bytes);
  if (o.store_bytes) {
    // The store's figure: the largest slot count whose total fits (non-decreasing in slots).
    e.fits_mandatory = budget >= e.mandatory_bytes && o.store_bytes(0) <= avail;
    if (e.fits_mandatory) {
      uint64_t lo = 0, hi = slot_limit;
      while (lo < hi) {
        const uint64_t mid = lo + (hi - lo + 1) / 2;
        if (o.store_bytes(mid) <= avail) lo = mid;
        else hi = mid - 1;
      }
      e.slots = lo;
      e.cache_bytes = o.store_bytes(lo);
    }
  } else {
    e.bounce = (uint64_t)o.io_depth * (align_up(fp.largest_expert_slice(), o.io_align) + o.io_align);
    e.fits_mandatory = budget >= e.mandatory_bytes + e.bounce;
    if (e.fits_mandatory && e.slot_bytes > 0) {
      e.slots = std::min(slot_limit, (avail - e.bounce) / e.slot_bytes);
      e.cache_bytes = e.slots * e.slot_bytes;
    }
  }
}

// The measured overhead plus the allocator's bound for `allocations` long-lived allocations.
PlanLine overhead_line(const PlanOptions& o, uint64_t allocations) {
  const uint64_t slack = allocations * o.allocation_slack_bytes;
  return {"runtime overhead", o.overhead_bytes + slack,
          (o.overhead_bytes ? format_bytes(o.overhead_bytes) +
                                  " measured (this process's resident set when planning: binary, libraries, header, "
                                  "tokenizer) + "
                            : std::string("not measured (no process) + ")) +
              format_bytes(slack) + " allocator bound (" + num(allocations) + " allocations x " +
              format_bytes(o.allocation_slack_bytes) + ")"};
}

uint64_t thread_bytes(const ModelConfig& c, const PlanOptions& o) {
  return o.thread_stack_bytes + (uint64_t)(c.sliding_window + c.index_topk + c.head_dim) * 4 + (64u << 10);
}

// An expert server's lines (PlanOptions::expert_server): its experts, one exchange, its threads.
Eval evaluate_expert_server(const ModelFootprint& fp, const PlanOptions& o, uint32_t chunk, int threads, uint64_t budget) {
  const ModelConfig& c = fp.config;
  Eval e;
  auto add = [&](std::string name, uint64_t bytes, std::string detail) {
    e.mandatory.push_back({std::move(name), bytes, std::move(detail)});
    e.mandatory_bytes += bytes;
  };
  add("owned experts", fp.resident_loaded_bytes,
      num(o.owned_experts) + " of " + num(fp.total_experts()) + " routed experts " +
          (fp.resident_loaded_bytes ? std::string("loaded (packed per layer and tensor, 64-byte aligned)")
                                    : std::string("streamed through the expert store below")) +
          "; an expert server holds no dense weights, sequence state or Engram rows");
  add("exchange scratch", exchange_scratch_bytes(c, chunk),
      "one exchange of up to " + num(chunk) + " rows and " + num((uint64_t)chunk * c.num_experts_per_tok) +
          " expert terms: the frames, the rows as f32, the terms, the routed FFN's rows");
  add("threads", thread_bytes(c, o) * (uint64_t)threads,
      std::to_string(threads) + " x (" + format_bytes(o.thread_stack_bytes) + " stack + per-thread scratch)");
  const PlanLine overhead = overhead_line(o, fp.routed_tensors.size() + 16);
  add(overhead.name, overhead.bytes, overhead.detail);
  size_store(fp, o, budget, e);
  return e;
}

// Everything for one chunk size.
Eval evaluate(const ModelFootprint& fp, const PlanOptions& o, uint32_t chunk, int threads, uint64_t budget) {
  if (o.expert_server) return evaluate_expert_server(fp, o, chunk, threads, budget);
  const ModelConfig& c = fp.config;
  Eval e;
  auto add = [&](std::string name, uint64_t bytes, std::string detail) {
    e.mandatory.push_back({std::move(name), bytes, std::move(detail)});
    e.mandatory_bytes += bytes;
  };
  // The engine's own figures for these options (model/deepseek41/engine_footprint.h).
  const EngineFootprint ef = engine_footprint(c, o.ctx, chunk, fp.resident_loaded_bytes);
  add("resident weights", ef.weights,
      num(fp.resident_tensors) + " tensors as loaded (64-byte aligned): everything but routed experts (" +
          format_bytes(fp.routed_expert_bytes) + ") and Engram tables (" + format_bytes(fp.engram_bytes) + ")");

  const SequenceStateBytes& st = ef.sequence;
  add("sequence state", st.total() * o.sequences,
      std::to_string(o.sequences) + " x ctx " + num(o.ctx) + ": window rings " + format_bytes(st.window) +
          ", compressed KV " + format_bytes(st.compressed_kv) + ", index keys " + format_bytes(st.index_keys) +
          ", carry " + format_bytes(st.carry) + " (BF16 window rows, packed FP4 compressed rows and keys)");
  add("eval rollback point", ef.rollback,
      "a multi-chunk eval's checkpoint of its start: window rings, carries, Engram history (compressed rows are append-only)");

  const ScratchBytes& sc = ef.scratch;
  add("scratch", sc.total(),
      "chunk " + num(chunk) + ": activation tensors " + format_bytes(sc.workspace) + ", op temporaries " +
          format_bytes(sc.op_temporaries) + ", chunk rows " +
          format_bytes(sc.chunk_rows) + ", indexer scores " + format_bytes(sc.indexer_scores) +
          (sc.engram_reads ? ", Engram reads " + format_bytes(sc.engram_reads) : std::string()) +
          ", logits " + format_bytes(sc.logits));

  const uint64_t per_thread = thread_bytes(c, o);
  add("threads", per_thread * (uint64_t)threads,
      std::to_string(threads) + " x (" + format_bytes(o.thread_stack_bytes) + " stack + per-thread scratch)");

  const uint64_t n_tables = c.engram_layer_ids.size();
  const uint64_t cache_rows = o.engram_cache_rows * n_tables;
  add("Engram row cache", n_tables ? engram_cache_bytes(o.engram_cache_rows, n_tables, c.engram_row_bytes()) : 0,
      n_tables ? num(cache_rows) + " rows as read, LRU per table (a chunk's read staging is in the scratch)"
               : "no Engram layers");

  // Long-lived allocations: every loaded tensor, every vector of each sequence, and a few store
  // and session buffers (slab, slot table, checkpoint set, logits rows).
  const uint64_t allocations = fp.resident_tensors + fp.routed_tensors.size() +
                               (uint64_t)o.sequences * (2 + 4 * c.kv_source_layer_ids.size()) + 16;
  const PlanLine overhead = overhead_line(o, allocations);
  add(overhead.name, overhead.bytes, overhead.detail);

  // At most one checkpoint per position, so ctx of the largest bound them below the budget.
  const uint64_t one_checkpoint = largest_checkpoint_bytes(c) + o.dspark_per_sequence;  // + the drafter's rings
  const uint64_t checkpoints = std::min<uint64_t>(o.checkpoint_budget, (uint64_t)o.ctx * one_checkpoint);
  add("prefix checkpoints", checkpoints * o.sequences,
      o.checkpoint_budget == 0 ? std::string("off (checkpoint budget 0)")
                               : num(o.checkpoint_budget / one_checkpoint) + " x up to " + format_bytes(one_checkpoint) +
                                     " (window rings, carry, Engram history, logits row) per sequence");

  if (o.prefix_cache_budget)
    add("prefix cache", o.prefix_cache_budget,
        "--cache-ram, shared by " + num(o.sequences) + " sequence(s): whole states at prompt boundaries");
  if (o.state_disk) {
    const uint64_t one = state_queue_charge(state_shape(c, o.ctx), o.ctx, true);
    add("state disk buffers", 3 * one,
        "--kv-disk-dir: 2 snapshots waiting to be written + 1 being read, each up to " + format_bytes(one));
  }

  if (o.device_bytes) add("GPU weight copies", o.device_bytes, o.device_detail);
  if (o.device_held_bytes)
    add("GPU deferred rows", o.device_held_bytes(chunk),
        "the shared expert's gate and up rows of up to " + num(chunk) +
            " tokens, held until the deferred batch that reads them on the device has run");
  if (o.fabric_bytes)
    add("fabric exchange", o.fabric_bytes(chunk),
        "one layer's exchange of up to " + num(chunk) + " rows and " + num((uint64_t)chunk * c.num_experts_per_tok) +
            " remote terms: Work frames to every rank, the answers, the split terms");

  if (o.dspark_fixed || o.dspark_per_sequence || o.dspark_per_row)
    add("DSpark drafter", o.dspark_fixed + o.dspark_per_sequence * o.sequences + o.dspark_per_row * chunk,
        o.dspark_detail + "; rings " + format_bytes(o.dspark_per_sequence) + " x " + num(o.sequences) +
            " sequence(s); captured rows " + format_bytes(o.dspark_per_row) + " x chunk " + num(chunk));

  for (const PlanLine& l : o.caller_lines) add(l.name, l.bytes, l.detail);

  size_store(fp, o, budget, e);
  return e;
}

std::string swap_description(const HostFacts& host) {
  std::string s;
  for (const SwapArea& a : host.swaps)
    s += (s.empty() ? "" : ", ") + a.name + " (" + format_bytes(a.size) + ", " + format_bytes(a.used) + " used)";
  if (s.empty()) s = "SwapTotal " + format_bytes(host.mem.swap_total);
  return s;
}

}  // namespace

// The plan with the drafter's line as o gives it (make_plan chooses where its experts live).
static Plan make_plan_with(const ModelFootprint& fp, const PlanOptions& o, const HostFacts& host) {
  const ModelConfig& c = fp.config;
  if (o.ctx == 0) throw Error("-c/--ctx-size must be at least 1");
  if (o.ctx > c.max_position_embeddings)
    throw Error("-c/--ctx-size " + num(o.ctx) + " exceeds the model's max_position_embeddings " + num(c.max_position_embeddings));
  if (o.sequences == 0) throw Error("sequences must be at least 1");
  if (o.threads < 0) throw Error("--threads must not be negative");
  if (o.io_align == 0 || (o.io_align & (o.io_align - 1)) != 0) throw Error("io_align must be a power of two");
  if (c.num_experts_per_tok == 0 || c.n_routed_experts == 0) throw Error("model has no routed experts");

  Plan p;
  p.model = fp.source;
  p.ctx = o.ctx;
  p.device_plan_title = o.device_plan_title;
  p.device_plan = o.device_plan;
  if (o.state_disk) {
    // What the "state disk buffers" line holds (the queue's size is the Session's StateDisk's).
    const uint64_t one = state_queue_charge(state_shape(c, o.ctx), o.ctx, true);
    p.state_disk_queue = 2 * one;
    p.state_disk_read = one;
  }
  p.sequences = o.sequences;
  p.threads = o.threads > 0 ? o.threads : std::max(1, (int)std::thread::hardware_concurrency());
  p.engram_cache_rows = c.engram_layer_ids.empty() ? 0 : o.engram_cache_rows;
  p.top_k = c.num_experts_per_tok;
  p.n_expert = c.n_routed_experts;
  p.total_experts = fp.total_experts();
  p.expert_bytes = fp.expert_bytes();
  p.chunk_auto = o.chunk == 0;
  if (o.budget.is_auto) {
    p.budget = auto_budget(host);
    char frac_buf[16];
    std::snprintf(frac_buf, sizeof frac_buf, "%.2f", (double)kAutoBudgetPercent / 100);
    const std::string frac = frac_buf;
    p.budget_source = "auto: min(" + frac + " x MemAvailable " + format_bytes(host.mem.available) +
                      ", MemAvailable - " + std::to_string(kAutoBudgetReservePercent) + "% of MemTotal (" +
                      format_bytes(host.mem.total) + ")" +
                      (host.cgroup.limited ? ", " + frac + " x cgroup headroom " + format_bytes(host.cgroup.headroom())
                                           : std::string()) +
                      ")";
  } else {
    p.budget = o.budget.bytes;
    p.budget_source = "--mem-budget " + format_bytes(o.budget.bytes);
    if (host.mem.total && o.budget.bytes > host.mem.available)
      p.warnings.push_back("the budget " + format_bytes(o.budget.bytes) + " is more than MemAvailable now (" +
                           format_bytes(host.mem.available) + ")");
  }
  if (o.checkpoint_budget > 0 && o.checkpoint_budget < largest_checkpoint_bytes(c))
    p.warnings.push_back("the checkpoint budget " + format_bytes(o.checkpoint_budget) + " is below one checkpoint (" +
                         format_bytes(largest_checkpoint_bytes(c)) +
                         "): prompts that do not extend the kept sequence may be evaluated from the start");
  if (o.chunk > o.ctx) p.warnings.push_back("--chunk " + num(o.chunk) + " is larger than -c/--ctx-size: using " + num(o.ctx));

  p.cache_per_layer = o.cache_per_layer;
  p.cache_policy = !o.cache_policy.empty() ? o.cache_policy : o.cache_per_layer ? "lru-per-layer" : "lru-global";
  auto cap = [&](uint64_t slots) { return union_capacity(slots, c.num_hidden_layers, c.n_routed_experts, o.cache_per_layer); };
  // One token's experts of a layer that this process computes: top_k, or for an expert server
  // at most the experts of a layer it owns.
  const uint64_t token_need = o.expert_server ? std::min<uint64_t>(p.top_k, o.owned_per_layer_max) : p.top_k;
  // Does a chunk fit: mandatory part within the budget, and a layer's share holding one token's
  // experts? A chunk's union larger than the share streams through it in windows
  // (model/streamed_experts.h), so the cache no longer bounds the chunk.
  auto fits = [&](uint32_t ch, Eval& e) {
    e = evaluate(fp, o, ch, p.threads, p.budget);
    return e.fits_mandatory && cap(e.slots) >= token_need;
  };
  // The largest chunk in [1, top] that fits. Fitting is monotone (a bigger chunk needs more
  // scratch, leaving fewer slots), so a binary search finds it.
  auto largest_fitting = [&](uint32_t top) -> uint32_t {
    Eval e;
    if (fits(top, e)) return top;
    if (!fits(1, e)) return 0;
    uint32_t lo = 1, hi = top;  // fits(lo), !fits(hi)
    while (hi - lo > 1) {
      const uint32_t mid = lo + (hi - lo) / 2;
      (fits(mid, e) ? lo : hi) = mid;
    }
    return lo;
  };
  Eval chosen;
  if (o.chunk > 0) {
    p.chunk = std::min(o.chunk, o.ctx);
    fits(p.chunk, chosen);  // fills chosen; the refusals below say why it may not fit
  } else {
    const uint32_t best = largest_fitting(std::max<uint32_t>(1, std::min(o.max_chunk, o.ctx)));
    p.chunk = best ? best : 1;  // nothing fits: report on the smallest chunk
    fits(p.chunk, chosen);  // the same for the automatic choice
  }
  p.mandatory = std::move(chosen.mandatory);
  p.mandatory_bytes = chosen.mandatory_bytes;
  p.bounce_bytes = chosen.bounce;
  p.store_figure = (bool)o.store_bytes;
  p.slot_bytes = chosen.slot_bytes;
  p.cache_slots = chosen.slots;
  p.cache_bytes = chosen.cache_bytes;
  p.chunk_union = chunk_expert_union(p.chunk, p.top_k, p.n_expert);
  p.union_capacity = cap(p.cache_slots);
  p.max_chunk_for_cache = p.union_capacity >= p.n_expert ? o.ctx : (uint32_t)(p.union_capacity / p.top_k);
  p.stream_window = p.chunk_union > p.union_capacity ? std::max<uint64_t>(1, p.union_capacity / 2) : 0;
  p.dspark = o.dspark_block != 0;
  if (o.dspark_block) p.dspark_verify_max = std::min<uint32_t>(o.dspark_block, std::max<uint32_t>(p.max_chunk_for_cache, 1) - 1);
  p.unused_bytes = sat_sub(p.budget, p.planned_bytes());

  // With several sequences their states (and checkpoint budgets) are counted once each.
  const std::string reduce = o.sequences > 1 ? "raise --mem-budget or lower --parallel (" + num(o.sequences) +
                                                   " sequence states), -c/--ctx-size, --chunk or --threads"
                                             : "raise --mem-budget or lower -c/--ctx-size, --chunk or --threads";
  const std::string holds_per_layer =
      o.cache_per_layer ? " (" + num(p.union_capacity) + " per layer under " + p.cache_policy + ")" : std::string();
  if (!chosen.fits_mandatory) {
    const uint64_t need = p.mandatory_bytes + p.bounce_bytes + (o.store_bytes ? o.store_bytes(0) : 0);
    std::string parts;
    for (const PlanLine& l : p.mandatory) parts += (parts.empty() ? "" : ", ") + l.name + " " + format_bytes(l.bytes);
    if (p.bounce_bytes) parts += ", bounce buffers " + format_bytes(p.bounce_bytes);
    p.refusals.push_back("the mandatory part needs " + format_bytes(need) + " but the budget is " +
                         format_bytes(p.budget) + " (" + format_bytes(need - std::min(need, p.budget)) +
                         " short): " + parts + "; " + reduce);
  } else if (p.union_capacity < token_need) {
    p.refusals.push_back("the expert cache left by the budget holds " + num(p.cache_slots) + " experts of " +
                         format_bytes(p.slot_bytes) + holds_per_layer + " but one token needs " +
                         (o.expert_server ? std::to_string(token_need) + " (what this rank owns of a layer, at most top_k)"
                                          : "top_k = " + std::to_string(p.top_k)) +
                         " experts of a layer; " + reduce);
  }
  p.swap_active = host.swap_active();
  if (p.swap_active) {
    p.swap_detail = swap_description(host);
    if (o.allow_swap)
      p.warnings.push_back("swap is active (" + p.swap_detail + "); allowed by --allow-swap");
    else
      p.refusals.push_back("swap is active (" + p.swap_detail +
                           "): a process streaming experts must fail, not page; disable swap (swapoff -a) or "
                           "pass --allow-swap");
  }
  p.admitted = p.refusals.empty();
  return p;
}

std::string format_plan(const Plan& p) {
  std::string out;
  char buf[512];
  auto row = [&](const std::string& name, uint64_t bytes, const std::string& detail) {
    std::snprintf(buf, sizeof buf, "  %-18s %12s", name.c_str(), format_bytes(bytes).c_str());
    out += buf;
    out += detail.empty() ? "\n" : "  " + detail + "\n";
  };
  out += "sluice plan: " + p.model + "\n";
  out += "  ctx " + num(p.ctx) + ", sequences " + std::to_string(p.sequences) + ", chunk " + num(p.chunk) +
         (p.chunk_auto ? " (auto)" : "") + ", threads " + std::to_string(p.threads) + "\n";
  row("budget", p.budget, p.budget_source);
  for (const PlanLine& l : p.mandatory) row(l.name, l.bytes, l.detail);
  row("mandatory total", p.mandatory_bytes, "");
  const double frac = p.total_experts ? (double)p.cache_slots / (double)p.total_experts : 0;
  if (p.store_figure) {
    row("expert cache", p.cache_bytes,
        num(p.cache_slots) + " expert slots (" + pct(frac) + " of " + num(p.total_experts) +
            "), the expert store's own figure: slots, slot records, no separate bounce area (reads land in the slots)");
  } else {
    row("bounce buffers", p.bounce_bytes, "direct-I/O buffers: largest expert slice + one page each");
    row("expert cache", p.cache_bytes,
        num(p.cache_slots) + " slots x " + format_bytes(p.slot_bytes) + " (expert " + num(p.expert_bytes) +
            " B in aligned windows + slot record) = " + pct(frac) + " of " + num(p.total_experts) + " routed experts");
  }
  row("unused", p.unused_bytes, p.cache_slots == p.total_experts && p.total_experts ? "every routed expert fits" : "");
  out += "  chunk " + num(p.chunk) + " can need min(" + num(p.chunk) + " x " + std::to_string(p.top_k) + ", " +
         num(p.n_expert) + ") = " + num(p.chunk_union) + " experts of one layer; one layer can hold " +
         num(p.union_capacity) + (p.cache_per_layer ? " (" + p.cache_policy + " share)" : " (" + p.cache_policy + ")") + ", " +
         (p.union_capacity < p.top_k ? std::string("not one token's experts")
          : p.stream_window == 0
              ? "so a chunk's experts are leased at once"
              : "so a longer chunk's experts stream through it in windows of " + num(p.stream_window) +
                    " (each read at most once per layer per chunk; at once up to chunk " + num(p.max_chunk_for_cache) + ")") +
         "\n";
  if (p.dspark)
    out += "  DSpark: a verify pass checks at most " + num(p.dspark_verify_max) + " drafts" +
           (p.dspark_verify_max < 2 ? " (fewer than 2: no speculation; a larger expert cache allows it)"
                                    : " (its " + num(p.dspark_verify_max + 1) + " rows' experts fit the cache at once)") +
           "; the drafter's routed experts are " +
           (p.dspark_streamed ? "streamed (" + num(p.dspark_cache_slots) + " slots of their own)" : std::string("resident")) +
           "\n";
  if (!p.device_plan_title.empty()) {
    out += "  " + p.device_plan_title + "\n";
    for (const PlanLine& l : p.device_plan) row("  " + l.name, l.bytes, l.detail);
  }
  out += std::string("  swap: ") + (p.swap_active ? "active: " + p.swap_detail : "off") + "\n";
  for (const std::string& w : p.warnings) out += "  warning: " + w + "\n";
  if (p.admitted) {
    out += "verdict: admitted (" + format_bytes(p.planned_bytes()) + " of " + format_bytes(p.budget) + ")\n";
  } else {
    out += "verdict: refused\n";
    for (const std::string& r : p.refusals) out += "  refused: " + r + "\n";
  }
  return out;
}

nlohmann::ordered_json plan_to_json(const Plan& p) {
  nlohmann::ordered_json j;
  j["model"] = p.model;
  j["ctx"] = p.ctx;
  j["sequences"] = p.sequences;
  j["chunk"] = p.chunk;
  j["chunk_auto"] = p.chunk_auto;
  j["threads"] = p.threads;
  j["budget"] = p.budget;
  j["budget_source"] = p.budget_source;
  nlohmann::ordered_json lines = nlohmann::ordered_json::array();
  for (const PlanLine& l : p.mandatory) lines.push_back({{"name", l.name}, {"bytes", l.bytes}, {"detail", l.detail}});
  j["mandatory"] = lines;
  j["mandatory_bytes"] = p.mandatory_bytes;
  j["bounce_bytes"] = p.bounce_bytes;
  j["store_figure"] = p.store_figure;
  j["expert_bytes"] = p.expert_bytes;
  j["slot_bytes"] = p.slot_bytes;
  j["cache_slots"] = p.cache_slots;
  j["cache_bytes"] = p.cache_bytes;
  j["total_experts"] = p.total_experts;
  j["top_k"] = p.top_k;
  j["n_expert"] = p.n_expert;
  j["cache_policy"] = p.cache_policy;
  j["union_capacity"] = p.union_capacity;
  j["chunk_union"] = p.chunk_union;
  j["max_chunk_for_cache"] = p.max_chunk_for_cache;
  j["stream_window"] = p.stream_window;
  if (p.dspark) {
    j["dspark_verify_max"] = p.dspark_verify_max;
    j["dspark_experts"] = p.dspark_streamed ? "streamed" : "resident";
    j["dspark_cache_slots"] = p.dspark_cache_slots;
  }
  if (!p.device_plan_title.empty()) {
    nlohmann::ordered_json dl = nlohmann::ordered_json::array();
    for (const PlanLine& l : p.device_plan) dl.push_back({{"name", l.name}, {"bytes", l.bytes}, {"detail", l.detail}});
    j["device"] = {{"title", p.device_plan_title}, {"lines", dl}};
  }
  j["unused_bytes"] = p.unused_bytes;
  j["planned_bytes"] = p.planned_bytes();
  j["swap_active"] = p.swap_active;
  j["admitted"] = p.admitted;
  j["refusals"] = p.refusals;
  j["warnings"] = p.warnings;
  return j;
}

DsparkExperts parse_dspark_experts(std::string_view s) {
  if (s == "auto") return DsparkExperts::Auto;
  if (s == "resident") return DsparkExperts::Resident;
  if (s == "stream") return DsparkExperts::Streamed;
  throw Error("--dspark-experts must be auto, resident or stream (got '" + std::string(s) + "')");
}

// The drafter's routed experts are a choice of the plan: resident they cost their bytes once
// and no reads; streamed they cost a small cache (one proposal's worst-case union per stage)
// and reads at every proposal. Resident is the better use of memory whenever it fits with a
// useful verify depth, because all three stages' experts are touched on every cycle; only a
// budget too tight for that streams them.
Plan make_plan(const ModelFootprint& fp, const PlanOptions& o, const HostFacts& host) {
  if (!o.dspark_block) return make_plan_with(fp, o, host);
  auto with = [&](bool streamed, const std::string& why) {
    PlanOptions q = o;
    q.dspark_fixed += streamed ? o.dspark_stream_bytes : o.dspark_expert_bytes;
    q.dspark_detail += streamed ? "; routed experts streamed through a cache of " + num(o.dspark_stream_slots) + " (" +
                                      format_bytes(o.dspark_stream_bytes) + ", one proposal's worst case per stage" + why + ")"
                                : "; routed experts resident (" + format_bytes(o.dspark_expert_bytes) + why + ")";
    Plan p = make_plan_with(fp, q, host);
    p.dspark_streamed = streamed;
    p.dspark_cache_slots = streamed ? o.dspark_stream_slots : 0;
    return p;
  };
  if (o.dspark_experts == DsparkExperts::Streamed) {
    if (!o.dspark_stream_bytes) throw Error("--dspark-experts stream: the drafter's experts cannot be streamed here (no store figure)");
    return with(true, "; --dspark-experts stream");
  }
  if (o.dspark_experts == DsparkExperts::Resident || !o.dspark_stream_bytes) return with(false, "");
  Plan r = with(false, "");
  if (r.admitted && r.dspark_verify_max >= 2) return r;
  Plan s = with(true, r.admitted ? "; resident they would leave the verify pass fewer than 2 drafts"
                                 : "; resident they do not fit the budget");
  if (s.admitted && (!r.admitted || s.dspark_verify_max >= 2)) return s;
  return r;
}

std::string refusal_summary(const Plan& p) {
  if (p.admitted) return "";
  std::string s = "memory admission refused";
  if (!p.refusals.empty()) s += ": " + p.refusals.front();
  if (p.refusals.size() > 1) s += " (and " + std::to_string(p.refusals.size() - 1) + " more)";
  return s;
}

void require_admitted(const Plan& p) {
  if (!p.admitted) throw Error(refusal_summary(p));
}

}  // namespace sluice
