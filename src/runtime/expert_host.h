// What a rank >= 1 of an expert-parallel job holds (docs/scale-out.md): the routed experts the
// placement gives it and nothing else of the model. No dense weight, sequence state, tokenizer
// use or Engram row is loaded; its admission (plan_expert_server) counts the owned experts
// (loaded packed, or streamed through its own store, which holds at most them), one exchange's
// scratch, its threads and the process's measured overhead. Its plan's chunk is the most rows
// one exchange may carry, which its Hello reports to rank 0.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fabric/placement.h"
#include "runtime/admission.h"
#include "runtime/session.h"

namespace sluice {
namespace storage { class ExpertStore; }

class Backend;
class Model;
class ExpertSource;

class ExpertHost {
 public:
  // From o: model_path, chunk, threads, budget, allow_swap, stream_experts, policy, io_depth,
  // direct_io, max_cache_experts, progress. Plans (refusing with Error and the plan's breakdown
  // when it does not fit), then loads the experts `rank` owns under p.
  ExpertHost(const SessionOptions& o, const ModelHeader& h, const fabric::Placement& p, int rank);
  ~ExpertHost();
  ExpertHost(const ExpertHost&) = delete;
  ExpertHost& operator=(const ExpertHost&) = delete;

  const Plan& plan() const;
  const Backend& backend() const;
  const Model& model() const;
  const ExpertSource& experts() const;
  uint64_t owned_experts() const;
  // Its expert store; null when its experts are resident.
  const storage::ExpertStore* store() const;
  // "expert cache N slots, hit rate .. read .." or "experts resident (N, X)".
  std::string summary() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice
