// Asynchronous positional reads behind one small interface: io_uring where the kernel allows
// it, a pool of pread threads otherwise. Backends do no retrying, splitting or queueing policy
// of their own; the expert store decides what to issue and when (it never has more than
// `depth` reads started at once), and interprets every result.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace sluice::storage {

struct ReadOp {
  uint64_t tag = 0;     // caller's id, handed back with the completion
  int fd = -1;
  uint64_t offset = 0;
  uint32_t len = 0;
  void* dst = nullptr;
};

// Called once per started read from a backend thread: bytes transferred (>= 0, possibly fewer
// than asked) or -errno. Must not call back into the backend's destructor.
using ReadDone = std::function<void(uint64_t tag, int64_t result)>;

class IoBackend {
 public:
  virtual ~IoBackend() = default;  // waits for nothing: the caller drains its reads first
  virtual const char* name() const = 0;
  // Starts one read. Returns 0, or -errno when it could not be started (no completion follows).
  virtual int start(const ReadOp& op) = 0;
};

// io_uring with room for `depth` reads in flight. Returns nullptr and sets *why when the
// kernel refuses (disabled, seccomp, old kernel, out of locked memory).
std::unique_ptr<IoBackend> make_uring_backend(uint32_t depth, ReadDone done, std::string* why);
// `threads` workers each doing one blocking pread at a time.
std::unique_ptr<IoBackend> make_pread_backend(uint32_t threads, ReadDone done);

}  // namespace sluice::storage
