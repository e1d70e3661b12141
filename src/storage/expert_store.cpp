// ExpertStore setup, leases, hints and statistics (reads: expert_store_io.cpp).
#include "storage/expert_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "storage/expert_store_impl.h"
#include "util/error.h"

namespace sluice::storage {

namespace {

std::string num(uint64_t v) { return std::to_string(v); }

void check_options(const StoreOptions& o) {
  if (o.queue_depth == 0 || o.queue_depth > 1024)
    throw Error("expert store: queue_depth must be 1..1024, got " + num(o.queue_depth));
  if (o.max_read_bytes < kIoAlign || o.max_read_bytes % kIoAlign != 0 || o.max_read_bytes > (1u << 30))
    throw Error("expert store: max_read_bytes must be a multiple of " + num(kIoAlign) + " up to 1 GiB, got " +
                num(o.max_read_bytes));
}

uint64_t reads_per_slot(const SlotLayout& l, uint64_t max_read) {
  uint64_t n = 0;
  for (uint32_t p = 0; p < kParts; ++p) n += (l.region_bytes[p] + max_read - 1) / max_read;
  return n;
}

// Opens a second description of f's file with O_DIRECT. Returns -1 with *why set when the
// filesystem refuses it (tmpfs before Linux 6.6, some FUSE and network filesystems).
int open_direct(const gguf::File& f, std::string* why) {
  const std::string self = "/proc/self/fd/" + std::to_string(f.fd());
  int fd = ::open(self.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0 && (errno == ENOENT || errno == EACCES)) fd = ::open(f.path().c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) {
    *why = std::string("O_DIRECT refused at open (") + std::strerror(errno) + ")";
    return -1;
  }
#ifdef STATX_DIOALIGN
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
    if (sx.stx_dio_offset_align == 0) {
      *why = "filesystem reports no O_DIRECT support (statx)";
    } else if (sx.stx_dio_offset_align > kIoAlign || sx.stx_dio_mem_align > kIoAlign) {
      *why = "O_DIRECT alignment " + num(sx.stx_dio_offset_align) + " exceeds " + num(kIoAlign);
    }
    if (!why->empty()) {
      ::close(fd);
      return -1;
    }
  }
#endif
  return fd;
}

}  // namespace

StoreBudget bytes_needed(const ExpertGeometry& g, const StoreOptions& o) {
  check_options(o);
  StoreBudget b;
  const SlotLayout l = slot_layout(g);
  b.slot_bytes = l.slot_bytes;
  uint64_t slots = o.cache_bytes / l.slot_bytes;
  if (o.max_slots) slots = std::min<uint64_t>(slots, o.max_slots);
  slots = std::min<uint64_t>(slots, (uint64_t)g.n_layer * g.n_expert);  // more could never be used
  b.slots = (uint32_t)slots;
  b.cache_bytes = slots * l.slot_bytes;
  b.bounce_bytes = 0;
  const uint32_t per_layer = eviction_per_layer(o.policy) ? b.slots / g.n_layer : b.slots;
  b.max_union_experts = std::min(per_layer, g.n_expert);
  // Slot table, index node, LRU links and the read descriptors of a slot being loaded; the
  // backend's ring / queue and per-layer statistics.
  const uint64_t per_slot = sizeof(Slot) + 64 + 4 * sizeof(uint32_t) + reads_per_slot(l, o.max_read_bytes) * (sizeof(Op) + 8);
  b.metadata_bytes = slots * per_slot + (uint64_t)o.queue_depth * 256 + (uint64_t)g.n_layer * sizeof(LayerStats);
  b.total = b.cache_bytes + b.bounce_bytes + b.metadata_bytes;
  return b;
}

ExpertBytes ExpertStore::Impl::bytes_of(uint32_t s) const {
  const Slot& sl = slots[s];
  const uint8_t* base = slot_base(s);
  const uint8_t* p[kParts];
  for (uint32_t k = 0; k < kParts; ++k)
    p[k] = base + layout.region_offset[k] + geo.window(sl.layer, k, sl.expert).head();
  return ExpertBytes{p[kGate], p[kUp], p[kDown]};
}

ExpertStore::Impl::Impl(const gguf::File& f, ExpertGeometry g, StoreOptions o)
    : geo(std::move(g)), opt(std::move(o)) {
  layout = slot_layout(geo);
  budget = bytes_needed(geo, opt);
  if (budget.max_union_experts == 0) {
    const uint64_t min_slots = eviction_per_layer(opt.policy) ? geo.n_layer : 1;
    throw Error("expert cache too small: " + num(opt.cache_bytes) + " bytes" +
                (opt.max_slots ? " / " + num(opt.max_slots) + " slots" : std::string()) + " hold " +
                num(budget.slots) + " experts of " + num(layout.slot_bytes) + " bytes; policy " +
                std::string(eviction_name(opt.policy)) + " needs at least " + num(min_slots) + " (" +
                num(min_slots * layout.slot_bytes) + " bytes)");
  }
  fd_buffered = ::fcntl(f.fd(), F_DUPFD_CLOEXEC, 0);
  if (fd_buffered < 0) throw Error(f.path() + ": cannot duplicate descriptor: " + std::strerror(errno));
  if (opt.direct_io) {
    fd_direct = open_direct(f, &direct_note);
    direct = fd_direct >= 0;
    if (!direct) direct_note += "; using buffered reads with POSIX_FADV_DONTNEED";
  } else {
    direct_note = "O_DIRECT disabled by option; buffered reads with POSIX_FADV_DONTNEED";
  }
  try {
    policy = make_policy(opt.policy, budget.slots, geo.n_layer, geo.n_expert);
    slots.resize(budget.slots);
    for (uint32_t s = budget.slots; s-- > 0;) free_slots.push_back(s);
    layer_stats.resize(geo.n_layer);
    void* m = ::mmap(nullptr, budget.cache_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
      throw Error("cannot allocate the expert cache (" + num(budget.cache_bytes) + " bytes): " + std::strerror(errno));
    slab = static_cast<uint8_t*>(m);
    auto done = [this](uint64_t tag, int64_t res) { complete(tag, res); };
    if (!opt.force_pread) io = make_uring_backend(opt.queue_depth, done, &backend_note);
    else backend_note = "pread forced by option";
    if (!io) io = make_pread_backend(opt.queue_depth, done);
  } catch (...) {
    if (slab) ::munmap(slab, budget.cache_bytes);
    if (fd_direct >= 0) ::close(fd_direct);
    ::close(fd_buffered);
    throw;
  }
}

ExpertStore::Impl::~Impl() {
  {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return in_flight == 0 && demand_q.empty() && prefetch_q.empty(); });
  }
  io.reset();  // joins the backend threads
  if (slab) ::munmap(slab, budget.cache_bytes);
  if (fd_direct >= 0) ::close(fd_direct);
  if (fd_buffered >= 0) ::close(fd_buffered);
}

bool ExpertStore::Impl::any_transient() const {
  for (const Slot& s : slots)
    if ((s.state == Slot::State::Loading && s.pins == 0) || s.state == Slot::State::Failed) return true;
  return false;
}

int64_t ExpertStore::Impl::take_slot_locked(uint32_t layer) {
  const int64_t c = policy->choose(layer, !free_slots.empty(), [this](uint32_t s) { return evictable(s); });
  if (c == EvictionPolicy::kFree) {
    const uint32_t s = free_slots.back();
    free_slots.pop_back();
    return s;
  }
  if (c >= 0) {
    evict_locked((uint32_t)c);
    return c;
  }
  return -1;
}

void ExpertStore::Impl::evict_locked(uint32_t s) {
  Slot& sl = slots[s];
  index.erase(key(sl.layer, sl.expert));
  policy->removed(s);
  LayerStats& st = layer_stats[sl.layer];
  st.evictions++;
  if (sl.unused_prefetch) st.prefetch_wasted++;
  sl = Slot{};
}

void ExpertStore::Impl::free_slot_locked(uint32_t s) {
  slots[s] = Slot{};
  free_slots.push_back(s);
  cv.notify_all();
}

void ExpertStore::Impl::unpin_locked(uint32_t s) {
  Slot& sl = slots[s];
  if (--sl.pins == 0) {
    if (sl.state == Slot::State::Failed && sl.ops_left == 0) free_slot_locked(s);
    cv.notify_all();
  }
}

// ---------------------------------------------------------------------------------------------

ExpertStore::ExpertStore(const gguf::File& f, uint32_t n_layer, uint32_t n_expert, StoreOptions o)
    : ExpertStore(f, expert_geometry(f, n_layer, n_expert), std::move(o)) {}

ExpertStore::ExpertStore(const gguf::File& f, ExpertGeometry g, StoreOptions o)
    : impl_(std::make_unique<Impl>(f, std::move(g), std::move(o))) {}

ExpertStore::~ExpertStore() = default;

void ExpertStore::Impl::check_acquire_locked(uint32_t layer, size_t n_experts) const {
  const uint32_t cap = policy->capacity(layer);
  if (n_experts > cap)
    throw Error("expert store: layer " + num(layer) + " needs " + num(n_experts) +
                " distinct experts at once but the cache holds at most " + num(cap) + " per layer (" +
                num(budget.slots) + " slots of " + num(layout.slot_bytes) + " bytes, " +
                std::string(policy->name()) + "); reduce the chunk size or enlarge the cache");
}

bool ExpertStore::Impl::pin_existing_locked(Acquire& a, size_t i) {
  auto it = index.find(key(a.layer, a.experts[i]));
  if (it == index.end()) return false;
  LayerStats& st = layer_stats[a.layer];
  const uint32_t s = it->second;
  Slot& sl = slots[s];
  if (sl.state == Slot::State::Ready) {
    st.hits++;
  } else {
    st.misses++;
    st.joined++;
    promote_locked(s);
  }
  if (sl.unused_prefetch) {
    st.prefetch_used++;
    sl.unused_prefetch = false;
  }
  sl.pins++;
  policy->touched(s);
  a.got[i] = s;
  a.pinned.push_back(s);
  return true;
}

void ExpertStore::Impl::pin_present_locked(Acquire& a) {
  for (size_t i = 0; i < a.experts.size(); ++i) {
    layer_stats[a.layer].requests++;
    pin_existing_locked(a, i);
  }
}

void ExpertStore::Impl::load_missing_locked(Acquire& a, std::unique_lock<std::mutex>& lk) {
  for (size_t i = 0; i < a.experts.size(); ++i) {
    if (a.got[i] != kNoSlot) continue;
    for (;;) {
      if (pin_existing_locked(a, i)) break;  // another thread started it while we waited
      const int64_t s = take_slot_locked(a.layer);
      if (s >= 0) {
        layer_stats[a.layer].misses++;
        slots[s].pins = 1;
        start_load_locked((uint32_t)s, a.layer, a.experts[i], false);
        a.got[i] = (uint32_t)s;
        a.pinned.push_back((uint32_t)s);
        break;
      }
      if (!any_transient())
        throw Error("expert store: no slot free for layer " + num(a.layer) + " expert " + num(a.experts[i]) +
                    ": the cache is leased by other users (" + num(budget.slots) + " slots)");
      pump_locked();
      a.waited = true;
      cv.wait(lk);  // a load finishing or failing frees a slot; then look again
    }
  }
  pump_locked();
}

void ExpertStore::Impl::wait_ready_locked(Acquire& a, std::unique_lock<std::mutex>& lk) {
  auto loading = [&] {
    for (uint32_t s : a.got)
      if (slots[s].state == Slot::State::Loading) return true;
    return false;
  };
  if (loading()) {
    a.waited = true;
    cv.wait(lk, [&] { return !loading(); });
  }
  for (uint32_t s : a.got)
    if (slots[s].state == Slot::State::Failed) throw Error(slots[s].error);
}

void ExpertStore::Impl::check_request(uint32_t layer, std::span<const uint32_t> experts) const {
  if (layer >= geo.n_layer)
    throw Error("expert store: layer " + num(layer) + " out of range (" + num(geo.n_layer) + " layers)");
  for (size_t i = 0; i < experts.size(); ++i) {
    if (experts[i] >= geo.n_expert)
      throw Error("expert store: expert " + num(experts[i]) + " out of range (" + num(geo.n_expert) + " experts)");
    if (i && experts[i] <= experts[i - 1])
      throw Error("expert store: experts of layer " + num(layer) + " must be ascending and distinct");
  }
}

Lease ExpertStore::acquire_resident(uint32_t layer, std::span<const uint32_t> experts) {
  Impl& m = *impl_;
  m.check_request(layer, experts);
  Lease lease;
  lease.layer_ = layer;
  // Room first: nothing may throw between pinning an entry and its place in the lease.
  lease.experts_.reserve(experts.size());
  lease.slots_.reserve(experts.size());
  lease.bytes_.reserve(experts.size());
  Impl::Acquire a{layer, experts, std::vector<uint32_t>(experts.size(), Impl::kNoSlot), {}, false};
  std::lock_guard<std::mutex> lk(m.mu);
  for (size_t i = 0; i < experts.size(); ++i) {
    const auto it = m.index.find(m.key(layer, experts[i]));
    if (it == m.index.end() || m.slots[it->second].state != Slot::State::Ready) continue;
    m.layer_stats[layer].requests++;
    m.pin_existing_locked(a, i);  // a hit
    lease.experts_.push_back(experts[i]);
    lease.slots_.push_back(a.got[i]);
    lease.bytes_.push_back(m.bytes_of(a.got[i]));
  }
  if (!lease.experts_.empty()) lease.store_ = this;
  return lease;
}

Lease ExpertStore::acquire(uint32_t layer, std::span<const uint32_t> experts) {
  Impl& m = *impl_;
  m.check_request(layer, experts);
  Lease lease;
  lease.layer_ = layer;
  if (experts.empty()) return lease;

  std::unique_lock<std::mutex> lk(m.mu);
  m.check_acquire_locked(layer, experts.size());
  Impl::Acquire a{layer, experts, std::vector<uint32_t>(experts.size(), Impl::kNoSlot), {}, false};
  a.pinned.reserve(experts.size());
  const uint64_t t0 = now_ns();
  try {
    m.pin_present_locked(a);
    m.load_missing_locked(a, lk);
    m.wait_ready_locked(a, lk);
  } catch (...) {
    // Loads already queued for this call go on (they become ordinary cache entries).
    m.pump_locked();
    for (uint32_t s : a.pinned) m.unpin_locked(s);
    if (a.waited) m.layer_stats[layer].stall_ns += now_ns() - t0;
    throw;
  }
  if (a.waited) m.layer_stats[layer].stall_ns += now_ns() - t0;
  lease.store_ = this;
  lease.experts_.assign(experts.begin(), experts.end());
  lease.slots_ = std::move(a.got);
  lease.bytes_.reserve(lease.slots_.size());
  for (uint32_t s : lease.slots_) lease.bytes_.push_back(m.bytes_of(s));
  return lease;
}

void ExpertStore::hint(uint32_t layer, std::span<const uint32_t> experts) {
  Impl& m = *impl_;
  if (layer >= m.geo.n_layer)
    throw Error("expert store: hint for layer " + num(layer) + " out of range (" + num(m.geo.n_layer) + " layers)");
  for (uint32_t e : experts)
    if (e >= m.geo.n_expert)
      throw Error("expert store: hint for expert " + num(e) + " out of range (" + num(m.geo.n_expert) + " experts)");
  std::lock_guard<std::mutex> lk(m.mu);
  LayerStats& st = m.layer_stats[layer];
  for (uint32_t e : experts) {
    auto it = m.index.find(Impl::key(layer, e));
    if (it != m.index.end()) {
      // Already there or on its way: keep it from being the next victim.
      if (m.slots[it->second].state == Slot::State::Ready) m.policy->touched(it->second);
      continue;
    }
    const uint64_t bytes = m.geo.load_bytes(layer, e);
    if (m.prefetch_bytes_in_flight + bytes > m.opt.prefetch_budget_bytes) {
      st.prefetch_dropped++;
      continue;
    }
    const int64_t s = m.take_slot_locked(layer);
    if (s < 0) {
      st.prefetch_dropped++;
      continue;
    }
    m.slots[s].prefetch_charge = bytes;
    m.prefetch_bytes_in_flight += bytes;
    st.prefetch_issued++;
    m.start_load_locked((uint32_t)s, layer, e, true);
  }
  m.pump_locked();
}

void ExpertStore::release(Lease& l) {
  if (!l.slots_.empty()) {
    std::lock_guard<std::mutex> lk(impl_->mu);
    for (uint32_t s : l.slots_) impl_->unpin_locked(s);
  }
  l.store_ = nullptr;
  l.experts_.clear();
  l.slots_.clear();
  l.bytes_.clear();
}

uint32_t ExpertStore::max_union_experts() const { return impl_->budget.max_union_experts; }
uint32_t ExpertStore::max_union_experts(uint32_t layer) const {
  if (layer >= impl_->geo.n_layer) throw Error("expert store: layer " + num(layer) + " out of range");
  return impl_->policy->capacity(layer);
}
const ExpertGeometry& ExpertStore::geometry() const { return impl_->geo; }
const StoreBudget& ExpertStore::budget() const { return impl_->budget; }
const uint8_t* ExpertStore::slot_memory() const { return impl_->slab; }
const StoreOptions& ExpertStore::options() const { return impl_->opt; }

StoreStats ExpertStore::stats() const {
  const Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.mu);
  StoreStats s;
  s.backend = m.io->name();
  s.backend_note = m.backend_note;
  s.direct_io = m.direct;
  s.direct_io_note = m.direct_note;
  s.last_error = m.last_error;
  s.slot_bytes = m.layout.slot_bytes;
  s.slots = m.budget.slots;
  s.slots_used = m.budget.slots - (uint32_t)m.free_slots.size();
  s.layers = m.layer_stats;
  return s;
}

RequestCounts ExpertStore::request_counts() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  RequestCounts c;
  for (const LayerStats& l : impl_->layer_stats) {
    c.requests += l.requests;
    c.hits += l.hits;
  }
  return c;
}

void ExpertStore::reset_stats() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  for (auto& l : impl_->layer_stats) l = LayerStats{};
  impl_->last_error.clear();
}

std::vector<uint32_t> ExpertStore::resident(uint32_t layer) const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::vector<uint32_t> out;
  for (const Slot& s : impl_->slots)
    if (s.state == Slot::State::Ready && s.layer == layer) out.push_back(s.expert);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint32_t> ExpertStore::held(uint32_t layer) const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::vector<uint32_t> out;
  for (const Slot& s : impl_->slots)
    if ((s.state == Slot::State::Ready || s.state == Slot::State::Loading) && s.layer == layer) out.push_back(s.expert);
  std::sort(out.begin(), out.end());
  return out;
}

void ExpertStore::wait_idle() const {
  std::unique_lock<std::mutex> lk(impl_->mu);
  impl_->cv.wait(lk, [&] {
    return impl_->in_flight == 0 && impl_->demand_q.empty() && impl_->prefetch_q.empty();
  });
}

// ---------------------------------------------------------------------------------------------

Lease::Lease(Lease&& o) noexcept
    : store_(o.store_), layer_(o.layer_), experts_(std::move(o.experts_)), slots_(std::move(o.slots_)),
      bytes_(std::move(o.bytes_)) {
  o.store_ = nullptr;
  o.experts_.clear();
  o.slots_.clear();
  o.bytes_.clear();
}

Lease& Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    release();
    store_ = o.store_;
    layer_ = o.layer_;
    experts_ = std::move(o.experts_);
    slots_ = std::move(o.slots_);
    bytes_ = std::move(o.bytes_);
    o.store_ = nullptr;
    o.experts_.clear();
    o.slots_.clear();
    o.bytes_.clear();
  }
  return *this;
}

Lease::~Lease() { release(); }

void Lease::release() {
  if (store_) store_->release(*this);
}

ExpertBytes Lease::get(uint32_t layer, uint32_t expert) const {
  if (layer == layer_ && store_) {
    auto it = std::lower_bound(experts_.begin(), experts_.end(), expert);
    if (it != experts_.end() && *it == expert) return bytes_[it - experts_.begin()];
  }
  throw Error("expert store: layer " + std::to_string(layer) + " expert " + std::to_string(expert) +
              " was not prepared (the current lease covers layer " + std::to_string(layer_) + ", " +
              std::to_string(experts_.size()) + " experts)");
}

}  // namespace sluice::storage
