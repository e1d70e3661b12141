#include "server/metrics.h"

#include <cstdio>

namespace sluice::server {

void HttpCounters::count(const std::string& endpoint, int status) {
  std::lock_guard lk(mu_);
  requests_[{endpoint, status}]++;
}

void HttpCounters::reject(const std::string& reason) {
  std::lock_guard lk(mu_);
  rejections_[reason]++;
}

std::map<std::pair<std::string, int>, uint64_t> HttpCounters::requests() const {
  std::lock_guard lk(mu_);
  return requests_;
}

std::map<std::string, uint64_t> HttpCounters::rejections() const {
  std::lock_guard lk(mu_);
  return rejections_;
}

const std::vector<double>& HttpCounters::ttft_bounds() {
  static const std::vector<double> b = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
  return b;
}

void HttpCounters::observe_ttft(double seconds) {
  std::lock_guard lk(mu_);
  if (ttft_.counts.empty()) {
    ttft_.bounds = ttft_bounds();
    ttft_.counts.assign(ttft_.bounds.size() + 1, 0);
  }
  size_t i = 0;
  while (i < ttft_.bounds.size() && seconds > ttft_.bounds[i]) ++i;
  ttft_.counts[i]++;
  ttft_.sum += seconds;
  ttft_.count++;
}

HttpCounters::Histogram HttpCounters::ttft() const {
  std::lock_guard lk(mu_);
  Histogram h = ttft_;
  if (h.counts.empty()) {
    h.bounds = ttft_bounds();
    h.counts.assign(h.bounds.size() + 1, 0);
  }
  return h;
}

namespace {

class Writer {
 public:
  void family(const char* name, const char* type, const char* help) {
    out += "# HELP ";
    out += name;
    out += ' ';
    out += help;
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += type;
    out += '\n';
  }
  void sample(const std::string& name, const std::string& labels, double v) {
    char num[64];
    std::snprintf(num, sizeof num, "%.17g", v);
    out += name;
    if (!labels.empty()) out += "{" + labels + "}";
    out += ' ';
    out += num;
    out += '\n';
  }
  void one(const char* name, const char* type, const char* help, double v) {
    family(name, type, help);
    sample(name, "", v);
  }
  // A Prometheus histogram from per-bucket (not cumulative) counts; the last count is above
  // every bound.
  void histogram(const char* name, const char* help, const std::vector<double>& bounds,
                 const std::vector<uint64_t>& counts, double sum) {
    family(name, "histogram", help);
    uint64_t cum = 0;
    for (size_t i = 0; i < bounds.size(); ++i) {
      cum += counts[i];
      char le[64];
      std::snprintf(le, sizeof le, "le=\"%g\"", bounds[i]);
      sample(std::string(name) + "_bucket", le, (double)cum);
    }
    cum += counts.back();
    sample(std::string(name) + "_bucket", "le=\"+Inf\"", (double)cum);
    sample(std::string(name) + "_sum", "", sum);
    sample(std::string(name) + "_count", "", (double)cum);
  }
  std::string out;
};

// Label values escape backslash, double quote and newline.
std::string label(const std::string& v) {
  std::string s;
  for (char c : v) {
    if (c == '\\' || c == '"') s += '\\', s += c;
    else if (c == '\n') s += "\\n";
    else s += c;
  }
  return s;
}

}  // namespace

std::string render_metrics(const MetricsInput& in) {
  Writer w;
  w.one("sluice_model_loaded", "gauge", "1 when the model is loaded and requests are served.", in.loaded ? 1 : 0);
  if (in.http) {
    w.family("sluice_http_requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
    for (const auto& [k, v] : in.http->requests())
      w.sample("sluice_http_requests_total", "endpoint=\"" + label(k.first) + "\",code=\"" + std::to_string(k.second) + "\"", (double)v);
    w.family("sluice_requests_rejected_total", "counter", "Requests refused before generation, by reason.");
    for (const char* r : {"queue_full", "too_large", "bad_request", "unauthorized", "not_ready", "timeout", "connections",
                          "request_memory", "token_slots"}) {
      const auto rej = in.http->rejections();
      const auto it = rej.find(r);
      w.sample("sluice_requests_rejected_total", std::string("reason=\"") + r + "\"", it == rej.end() ? 0.0 : (double)it->second);
    }
    const HttpCounters::Histogram t = in.http->ttft();
    w.histogram("sluice_time_to_first_token_seconds", "Seconds from queueing a request to its first generated token.",
                t.bounds, t.counts, t.sum);
  }
  if (in.worker) {
    w.one("sluice_requests_completed_total", "counter", "Generations that ran to a stop, length or context limit.",
          (double)in.worker->completed.load());
    w.family("sluice_requests_cancelled_total", "counter", "Generations cancelled, by reason.");
    w.sample("sluice_requests_cancelled_total", "reason=\"disconnect\"", (double)in.worker->cancelled_disconnect.load());
    w.sample("sluice_requests_cancelled_total", "reason=\"shutdown\"", (double)in.worker->cancelled_shutdown.load());
    w.one("sluice_requests_failed_total", "counter", "Generations that ended with an error.", (double)in.worker->failed.load());
    w.one("sluice_prompt_tokens_cached_total", "counter",
          "Prompt tokens not evaluated again (the kept sequence, or a prefix checkpoint of it).",
          (double)in.worker->reused_tokens.load());
  }
  w.one("sluice_requests_processing", "gauge", "Generations running now (at most --parallel).", (double)in.running);
  w.one("sluice_slots", "gauge", "Sequences the engine runs at once (--parallel).", (double)in.slots);
  w.one("sluice_requests_waiting", "gauge", "Requests waiting in the queue.", (double)in.waiting);
  w.one("sluice_queue_capacity", "gauge", "Requests that may wait behind the running ones (--queue).", (double)in.queue_depth);

  const SessionStats& s = in.session;
  // Continuous batching: how many sequences each step evaluated together (1, 2, 4, ... up to
  // --parallel), and what each slot is doing.
  {
    std::vector<double> bounds;
    std::vector<uint64_t> counts;
    const size_t n = s.steps_by_sequences.empty() ? 1 : s.steps_by_sequences.size() - 1;
    for (size_t b = 1; b < n; b *= 2) bounds.push_back((double)b);
    bounds.push_back((double)n);
    counts.assign(bounds.size() + 1, 0);
    double sum = 0;
    for (size_t k = 1; k < s.steps_by_sequences.size(); ++k) {
      size_t i = 0;
      while (i < bounds.size() && (double)k > bounds[i]) ++i;
      counts[i] += s.steps_by_sequences[k];
      sum += (double)k * (double)s.steps_by_sequences[k];
    }
    w.histogram("sluice_batch_sequences", "Sequences evaluated together per engine step (--parallel batches them).",
                bounds, counts, sum);
  }
  w.one("sluice_prefix_cache_entries", "gauge", "States held by the shared prefix cache (--cache-ram).", (double)s.prefix_entries);
  w.one("sluice_prefix_cache_bytes", "gauge", "Bytes the shared prefix cache holds (charged per entry).", (double)s.prefix_bytes);
  w.one("sluice_prefix_cache_budget_bytes", "gauge", "The shared prefix cache's budget (--cache-ram; 0: none).",
        (double)s.prefix_budget);
  w.one("sluice_prefix_cache_lookups_total", "counter", "Requests that looked their prompt up in the prefix cache.",
        (double)s.prefix_lookups);
  w.one("sluice_prefix_cache_hits_total", "counter", "Requests that started from a prefix cache state.", (double)s.prefix_hits);
  w.one("sluice_prefix_cache_hit_tokens_total", "counter", "Prompt tokens those hits did not evaluate again.",
        (double)s.prefix_hit_tokens);
  w.one("sluice_prefix_cache_evicted_total", "counter", "Prefix cache states dropped to stay in the budget.",
        (double)s.prefix_evicted);
  if (s.state_disk) {
    w.one("sluice_state_disk_entries", "gauge", "State files of this model in --kv-disk-dir.", (double)s.disk_entries);
    w.one("sluice_state_disk_bytes", "gauge", "Bytes of those files.", (double)s.disk_bytes);
    w.one("sluice_state_disk_budget_bytes", "gauge", "Their budget (--kv-disk-budget).", (double)s.disk_budget);
    w.one("sluice_state_disk_lookups_total", "counter", "Requests that looked their prompt up on disk.", (double)s.disk_lookups);
    w.one("sluice_state_disk_hits_total", "counter", "Requests that started from a state read from disk.", (double)s.disk_hits);
    w.one("sluice_state_disk_hit_tokens_total", "counter", "Prompt tokens those hits did not evaluate again.",
          (double)s.disk_hit_tokens);
    w.one("sluice_state_disk_written_total", "counter", "State files written.", (double)s.disk_written);
    w.one("sluice_state_disk_written_bytes_total", "counter", "Bytes of state files written.", (double)s.disk_written_bytes);
    w.one("sluice_state_disk_skipped_total", "counter",
          "Snapshots not written: the write queue full, larger than the budget, the disk nearly full.", (double)s.disk_skipped);
    w.one("sluice_state_disk_evicted_total", "counter", "State files deleted to stay within the budget.", (double)s.disk_evicted);
    w.one("sluice_state_disk_rejected_total", "counter",
          "This model's state files that failed their checks (deleted; the state was recomputed).", (double)s.disk_rejected);
    w.one("sluice_state_disk_write_errors_total", "counter", "State file writes that failed.", (double)s.disk_write_errors);
  }
  if (s.dspark) {
    w.one("sluice_dspark_blocks_total", "counter", "Drafter blocks proposed (--dspark).", (double)s.spec_blocks);
    w.one("sluice_dspark_cycles_total", "counter", "Speculative verify passes.", (double)s.spec_cycles);
    w.one("sluice_dspark_drafts_total", "counter", "Drafts verified.", (double)s.spec_drafts);
    w.one("sluice_dspark_drafts_accepted_total", "counter", "Drafts accepted by the exact rule.", (double)s.spec_accepted);
    w.one("sluice_dspark_tokens_total", "counter", "Tokens emitted by verify passes (accepted drafts + one each).",
          (double)s.spec_tokens);
    w.one("sluice_dspark_guard_pauses_total", "counter", "Times the acceptance guard paused drafting for 64 tokens.",
          (double)s.spec_pauses);
    w.one("sluice_dspark_propose_seconds_total", "counter", "Seconds spent proposing blocks.", s.spec_propose_s);
    w.one("sluice_dspark_verify_seconds_total", "counter", "Seconds spent in verify passes.", s.spec_verify_s);
    // The drafter's own expert store (--dspark-experts stream; all zero when its experts are resident).
    const storage::LayerStats d = s.dspark_store.total();
    w.one("sluice_dspark_expert_slots", "gauge", "Slots of the drafter's expert store (0: its experts are resident).",
          (double)s.dspark_store.slots);
    w.one("sluice_dspark_expert_requests_total", "counter", "Drafter expert lookups in its store.", (double)d.requests);
    w.one("sluice_dspark_expert_hits_total", "counter", "Drafter expert lookups served from memory.", (double)d.hits);
    w.one("sluice_dspark_expert_read_bytes_total", "counter", "Bytes the drafter's expert store read from the support file.",
          (double)(d.bytes_demand + d.bytes_prefetch));
  }
  if (s.gpu) {
    // --backend vulkan: the device's copies and its routed-expert slots (the tier above the
    // expert cache below; a slot hit is no lookup there).
    const GpuStats& g = s.gpu_stats;
    w.one("sluice_gpu_weight_bytes", "gauge", "Bytes of weights and expert slots on the device.", (double)g.bytes_on_device);
    w.one("sluice_gpu_linear_total", "counter", "Linear layers run on the device.", (double)g.linear_on_device);
    w.one("sluice_gpu_linear_host_total", "counter", "Linear layers run on the CPU (no copy on the device).",
          (double)g.linear_on_host);
    w.one("sluice_gpu_kv_slots", "gauge", "Attention rows the device keeps between steps (--gpu-kv).", (double)g.kv_slots);
    w.one("sluice_gpu_kv_hits_total", "counter", "Attention rows read from a device slot.", (double)g.kv_hits);
    w.one("sluice_gpu_kv_misses_total", "counter", "Attention rows copied into a device slot.", (double)g.kv_misses);
    w.one("sluice_gpu_kv_staged_total", "counter", "Attention rows staged with their batch (no slot free of it).",
          (double)g.kv_staged);
    w.one("sluice_gpu_expert_slots", "gauge", "Routed-expert slots on the device (--gpu-experts).", (double)g.expert_slots);
    w.one("sluice_gpu_expert_hits_total", "counter", "Routed-expert lookups served by a device slot.", (double)g.expert_hits);
    w.one("sluice_gpu_expert_misses_total", "counter", "Routed-expert lookups copied into a slot from the host store.",
          (double)g.expert_misses);
    w.one("sluice_gpu_expert_upload_bytes_total", "counter", "Bytes of experts copied into device slots.",
          (double)g.expert_upload_bytes);
    w.one("sluice_gpu_expert_upload_seconds_total", "counter",
          "Time the host spent copying routed-expert misses into device slots (the slot tier's stall).",
          (double)g.expert_upload_ns() / 1e9);
    w.one("sluice_gpu_expert_uploads_ahead_total", "counter",
          "Routed experts copied into mapped slots while the device ran the group before.",
          (double)g.expert_uploads_ahead);
    w.one("sluice_gpu_expert_uploads_hinted_total", "counter",
          "Routed experts copied into unmapped slots by hint-started copies, ahead of their layer.",
          (double)g.expert_uploads_hinted);
    w.one("sluice_gpu_expert_hints_used_total", "counter",
          "Of the hint-started copies, those their layer's routed op used (each also a miss).",
          (double)g.expert_hints_used);
    w.one("sluice_gpu_expert_hints_dropped_total", "counter",
          "Expert hints the device dropped: its last hint-started copies were still in flight.",
          (double)g.expert_hints_dropped);
    w.one("sluice_gpu_expert_cpu_total", "counter",
          "Routed-expert lookups without a slot computed by the CPU from host memory (--cpu-experts).",
          (double)g.expert_on_cpu);
    w.one("sluice_gpu_expert_in_place_total", "counter",
          "Routed experts the device ran from the host store's memory (--gpu-experts in-place, no copy).",
          (double)g.expert_in_place);
  }
  w.family("sluice_slot_busy", "gauge", "1 while the slot runs a request.");
  for (size_t k = 0; k < s.slot.size(); ++k)
    w.sample("sluice_slot_busy", "slot=\"" + std::to_string(k) + "\"", s.slot[k].phase == SlotStats::Phase::Idle ? 0 : 1);
  w.family("sluice_slot_tokens", "gauge", "Tokens in the slot's sequence (kept for the next turn when idle).");
  for (size_t k = 0; k < s.slot.size(); ++k)
    w.sample("sluice_slot_tokens", "slot=\"" + std::to_string(k) + "\"", (double)s.slot[k].position);

  w.one("sluice_generate_calls_total", "counter", "Generations the engine started.", (double)s.requests);
  w.one("sluice_prompt_tokens_total", "counter", "Prompt tokens evaluated (prefill).", (double)s.prompt_tokens);
  w.one("sluice_prompt_seconds_total", "counter", "Seconds spent in prefill.", s.prefill_s);
  w.one("sluice_tokens_predicted_total", "counter", "Tokens generated.", (double)s.generated_tokens);
  w.one("sluice_tokens_predicted_seconds_total", "counter", "Seconds spent generating tokens.", s.decode_s);

  const storage::LayerStats t = s.store.total();
  w.one("sluice_expert_streaming", "gauge", "1 when routed experts are streamed from disk, 0 when resident.", s.streaming ? 1 : 0);
  w.one("sluice_expert_cache_requests_total", "counter", "Expert lookups in the expert cache.", (double)t.requests);
  w.one("sluice_expert_cache_hits_total", "counter", "Expert lookups served from memory.", (double)t.hits);
  w.one("sluice_expert_cache_misses_total", "counter", "Expert lookups that needed a read.", (double)t.misses);
  w.family("sluice_expert_bytes_read_total", "counter", "Bytes of experts read from disk, by cause.");
  w.sample("sluice_expert_bytes_read_total", "kind=\"demand\"", (double)t.bytes_demand);
  w.sample("sluice_expert_bytes_read_total", "kind=\"prefetch\"", (double)t.bytes_prefetch);
  w.one("sluice_expert_read_errors_total", "counter", "Expert loads that failed after retries.", (double)t.read_errors);
  w.one("sluice_expert_evictions_total", "counter", "Experts evicted from the cache.", (double)t.evictions);
  w.one("sluice_expert_stall_seconds_total", "counter", "Seconds generation waited for expert reads.", (double)t.stall_ns / 1e9);
  w.one("sluice_expert_cache_slots", "gauge", "Expert cache slots.", (double)s.store.slots);
  w.one("sluice_expert_cache_slots_used", "gauge", "Expert cache slots holding an expert.", (double)s.store.slots_used);
  w.one("sluice_expert_cache_bytes", "gauge", "Bytes of the expert cache (slots x slot size).",
        (double)s.store.slots * (double)s.store.slot_bytes);

  w.one("sluice_memory_rss_bytes", "gauge", "Resident memory of the server process now.", (double)in.rss_bytes);
  w.one("sluice_request_memory_bytes", "gauge", "The request memory (--request-memory), planned with the model.",
        (double)in.request_memory_bytes);
  w.one("sluice_request_memory_used_bytes", "gauge", "Request memory taken by the requests in flight now.",
        (double)in.request_memory_used);
  w.one("sluice_request_memory_peak_bytes", "gauge", "The most request memory taken at once since the start.",
        (double)in.request_memory_peak);
  w.one("sluice_request_memory_refused_total", "counter",
        "Requests refused because their working memory was not free (503) or larger than the pool (413).",
        (double)in.request_memory_refused);
  w.one("sluice_memory_budget_bytes", "gauge", "Memory budget admitted at load (--mem-budget).", (double)s.budget_bytes);
  w.one("sluice_memory_planned_bytes", "gauge", "Memory the load plan accounts for.", (double)s.planned_bytes);
  return w.out;
}

}  // namespace sluice::server
