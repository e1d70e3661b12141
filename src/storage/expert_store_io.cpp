// Read scheduling and completion for ExpertStore: windows split into reads, demand before
// prefetch, short-read continuation, one EIO retry, O_DIRECT -> buffered fallback, failures that
// never expose a half-filled entry.
#include <fcntl.h>

#include <algorithm>
#include <cstring>

#include "storage/expert_store_impl.h"
#include "util/error.h"

namespace sluice::storage {

namespace {
std::string num(uint64_t v) { return std::to_string(v); }
}  // namespace

void ExpertStore::Impl::start_load_locked(uint32_t s, uint32_t layer, uint32_t expert, bool prefetch) {
  Slot& sl = slots[s];
  sl.state = Slot::State::Loading;
  sl.layer = layer;
  sl.expert = expert;
  sl.by_prefetch = prefetch;
  sl.unused_prefetch = prefetch;
  sl.error.clear();
  index[key(layer, expert)] = s;
  policy->inserted(s, layer);
  std::deque<uint32_t>& q = prefetch ? prefetch_q : demand_q;
  for (uint32_t p = 0; p < kParts; ++p) {
    const Window w = geo.window(layer, p, expert);
    uint8_t* region = slot_base(s) + layout.region_offset[p];
    const uint64_t slice_end = w.slice_offset + w.slice_bytes;
    for (uint64_t off = w.begin; off < w.end; off += opt.max_read_bytes) {
      Op op;
      op.slot = s;
      op.part = p;
      op.offset = off;
      op.len = (uint32_t)std::min<uint64_t>(opt.max_read_bytes, w.end - off);
      op.need = (uint32_t)(std::min(off + op.len, slice_end) - off);
      op.dst = region + (off - w.begin);
      op.buffered = !direct;
      uint32_t id;
      if (!free_ops.empty()) {
        id = free_ops.back();
        free_ops.pop_back();
        ops[id] = op;
      } else {
        id = (uint32_t)ops.size();
        ops.push_back(op);
      }
      sl.ops_left++;
      q.push_back(id);
    }
  }
}

void ExpertStore::Impl::promote_locked(uint32_t s) {
  // Queued reads of this slot move behind the demand reads already queued; reads in flight are
  // requeued as demand if they need another round (requeue_locked looks at the pins).
  std::deque<uint32_t> keep;
  for (uint32_t id : prefetch_q) (ops[id].slot == s ? demand_q : keep).push_back(id);
  prefetch_q.swap(keep);
}

void ExpertStore::Impl::pump_locked() {
  const uint32_t depth = opt.queue_depth;
  const uint32_t prefetch_depth = std::max(1u, depth / 2);
  while (in_flight < depth) {
    uint32_t id;
    bool pf;
    if (!demand_q.empty()) {
      id = demand_q.front();
      demand_q.pop_front();
      pf = false;
    } else if (!prefetch_q.empty() && prefetch_in_flight < prefetch_depth) {
      id = prefetch_q.front();
      prefetch_q.pop_front();
      pf = true;
    } else {
      break;
    }
    Op& op = ops[id];
    op.t_start = now_ns();
    op.prefetch_flight = pf;
    in_flight++;
    if (pf) prefetch_in_flight++;
    const ReadOp r{id, op.buffered ? fd_buffered : fd_direct, op.offset, op.len, op.dst};
    const int rc = io->start(r);
    if (rc < 0) {
      in_flight--;
      if (pf) prefetch_in_flight--;
      layer_stats[slots[op.slot].layer].read_errors++;
      fail_slot_locked(op.slot, describe(op) + " could not be started: " + std::strerror(-rc));
      op_finished_locked(id);
    }
  }
}

std::string ExpertStore::Impl::describe(const Op& op) const {
  const Slot& sl = slots[op.slot];
  const ExpertTensor& t = geo.layers[sl.layer][op.part];
  const Window w = geo.window(sl.layer, op.part, sl.expert);
  return "expert store: " + geo.path + ": tensor " + t.name + " expert " + num(sl.expert) + " (slice at file offset " +
         num(w.slice_offset) + ", " + num(w.slice_bytes) + " bytes): read of " + num(op.len) +
         " bytes at file offset " + num(op.offset) + (op.buffered ? "" : " (O_DIRECT)");
}

void ExpertStore::Impl::complete(uint64_t tag, int64_t res) {
  int fadvise_fd = -1;
  uint64_t fadvise_off = 0, fadvise_len = 0;
  {
    std::lock_guard<std::mutex> lk(mu);
    const Op& op = ops[(uint32_t)tag];
    if (op.buffered && res > 0) {
      // Buffered fallback must not grow the page cache behind the budget's back.
      fadvise_fd = fd_buffered;
      fadvise_off = op.offset;
      fadvise_len = (uint64_t)res;
    }
    complete_locked((uint32_t)tag, res);
    pump_locked();
    cv.notify_all();
  }
  if (fadvise_fd >= 0) ::posix_fadvise(fadvise_fd, (off_t)fadvise_off, (off_t)fadvise_len, POSIX_FADV_DONTNEED);
}

void ExpertStore::Impl::complete_locked(uint32_t id, int64_t res) {
  Op& op = ops[id];
  Slot& sl = slots[op.slot];
  LayerStats& st = layer_stats[sl.layer];
  in_flight--;
  if (op.prefetch_flight) prefetch_in_flight--;
  st.reads++;
  st.latency.add(now_ns() - op.t_start);

  if (opt.fault_injector) {
    const ReadAttempt a{geo.layers[sl.layer][op.part].name, sl.layer, sl.expert, op.part, op.offset, op.len,
                        op.attempt, !op.buffered, sl.by_prefetch};
    const ReadFault f = opt.fault_injector(a);
    if (f.kind == ReadFault::kFail) res = -(int64_t)f.error;
    else if (f.kind == ReadFault::kShort && res > (int64_t)f.bytes) res = f.bytes;
  }
  if (sl.state == Slot::State::Failed) {  // a sibling read already failed this load
    op_finished_locked(id);
    return;
  }
  if (res > 0) (sl.by_prefetch ? st.bytes_prefetch : st.bytes_demand) += (uint64_t)res;

  if (res < 0) {
    const int err = (int)-res;
    if (err == EINTR || err == EAGAIN) {
      st.retries++;
      requeue_locked(id, true);
    } else if (err == EINVAL && !op.buffered) {
      switch_to_buffered_locked(std::string("O_DIRECT read refused (") + std::strerror(err) + ") at file offset " +
                                num(op.offset) + "; using buffered reads with POSIX_FADV_DONTNEED");
      op.buffered = true;
      st.retries++;
      requeue_locked(id, true);
    } else if (err == EIO && op.eio_retries == 0) {
      op.eio_retries++;  // media errors are usually persistent: one retry, then fail the request
      st.retries++;
      requeue_locked(id, true);
    } else {
      st.read_errors++;
      fail_slot_locked(op.slot, describe(op) + " failed: " + std::strerror(err));
      op_finished_locked(id);
    }
  } else if ((uint64_t)res >= op.need) {
    op_finished_locked(id);
  } else if (res == 0) {
    st.read_errors++;
    fail_slot_locked(op.slot, describe(op) + " hit end of file: the file is truncated (" + num(op.need) +
                                  " more bytes expected)");
    op_finished_locked(id);
  } else {
    // Short read: continue where it stopped. An unaligned remainder cannot go through O_DIRECT.
    op.offset += (uint64_t)res;
    op.dst += res;
    op.len -= (uint32_t)res;
    op.need -= (uint32_t)res;
    if (!op.buffered && (op.offset % kIoAlign != 0 || op.len % kIoAlign != 0)) op.buffered = true;
    st.retries++;
    requeue_locked(id, true);
  }
}

void ExpertStore::Impl::requeue_locked(uint32_t id, bool front) {
  Op& op = ops[id];
  op.attempt++;
  std::deque<uint32_t>& q = slots[op.slot].pins > 0 || !slots[op.slot].by_prefetch ? demand_q : prefetch_q;
  if (front) q.push_front(id);
  else q.push_back(id);
}

void ExpertStore::Impl::op_finished_locked(uint32_t id) {
  const uint32_t s = ops[id].slot;
  free_ops.push_back(id);
  Slot& sl = slots[s];
  if (--sl.ops_left > 0) return;
  prefetch_bytes_in_flight -= sl.prefetch_charge;
  sl.prefetch_charge = 0;
  if (sl.state == Slot::State::Loading) sl.state = Slot::State::Ready;
  else if (sl.state == Slot::State::Failed && sl.pins == 0) free_slot_locked(s);
  cv.notify_all();
}

void ExpertStore::Impl::fail_slot_locked(uint32_t s, const std::string& msg) {
  Slot& sl = slots[s];
  if (sl.state != Slot::State::Loading) return;
  sl.state = Slot::State::Failed;
  sl.error = msg;
  last_error = msg;
  index.erase(key(sl.layer, sl.expert));
  policy->removed(s);
  // Reads of this load not started yet are dropped; those in flight still write into the slot,
  // so it is reused only after they complete (op_finished_locked frees it).
  auto drop = [&](std::deque<uint32_t>& q) {
    std::deque<uint32_t> keep;
    std::vector<uint32_t> dropped;
    for (uint32_t id : q) {
      if (ops[id].slot == s) dropped.push_back(id);
      else keep.push_back(id);
    }
    q.swap(keep);
    return dropped;
  };
  std::vector<uint32_t> dropped = drop(demand_q);
  for (uint32_t id : drop(prefetch_q)) dropped.push_back(id);
  for (uint32_t id : dropped) {
    free_ops.push_back(id);
    sl.ops_left--;
  }
  // The caller still owns one op of this slot (it calls op_finished_locked next), so ops_left > 0.
  cv.notify_all();
}

void ExpertStore::Impl::switch_to_buffered_locked(const std::string& why) {
  if (!direct) return;
  direct = false;
  direct_note = why;
  for (uint32_t id : demand_q) ops[id].buffered = true;
  for (uint32_t id : prefetch_q) ops[id].buffered = true;
}

}  // namespace sluice::storage
