// Expert store throughput against the device's own random-read speed, both with O_DIRECT at the
// same queue depth:
//   (a) raw: random 1 MiB aligned reads of the expert region through io_uring,
//   (b) store: random expert unions through ExpertStore (cache ~25% of the experts),
//   (c) store + hints: the same, with the next union hinted while the current lease is held (a
//       perfect predictor, an upper bound for the engine's next-layer router prefetch). Without
//       --compute-ms there is nothing to overlap, so (c) only shows what the join path costs;
//       with it, compare the stall times.
// Prints GB/s, IOPS, hit rate and read latency per run, the median over runs, and (b)/(a).
//
// The model file (default /var/tmp/sluice-bench-experts.gguf, ~3.2 GB: 4 layers x 80 experts of
// 3.0 + 3.0 + 3.9 MB, like V4.1's Q2 experts, slices not page aligned) is written once with real
// (non-sparse) bytes and reused while its size matches.
#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "storage/raw_read_bandwidth.h"
#include "format/gguf.h"
#include "storage/expert_store.h"
#include "util/error.h"

using namespace sluice;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Args {
  std::string file = "/var/tmp/sluice-bench-experts.gguf";
  uint32_t layers = 4, experts = 80;
  uint32_t queue_depth = 16;
  uint32_t union_size = 8;
  double cache_fraction = 0.25;
  double seconds = 4;
  double compute_ms = 0;  // simulated compute per layer while the lease is held
  int runs = 3;
  std::string policy = "global";
};


void write_model(const Args& a) {
  gguf::Writer w;
  w.add("general.architecture", gguf::Value::str("bench"));
  for (uint32_t L = 0; L < a.layers; ++L) {
    const std::string b = "blk." + std::to_string(L) + ".";
    w.add_tensor(b + "ffn_gate_exps.weight", {4000, 750, a.experts}, GgmlType::I8);  // 3,000,000 B / expert
    w.add_tensor(b + "ffn_up_exps.weight", {4000, 750, a.experts}, GgmlType::I8);
    w.add_tensor(b + "ffn_down_exps.weight", {3900, 1000, a.experts}, GgmlType::I8);  // 3,900,000 B
  }
  struct stat st {};
  if (::stat(a.file.c_str(), &st) == 0 && (uint64_t)st.st_size == w.file_size()) {
    std::printf("reusing %s (%.2f GB)\n", a.file.c_str(), (double)st.st_size / 1e9);
    return;
  }
  std::printf("writing %s (%.2f GB of non-sparse data)...\n", a.file.c_str(), (double)w.file_size() / 1e9);
  std::fflush(stdout);
  std::vector<uint64_t> buf(1 << 20);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  w.write(a.file, [&](const gguf::TensorInfo& t, const gguf::Writer::Sink& sink) {
    for (uint64_t done = 0; done < t.nbytes;) {
      for (auto& v : buf) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        v = x;
      }
      const uint64_t n = std::min<uint64_t>(buf.size() * 8, t.nbytes - done);
      sink(buf.data(), n);
      done += n;
    }
  }, /*sparse=*/false, Existing::Replace);  // the bench's own file of the wrong size (a regular file only)
  const int fd = ::open(a.file.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

struct Result {
  double gbps = 0, iops = 0, hit_rate = 0, lat_mean_us = 0, lat_p50_us = 0, lat_p99_us = 0, stall_s = 0;
  uint64_t bytes = 0;
};

// (a) Random 1 MiB O_DIRECT reads over [begin, end) at queue depth qd.
Result raw_reads(const Args& a, uint64_t begin, uint64_t end, uint64_t seed) {
  const storage::RawReadResult raw = storage::raw_direct_reads(a.file, begin, end, a.queue_depth, a.seconds, seed);
  Result r;
  r.bytes = raw.bytes;
  r.gbps = raw.gbps;
  r.iops = raw.iops;
  r.lat_mean_us = raw.lat_mean_us;
  r.lat_p50_us = raw.lat_p50_us;
  r.lat_p99_us = raw.lat_p99_us;
  return r;
}

// (b)/(c) Random unions through the store, layer after layer like a decode.
Result store_reads(const Args& a, const gguf::File& f, bool hints, uint64_t seed) {
  storage::StoreOptions o;
  o.queue_depth = a.queue_depth;
  o.policy = a.policy == "per-layer" ? storage::EvictionKind::LruPerLayer : storage::EvictionKind::LruGlobal;
  const storage::ExpertGeometry g = storage::expert_geometry(f, a.layers, a.experts);
  const uint64_t slot = storage::slot_layout(g).slot_bytes;
  o.cache_bytes = (uint64_t)(a.cache_fraction * a.layers * a.experts) * slot;
  o.prefetch_budget_bytes = hints ? (uint64_t)a.union_size * slot : 0;
  storage::ExpertStore store(f, g, o);
  std::mt19937_64 rng(seed);
  auto next_union = [&] {
    std::vector<uint32_t> u;
    while (u.size() < a.union_size) {
      const uint32_t e = (uint32_t)(rng() % a.experts);
      if (std::find(u.begin(), u.end(), e) == u.end()) u.push_back(e);
    }
    std::sort(u.begin(), u.end());
    return u;
  };
  // Warm up until the cache is full (steady state: every miss evicts), then a few more rounds.
  uint32_t layer = 0;
  for (uint32_t i = 0; store.stats().slots_used < store.budget().slots || i < 2 * a.layers; ++i) {
    store.acquire(layer, next_union());
    layer = (layer + 1) % a.layers;
  }
  store.reset_stats();
  std::vector<uint32_t> cur = next_union();
  const double t0 = now_s();
  double dt = 0;
  while ((dt = now_s() - t0) < a.seconds) {
    std::vector<uint32_t> nxt = next_union();
    const uint32_t next_layer = (layer + 1) % a.layers;
    storage::Lease lease = store.acquire(layer, cur);
    if (hints) store.hint(next_layer, nxt);
    if (a.compute_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(a.compute_ms));
    lease.release();
    cur = std::move(nxt);
    layer = next_layer;
  }
  store.wait_idle();
  dt = now_s() - t0;
  const storage::StoreStats s = store.stats();
  const storage::LayerStats t = s.total();
  Result r;
  r.bytes = t.bytes_demand + t.bytes_prefetch;
  r.gbps = (double)r.bytes / dt / 1e9;
  r.iops = (double)t.reads / dt;
  r.hit_rate = t.requests ? (double)t.hits / (double)t.requests : 0;
  r.lat_mean_us = t.latency.mean_us();
  r.lat_p50_us = t.latency.quantile_us(0.5);
  r.lat_p99_us = t.latency.quantile_us(0.99);
  r.stall_s = (double)t.stall_ns / 1e9;
  if (seed == 1) std::printf("%s", s.summary().c_str());
  return r;
}

void print(const char* what, const Result& r) {
  std::printf("  %-14s %6.2f GB/s  %8.0f IOPS  hit %5.1f%%  latency mean %6.0f us p50<=%5.0f p99<=%6.0f  stall %.2f s\n",
              what, r.gbps, r.iops, 100 * r.hit_rate, r.lat_mean_us, r.lat_p50_us, r.lat_p99_us, r.stall_s);
}

Result median(std::vector<Result> v) {
  std::sort(v.begin(), v.end(), [](const Result& x, const Result& y) { return x.gbps < y.gbps; });
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"sluice expert store benchmark (O_DIRECT, random expert loads vs raw random reads)"};
  app.add_option("--file", a.file, "model file to create or reuse");
  app.add_option("--layers", a.layers);
  app.add_option("--experts", a.experts, "experts per layer");
  app.add_option("--qd", a.queue_depth, "queue depth for both");
  app.add_option("--union", a.union_size, "distinct experts per acquire");
  app.add_option("--cache-fraction", a.cache_fraction, "share of all experts the cache holds");
  app.add_option("--seconds", a.seconds, "duration of each measurement");
  app.add_option("--runs", a.runs, "runs of each arm (interleaved); the median is reported");
  app.add_option("--policy", a.policy, "global | per-layer");
  app.add_option("--compute-ms", a.compute_ms, "simulated compute per layer (the hint overlaps it)");
  CLI11_PARSE(app, argc, argv);
  try {
    write_model(a);
    const gguf::File f = gguf::File::open(a.file);
    const gguf::TensorInfo* first = f.find_tensor("blk.0.ffn_gate_exps.weight");
    std::printf("file %s: %.2f GB, %u layers x %u experts, cache %.0f%% (%s LRU), union %u, queue depth %u, "
                "compute %.1f ms/layer\n", a.file.c_str(), (double)f.file_size() / 1e9, a.layers, a.experts,
                100 * a.cache_fraction, a.policy.c_str(), a.union_size, a.queue_depth, a.compute_ms);
    std::vector<Result> raw, st, hinted;
    for (int i = 0; i < a.runs; ++i) {  // interleaved so drift hits every arm alike
      std::printf("run %d\n", i + 1);
      raw.push_back(raw_reads(a, first->file_offset, f.file_size(), 100 + i));
      print("(a) raw 1MiB", raw.back());
      st.push_back(store_reads(a, f, false, 1 + i));
      print("(b) store", st.back());
      hinted.push_back(store_reads(a, f, true, 1 + i));
      print("(c) store+hint", hinted.back());
    }
    const Result ra = median(raw), rb = median(st), rc = median(hinted);
    std::printf("median of %d runs\n", a.runs);
    print("(a) raw 1MiB", ra);
    print("(b) store", rb);
    print("(c) store+hint", rc);
    std::printf("(b)/(a) = %.3f   (c)/(a) = %.3f\n", rb.gbps / ra.gbps, rc.gbps / ra.gbps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
