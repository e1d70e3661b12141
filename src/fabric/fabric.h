// The link between the processes of one job (docs/scale-out.md). sluice uses only nonblocking
// point-to-point messages, and every wait has a deadline: a slow or dead peer becomes an Error
// the caller can name, never a hang. One thread uses a Fabric at a time.
//
// Two implementations: MpiFabric (mpi_fabric.h; built when Open MPI's headers are present) for
// processes started by mpirun, and LocalFabric (local_fabric.h), ranks that are threads of one
// process, which the tests use to run a whole job under the sanitizers without mpirun.
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace sluice::fabric {

using Clock = std::chrono::steady_clock;

// What crossed this end of the fabric, counted by the fabric as messages are handed over.
struct Counters {
  uint64_t sent_messages = 0, sent_bytes = 0;
  uint64_t received_messages = 0, received_bytes = 0;
};

class Fabric {
 public:
  virtual ~Fabric() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view name() const = 0;  // "mpi", "local"

  // Queues `bytes` for `peer` under `tag` and returns; the message leaves in the background
  // (progressed by recv and flush). Throws Error for a peer out of range.
  virtual void send(int peer, uint32_t tag, std::vector<uint8_t> bytes) = 0;
  // The next message from `peer` under `tag`, or nullopt when none began to arrive by
  // `deadline` (Clock::time_point::max(): wait as long as it takes). A message that began to
  // arrive is received whole (within a bound of its own, else an Error). A message longer than
  // max_bytes is an Error naming its size; it is never received into memory.
  virtual std::optional<std::vector<uint8_t>> recv(int peer, uint32_t tag, size_t max_bytes,
                                                   Clock::time_point deadline) = 0;
  // Waits until every queued send has left this process: false at the deadline.
  virtual bool flush(Clock::time_point deadline) = 0;
  // Ends every process of the job with `code` (after a fatal fabric error); does not return for
  // MPI. LocalFabric wakes every waiting rank with an Error instead.
  virtual void abort(int code) = 0;

  Counters counters() const { return counters_; }

 protected:
  Counters counters_;
};

// A deadline `ms` milliseconds from now.
inline Clock::time_point deadline_in(std::chrono::milliseconds ms) { return Clock::now() + ms; }

}  // namespace sluice::fabric
