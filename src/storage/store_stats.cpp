// Expert store statistics (see store_stats.h).
#include "storage/store_stats.h"

#include <algorithm>
#include <bit>
#include <cstdio>

namespace sluice::storage {

void LatencyStats::add(uint64_t ns) {
  ++count;
  sum_ns += ns;
  max_ns = std::max(max_ns, ns);
  const uint64_t us = ns / 1000;
  int b = us == 0 ? 0 : (int)std::bit_width(us);  // us < 2^b
  buckets[std::min(b, kBuckets - 1)]++;
}

void LatencyStats::merge(const LatencyStats& o) {
  count += o.count;
  sum_ns += o.sum_ns;
  max_ns = std::max(max_ns, o.max_ns);
  for (int i = 0; i < kBuckets; ++i) buckets[i] += o.buckets[i];
}

double LatencyStats::quantile_us(double q) const {
  if (count == 0) return 0;
  const uint64_t want = std::max<uint64_t>(1, (uint64_t)(q * (double)count + 0.5));
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += buckets[i];
    if (seen >= want) return i == kBuckets - 1 ? (double)max_ns / 1000.0 : (double)(1ull << i);
  }
  return (double)max_ns / 1000.0;
}

void LayerStats::merge(const LayerStats& o) {
  requests += o.requests;
  hits += o.hits;
  misses += o.misses;
  joined += o.joined;
  prefetch_issued += o.prefetch_issued;
  prefetch_used += o.prefetch_used;
  prefetch_dropped += o.prefetch_dropped;
  prefetch_wasted += o.prefetch_wasted;
  evictions += o.evictions;
  bytes_demand += o.bytes_demand;
  bytes_prefetch += o.bytes_prefetch;
  reads += o.reads;
  read_errors += o.read_errors;
  retries += o.retries;
  stall_ns += o.stall_ns;
  latency.merge(o.latency);
}

LayerStats StoreStats::total() const {
  LayerStats t;
  for (const auto& l : layers) t.merge(l);
  return t;
}

std::string StoreStats::summary() const {
  const LayerStats t = total();
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "expert store: %s%s, %s I/O%s%s, %u/%u slots of %llu bytes\n"
                "  requests %llu: hits %llu (%.1f%%), misses %llu (joined prefetch %llu)\n"
                "  prefetch: issued %llu, used %llu, dropped %llu, wasted %llu\n"
                "  read %llu bytes demand + %llu prefetch in %llu requests; latency mean %.0f us, p50 <= %.0f us, "
                "p99 <= %.0f us, max %.0f us\n"
                "  stall %.3f s, evictions %llu, read errors %llu, retries %llu\n",
                backend.c_str(), backend_note.empty() ? "" : (" (" + backend_note + ")").c_str(),
                direct_io ? "O_DIRECT" : "buffered", direct_io_note.empty() ? "" : " - ",
                direct_io_note.c_str(), slots_used, slots, (unsigned long long)slot_bytes,
                (unsigned long long)t.requests, (unsigned long long)t.hits,
                t.requests ? 100.0 * (double)t.hits / (double)t.requests : 0.0, (unsigned long long)t.misses,
                (unsigned long long)t.joined, (unsigned long long)t.prefetch_issued,
                (unsigned long long)t.prefetch_used, (unsigned long long)t.prefetch_dropped,
                (unsigned long long)t.prefetch_wasted, (unsigned long long)t.bytes_demand,
                (unsigned long long)t.bytes_prefetch, (unsigned long long)t.reads, t.latency.mean_us(),
                t.latency.quantile_us(0.5), t.latency.quantile_us(0.99), (double)t.latency.max_ns / 1000.0,
                (double)t.stall_ns / 1e9, (unsigned long long)t.evictions, (unsigned long long)t.read_errors,
                (unsigned long long)t.retries);
  std::string s = buf;
  if (!last_error.empty()) s += "  last error: " + last_error + "\n";
  return s;
}

}  // namespace sluice::storage

