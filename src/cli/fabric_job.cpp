#include "cli/fabric_job.h"

#include <cstdio>
#include <cstdlib>
#include <random>

#include <unistd.h>

#include "cli/cmd_run.h"
#include "cli/commands.h"
#include "fabric/mpi_fabric.h"
#include "runtime/expert_host.h"
#include "runtime/meminfo.h"
#include "util/error.h"
#include "util/read_file.h"

namespace sluice::cli {

void add_fabric_options(CLI::App* sub, FabricCliOptions& o) {
  sub->add_option("--fabric", o.fabric, "none (default) or mpi: run under mpirun, routed experts spread over the ranks")
      ->check(CLI::IsMember({"none", "mpi"}));
  sub->add_option("--fabric-if", o.iface,
                  "with --fabric mpi, required: the interface or CIDR of the dedicated link the ranks talk over "
                  "(MPI over TCP has no authentication or encryption)");
  sub->add_option("--placement", o.placement,
                  "which rank computes each expert: balanced (default), local-first:PROFILE (rank 0 keeps the experts "
                  "a routing profile from `run --routing-profile` shows chosen most) or a FILE");
  sub->add_option("--local-experts", o.local_experts,
                  "with --placement local-first: experts per layer rank 0 keeps (default: experts / ranks)");
  sub->add_option("--fabric-timeout", o.timeout_ms, "milliseconds a rank may take to answer a decode exchange, and per token of a prefill exchange (default 2000)")
      ->check(CLI::Range(1u, 3600000u));
  sub->add_option("--fabric-start-timeout", o.start_timeout_s,
                  "seconds every rank may take to load and say Hello (default 600)")
      ->check(CLI::Range(1u, 86400u));
}

std::unique_ptr<FabricJob> FabricJob::open(const FabricCliOptions& o, const ModelHeader& h) {
  if (o.fabric == "none") {
    if (!o.iface.empty()) throw UsageError("--fabric-if needs --fabric mpi");
    return nullptr;
  }
  if (o.iface.empty())
    throw UsageError("--fabric mpi needs --fabric-if IF: the interface or CIDR of a dedicated link (MPI over TCP has "
                     "no authentication or encryption; docs/scale-out.md)");
  std::unique_ptr<fabric::Fabric> f = fabric::open_mpi_fabric(o.iface);
  const ModelConfig& c = h.config;
  const uint32_t R = (uint32_t)f->size();
  constexpr uint64_t kLimit = 64ull << 20;
  const std::string kLocalFirst = "local-first:";
  if (o.local_experts && o.placement.rfind(kLocalFirst, 0) != 0)
    throw UsageError("--local-experts needs --placement local-first:PROFILE");
  fabric::Placement p;
  if (o.placement == "balanced") {
    p = fabric::balanced_placement(R, c.num_hidden_layers, c.n_routed_experts);
  } else if (o.placement.rfind(kLocalFirst, 0) == 0) {
    const std::string path = o.placement.substr(kLocalFirst.size());
    try {
      p = fabric::local_first_placement(
          fabric::parse_routing_profile(read_file_bounded(path, kLimit, "64 MiB, a routing profile's limit"),
                                        c.num_hidden_layers, c.n_routed_experts),
          R, o.local_experts);
    } catch (const Error& e) {
      throw Error(with_path(path, e.what()));
    }
  } else {
    p = fabric::parse_placement(read_file_bounded(o.placement, kLimit, "64 MiB, a placement file's limit"), R,
                                c.num_hidden_layers, c.n_routed_experts);
  }
  return std::make_unique<FabricJob>(std::move(f), std::move(p), o, h);
}

FabricJob::FabricJob(std::unique_ptr<fabric::Fabric> f, fabric::Placement p, const FabricCliOptions& o,
                     const ModelHeader& h)
    : f_(std::move(f)), p_(std::move(p)), o_(o), model_path_(h.path), cfg_(h.config) {
  if (f_->rank() == 0)
    experts_ = std::make_unique<FabricExperts>(*f_, p_, cfg_.hidden_size, std::chrono::milliseconds(o_.timeout_ms));
}

// A coordinator that never said Bye is leaving on an error its caller did not hand to fail():
// the peers would wait for it (and MPI_Finalize for them), so the job ends here.
FabricJob::~FabricJob() {
  if (coordinator() && !ended_ && f_->size() > 1) fail("the command ended before the job did");
}

fabric::Hello FabricJob::hello(const Plan& pl, uint64_t owned, bool resident) const {
  fabric::Hello h = own_hello(model_path_, cfg_, p_);
  h.owned_experts = owned;
  h.owned_bytes = owned * pl.expert_bytes;
  h.budget = pl.budget;
  h.cache_slots = pl.cache_slots;
  h.resident = resident;
  h.rows = pl.chunk;
  return h;
}

int FabricJob::serve(SessionOptions so, const ModelHeader& h) {
  try {
    // Only this rank's experts: no dense weights, sequence state or Engram rows (expert_host.h).
    const ExpertHost host(so, h, p_, f_->rank());
    const Plan& pl = host.plan();
    const fabric::Hello me = hello(pl, host.owned_experts(), !so.stream_experts);
    const JobStart job = join_job(*f_, me, std::chrono::seconds(o_.start_timeout_s));
    std::fprintf(stderr, "sluice (rank %d): pid %d serving %llu experts, exchanges of up to %u rows\n", f_->rank(),
                 (int)::getpid(), (unsigned long long)me.owned_experts, pl.chunk);
    // A peer whose launcher went away (rank 0's box lost, mpirun killed) would wait for work
    // forever: once it is re-parented, it ends.
    const pid_t parent = ::getppid();
    const ServeStats st = serve_experts(
        *f_, host.backend(), host.model(), host.experts(), p_, job,
        [parent] {
          if (::getppid() != parent) throw Error("fabric: the process that started this rank is gone; ending");
        },
        host.store());
    std::fprintf(stderr, "sluice (rank %d): served %llu exchanges, %llu expert terms, %llu failed | %llu experts owned | %s\n",
                 f_->rank(), (unsigned long long)st.frames, (unsigned long long)st.triples,
                 (unsigned long long)st.failed, (unsigned long long)me.owned_experts, host.summary().c_str());
    return 0;
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

void FabricJob::start(const Session& s) {
  std::random_device rd;
  uint64_t nonce = 0;
  while (nonce == 0) nonce = ((uint64_t)rd() << 32) ^ rd();
  const uint32_t max_rows = exchange_rows(s.plan().chunk, s.options().parallel);
  try {
    start_job(*f_, hello(s.plan(), p_.owned_by(0), !s.options().stream_experts), nonce, max_rows, std::chrono::seconds(o_.start_timeout_s));
  } catch (const std::exception& e) {
    fail(e.what());
  }
  experts_->start(nonce, max_rows);
}

void FabricJob::end() {
  if (experts_ && !ended_) experts_->end();
  ended_ = true;
}

void FabricJob::fail(const std::string& why) {
  std::fprintf(stderr, "sluice (rank %d): %s\n", f_->rank(), why.c_str());
  std::fflush(stderr);
  f_->abort(75);
  std::_Exit(75);
}

std::vector<PeerTraffic> FabricJob::traffic() const { return experts_ ? experts_->traffic() : std::vector<PeerTraffic>{}; }

std::string FabricJob::store_text(const PeerTraffic& t) {
  if (t.store_requests == 0) return "experts resident";
  char b[96];
  std::snprintf(b, sizeof b, "expert cache hit rate %.1f%% (%llu/%llu)", 100.0 * (double)t.store_hits / (double)t.store_requests,
                (unsigned long long)t.store_hits, (unsigned long long)t.store_requests);
  return b;
}

std::string FabricJob::summary() const {
  std::string s = "fabric: " + std::to_string(f_->size()) + " ranks (" + std::string(f_->name()) + ", " + p_.name + ")";
  const std::vector<PeerTraffic> t = traffic();
  for (size_t r = 1; r < t.size(); ++r) {
    char b[256];
    std::snprintf(b, sizeof b, " | rank %zu: %llu exchanges, %llu terms, %s out, %s in, p50 %.0f us, p99 %.0f us, %s", r,
                  (unsigned long long)t[r].exchanges, (unsigned long long)t[r].triples, format_bytes(t[r].work_bytes).c_str(),
                  format_bytes(t[r].result_bytes).c_str(), t[r].p50_us, t[r].p99_us, store_text(t[r]).c_str());
    s += b;
  }
  return s;
}

}  // namespace sluice::cli
