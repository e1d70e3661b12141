// `--fabric mpi`: one command run by every rank of an mpirun job (docs/scale-out.md). Rank 0 is
// the command as usual, with the routed experts other ranks own computed there; every other rank
// loads the same model with the same options, says Hello and serves experts until rank 0 says
// Bye. A fabric error ends the whole job with one line naming the rank and what it did not do.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "fabric/fabric.h"
#include "runtime/expert_parallel.h"
#include "runtime/session.h"

namespace sluice::cli {

struct FabricCliOptions {
  std::string fabric = "none";        // none | mpi
  std::string iface;                  // --fabric-if: the interface or CIDR of the dedicated link
  std::string placement = "balanced";  // balanced | local-first:PROFILE | FILE
  uint32_t local_experts = 0;          // --local-experts: local-first's rank-0 experts per layer (0: even share)
  uint32_t timeout_ms = 2000;          // --fabric-timeout: an exchange's deadline
  uint32_t start_timeout_s = 600;      // --fabric-start-timeout: every rank loaded and said Hello
};
void add_fabric_options(CLI::App* sub, FabricCliOptions& o);

class FabricJob {
 public:
  // Null for --fabric none. Opens the fabric (MPI_Init) and makes the placement for h's model.
  static std::unique_ptr<FabricJob> open(const FabricCliOptions& o, const ModelHeader& h);
  // Over a given fabric (the tests' LocalFabric).
  FabricJob(std::unique_ptr<fabric::Fabric> f, fabric::Placement p, const FabricCliOptions& o, const ModelHeader& h);
  ~FabricJob();

  bool coordinator() const { return f_->rank() == 0; }
  int rank() const { return f_->rank(); }
  // Rank >= 1: load with `so`, say Hello, serve until Bye. Returns the exit code.
  int serve(SessionOptions so, const ModelHeader& h);
  // Rank 0: what SessionOptions::remote gets; start() once the Session is built (the handshake).
  const RemoteExperts* remote() const { return experts_.get(); }
  void start(const Session& s);
  // Rank 0: Bye to every peer (at the end of the command).
  void end();
  // A fatal error: prints it (once, naming this rank) and ends the job (MPI_Abort).
  [[noreturn]] void fail(const std::string& why);
  // "fabric: 2 ranks (mpi, balanced) | rank 1: N exchanges, X out, Y in, p50 .. p99 .." for summaries.
  std::string summary() const;
  std::vector<PeerTraffic> traffic() const;
  // A peer's expert store as its answers report it: "expert cache hit rate 93.1% (..)" or
  // "experts resident".
  static std::string store_text(const PeerTraffic& t);
  bool broken() const { return experts_ && experts_->broken(); }

 private:
  // This rank's Hello with its admission: `owned` experts, the plan's budget, slots and chunk.
  fabric::Hello hello(const Plan& pl, uint64_t owned, bool resident) const;
  std::unique_ptr<fabric::Fabric> f_;
  fabric::Placement p_;
  FabricCliOptions o_;
  std::string model_path_;
  ModelConfig cfg_;
  std::unique_ptr<FabricExperts> experts_;
  bool ended_ = false;
};

}  // namespace sluice::cli
