// /metrics in the Prometheus text exposition format (version 0.0.4): HELP and TYPE lines, then
// samples. Counters end in _total. Names follow llama.cpp's where the meaning matches, under the
// sluice_ prefix, plus the expert-store and memory numbers an SSD engine needs.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/session.h"
#include "server/worker.h"

namespace sluice::server {

// Counters of the HTTP side (the worker and the Session keep the generation ones).
class HttpCounters {
 public:
  void count(const std::string& endpoint, int status);
  void reject(const std::string& reason);  // queue_full, too_large, bad_request, unauthorized, not_ready, timeout, connections
  std::map<std::pair<std::string, int>, uint64_t> requests() const;
  std::map<std::string, uint64_t> rejections() const;
  // Time from queueing to the first generated token, one per request that got one.
  void observe_ttft(double seconds);
  struct Histogram {
    std::vector<double> bounds;    // upper bounds of the buckets, ascending (+Inf implied)
    std::vector<uint64_t> counts;  // per bucket, not cumulative; bounds.size() + 1 (the last: above all)
    double sum = 0;
    uint64_t count = 0;
  };
  Histogram ttft() const;
  static const std::vector<double>& ttft_bounds();

 private:
  mutable std::mutex mu_;
  Histogram ttft_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> rejections_;
};

struct MetricsInput {
  const HttpCounters* http = nullptr;
  const WorkerCounters* worker = nullptr;
  bool loaded = false;
  size_t running = 0;     // jobs on slots now
  size_t slots = 1;       // --parallel
  size_t waiting = 0;
  size_t queue_depth = 0;
  SessionStats session;   // zero before the model is loaded
  uint64_t rss_bytes = 0; // now, read by the caller
  // The request memory (server/request_memory.h): its size, what is taken now and at most so far,
  // and the takes it refused.
  uint64_t request_memory_bytes = 0, request_memory_used = 0, request_memory_peak = 0, request_memory_refused = 0;
};

std::string render_metrics(const MetricsInput& in);

}  // namespace sluice::server
