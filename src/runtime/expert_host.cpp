#include "runtime/expert_host.h"

#include <cstdio>

#include "backend/cpu_backend.h"
#include "model/model.h"
#include "model/streamed_experts.h"
#include "runtime/expert_parallel.h"
#include "runtime/meminfo.h"
#include "runtime/store_plan.h"
#include "util/error.h"

namespace sluice {

struct ExpertHost::Impl {
  Plan plan;
  uint64_t owned = 0;
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<storage::ExpertStore> store;
  std::unique_ptr<StreamedExperts> streamed;
};

ExpertHost::ExpertHost(const SessionOptions& o, const ModelHeader& h, const fabric::Placement& p, int rank)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  const ModelConfig& c = h.config;
  if (o.threads < 0) throw Error("threads must not be negative");
  if (p.layers != c.num_hidden_layers || p.experts != c.n_routed_experts)
    throw Error("expert host: a placement of " + std::to_string(p.layers) + " x " + std::to_string(p.experts) +
                " experts for a model of " + std::to_string(c.num_hidden_layers) + " x " +
                std::to_string(c.n_routed_experts));
  std::vector<uint32_t> owned(c.num_hidden_layers, 0);
  for (uint32_t L = 0; L < c.num_hidden_layers; ++L)
    for (uint32_t e = 0; e < c.n_routed_experts; ++e) owned[L] += p.owner_of(L, e) == rank;
  for (uint32_t n : owned) s.owned += n;
  try {
    StorePlanOptions spo;
    // Rank 0's exchanges carry up to exchange_rows(its chunk, parallel) rows; with --chunk given
    // (every rank runs the same command line) that is known here, else the largest that fits.
    spo.plan.chunk = o.chunk ? exchange_rows(o.chunk, o.parallel) : 0;
    spo.plan.max_chunk = std::max(spo.plan.max_chunk, exchange_rows(0, o.parallel));
    spo.plan.threads = o.threads;
    spo.plan.budget = o.budget;
    spo.plan.allow_swap = o.allow_swap;
    spo.plan.max_cache_experts = o.max_cache_experts;
    spo.store = session_store_options(o);
    spo.stream_experts = o.stream_experts;
    s.plan = plan_expert_server(h.file, spo, owned);
    require_admitted(s.plan);
  } catch (const Error& e) {
    throw Error(with_path(o.model_path, e.what()));
  }
  s.backend = std::make_unique<CpuBackend>(s.plan.threads);
  LoadOptions lo;
  lo.backend = s.backend.get();
  lo.experts_only = true;
  lo.resident_experts = !o.stream_experts;
  lo.owned = [&p, rank](uint32_t layer, uint32_t expert) { return p.owner_of(layer, expert) == rank; };
  if (o.progress) lo.progress = [&](uint64_t done, uint64_t total) { o.progress("loading experts", done, total); };
  s.model = load_model(o.model_path, lo);
  if (o.stream_experts) {
    s.store = open_expert_store(*s.model, store_options_for(s.plan, session_store_options(o)));
    s.streamed = std::make_unique<StreamedExperts>(*s.store);
  }
}

ExpertHost::~ExpertHost() {
  if (impl_ && impl_->streamed) impl_->streamed->release();
}

const Plan& ExpertHost::plan() const { return impl_->plan; }
const Backend& ExpertHost::backend() const { return *impl_->backend; }
const Model& ExpertHost::model() const { return *impl_->model; }
const ExpertSource& ExpertHost::experts() const {
  return impl_->streamed ? static_cast<const ExpertSource&>(*impl_->streamed) : resident_expert_source(*impl_->model);
}
uint64_t ExpertHost::owned_experts() const { return impl_->owned; }
const storage::ExpertStore* ExpertHost::store() const { return impl_->store.get(); }

std::string ExpertHost::summary() const {
  const Impl& s = *impl_;
  const ProcMemory pm = read_self_status();
  char b[512];
  if (!s.store) {
    std::snprintf(b, sizeof b, "%llu experts resident (%s loaded) | peak RSS %s of budget %s",
                  (unsigned long long)s.owned, format_bytes(s.model->loaded_bytes).c_str(), format_bytes(pm.hwm).c_str(),
                  format_bytes(s.plan.budget).c_str());
    return b;
  }
  const storage::StoreStats st = s.store->stats();
  const storage::LayerStats t = st.total();
  const double hit = t.requests ? 100.0 * (double)t.hits / (double)t.requests : 0.0;
  std::snprintf(b, sizeof b,
                "expert cache %u slots, hit rate %.1f%% (%llu/%llu), read %s, stall %.3f s | peak RSS %s of budget %s",
                st.slots, hit, (unsigned long long)t.hits, (unsigned long long)t.requests,
                format_bytes(t.bytes_demand + t.bytes_prefetch).c_str(), (double)t.stall_ns / 1e9,
                format_bytes(pm.hwm).c_str(), format_bytes(s.plan.budget).c_str());
  return b;
}

}  // namespace sluice
