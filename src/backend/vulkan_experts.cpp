// The Vulkan backend's routed experts: in device slots (the slots' LRU order, the router's hints
// and their copies, staged uploads) and in place.
// Built only with the Vulkan backend (CMakeLists.txt sets SLUICE_HAVE_VULKAN on vulkan_*.cpp).
#if SLUICE_HAVE_VULKAN
#include "backend/vulkan_backend_impl.h"

namespace sluice::vk_backend {

void VulkanBackend::routed_ffn(ExpertTensors t, const ExpertSource& src, uint32_t layer,
                               std::span<const ExpertTriple> triples, float limit, CMat x, Mat routed) const {
  const bool device = experts_on_device(t);
  settle_for(x, routed);
  if (!device) return CpuBackend::routed_ffn(t, src, layer, triples, limit, x, routed);
  const size_t H = x.width;
  device_routed(
      t, src, layer, triples, limit, x,
      [&](size_t j, const float* d) {
        float* ri = routed.row(triples[j].token);
        for (size_t k = 0; k < H; ++k) ri[k] += d[k];
      },
      routed);
}

void VulkanBackend::routed_ffn_rows(ExpertTensors t, const ExpertSource& src, uint32_t layer,
                                    std::span<const ExpertTriple> triples, float limit, CMat x, Mat rows) const {
  const bool device = experts_on_device(t);
  settle_for(x, rows);
  if (!device) return CpuBackend::routed_ffn_rows(t, src, layer, triples, limit, x, rows);
  if (rows.n != triples.size() || rows.width != x.width) throw Error("routed_ffn_rows: shapes differ");
  device_routed(t, src, layer, triples, limit, x,
                [&](size_t j, const float* d) { std::copy(d, d + x.width, rows.row(j)); });
}

std::vector<uint32_t> VulkanBackend::unheld_experts(const ExpertSource& src, uint32_t layer,
                                                    std::vector<uint32_t> experts) const {
  if (slots_wanted_ == 0) return experts;
  const std::lock_guard<std::mutex> lk(mu_);
  std::erase_if(experts, [&](uint32_t e) { return find_slot(src.id, layer, e) != nullptr; });
  return experts;
}

void VulkanBackend::prefetch_experts(const ExpertSource& src, uint32_t layer, ExpertTensors t,
                                     std::span<const uint32_t> now, ExpertTensors next_t,
                                     std::span<const uint32_t> next) const {
  if (!prefetches_experts()) return;
  const std::lock_guard<std::mutex> lk(mu_);
  if (slot_stride_ == 0 || std::any_of(slabs_.begin(), slabs_.end(), [](const Buffer& b) { return b.map != nullptr; }))
    return;
  const uint64_t floor = use_clock_ + 1;  // slots used from here on are this call's
  for (const uint32_t e : now)
    if (ExpertSlot* sl = find_slot(src.id, layer, e)) slot_used(*sl);
  // Staged copies of kept attention rows name no expert slot (pending_slots_ lists those that do).
  if (!settle_hint() || deferred_.reads_experts || !pending_slots_.empty()) {
    ++st_.expert_hints_dropped;
    return;
  }
  ensure(hint_stage_, staging_bytes_);
  VkDeviceSize used = 0;
  std::vector<PendingCopy> copies[2];  // this layer's, the next layer's guesses
  auto take = [&](uint32_t L, std::span<const uint32_t> experts, ExpertTensors et, int batch) {
    if (!et.gate || !et.up || !et.down) return;
    const ExpertParts parts = expert_parts(et);
    if (!fits_slots(parts)) return;  // its routed op runs elsewhere
    const uint64_t* const bytes = parts.bytes;
    std::vector<uint32_t> want;
    for (const uint32_t e : experts)
      if (!find_slot(src.id, L, e)) want.push_back(e);
    if (want.empty()) return;
    if (st_.expert_layers.size() <= L) st_.expert_layers.resize(L + 1);
    GpuLayerStats& ls = st_.expert_layers[L];
    src.at_hand(L, want, [&](uint32_t e, const ExpertWeights& ew) {
      if (find_slot(src.id, L, e)) return;
      VkDeviceSize need = 0;
      for (int i = 0; i < 3; ++i) need += (bytes[i] + 3) / 4 * 4;
      if (used + need > hint_stage_.size) return;  // the rest wait for their turn
      const size_t victim = lru_slot(floor);
      if (victim == slots_.size()) return;  // every slot is this call's
      ExpertSlot& sl = slots_[victim];
      unname_slot(sl);
      const uint8_t* from[3] = {ew.gate, ew.up, ew.down};
      for (int i = 0; i < 3; ++i) {
        std::memcpy(static_cast<uint8_t*>(hint_stage_.map) + used, from[i], bytes[i]);
        copies[batch].push_back({slabs_[sl.slab].buf, VkBufferCopy{used, sl.offset + part_off_[i], bytes[i]}});
        used += (bytes[i] + 3) / 4 * 4;
        st_.expert_upload_bytes += bytes[i];
        ls.upload_bytes += bytes[i];
      }
      name_slot(victim, src.id, L, e);
      sl.hinted = true;
      sl.ready = timeline_ok_ ? timeline_value_ + 1 + (uint64_t)batch : 0;
      slot_used(sl);
      hint_slots_.push_back(victim);
      ++st_.expert_uploads_hinted;
    });
  };
  const char* const what = "copying hinted experts";
  // Slots are named as their bytes are staged: anything that throws before the submission is
  // on the queue (a source that fails, a refused submission) un-names them.
  try {
    take(layer, now, t, 0);
    take(layer + 1, next, next_t, 1);
    if (copies[0].empty() && copies[1].empty()) return;
    // Two batches in one submission, each signalling its own value (timeline_value_ + 1 and
    // + 2, whether or not it has copies), the fence after both.
    VkSubmitInfo si[2]{};
    VkTimelineSemaphoreSubmitInfo ts[2]{};
    uint64_t values[2] = {timeline_value_ + 1, timeline_value_ + 2};
    for (int b = 0; b < 2; ++b) {
      VkCommandBuffer cb = hint_cmd_[b];
      begin_recording(cb);
      record_copies(cb, hint_stage_.buf, copies[b]);
      check(vkEndCommandBuffer(cb), "recording commands");
      si[b].sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
      si[b].commandBufferCount = 1;
      si[b].pCommandBuffers = &hint_cmd_[b];
      if (timeline_ok_) {
        ts[b].sType = VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO;
        ts[b].signalSemaphoreValueCount = 1;
        ts[b].pSignalSemaphoreValues = &values[b];
        si[b].pNext = &ts[b];
        si[b].signalSemaphoreCount = 1;
        si[b].pSignalSemaphores = &timeline_;
      }
    }
    if (fault_before_ && fault_before_(what)) throw lost(what, VK_ERROR_DEVICE_LOST);
    check(vkQueueSubmit(xfer_queue_, 2, si, hint_fence_), what);
    if (timeline_ok_) timeline_value_ += 2;
  } catch (...) {
    unname_hinted();
    throw;
  }
  ++st_.submissions;
  ++st_.hint_submissions;
  hint_in_flight_ = true;
  hint_barrier_ = !timeline_ok_;  // with a timeline, the submissions touching the slots wait for it
}

bool VulkanBackend::experts_on_device(ExpertTensors t) const {
  if (slots_wanted_ == 0 && !in_place_) return false;
  const ExpertParts parts = expert_parts(t);
  const std::lock_guard<std::mutex> lk(mu_);
  bool fits = false;
  if (in_place_) {
    fits = parts.shaders && !in_place_released_;
  } else {
    if (parts.shaders && slot_stride_ == 0 && !st_.expert_slots_refused) make_slots(parts.bytes);
    fits = fits_slots(parts);
  }
  if (!fits) ++st_.expert_calls_on_host;
  return fits;
}

VulkanBackend::ExpertParts VulkanBackend::expert_parts(ExpertTensors t) const {
  ExpertParts p;
  uint32_t kind = 0;
  int i = 0;
  for (const Weight* w : {t.gate, t.up, t.down}) {
    p.bytes[i++] = w->rows * w->row_bytes;
    p.shaders &= pipeline_for(w->type, kind) != VK_NULL_HANDLE && w->rows * w->row_bytes <= max_range_;
  }
  return p;
}

bool VulkanBackend::fits_slots(const ExpertParts& p) const {
  return p.shaders && slot_stride_ != 0 && p.bytes[0] <= part_cap_[0] && p.bytes[1] <= part_cap_[1] &&
         p.bytes[2] <= part_cap_[2];
}

template <class Take>
void VulkanBackend::device_routed(ExpertTensors t, const ExpertSource& src, uint32_t layer,
                                  std::span<const ExpertTriple> triples, float limit, CMat x, Take&& take,
                                  Mat sums) const {
  const Weight* parts[3] = {t.gate, t.up, t.down};
  VkPipeline pipes[3];
  uint32_t kinds[3] = {};
  for (int i = 0; i < 3; ++i) pipes[i] = pipeline_for(parts[i]->type, kinds[i]);
  const std::lock_guard<std::mutex> lk(mu_);
  // The experts with a slot are marked used now, so placing the others (least recently used
  // out) never evicts one of them before its turn. With fewer slots than the call's experts
  // that cannot be avoided, and every expert is asked of the source.
  const std::vector<uint32_t> used = experts_of(triples);
  std::vector<uint32_t> missing;
  for (const uint32_t e : used) {
    if (ExpertSlot* sl = find_slot(src.id, layer, e)) slot_used(*sl);
    else missing.push_back(e);
  }
  const std::vector<uint32_t> on_cpu =
      split_.active() ? ExpertSplit::pick(triples, missing, split_.cpu_count(used.size() - missing.size(), missing.size()))
                      : std::vector<uint32_t>{};
  // Copies ahead: where the slots are mapped (an integrated GPU, a card with resizable BAR, a
  // CPU device) a copy into a slot is the host's memcpy, so while the device runs a group the
  // host copies in the next group's misses. Only when every expert of the call has a slot (a
  // copy ahead then evicts nothing the call still needs, and nothing a submitted command reads:
  // this call's slots are the most recently used) and the source holds its union (asking for a
  // later expert first must not move it on).
  std::vector<uint32_t> ahead;  // misses the device will run, ascending; copied in early or at their turn
  if (slots_.size() >= used.size() && src.holds_union() &&
      std::all_of(slabs_.begin(), slabs_.end(), [](const Buffer& b) { return b.map != nullptr; }))
    for (const uint32_t e : missing)
      if (!std::binary_search(on_cpu.begin(), on_cpu.end(), e)) ahead.push_back(e);
  size_t ahead_next = 0;          // ahead[ahead_next..] are not in a slot yet
  std::vector<uint32_t> early;    // copied in ahead of their turn (ascending)
  if (used.size() > slots_.size()) missing = used;
  if (!missing.empty()) src.prepare(layer, missing);
  // A CPU expert keeps the source's pointers until its group is done: where a windowed source
  // may move on at the next get(), it is the last of its group.
  const bool ends_group = !src.holds_union();
  // Groups of experts no larger than the slots (placing one never evicts another of its
  // group) or than a submission's descriptor sets allow: one round trip per group (two where
  // the SwiGLU runs on the host).
  const ExpertGrouping grouping{in_place_ ? kGroupExperts : std::max<size_t>(1, std::min<size_t>(slots_.size(), kGroupExperts)),
                                std::min<uint64_t>(kGpuExpertGroupBytes, io_limit_ / 2)};
  if (st_.expert_layers.size() <= layer) st_.expert_layers.resize(layer + 1);
  GpuLayerStats& ls = st_.expert_layers[layer];
  struct Handle {
    bool on_device = false;  // false: the CPU runs it from `host`
    DeviceWeight part[3]{};  // gate, up, down where the dispatches read them
    ExpertWeights host{};
    bool ends_group = false;
    bool fused = false;  // on the device, SwiGLU and down projection in the gate-and-up submission
  };
  // An expert on the device runs whole in one submission (routed_terms.h `fused`): gate and up
  // into one scratch tensor [g | u] per token, the SwiGLU with its tokens' routing weights a
  // stage after them (swiglu.comp), the down projection's activations quantized from it and the
  // down projection, chained, as the shared expert's are. Where the device cannot (no
  // shaderFloat64, a down projection whose activations it does not quantize), the SwiGLU and
  // the quantization run on the host between two submissions.
  const size_t F = t.gate->rows;
  const bool fuse = swiglu_ != VK_NULL_HANDLE && quantizes(t.down->act(), F);
  std::vector<Tensor> scratch;  // the fused experts' [g | u] rows, until their submission has run
  using Job = ExpertJob<Handle>;
  using clock = std::chrono::steady_clock;
  std::vector<LinearItem> items;
  double cpu_s = 0, dev_s = 0;  // the group's CPU experts and device submissions, both phases
  size_t n_cpu = 0, n_dev = 0;
  // Copies expert e into a slot (a miss), counted for its layer and the split's cost model.
  auto copy_in = [&](uint32_t e) {
    const auto t0 = clock::now();
    ExpertSlot* sl = place(src.id, layer, e, src.get(layer, e), t, ls);
    slot_used(*sl);
    const auto took = clock::now() - t0;
    split_.upload_took(std::chrono::duration<double>(took).count(), 1);
    ls.upload_ns += (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(took).count();
    return sl;
  };
  // While the device runs a group: the next group's worth of misses copied in.
  auto copy_ahead = [&] {
    for (size_t k = 0; k < grouping.max_experts && ahead_next < ahead.size(); ++k, ++ahead_next) {
      copy_in(ahead[ahead_next]);
      early.push_back(ahead[ahead_next]);
      ++st_.expert_uploads_ahead;
    }
  };
  // A phase's experts without a slot, computed by the CPU from the source's bytes.
  auto run_cpu_jobs = [&](std::span<const Job> jobs, bool down) {
    const auto t0 = clock::now();
    for (const Job& j : jobs) {
      if (j.h.on_device) continue;
      if (down) {
        expert_projection(*parts[2], j.h.host.down, j.down_acts, j.down_y);
      } else {
        expert_projection(*parts[0], j.h.host.gate, j.acts[0], j.y[0]);
        expert_projection(*parts[1], j.h.host.up, j.acts[1], j.y[1]);
      }
    }
    cpu_s += std::chrono::duration<double>(clock::now() - t0).count();
  };
  // The terms summed on the device (above): decided when the group's handles are known.
  bool summed = false;
  Tensor terms;  // [triples][H], a fused expert's rows from its first triple's
  const bool may_sum = sums.p && routed_sum_ != VK_NULL_HANDLE && !split_.active() && sums.n != 0 &&
                       live_->holder(sums.p, (sums.n - 1) * sums.stride + sums.width).id;
  // One phase of a group: the device's projections submitted, the CPU's computed meanwhile.
  auto phase = [&](std::span<Job> jobs, bool down) {
    items.clear();
    scratch.clear();
    size_t covered = 0;
    for (const Job& j : jobs) covered += j.n;
    const bool sum_here = !down && may_sum && covered == triples.size() &&
                          std::all_of(jobs.begin(), jobs.end(), [](const Job& j) { return j.h.on_device && j.h.fused; });
    if (sum_here) terms = tensor(triples.size(), x.width);
    size_t first = 0;  // the job's first triple
    for (const Job& j : jobs) {
      const size_t j_first = first;
      first += j.n;
      if (!j.h.on_device || (down && j.h.fused)) continue;
      if (down) {
        items.push_back({j.h.part[2], parts[2], j.down_acts, j.down_stride, j.down_y, parts[2]->rows});
      } else if (!j.h.fused) {
        for (int p = 0; p < 2; ++p)
          items.push_back({j.h.part[p], parts[p], j.acts[p], j.strides[p], j.y[p], parts[p]->rows});
      } else {
        float* gu = scratch.emplace_back(tensor(j.n, 2 * F)).m().p;
        const uint64_t id = live_->holder(gu, j.n * 2 * F).id;
        for (int p = 0; p < 2; ++p)
          items.push_back({j.h.part[p], parts[p], j.acts[p], j.strides[p], gu + p * F, F, 2 * F, 0, true, id, gu});
        LinearItem d{j.h.part[2], parts[2], {}, quantized_row_bytes(parts[2]->act(), F), j.down_y, parts[2]->rows};
        if (sum_here) {  // into the terms tensor, so the batch may keep it
          d.y = terms.m().row(j_first);
          d.y_row = d.y;
          d.tensor = live_->holder(d.y, j.n * x.width).id;
        }
        d.x = gu;
        d.x_stride = 2 * F;
        d.n_x = j.n;
        d.glu_g = gu;
        d.glu_u = gu + F;
        d.glu_w = j.weights.data();
        d.glu_limit = limit;
        items.push_back(d);
      }
    }
    std::function<void()> meanwhile;
    const bool cpu_jobs = std::any_of(jobs.begin(), jobs.end(), [](const Job& j) { return !j.h.on_device; });
    if (cpu_jobs || (!down && ahead_next < ahead.size()))
      meanwhile = [&, cpu_jobs, down] {
        if (cpu_jobs) run_cpu_jobs(jobs, down);
        if (!down) copy_ahead();
      };
    if (sum_here && record_routed_sum(items, jobs, triples, terms, sums, scratch)) {
      summed = true;
      return;
    }
    dev_s = add_seconds(dev_s, device_linears(items, std::move(meanwhile)));
    if (sum_here) {  // no room to keep them in the batch: the terms go to routed_terms' rows after all
      size_t at = 0;
      for (const Job& j : jobs) {
        std::memcpy(j.down_y, terms.c().row(at), j.n * x.width * sizeof(float));
        at += j.n;
      }
    }
  };
  sluice::routed_terms(
      t, triples, limit, x, grouping,
      [&](uint32_t e) {
        Handle h;
        if (in_place_) {
          h.host = src.get(layer, e);
          h.ends_group = ends_group;
          h.on_device = view_in_place(src, h.host, parts, pipes, kinds, h.part);
          h.fused = h.on_device && fuse;
          ++(h.on_device ? st_.expert_in_place : st_.expert_in_place_refused);
          ++(h.on_device ? ls.in_place : ls.on_cpu);
          ++(h.on_device ? n_dev : n_cpu);
          return h;
        }
        if (std::binary_search(on_cpu.begin(), on_cpu.end(), e)) {
          h.host = src.get(layer, e);
          h.ends_group = ends_group;
          ++st_.expert_on_cpu;
          ++ls.on_cpu;
          ++n_cpu;
          return h;
        }
        ExpertSlot* slot = find_slot(src.id, layer, e);
        const bool copied_early = std::binary_search(early.begin(), early.end(), e);
        // A slot a hint filled counts as the miss it was, copied ahead of its turn.
        if (slot && !copied_early && !slot->hinted) {
          ++st_.expert_hits;
          ++ls.hits;
        } else {
          if (!slot) slot = copy_in(e);
          if (slot->hinted) ++st_.expert_hints_used;
          slot->hinted = false;
          ++st_.expert_misses;
          ++ls.misses;
        }
        // Its turn has come: no copy ahead of it is left to make.
        while (ahead_next < ahead.size() && ahead[ahead_next] <= e) ++ahead_next;
        slot_used(*slot);
        h.on_device = true;
        h.fused = fuse;
        for (int p = 0; p < 3; ++p) h.part[p] = slot_part(*slot, p, pipes[p], kinds[p]);
        ++n_dev;
        return h;
      },
      [&](std::span<Job> jobs) {
        dev_s = cpu_s = 0;
        phase(jobs, false);
      },
      [&](std::span<Job> jobs) {
        if (summed) return;
        phase(jobs, true);
        if (n_dev) split_.device_took(dev_s, n_dev);
        if (n_cpu) split_.cpu_took(cpu_s, n_cpu);
        n_dev = n_cpu = 0;
      },
      [&](size_t j, const float* d) {
        if (!summed) take(j, d);
      });
  st_.split_upload_s = split_.costs().upload;
  st_.split_device_s = split_.costs().device;
  st_.split_cpu_s = split_.costs().cpu;
}

template <class Items, class Jobs>
bool VulkanBackend::record_routed_sum(const Items& items, const Jobs& jobs, std::span<const ExpertTriple> triples,
                                      const Tensor& terms, Mat sums, std::span<const Tensor> scratch) const {
  const size_t H = terms.width(), n = sums.n;
  // Room: the items alone in one submission (device_linears would split them otherwise), the
  // sum's lists and a region of the sums' rows.
  const size_t words = 2 * n + triples.size();
  VkDeviceSize act = aligned(words * 4) + aligned((VkDeviceSize)n * sums.width * sizeof(float)), out = 0;
  for (const auto& it : items) {
    act += aligned((VkDeviceSize)it.tokens() * (it.xf ? it.W->cols * sizeof(float) : it.stride)) +
           (it.x ? aligned((VkDeviceSize)it.tokens() * it.W->cols * sizeof(float)) : 0) + aligned(it.tokens() * sizeof(float));
    out += aligned((VkDeviceSize)it.tokens() * it.y_step() * sizeof(float));
  }
  out += aligned((VkDeviceSize)n * sums.stride * sizeof(float));
  if (deferred_.ds.size() + 3 * items.size() + 1 > kSets || deferred_.act_used + act > io_limit_ ||
      deferred_.out_used + out > io_limit_)
    return false;
  device_linears(items, {}, /*defer=*/true);
  deferred_.reads_experts = true;
  for (const Tensor& gu : scratch) deferred_.keep.push_back(gu);  // the batch reads and writes them
  // Each term row's place: the region the expert's down projection writes.
  std::vector<uint32_t> place(triples.size());
  std::vector<const Region*> term_regions;
  uint32_t after = 0;
  size_t first = 0;
  for (const auto& j : jobs) {
    const Region* r = deferred_.source_of(CMat{terms.c().row(first), j.n, H, H});
    if (!r) throw Error("routed experts: the device's terms are in no region of the batch");  // device_linears placed them
    for (size_t k = 0; k < j.n; ++k) place[first + k] = kInOut | (out_place(*r, CMat{terms.c().row(first + k), 1, H, H}));
    after = std::max(after, r->stage);
    term_regions.push_back(r);
    first += j.n;
  }
  // [first, count per token][triple ids' places], in triple order per token.
  std::vector<std::vector<uint32_t>> per(n);
  for (size_t j = 0; j < triples.size(); ++j) per[triples[j].token].push_back(place[j]);
  std::vector<uint32_t> lists(2 * n);
  for (size_t t = 0; t < n; ++t) {
    lists[2 * t] = (uint32_t)lists.size();
    lists[2 * t + 1] = (uint32_t)per[t].size();
    lists.insert(lists.end(), per[t].begin(), per[t].end());
  }
  RowSpans sp = row_spans();
  for (const Region* tr : term_regions) reads_region(sp, (int)(tr - deferred_.regions.data()));
  Operand s;
  const uint32_t at = stage_words(lists);
  if (at == UINT32_MAX || !operand(sums, s)) throw Error("routed experts: no room for the sums in the batch");
  const int yr = output_region(sums);
  if (yr < 0) throw Error("routed experts: no room for the sums in the batch");
  deferred_.keep.push_back(terms);
  Region& r = deferred_.regions[(size_t)yr];
  const uint32_t stage = std::max(after, s.stage) + 1;
  reads(sp, s);
  writes(sp, r);
  deferred_.ds.push_back(row_op(routed_sum_,
                                {(uint32_t)n, (uint32_t)sums.width, s.at, s.stride, at, out_place(r, sums), (uint32_t)r.stride},
                                grid_x(sums.width), (uint32_t)n, stage, sp));
  r.stage = stage;
  mark_read(s, stage);
  return true;
}

bool VulkanBackend::view_in_place(const ExpertSource& src, const ExpertWeights& w, const Weight* const parts[3],
                                  const VkPipeline pipes[3], const uint32_t kinds[3], DeviceWeight out[3]) const {
  auto held = held_.find(src.id);
  if (held == held_.end()) held = held_.emplace(src.id, src.held_memory()).first;
  const uint8_t* p[3] = {w.gate, w.up, w.down};
  // A chunk and the pages around it within one binding (the import widens it to whole pages).
  const uint64_t max_chunk = max_range_ > 2 * import_align_ ? max_range_ - 2 * import_align_ : 0;
  const VkDeviceSize align = offset_align();
  for (int i = 0; i < 3; ++i) {
    const uint64_t bytes = parts[i]->rows * parts[i]->row_bytes;
    const HeldChunk c = held_chunk(held->second, p[i], bytes, max_chunk);
    if (!c.lo || reinterpret_cast<uintptr_t>(p[i]) % 4 != 0) return false;
    auto it = expert_chunks_.find({src.id, c.lo});
    if (it == expert_chunks_.end()) {
      GpuWeight g;
      ExpertChunk ch;
      if (import_pages(c.lo, (uint64_t)(c.hi - c.lo), g)) {
        ch.b = g.b;
        ch.at = g.w_off;
        ++st_.expert_chunks_mapped;
        st_.expert_bytes_mapped += g.b.size;
      }
      it = expert_chunks_.emplace(std::make_pair(src.id, c.lo), ch).first;
    }
    const ExpertChunk& ch = it->second;
    if (!ch.b.buf) return false;
    const VkDeviceSize rel = ch.at + (VkDeviceSize)(p[i] - c.lo), off = rel / align * align;
    out[i] = DeviceWeight{pipes[i], ch.b.buf, off, std::min<VkDeviceSize>(ch.b.size - off, (rel - off + bytes + 3) / 4 * 4),
                          kinds[i], (uint32_t)(rel - off)};
  }
  return true;
}

void VulkanBackend::release_expert_chunks() const {
  for (auto& [key, ch] : expert_chunks_) free_buffer(ch.b);
  expert_chunks_.clear();
  held_.clear();
}

void VulkanBackend::make_slots(const uint64_t part[3]) const {
  const VkDeviceSize align = offset_align();
  VkDeviceSize off = 0;
  for (int i = 0; i < 3; ++i) {
    part_off_[i] = off;
    part_cap_[i] = (part[i] + align - 1) / align * align;
    off += part_cap_[i];
  }
  const uint64_t held = st_.bytes_on_device + st_.bytes_imported;
  const uint64_t left = budget_ > held ? budget_ - held : 0;
  const uint64_t n = std::min<uint64_t>(slots_wanted_, left / off);
  if (n == 0) {
    st_.expert_slots_refused = true;
    return;
  }
  const uint64_t per_slab = std::max<uint64_t>(1, kSlabBytes / off);
  for (uint64_t made = 0; made < n; made += per_slab) {
    const uint64_t k = std::min(per_slab, n - made);
    slabs_.push_back(make_weight_buffer(k * off));
    for (uint64_t j = 0; j < k; ++j) {
      ExpertSlot sl;
      sl.slab = (uint32_t)(slabs_.size() - 1);
      sl.offset = j * off;
      slots_.push_back(sl);
      link_newest((uint32_t)(slots_.size() - 1));  // empty slots go first, in their order
    }
    st_.bytes_on_device += k * off;
  }
  slot_stride_ = off;
  st_.expert_slots = n;
  st_.expert_slot_bytes = off;
}

ExpertSlot* VulkanBackend::find_slot(uint64_t source, uint32_t layer, uint32_t expert) const {
  const auto it = slot_index_.find(SlotKey{source, layer, expert});
  return it == slot_index_.end() ? nullptr : &slots_[it->second];
}

void VulkanBackend::name_slot(size_t i, uint64_t source, uint32_t layer, uint32_t expert) const {
  ExpertSlot& sl = slots_[i];
  sl.source = source;
  sl.layer = layer;
  sl.expert = expert;
  slot_index_[SlotKey{source, layer, expert}] = i;
}

void VulkanBackend::unname_slot(ExpertSlot& sl) const {
  if (sl.source) slot_index_.erase(SlotKey{sl.source, sl.layer, sl.expert});
  sl.source = 0;
}

void VulkanBackend::link_newest(uint32_t i) const {
  slots_[i].older = lru_newest_;
  slots_[i].newer = UINT32_MAX;
  (lru_newest_ == UINT32_MAX ? lru_oldest_ : slots_[lru_newest_].newer) = i;
  lru_newest_ = i;
}

void VulkanBackend::unlink(uint32_t i) const {
  ExpertSlot& sl = slots_[i];
  (sl.older == UINT32_MAX ? lru_oldest_ : slots_[sl.older].newer) = sl.newer;
  (sl.newer == UINT32_MAX ? lru_newest_ : slots_[sl.newer].older) = sl.older;
}

void VulkanBackend::slot_used(ExpertSlot& sl) const {
  sl.last_use = ++use_clock_;
  const uint32_t i = (uint32_t)(&sl - slots_.data());
  unlink(i);
  link_newest(i);
}

ExpertSlot* VulkanBackend::place(uint64_t source, uint32_t layer, uint32_t expert, const ExpertWeights& ew,
                                 ExpertTensors t, GpuLayerStats& ls) const {
  const size_t victim = lru_slot();
  ExpertSlot& sl = slots_[victim];
  unname_slot(sl);  // an upload that throws leaves the slot empty, never half-filled and named
  sl.hinted = false;
  touch_slot(sl);  // a hint's copy into it before this one's
  sl.ready = 0;
  const uint8_t* src[3] = {ew.gate, ew.up, ew.down};
  const Weight* w[3] = {t.gate, t.up, t.down};
  bool staged = false;
  for (int i = 0; i < 3; ++i) {
    const uint64_t bytes = w[i]->rows * w[i]->row_bytes;
    staged |= stage_or_upload(slabs_[sl.slab], sl.offset + part_off_[i], src[i], bytes);
    st_.expert_upload_bytes += bytes;
    ls.upload_bytes += bytes;
  }
  name_slot(victim, source, layer, expert);
  if (staged) pending_slots_.push_back(victim);
  return &sl;
}

bool VulkanBackend::stage_or_upload(Buffer& b, VkDeviceSize at, const uint8_t* src, uint64_t bytes) const {
  if (b.map || split_.active() || bytes > staging_bytes_) {
    upload(b, at, src, bytes);
    return false;
  }
  stage_copy(b.buf, at, bytes, [&](uint8_t* dst) { std::memcpy(dst, src, bytes); });
  ++st_.staged_uploads;
  return true;
}

void VulkanBackend::stage_copy(VkBuffer dst, VkDeviceSize at, VkDeviceSize bytes, const std::function<void(uint8_t*)>& fill) const {
  const VkDeviceSize room = (bytes + 3) / 4 * 4;
  if (staged_used_ + room > staging_bytes_) flush_uploads();
  if (staged_used_ == 0) ensure(stage_, staging_bytes_);  // never regrown while copies are pending
  fill(static_cast<uint8_t*>(stage_.map) + staged_used_);
  pending_.push_back({dst, VkBufferCopy{staged_used_, at, bytes}});
  staged_used_ += room;
}

void VulkanBackend::record_pending_uploads() const {
  if (pending_.empty()) return;
  record_copies(cmd_, stage_.buf, pending_);
  barrier(VK_ACCESS_TRANSFER_WRITE_BIT, VK_ACCESS_SHADER_READ_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
          VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT);
}

void VulkanBackend::settle_uploads(bool ok) const {
  if (!ok) {
    for (const size_t i : pending_slots_) unname_slot(slots_[i]);
    for (const uint32_t i : kv_pending_) kv_rows_.forget(i);
  }
  kv_pending_.clear();
  pending_.clear();
  pending_slots_.clear();
  staged_used_ = 0;
}

bool VulkanBackend::settle_hint() const {
  if (!hint_in_flight_) return true;
  VkResult r = vkGetFenceStatus(dev_, hint_fence_);
  if (r == VK_NOT_READY) return false;
  if (r == VK_SUCCESS) r = vkResetFences(dev_, 1, &hint_fence_);
  hint_in_flight_ = false;
  if (r != VK_SUCCESS) {
    unname_hinted();
    throw lost("copying hinted experts", r);
  }
  hint_slots_.clear();
  return true;
}

void VulkanBackend::unname_hinted() const {
  for (const size_t i : hint_slots_) {
    ExpertSlot& sl = slots_[i];
    if (sl.hinted) {
      unname_slot(sl);
      sl.ready = 0;  // a value that may never be signalled: nothing waits for it
    }
    sl.hinted = false;
  }
  hint_slots_.clear();
}

DeviceWeight VulkanBackend::slot_part(const ExpertSlot& sl, int i, VkPipeline pipe, uint32_t kind) const {
  touch_slot(sl);
  return DeviceWeight{pipe, slabs_[sl.slab].buf, sl.offset + part_off_[i], part_cap_[i], kind, 0};
}

}  // namespace sluice::vk_backend
#endif
