// Expert parallelism across processes (docs/scale-out.md): rank 0, the coordinator, runs the
// whole forward pass and owns a share of the routed experts; every other rank is an expert
// server that computes the experts the placement gives it, on the rows rank 0 sends, and sends
// each (expert, token) term back. Rank 0 adds all terms in the single-box order, so logits are
// bit-identical to one process.
//
// Start: every peer sends rank 0 its Hello (build, kernel ISA, model file identity, placement,
// its admission); rank 0 compares each with its own and answers Welcome (the job's nonce, the
// most rows a frame carries) or Refuse (the first field that differs). Then rank 0 sends Work
// frames during its passes and Bye at the end.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "fabric/fabric.h"
#include "fabric/frames.h"
#include "fabric/placement.h"
#include "model/deepseek41/config.h"
#include "model/remote_experts.h"

namespace sluice {
namespace storage { class ExpertStore; }

class Model;
class ExpertSource;

// What one rank exchanged with rank 0, as rank 0 counted it.
struct PeerTraffic {
  uint64_t exchanges = 0;      // Work frames sent (each answered by one Result)
  uint64_t work_bytes = 0, result_bytes = 0;
  uint64_t triples = 0;        // (expert, token) terms computed there
  uint64_t stale = 0;          // answers to an exchange a failed pass abandoned, dropped
  uint64_t hints = 0, hint_bytes = 0;  // Hint frames sent (the next layer's predicted experts)
  double p50_us = 0, p99_us = 0;  // exchange latency, Work sent to Result received (last 4096)
  // The rank's expert store as its latest Result reported it (requests 0: resident experts).
  uint64_t store_requests = 0, store_hits = 0;
};

// Prometheus lines of each peer's traffic (label rank="R"): exchanges, expert terms, bytes sent
// and received, exchange latency p50 and p99 (microseconds), its expert store's requests and
// hits, and the job's rank count.
std::string fabric_metrics(const std::vector<PeerTraffic>& t);

// The most rows one exchange carries in a job whose rank 0 evaluates chunks of `chunk` rows and
// `parallel` sequences per step (a decode step of every slot is one pass): rank 0's Welcome
// limit, and what a peer given the same --chunk plans its scratch for.
inline uint32_t exchange_rows(uint32_t chunk, uint32_t parallel) { return std::max({chunk, parallel, 16u}); }

// This process's Hello: build, ISA, identity of the model file, the placement and the shape.
fabric::Hello own_hello(const std::string& model_path, const ModelConfig& c,
                        const fabric::Placement& p);

// Rank 0: every peer's Hello (within `timeout`), compared with `mine`; each gets Welcome, or,
// when any differs, holds fewer than `max_rows` rows per exchange or does not answer, every peer gets Refuse and this throws Error
// naming the rank and the field. Returns the peers' Hellos (index = rank; [0] is mine).
std::vector<fabric::Hello> start_job(fabric::Fabric& f, const fabric::Hello& mine, uint64_t nonce, uint32_t max_rows,
                                     std::chrono::milliseconds timeout);

// The coordinator's side: a RemoteExperts over the fabric.
class FabricExperts final : public RemoteExperts {
 public:
  FabricExperts(fabric::Fabric& f, fabric::Placement p, uint32_t hidden, std::chrono::milliseconds timeout);
  // After start_job: the job's nonce and the most rows one exchange may carry. begin() before
  // it is an Error.
  void start(uint64_t nonce, uint32_t max_rows);
  bool local(uint32_t layer, uint32_t expert) const override;
  void begin(uint32_t layer, std::span<const ExpertTriple> triples, CMat x) const override;
  void finish(uint32_t layer, Mat terms) const override;
  uint64_t exchange_bytes(uint64_t rows, uint64_t triples) const override;
  // One Hint frame to each rank that owns some of `experts` (not waited for).
  void hint(uint32_t layer, std::span<const uint32_t> experts) const override;
  // Tells every peer the job is over (they exit) and waits for the sends to leave.
  void end() const;
  std::vector<PeerTraffic> traffic() const;  // index = rank ([0] stays empty)
  // A rank missed its deadline or answered out of protocol: the job cannot go on. (A peer that
  // could not compute an exchange, a read error, does not break it.)
  bool broken() const { return broken_; }
  const fabric::Placement& placement() const { return p_; }

 private:
  void finish_all(uint32_t layer, Mat terms) const;
  struct Outstanding {
    int rank = 0;
    uint64_t seq = 0;
    std::vector<uint32_t> at;  // the begin() triple index of each term the rank returns
    uint32_t rows = 0;         // tokens the frame carried: the deadline is the timeout per row
    fabric::Clock::time_point sent;
  };
  fabric::Fabric& f_;
  fabric::Placement p_;
  uint32_t hidden_, max_rows_ = 0;
  uint64_t nonce_ = 0;
  std::chrono::milliseconds timeout_;
  mutable uint64_t seq_ = 0;
  mutable uint32_t layer_ = 0;
  mutable std::vector<Outstanding> out_;
  mutable std::vector<uint64_t> done_seq_;  // per rank: the newest exchange answered
  mutable std::vector<PeerTraffic> traffic_;
  mutable std::vector<std::vector<float>> lat_us_;  // per rank, a ring of the last 4096
  mutable std::atomic<bool> broken_{false};
  mutable std::mutex stats_mu_;  // traffic_ and lat_us_: traffic() is read from other threads (/metrics)
};

// Rank >= 1: Hello to rank 0, then Welcome (returned: the nonce and the most rows per frame) or
// Refuse (an Error with rank 0's reason).
struct JobStart {
  uint64_t nonce = 0;
  uint32_t max_rows = 0;
};
JobStart join_job(fabric::Fabric& f, const fabric::Hello& mine, std::chrono::milliseconds timeout);

// Rank >= 1: computes Work frames from rank 0 until Bye, with `src` (this rank's resident or
// streamed experts) on `be`. A Work frame that cannot be computed (a read error) is answered
// with Failed, and serving goes on; a malformed frame is answered with Failed and ends serving
// with an Error naming what was wrong.
struct ServeStats {
  uint64_t frames = 0, triples = 0, failed = 0;
  uint64_t hints = 0;  // Hint frames passed to the expert source
};
// `idle` (may be empty) is called after each second without a frame; it may throw Error to end
// serving (the CLI's checks that the launcher is still there). `store` (may be null: resident
// experts) is this rank's expert store, whose counters each Result carries to rank 0.
ServeStats serve_experts(fabric::Fabric& f, const Backend& be, const Model& m, const ExpertSource& src,
                         const fabric::Placement& p, const JobStart& job, const std::function<void()>& idle = {},
                         const storage::ExpertStore* store = nullptr);

}  // namespace sluice
