// The Vulkan backend's deferred batch and its submissions: the batch's regions, operands and row
// spans, recording, submitting and waiting (dispatch, barriers, fences).
// Built only with the Vulkan backend (CMakeLists.txt sets SLUICE_HAVE_VULKAN on vulkan_*.cpp).
#if SLUICE_HAVE_VULKAN
#include "backend/vulkan_backend_impl.h"

namespace sluice::vk_backend {

void VulkanBackend::settle() const {
  const std::lock_guard<std::mutex> lk(mu_);
  flush_deferred();
}

void VulkanBackend::settle_for(CMat x, CMat out) const {
  const std::lock_guard<std::mutex> lk(mu_);
  if (deferred_.reads_experts || deferred_writes(x) || deferred_writes(out)) flush_deferred();
}

double VulkanBackend::submit_batch(const Deferred& sub, const std::function<void()>& meanwhile) const {
  if (scratch_local_) {  // what the host reads below, and nothing else, crosses to it
    for (const HostStore& h : sub.stores)
      if (h.n) read_back(h.place * sizeof(float), ((h.n - 1) * h.src_stride + h.width) * sizeof(float));
    for (const CopyOut& c : sub.outs)
      if (c.n) read_back(c.off, ((c.n - 1) * c.src_step + c.rows) * sizeof(float));
  }
  double s = 0;
  // The kept rows this batch reads may be given to others once it is on its way (submitted and
  // waited for, or failed).
  struct NextBatch {
    DeviceRows& r;
    ~NextBatch() { r.next_batch(); }
  } next{kv_rows_};
  if (!sub.ds.empty()) s = dispatch(sub.ds, meanwhile);
  else if (!readback_.empty()) submit([] {}, "reading back rows");
  const uint8_t* out = rows_out();
  for (const HostStore& h : sub.stores) {
    const float* src = reinterpret_cast<const float*>(out) + h.place;
    if (h.fp4) {  // the CPU's packing (CpuBackend::store_fp4), so its bits
      const size_t rb = fp4_row_bytes(h.grid, h.width);
      for (size_t t = 0; t < h.n; ++t) fp4_pack_row(h.grid, src + t * h.src_stride, h.width, h.fp4 + t * rb);
      continue;
    }
    for (size_t t = 0; t < h.n; ++t)
      for (size_t k = 0; k < h.width; ++k) h.dst[t * h.dst_stride + k] = f32_to_bf16(src[t * h.src_stride + k]);
  }
  const std::unique_lock<std::mutex> lk = live_->lock();  // no deferred target is freed meanwhile
  for (const CopyOut& c : sub.outs) {
    if (c.tensor && !live_->alive(c.tensor)) continue;
    if (c.step == c.rows && c.src_step == c.rows) {
      std::memcpy(c.y, out + c.off, c.n * c.rows * sizeof(float));
      continue;
    }
    for (size_t t = 0; t < c.n; ++t)
      std::memcpy(c.y + t * c.step, out + c.off + t * c.src_step * sizeof(float), c.rows * sizeof(float));
  }
  return s;
}

void VulkanBackend::flush_deferred() const {
  if (deferred_.ds.empty() && deferred_.stores.empty() && deferred_.outs.empty()) return;
  const Deferred sub = std::exchange(deferred_, Deferred{});
  (void)submit_batch(sub, {});
}

bool VulkanBackend::rewritten_whole(CMat y) const {
  const LiveTensors::Held held = live_->holder(y.p, (y.n - 1) * y.stride + y.width);
  return held.id && (size_t)(y.p - held.start) % y.stride + y.width <= y.stride && rewrites_whole(y, held);
}

bool VulkanBackend::deferred_writes(CMat m) const {
  if (m.n == 0 || m.width == 0) return false;
  return std::any_of(deferred_.outs.begin(), deferred_.outs.end(), [&](const CopyOut& c) { return c.overlaps(m); });
}

bool VulkanBackend::operand(CMat m, Operand& o) const {
  if (const Region* r = deferred_.source_of(m)) {
    o = Operand{kInOut | out_place(*r, m), (uint32_t)r->stride, r->stage, (int)(r - deferred_.regions.data())};
    return true;
  }
  if (deferred_writes(m)) return false;
  const uint32_t at = stage_rows(m);
  if (at == UINT32_MAX) return false;
  o = Operand{at, (uint32_t)m.width, 0, -1};
  return true;
}

uint32_t VulkanBackend::stage_words(std::span<const uint32_t> w) const {
  ensure_io();
  const VkDeviceSize b = aligned((VkDeviceSize)w.size_bytes());
  if (deferred_.act_used + b > io_limit_) return UINT32_MAX;
  std::memcpy(static_cast<uint8_t*>(act_.map) + deferred_.act_used, w.data(), w.size_bytes());
  const uint32_t at = (uint32_t)(deferred_.act_used / sizeof(float));
  deferred_.act_used += b;
  return at;
}

uint32_t VulkanBackend::stage_rows(CMat m) const {
  ensure_io();
  const VkDeviceSize b = aligned((VkDeviceSize)m.n * m.width * sizeof(float));
  if (deferred_.act_used + b > io_limit_) return UINT32_MAX;
  uint8_t* const a = static_cast<uint8_t*>(act_.map) + deferred_.act_used;
  for (size_t t = 0; t < m.n; ++t) std::memcpy(a + t * m.width * sizeof(float), m.row(t), m.width * sizeof(float));
  const uint32_t at = (uint32_t)(deferred_.act_used / sizeof(float));
  deferred_.act_used += b;
  return at;
}

int VulkanBackend::output_region(Mat y) const {
  const LiveTensors::Held held = live_->holder(y.p, (y.n - 1) * y.stride + y.width);
  if (!held.id) return -1;
  ensure_io();
  const size_t c0 = (size_t)(y.p - held.start) % y.stride;
  const VkDeviceSize o = aligned((VkDeviceSize)y.n * y.stride * sizeof(float));
  if (c0 + y.width > y.stride || !rewrites_whole(y, held) || deferred_.out_used + o > io_limit_) return -1;
  deferred_.regions.push_back(Region{held.id, y.p - c0, y.n, y.stride, deferred_.out_used, 0, 0, {{c0, y.width}}});
  deferred_.outs.push_back({deferred_.out_used + c0 * sizeof(float), y.p, y.n, y.width, y.stride, y.stride, held.id});
  deferred_.out_used += o;
  return (int)deferred_.regions.size() - 1;
}

VulkanBackend::Region* VulkanBackend::in_place_region(CMat x) const {
  Region* r = const_cast<Region*>(deferred_.source_of(x));
  return r && !stored_from((int)(r - deferred_.regions.data())) ? r : nullptr;
}

bool VulkanBackend::rewrites_whole(CMat y, const LiveTensors::Held& held) const {
  const size_t c0 = (size_t)(y.p - held.start) % y.stride;
  const float* const y0 = y.p - c0;  // y's first row's start
  return std::all_of(deferred_.outs.begin(), deferred_.outs.end(), [&](const CopyOut& c) {
    if (!c.overlaps(y)) return true;
    const ptrdiff_t d = c.y - y0;
    return c.tensor == held.id && c.step == y.stride && c.n == y.n && d >= (ptrdiff_t)c0 &&
           (size_t)d + c.rows <= c0 + y.width;
  });
}

void VulkanBackend::mark_read(const Operand& o, uint32_t stage) const {
  if (o.region < 0) return;
  Region& r = deferred_.regions[(size_t)o.region];
  r.read = std::max(r.read, stage);
}

void VulkanBackend::reads_floats(RowSpans& s, uint64_t lo, uint64_t hi) {
  s.in_lo = std::min(s.in_lo, lo);
  s.in_hi = std::max(s.in_hi, hi);
}

void VulkanBackend::reads_region(RowSpans& s, int region) const {
  if (region < 0) return;
  const auto [lo, hi] = floats_of(deferred_.regions[(size_t)region]);
  reads_floats(s, lo, hi);
}

bool VulkanBackend::reads_place(RowSpans& s, uint32_t place) const {
  const uint64_t f = place & ~kInOut;
  for (const Region& r : deferred_.regions) {
    const auto [lo, hi] = floats_of(r);
    if (f >= lo && f < hi) {
      reads_floats(s, lo, hi);
      return true;
    }
  }
  return false;
}

void VulkanBackend::writes(RowSpans& s, const Region& r) {
  s.out_off = r.off;
  s.out_bytes = (VkDeviceSize)r.n * r.stride * sizeof(float);
}

VulkanBackend::Dispatch VulkanBackend::row_op(VkPipeline pipe,
                                              const std::array<uint32_t, sizeof(Push) / sizeof(uint32_t)>& push,
                                              uint32_t gx, uint32_t gy, uint32_t stage, const RowSpans& sp) const {
  Dispatch d{DeviceWeight{pipe, exp_consts_.buf, 0, exp_consts_.size, 0, 0}, 0, 0, 0, std::bit_cast<Push>(push), gx, gy};
  d.stage = stage;
  d.row = true;
  d.act_off = sp.staged;
  d.act_bytes = deferred_.act_used - sp.staged;
  d.out_off = sp.out_off;
  d.out_bytes = (sp.out_bytes + 3) / 4 * 4;
  if (sp.in_hi > sp.in_lo) {
    d.in_off = sp.in_lo * sizeof(float) / offset_align() * offset_align();
    d.in_bytes = sp.in_hi * sizeof(float) - d.in_off;
  }
  d.push.base_staged = (uint32_t)(d.act_off / sizeof(float));
  d.push.base_in = (uint32_t)(d.in_off / sizeof(float));
  d.push.base_out = (uint32_t)(d.out_off / sizeof(float));
  ++st_.ops_on_device;
  return d;
}

bool VulkanBackend::defer_row_op(VkPipeline pipe, std::initializer_list<const Operand*> ops, Mat y,
                                 std::initializer_list<uint32_t> head, uint32_t gx, RowSpans sp) const {
  const int yr = output_region(y);
  if (yr < 0) return false;
  Region& r = deferred_.regions[(size_t)yr];
  uint32_t stage = 0;
  for (const Operand* o : ops) stage = std::max(stage, o->stage);
  ++stage;
  std::array<uint32_t, sizeof(Push) / sizeof(uint32_t)> push{};
  std::copy(head.begin(), head.end(), push.begin());
  push[head.size()] = out_place(r, y);
  push[head.size() + 1] = (uint32_t)r.stride;
  for (const Operand* o : ops) reads(sp, *o);
  writes(sp, r);
  deferred_.ds.push_back(row_op(pipe, push, gx, (uint32_t)y.n, stage, sp));
  r.stage = stage;
  for (const Operand* o : ops) mark_read(*o, stage);
  return true;
}

void VulkanBackend::barrier(VkAccessFlags src, VkAccessFlags dst, VkPipelineStageFlags src_stages, VkPipelineStageFlags dst_stages) const {
  VkMemoryBarrier mb{};
  mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
  mb.srcAccessMask = src;
  mb.dstAccessMask = dst;
  vkCmdPipelineBarrier(cmd_, src_stages, dst_stages, 0, 1, &mb, 0, nullptr, 0, nullptr);
}

void VulkanBackend::begin_recording(VkCommandBuffer cb) {
  check(vkResetCommandBuffer(cb, 0), "resetting the command buffer");
  VkCommandBufferBeginInfo begin{};
  begin.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vkBeginCommandBuffer(cb, &begin), "recording commands");
}

void VulkanBackend::record_copies(VkCommandBuffer cb, VkBuffer from, std::span<const PendingCopy> copies) {
  std::vector<VkBufferCopy> regions;
  for (size_t i = 0; i < copies.size();) {
    regions.clear();
    size_t j = i;
    for (; j < copies.size() && copies[j].dst == copies[i].dst; ++j) regions.push_back(copies[j].region);
    vkCmdCopyBuffer(cb, from, copies[i].dst, (uint32_t)regions.size(), regions.data());
    i = j;
  }
}

void VulkanBackend::record_read_back(std::vector<VkBufferCopy>& rb) const {
  if (rb.empty()) return;
  std::sort(rb.begin(), rb.end(), [](const VkBufferCopy& a, const VkBufferCopy& b) { return a.srcOffset < b.srcOffset; });
  size_t m = 0;
  for (size_t i = 1; i < rb.size(); ++i) {
    VkBufferCopy& last = rb[m];
    if (rb[i].srcOffset <= last.srcOffset + last.size)
      last.size = std::max(last.size, rb[i].srcOffset + rb[i].size - last.srcOffset);
    else
      rb[++m] = rb[i];
  }
  rb.resize(m + 1);
  barrier(VK_ACCESS_SHADER_WRITE_BIT, VK_ACCESS_TRANSFER_READ_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
          VK_PIPELINE_STAGE_TRANSFER_BIT);
  vkCmdCopyBuffer(cmd_, out_.buf, back_.buf, (uint32_t)rb.size(), rb.data());
  for (const VkBufferCopy& c : rb) st_.bytes_read_back += c.size;
}

double VulkanBackend::dispatch(std::span<const Dispatch> ds, const std::function<void()>& meanwhile) const {
  if (ds.empty() || ds.size() > kSets) {
    readback_.clear();
    throw Error("vulkan: a submission takes 1 to " + std::to_string(kSets) + " dispatches");
  }
  std::vector<VkDescriptorBufferInfo> bi(ds.size() * kBindings);
  std::vector<VkWriteDescriptorSet> wr(ds.size() * kBindings);
  for (size_t d = 0; d < ds.size(); ++d) {
    const Dispatch& x = ds[d];
    bi[d * kBindings + 0] = {x.wt.buf, x.wt.offset, x.wt.range};
    const Buffer& in = x.chained ? out_ : act_;
    const Buffer& out = x.quantize ? act_ : out_;
    try {
      // A binding the shader does not reach names the tables, which nothing writes.
      if (x.row && x.act_bytes == 0)
        bi[d * kBindings + 1] = {tables_.buf, 0, VK_WHOLE_SIZE};
      else
        bi[d * kBindings + 1] = {in.buf, x.act_off, binding_range(in, x.act_off, x.act_bytes)};
      bi[d * kBindings + 2] = {out.buf, x.out_off, binding_range(out, x.out_off, x.out_bytes)};
      if (x.in_bytes)
        bi[d * kBindings + 4] = {out_.buf, x.in_off, binding_range(out_, x.in_off, x.in_bytes)};
      else
        bi[d * kBindings + 4] = {tables_.buf, 0, VK_WHOLE_SIZE};
    } catch (...) {
      readback_.clear();
      throw;
    }
    bi[d * kBindings + 3] = {x.kept ? x.kept : tables_.buf, 0, VK_WHOLE_SIZE};
    for (uint32_t i = 0; i < kBindings; ++i) {
      VkWriteDescriptorSet& w = wr[d * kBindings + i];
      w.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET;
      w.dstSet = sets_[d];
      w.dstBinding = i;
      w.descriptorCount = 1;
      w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
      w.pBufferInfo = &bi[d * kBindings + i];
    }
  }
  vkUpdateDescriptorSets(dev_, (uint32_t)wr.size(), wr.data(), 0, nullptr);
  const char* what = meanwhile          ? "a batch of linear dispatches beside the CPU's experts"
                     : !pending_slots_.empty() ? "expert uploads and a batch of linear dispatches"
                     : !kv_pending_.empty()    ? "attention-row copies and a batch of linear dispatches"
                     : ds.size() == 1    ? "a linear dispatch"
                                         : "a batch of linear dispatches";
  begin_submit(
      [&] {
        // Stage by stage, a barrier between: a quantizer before the linears reading its codes,
        // a chained quantizer after the linears whose outputs it reads.
        uint32_t last = 0;
        for (const Dispatch& d : ds) last = std::max(last, d.stage);
        bool first = true;
        for (uint32_t stage = 0; stage <= last; ++stage) {
          bool any = false;
          for (size_t d = 0; d < ds.size(); ++d) {
            if (ds[d].stage != stage) continue;
            if (!any && !first)
              barrier(VK_ACCESS_SHADER_WRITE_BIT, VK_ACCESS_SHADER_READ_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                      VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT);
            any = true;
            vkCmdBindPipeline(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, ds[d].wt.pipe);
            vkCmdBindDescriptorSets(cmd_, VK_PIPELINE_BIND_POINT_COMPUTE, layout_, 0, 1, &sets_[d], 0, nullptr);
            vkCmdPushConstants(cmd_, layout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, sizeof(Push), &ds[d].push);
            vkCmdDispatch(cmd_, ds[d].gx, ds[d].gy, 1);
          }
          first = first && !any;
        }
      },
      what);
  if (meanwhile) {
    try {
      meanwhile();
    } catch (...) {
      (void)wait_fence();  // the submission reads buffers the caller may free once this throws
      settle_uploads(false);
      throw;
    }
  }
  return finish_submit(what, (bool)meanwhile);
}

VkDeviceSize VulkanBackend::binding_range(const Buffer& b, VkDeviceSize off, VkDeviceSize bytes) {
  if (bytes == 0) return VK_WHOLE_SIZE;
  if (off > b.size || bytes > b.size - off)
    throw Error("vulkan: a dispatch's binding of " + std::to_string(bytes) + " bytes at " + std::to_string(off) +
                " passes the end of its " + std::to_string(b.size) + "-byte buffer");
  return bytes;
}

Error VulkanBackend::lost(const char* what, VkResult r) const {
  return Error(std::string("vulkan: ") + what + " on " + info_.name + " did not finish: " + result_name(r) +
               " (the sequence is left as it was)");
}

VkResult VulkanBackend::wait_fence() const {
  const VkResult r = vkWaitForFences(dev_, 1, &fence_, VK_TRUE, kFenceTimeoutNs);
  return r == VK_SUCCESS ? vkResetFences(dev_, 1, &fence_) : r;
}

double VulkanBackend::finish_submit(const char* what, bool overlapped) const {
  VkResult r = wait_fence();
  if (r == VK_SUCCESS && fault_ && fault_(what)) r = VK_ERROR_DEVICE_LOST;
  settle_uploads(r == VK_SUCCESS);
  if (r != VK_SUCCESS) throw lost(what, r);
  double s = -1;
  uint64_t t[2] = {0, 0};
  if (timestamps_ && vkGetQueryPoolResults(dev_, timestamps_, 0, 2, sizeof t, t, sizeof(uint64_t),
                                           VK_QUERY_RESULT_64_BIT) == VK_SUCCESS) {
    const uint64_t mask = ts_bits_ >= 64 ? ~0ull : (1ull << ts_bits_) - 1;
    s = (double)(((t[1] & mask) - (t[0] & mask)) & mask) * ts_period_ns_ * 1e-9;
  } else if (!overlapped) {
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - submitted_at_).count();
  }
  return s;
}

}  // namespace sluice::vk_backend
#endif
