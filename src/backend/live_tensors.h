// The activation tensors a backend has allocated and not yet freed, so that work it defers can
// tell whether the memory it will write still belongs to the tensor it was issued for. A device
// backend that holds back a linear's output until a host decision needs it (vulkan_backend.cpp:
// deferred submissions) writes it only into a tensor that is still alive and is the same
// allocation: a tensor freed meanwhile (an eval abandoned by an error, say) is not written, and
// its address reused by a new tensor is not mistaken for it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "backend/backend.h"

namespace sluice {

class LiveTensors {
 public:
  // A zero-filled f32 [n][width] tensor, registered until its memory is freed. The registry
  // outlives every tensor it made (each holds a reference to it).
  static Tensor make(const std::shared_ptr<LiveTensors>& self, size_t n, size_t width);

  // The allocation that holds floats [p, p + count) whole (id 0 when none does) and where it starts.
  struct Held {
    uint64_t id = 0;
    const float* start = nullptr;
  };
  Held holder(const float* p, size_t count) const;
  // True while allocation `id` (from holder) is alive. Hold lock() across the check and the write.
  bool alive(uint64_t id) const;
  std::unique_lock<std::mutex> lock() const { return std::unique_lock<std::mutex>(mu_); }
  size_t count() const;

 private:
  struct Span {
    const float* end;
    uint64_t id;
  };
  Held holder_locked(const float* p, size_t count) const;
  mutable std::mutex mu_;
  std::map<const float*, Span> live_;  // by start address
  uint64_t next_id_ = 1;
};

}  // namespace sluice
