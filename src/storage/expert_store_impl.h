// Private state of ExpertStore, shared by expert_store.cpp (leases, hints, setup) and
// expert_store_io.cpp (read scheduling and completion). One mutex guards all of it; the backend
// threads take it only to record a completion.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "storage/eviction_policy.h"
#include "storage/expert_store.h"
#include "storage/io_backend.h"

namespace sluice::storage {

inline uint64_t now_ns() {
  return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Slot {
  enum class State : uint8_t { Free, Loading, Ready, Failed };
  State state = State::Free;
  uint32_t layer = 0, expert = 0;
  uint32_t pins = 0;              // leases holding it + acquires waiting for it
  uint32_t ops_left = 0;          // reads queued or in flight
  bool by_prefetch = false;       // load started by hint(): its bytes count as prefetch
  bool unused_prefetch = false;   // prefetched and not requested yet
  uint64_t prefetch_charge = 0;   // bytes charged to the prefetch budget while loading
  std::string error;              // State::Failed
};

struct Op {
  uint32_t slot = 0, part = 0;
  uint64_t offset = 0;   // absolute file offset of the next byte to read
  uint32_t len = 0;      // bytes to ask for (window bytes left)
  uint32_t need = 0;     // bytes that must arrive (the rest may lie past end of file)
  uint8_t* dst = nullptr;
  uint32_t attempt = 0;
  uint32_t eio_retries = 0;
  bool buffered = false;
  bool prefetch_flight = false;  // counted in prefetch_in_flight while started
  uint64_t t_start = 0;
};

struct ExpertStore::Impl {
  Impl(const gguf::File& f, ExpertGeometry g, StoreOptions o);
  ~Impl();

  // ---- setup (expert_store.cpp)
  ExpertGeometry geo;
  SlotLayout layout;
  StoreOptions opt;
  StoreBudget budget;
  int fd_direct = -1, fd_buffered = -1;
  bool direct = false;
  std::string direct_note;
  uint8_t* slab = nullptr;
  std::unique_ptr<EvictionPolicy> policy;
  std::unique_ptr<IoBackend> io;
  std::string backend_note;

  // ---- state (guarded by mu)
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::vector<Slot> slots;
  std::vector<uint32_t> free_slots;  // stack; initially 0 on top
  std::unordered_map<uint64_t, uint32_t> index;  // key(layer, expert) -> slot (Loading or Ready)
  std::vector<Op> ops;
  std::vector<uint32_t> free_ops;
  std::deque<uint32_t> demand_q, prefetch_q;
  uint32_t in_flight = 0, prefetch_in_flight = 0;
  uint64_t prefetch_bytes_in_flight = 0;
  std::vector<LayerStats> layer_stats;
  std::string last_error;

  static uint64_t key(uint32_t layer, uint32_t expert) { return (uint64_t)layer << 32 | expert; }
  uint8_t* slot_base(uint32_t s) const { return slab + (uint64_t)s * layout.slot_bytes; }
  ExpertBytes bytes_of(uint32_t s) const;

  // ---- cache bookkeeping (expert_store.cpp)
  bool evictable(uint32_t s) const { return slots[s].state == Slot::State::Ready && slots[s].pins == 0; }
  bool any_transient() const;               // a slot that will become reusable without us
  int64_t take_slot_locked(uint32_t layer);  // free or evicted slot, or -1
  void evict_locked(uint32_t s);
  void free_slot_locked(uint32_t s);
  void unpin_locked(uint32_t s);

  // ---- acquire, in its three phases (expert_store.cpp). One acquire() call's progress: the slot
  // of each requested expert (kNoSlot until it has one), what to unpin if the call fails, and
  // whether it had to wait (its stall).
  static constexpr uint32_t kNoSlot = ~0u;
  struct Acquire {
    uint32_t layer = 0;
    std::span<const uint32_t> experts;
    std::vector<uint32_t> got;
    std::vector<uint32_t> pinned;
    bool waited = false;
  };
  void check_request(uint32_t layer, std::span<const uint32_t> experts) const;  // throws on bad ids
  void check_acquire_locked(uint32_t layer, size_t n_experts) const;  // throws when it can never fit
  bool pin_existing_locked(Acquire& a, size_t i);  // pins experts[i] if resident or loading
  // Phase 1: pin every member already resident or loading, so that loading the missing ones can
  // never evict another member of the same union. Phase 2: a slot and a read for each missing
  // one, waiting for slots to free up. Phase 3: wait until every member is read; a failed read
  // throws its error.
  void pin_present_locked(Acquire& a);
  void load_missing_locked(Acquire& a, std::unique_lock<std::mutex>& lk);
  void wait_ready_locked(Acquire& a, std::unique_lock<std::mutex>& lk);

  // ---- reads (expert_store_io.cpp)
  void start_load_locked(uint32_t s, uint32_t layer, uint32_t expert, bool prefetch);
  void promote_locked(uint32_t s);           // a demand joined this slot's prefetch
  void pump_locked();
  void complete(uint64_t tag, int64_t res);  // backend thread
  void complete_locked(uint32_t id, int64_t res);
  void requeue_locked(uint32_t id, bool front);
  void op_finished_locked(uint32_t id);
  void fail_slot_locked(uint32_t s, const std::string& msg);
  void switch_to_buffered_locked(const std::string& why);
  std::string describe(const Op& op) const;
};

}  // namespace sluice::storage
