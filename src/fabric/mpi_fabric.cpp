#include "fabric/mpi_fabric.h"

#include <cstdlib>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "util/error.h"

#if SLUICE_HAVE_MPI
#include <mpi.h>
#endif

namespace sluice::fabric {

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

#if SLUICE_HAVE_MPI

bool mpi_available() { return true; }

namespace {

// Polls yield for the first 200 us (an answer on a real link usually comes within tens of
// microseconds), then sleep 20 us until 5 ms, then 200 us: a waiting rank leaves the cores to the
// ones computing, and an idle one costs almost nothing.
class Backoff {
 public:
  void pause() {
    const auto waited = std::chrono::steady_clock::now() - t0_;
    if (waited < std::chrono::microseconds(200)) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(waited < std::chrono::milliseconds(5) ? 20 : 200));
  }

 private:
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

constexpr std::chrono::seconds kTransfer{60};

class MpiFabric final : public Fabric {
 public:
  MpiFabric() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiFabric() override {
    flush(deadline_in(std::chrono::milliseconds(2000)));
    for (Pending& p : pending_) MPI_Request_free(&p.req);
    MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view name() const override { return "mpi"; }

  void send(int peer, uint32_t tag, std::vector<uint8_t> bytes) override {
    check_peer(peer);
    if (bytes.size() > (size_t)INT32_MAX) throw Error("fabric: a message of " + std::to_string(bytes.size()) + " bytes is too long");
    counters_.sent_messages += 1;
    counters_.sent_bytes += bytes.size();
    pending_.push_back(Pending{std::move(bytes), MPI_REQUEST_NULL});
    Pending& p = pending_.back();
    MPI_Isend(p.bytes.data(), (int)p.bytes.size(), MPI_BYTE, peer, (int)tag, MPI_COMM_WORLD, &p.req);
    progress();
  }

  std::optional<std::vector<uint8_t>> recv(int peer, uint32_t tag, size_t max_bytes, Clock::time_point deadline) override {
    check_peer(peer);
    Backoff b;
    MPI_Status st{};
    for (;;) {
      progress();
      int flag = 0;
      MPI_Iprobe(peer, (int)tag, MPI_COMM_WORLD, &flag, &st);
      if (flag) break;
      if (Clock::now() >= deadline) return std::nullopt;
      b.pause();
    }
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    if (count < 0 || (size_t)count > max_bytes)
      throw Error("fabric: rank " + std::to_string(peer) + " sent a message of " + std::to_string(count) +
                  " bytes, more than the " + std::to_string(max_bytes) + " expected");
    // Matched: the message is being received. The caller's deadline was for its arrival; the
    // transfer itself (a large message needs the sender's progress) gets its own bound, and an
    // MPI receive that has begun cannot be cancelled, so at that bound it is an Error and the
    // buffer is left to MPI (the job ends on it anyway).
    auto m = std::make_unique<std::vector<uint8_t>>((size_t)count);
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Irecv(m->data(), count, MPI_BYTE, peer, (int)tag, MPI_COMM_WORLD, &req);
    const Clock::time_point done_by = std::max(deadline, Clock::now() + kTransfer);
    for (Backoff b2;;) {
      int done = 0;
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) break;
      progress();
      if (Clock::now() >= done_by) {
        m.release();  // NOLINT: MPI may still write into it
        throw Error("fabric: a message of " + std::to_string(count) + " bytes from rank " + std::to_string(peer) +
                    " did not complete within " + std::to_string(kTransfer.count()) + " s");
      }
      b2.pause();
    }
    counters_.received_messages += 1;
    counters_.received_bytes += m->size();
    return std::move(*m);
  }

  bool flush(Clock::time_point deadline) override {
    for (Backoff b; !pending_.empty(); b.pause()) {
      progress();
      if (pending_.empty()) break;
      if (Clock::now() >= deadline) return false;
    }
    return true;
  }

  void abort(int code) override { MPI_Abort(MPI_COMM_WORLD, code); }

 private:
  struct Pending {
    std::vector<uint8_t> bytes;
    MPI_Request req;
  };
  void check_peer(int peer) const {
    if (peer < 0 || peer >= size_)
      throw Error("fabric: no rank " + std::to_string(peer) + " (the job has " + std::to_string(size_) + ")");
  }
  // Completed sends give their buffers back.
  void progress() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      int done = 0;
      MPI_Test(&it->req, &done, MPI_STATUS_IGNORE);
      it = done ? pending_.erase(it) : std::next(it);
    }
  }

  int rank_ = 0, size_ = 1;
  std::list<Pending> pending_;  // a list: MPI holds pointers into each buffer until its send completes
};

}  // namespace

std::unique_ptr<Fabric> open_mpi_fabric(const std::string& interface) {
  if (interface.empty())
    throw Error("--fabric mpi needs --fabric-if IF (the interface or CIDR of the dedicated link): MPI over TCP has no "
                "authentication or encryption");
  if (!launched_by_mpirun()) throw Error("--fabric mpi: this process was not started by mpirun");
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) throw Error("--fabric mpi: MPI is already initialized in this process");
  // Open MPI reads its parameters from the environment at MPI_Init; one set by the user must agree.
  const char* have = std::getenv("OMPI_MCA_btl_tcp_if_include");
  if (have && interface != have)
    throw Error("--fabric-if " + interface + " disagrees with OMPI_MCA_btl_tcp_if_include=" + have);
  ::setenv("OMPI_MCA_btl_tcp_if_include", interface.c_str(), 1);
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    throw Error("--fabric mpi: MPI_Init_thread failed");
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    throw Error("--fabric mpi: this MPI library does not support MPI_THREAD_SERIALIZED");
  }
  // A failed call ends the job with MPI's message rather than returning an error code here.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  return std::make_unique<MpiFabric>();
}

#else

bool mpi_available() { return false; }

std::unique_ptr<Fabric> open_mpi_fabric(const std::string&) {
  throw Error("--fabric mpi: this sluice was built without MPI (install libopenmpi-dev and rebuild)");
}

#endif

}  // namespace sluice::fabric
