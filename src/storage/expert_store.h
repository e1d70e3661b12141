// The bounded SSD expert store: routed-expert slices read on demand (O_DIRECT through io_uring
// at queue depth, or a pread thread pool) into a cache bounded in bytes and slots.
//
// Memory: the cache is one anonymous mapping of slots x slot_bytes, sized and reported by
// bytes_needed() before anything is allocated. Each slot holds one expert of one layer: three
// kIoAlign-aligned windows (gate, up, down), read straight from the file, with the slices at
// their offsets inside them; there is no separate bounce buffer. Bytes are never converted.
//
// Leases: acquire(layer, experts) pins the union a computation needs and returns pointers that
// stay valid until the Lease is released; pinned entries are never evicted. A union larger than
// max_union_experts(layer) throws Error before anything changes.
//
// Prefetch: hint(layer, experts) starts predicted loads under a byte budget into free or
// evictable (never leased) slots. Demand reads are issued before queued prefetch reads, prefetch
// reads never use more than half the queue depth, and a demand for an expert whose prefetch is
// in flight joins it instead of reading again. A wrong hint costs only I/O and an eviction.
//
// Errors: an I/O error (after one retry of EIO), a short read at end of file or a truncated file
// makes acquire() throw Error naming the tensor, expert and file offset; the failed entry never
// becomes visible, its slot returns to the free list once its reads have drained, and the next
// request reads again. If O_DIRECT is refused (EINVAL at open or read, statx alignment larger
// than kIoAlign) the store switches to buffered reads with POSIX_FADV_DONTNEED and says so in
// stats().direct_io_note.
//
// Thread safety: every member function may be called from any thread. A Lease is used by one
// thread at a time and must be released or destroyed before the store.
#pragma once
#include <cerrno>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "storage/eviction_policy.h"
#include "storage/expert_geometry.h"
#include "storage/store_stats.h"

namespace sluice::storage {

// One read about to be interpreted; handed to the fault injector.
struct ReadAttempt {
  const std::string& tensor;
  uint32_t layer, expert, part;
  uint64_t offset;    // absolute file offset of this read
  uint32_t length;    // bytes asked
  uint32_t attempt;   // 0 for the first try of this read, then 1, 2, ...
  bool direct;        // O_DIRECT descriptor
  bool prefetch;      // the load was started by hint()
};

// What the injector makes of a read's real result.
struct ReadFault {
  enum Kind { kOk, kFail, kShort } kind = kOk;
  int error = EIO;      // kFail: the read returns -error
  uint32_t bytes = 0;   // kShort: the read returns at most this many bytes (0: end of file)
  static ReadFault ok() { return {}; }
  static ReadFault fail(int err = EIO) { return {kFail, err, 0}; }
  static ReadFault short_read(uint32_t n) { return {kShort, 0, n}; }
};
// Called with the store's lock held, from an I/O thread: it must not call back into the store
// and must not throw.
using FaultInjector = std::function<ReadFault(const ReadAttempt&)>;

struct StoreOptions {
  uint64_t cache_bytes = 1ull << 30;  // budget for slots (slots = cache_bytes / slot_bytes)
  uint32_t max_slots = 0;             // further cap on slots; 0: none
  EvictionKind policy = EvictionKind::LruPerLayer;
  uint32_t queue_depth = 16;          // reads in flight at once (1..1024)
  uint64_t prefetch_budget_bytes = 0; // load bytes of hinted experts in flight at once; 0: hints do nothing
  uint64_t max_read_bytes = 1u << 20; // windows are split into reads of at most this (kIoAlign multiple)
  bool force_pread = false;           // use the pread thread pool even where io_uring works
  bool direct_io = true;              // false: buffered reads + POSIX_FADV_DONTNEED from the start
  FaultInjector fault_injector;       // test hook
};

// Every byte the store will allocate, computed before allocating it.
struct StoreBudget {
  uint64_t slot_bytes = 0;        // one expert: three aligned windows
  uint32_t slots = 0;
  uint64_t cache_bytes = 0;       // slots * slot_bytes (the one large allocation)
  uint64_t bounce_bytes = 0;      // 0: reads land in the slots themselves
  uint64_t metadata_bytes = 0;    // slot table, index, LRU lists, read descriptors (estimate, upper bound)
  uint64_t total = 0;
  uint32_t max_union_experts = 0; // largest union one acquire() can hold, in any layer
};
// Throws Error for invalid options (queue depth, read size); a cache too small for one slot per
// layer is reported as slots / max_union_experts of 0, which the store constructor refuses.
StoreBudget bytes_needed(const ExpertGeometry& g, const StoreOptions& o);

// Pointers to one expert's gate, up and down slices (native bytes).
struct ExpertBytes {
  const uint8_t* gate = nullptr;
  const uint8_t* up = nullptr;
  const uint8_t* down = nullptr;
};

class ExpertStore;

class Lease {
 public:
  Lease() = default;
  Lease(Lease&& o) noexcept;
  Lease& operator=(Lease&& o) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease();

  bool empty() const { return experts_.empty(); }
  uint32_t layer() const { return layer_; }
  std::span<const uint32_t> experts() const { return experts_; }
  // Throws Error when `expert` of `layer` is not part of this lease.
  ExpertBytes get(uint32_t layer, uint32_t expert) const;
  void release();

 private:
  friend class ExpertStore;
  ExpertStore* store_ = nullptr;
  uint32_t layer_ = 0;
  std::vector<uint32_t> experts_;  // ascending
  std::vector<uint32_t> slots_;
  std::vector<ExpertBytes> bytes_;
};

class ExpertStore {
 public:
  // Geometry of blk.L.ffn_{gate,up,down}_exps.weight, L < n_layer. The store keeps its own
  // descriptors of the file, so `f` need not outlive it.
  ExpertStore(const gguf::File& f, uint32_t n_layer, uint32_t n_expert, StoreOptions o = {});
  ExpertStore(const gguf::File& f, ExpertGeometry g, StoreOptions o);
  ~ExpertStore();  // waits for reads in flight
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  // Leases `experts` (ascending, distinct, < n_expert) of `layer`, reading the missing ones, and
  // waits for them. Throws Error when the union does not fit, on bad ids and on read errors; on
  // any throw nothing stays leased and the cache holds only complete entries.
  Lease acquire(uint32_t layer, std::span<const uint32_t> experts);
  // Leases those of `experts` (ascending, distinct) whose bytes are resident and complete at the
  // call, in one step under the store's lock: never reads, never waits, never evicts, so an
  // expert evicted just before is left out rather than read on the spot. The lease's experts()
  // say which. Throws Error only on bad ids.
  Lease acquire_resident(uint32_t layer, std::span<const uint32_t> experts);
  // Predicted use (any order, duplicates ignored). Never blocks on I/O, never throws for
  // capacity reasons; throws Error only for ids out of range.
  void hint(uint32_t layer, std::span<const uint32_t> experts);

  uint32_t max_union_experts() const;                // min over layers
  uint32_t max_union_experts(uint32_t layer) const;
  const ExpertGeometry& geometry() const;
  const StoreBudget& budget() const;
  // The slots' one mapping: budget().slots slots of budget().slot_bytes, back to back, in place
  // from construction to destruction; every leased expert's bytes lie within one slot.
  const uint8_t* slot_memory() const;
  const StoreOptions& options() const;
  StoreStats stats() const;
  RequestCounts request_counts() const;  // the totals of stats() alone, without copying the layers
  void reset_stats();
  // Experts of `layer` whose bytes are resident and complete, ascending.
  std::vector<uint32_t> resident(uint32_t layer) const;
  // Experts of `layer` that are resident or being read (a slot is theirs), ascending: what a
  // later acquire() finds without starting a read. Cache-aware routing (--route-bias) favours
  // these; unlike resident() it does not depend on how far the reads in flight have got.
  std::vector<uint32_t> held(uint32_t layer) const;
  // Blocks until no read is queued or in flight (finished prefetches become resident).
  void wait_idle() const;

  struct Impl;

 private:
  friend class Lease;
  void release(Lease& l);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::storage
