// The Vulkan backend's linear layers: linear() and linears(), the shared expert's chain, the
// dispatches' shape, the linears recorded on the device, and the activation quantizers.
// Built only with the Vulkan backend (CMakeLists.txt sets SLUICE_HAVE_VULKAN on vulkan_*.cpp).
#if SLUICE_HAVE_VULKAN
#include "backend/vulkan_backend_impl.h"

namespace sluice::vk_backend {

void VulkanBackend::linear(const Weight& W, CMat x, Mat y, bool round, uint64_t row0) const {
  const LinearCall c{&W, x, y, round, row0};
  linears(std::span<const LinearCall>(&c, 1));
}

void VulkanBackend::linears(std::span<const LinearCall> calls) const {
  struct Quantized {  // one input's activation rows in one format
    const float* p;
    size_t n, stride, width;
    ActType type;
    ActRows acts;
    std::vector<const uint8_t*> rows;
  };
  // Inputs are read now (staged or quantized on the host): a call reading what deferred
  // linears write, unless it chains after them, submits them first; so does one writing some of
  // what they write other than whole (rows written again whole go into a new region: readers
  // before read the old one, region_of), and one the CPU runs.
  // A float weight reads its f32 rows where a region of the deferred batch holds them (in_place).
  std::vector<char> in_place(calls.size(), 0);
  {
    const std::lock_guard<std::mutex> lk(mu_);
    if (std::any_of(calls.begin(), calls.end(), [&](const LinearCall& c) {
          return !linear_fits(*c.W, c.x, c.y) || (deferred_writes(c.y) && !rewritten_whole(c.y)) ||
                 (deferred_writes(c.x) && !((device_quantizes(*c.W) || reads_rows_in_place(*c.W, c.x)) &&
                                            deferred_.source_of(c.x)));
        }))
      flush_deferred();
    for (size_t i = 0; i < calls.size(); ++i)
      in_place[i] = linear_fits(*calls[i].W, calls[i].x, calls[i].y) && reads_rows_in_place(*calls[i].W, calls[i].x);
  }
  std::vector<Quantized> quantized;
  quantized.reserve(calls.size());  // items point into it: never reallocated
  std::vector<LinearItem> items;
  uint64_t on_host = 0;
  bool defer = true;  // every output in a live tensor: the batch may wait for the next submission
  for (size_t ci = 0; ci < calls.size(); ++ci) {
    const LinearCall& c = calls[ci];
    const Weight& W = *c.W;
    if (!linear_fits(W, c.x, c.y)) {
      ++on_host;
      CpuBackend::linear(W, c.x, c.y, c.round, c.row0);
      continue;
    }
    if (c.x.width != W.cols)
      throw Error("linear: " + std::to_string(c.x.width) + " inputs for a weight of " + std::to_string(W.cols) + " columns");
    if (c.row0 + c.y.width > W.rows)
      throw Error("linear: rows " + std::to_string(c.row0) + ".." + std::to_string(c.row0 + c.y.width) +
                  " of a weight of " + std::to_string(W.rows));
    const ActType type = W.act();
    const GpuWeight& gw = *static_cast<const GpuWeight*>(W.device);
    // A live tensor's rows from their start: y is the columns from c0 of n of them.
    const LiveTensors::Held held = live_->holder(c.y.p, (c.y.n - 1) * c.y.stride + c.y.width);
    const size_t c0 = held.id ? (size_t)(c.y.p - held.start) % c.y.stride : 0;
    const uint64_t tensor = held.id && c0 + c.y.width <= c.y.stride ? held.id : 0;
    const float* y_row = c.y.p - c0;
    defer = defer && tensor != 0;
    // Rows the device reads from f32: in place where the batch holds them (a float weight; the
    // stride is set where the item is placed), or quantized there.
    if (in_place[ci] || device_quantizes(W)) {
      LinearItem it{DeviceWeight{gw.pipe, gw.b.buf, 0, gw.b.size, gw.kind, gw.w_off}, &W, {},
                    in_place[ci] ? 0 : quantized_row_bytes(type, W.cols), c.y.p, c.y.width, c.y.stride, c.row0, c.round,
                    tensor, y_row};
      (in_place[ci] ? it.xf : it.x) = c.x.p;
      it.x_stride = c.x.stride;
      it.n_x = c.x.n;
      items.push_back(it);
      continue;
    }
    auto q = std::find_if(quantized.begin(), quantized.end(), [&](const Quantized& z) {
      return z.p == c.x.p && z.n == c.x.n && z.stride == c.x.stride && z.width == c.x.width && z.type == type;
    });
    if (q == quantized.end()) {
      Quantized& z = quantized.emplace_back(
          Quantized{c.x.p, c.x.n, c.x.stride, c.x.width, type, quantize_rows(type, c.x.p, c.x.stride, c.x.n, W.cols), {}});
      for (size_t t = 0; t < c.x.n; ++t) z.rows.push_back(z.acts.row(t));
      q = std::prev(quantized.end());
    }
    items.push_back({DeviceWeight{gw.pipe, gw.b.buf, 0, gw.b.size, gw.kind, gw.w_off}, &W, q->rows, q->acts.stride, c.y.p,
                     c.y.width, c.y.stride, c.row0, c.round, tensor, y_row});
  }
  const std::lock_guard<std::mutex> lk(mu_);
  st_.linear_on_host += on_host;
  if (!items.empty()) device_linears(items, {}, defer);
  st_.linear_on_device += items.size();
}

void VulkanBackend::shared_ffn(const Weight& gate, const Weight& up, const Weight& down, float limit, CMat x,
                               Mat out) const {
  const size_t n = x.n, F = gate.rows;
  const Tensor gu = tensor(n, 2 * F);
  const Mat g = gu.m().cols(0, F), u = gu.m().cols(F, F);
  const LinearCall gate_up[2] = {{&gate, x, g, true, 0}, {&up, x, u, true, 0}};
  linears(gate_up);
  {
    const std::lock_guard<std::mutex> lk(mu_);
    // The batch reads and writes gu's rows on the device: it keeps the tensor (its address is
    // not reused while a deferred region names it).
    if (defer_swiglu(g, u, limit)) {
      deferred_.keep.push_back(gu);
    } else {
      flush_deferred();
      swiglu_rows(g.p, g.stride, u.p, u.stride, n, F, limit, nullptr);
    }
  }
  linear(down, g, out, true, 0);
}

std::vector<uint8_t> VulkanBackend::quantize_alone(ActType a, const float* x, size_t n, size_t cols) const {
  const std::lock_guard<std::mutex> lk(mu_);
  flush_deferred();
  if (!quantizes(a, cols))
    throw Error("gpu_quantize: the device has no quantizer for this format or row length");
  const size_t stride = quantized_row_bytes(a, cols), row = activation_bytes(a, (int64_t)cols);
  const VkDeviceSize f = aligned((VkDeviceSize)n * cols * sizeof(float));
  ensure(act_, io_limit_);
  if (f + n * stride > act_.size) throw Error("gpu_quantize: the rows do not fit the staging buffer");
  std::memcpy(act_.map, x, n * cols * sizeof(float));
  const uint32_t units = quantize_units(a, cols);
  Dispatch q{DeviceWeight{quantizer(a), tables_.buf, 0, tables_.size, 0, 0}, 0, f, (VkDeviceSize)(n * stride),
             Push{units, (uint32_t)cols, (uint32_t)n, 0, (uint32_t)cols, (uint32_t)stride, 0, 0, 0}, grid_x(units),
             (uint32_t)n};
  q.quantize = true;
  q.act_bytes = rows_span(n, cols * sizeof(float), cols * sizeof(float));
  (void)dispatch(std::span<const Dispatch>(&q, 1));
  std::vector<uint8_t> out(n * row);
  for (size_t t = 0; t < n; ++t) std::memcpy(out.data() + t * row, static_cast<const uint8_t*>(act_.map) + f + t * stride, row);
  return out;
}

double VulkanBackend::device_linear(const DeviceWeight& wt, const Weight& W, uint64_t row0,
                                    std::span<const uint8_t* const> acts, size_t stride, float* y, size_t ldy,
                                    size_t rows, bool round) const {
  const uint64_t limit = io_limit_;
  const uint64_t out_row = (uint64_t)rows * sizeof(float);
  const uint64_t per_group = std::max<uint64_t>(1, std::min(limit / out_row, limit / stride));
  double s = 0;
  for (size_t t0 = 0; t0 < acts.size(); t0 += per_group) {
    const size_t n = (size_t)std::min<uint64_t>(per_group, acts.size() - t0);
    ensure(act_, (VkDeviceSize)n * stride);
    ensure_out();
    for (size_t t = 0; t < n; ++t) std::memcpy(static_cast<uint8_t*>(act_.map) + t * stride, acts[t0 + t], stride);
    Dispatch d{wt, 0, 0, (VkDeviceSize)n * out_row, push_for(wt, W, row0, n, stride, rows, round)};
    d.act_bytes = rows_span(n, stride, stride);
    shape_linear(d, rows, n);
    read_back(0, (VkDeviceSize)n * out_row);
    s = add_seconds(s, dispatch(std::span<const Dispatch>(&d, 1)));
    const float* out = reinterpret_cast<const float*>(rows_out());
    for (size_t t = 0; t < n; ++t) std::memcpy(y + (t0 + t) * ldy, out + t * rows, out_row);
  }
  return s;
}

Push VulkanBackend::push_for(const DeviceWeight& wt, const Weight& W, uint64_t row0, size_t n, size_t stride,
                             size_t rows, bool round) {
  return Push{(uint32_t)rows, (uint32_t)W.cols, (uint32_t)n, (uint32_t)row0, (uint32_t)W.row_bytes,
              (uint32_t)stride, wt.kind, round ? 1u : 0u, wt.w_off, 0, (uint32_t)rows};
}

bool VulkanBackend::reads_rows_in_place(const Weight& W, CMat x) const {
  const Region* r = W.device && float_ ? deferred_.source_of(x) : nullptr;
  return r && static_cast<const GpuWeight*>(W.device)->pipe == float_ &&
         (r->off + (VkDeviceSize)(x.p - r->row) * sizeof(float)) % offset_align() == 0;
}

void VulkanBackend::shape_linear(Dispatch& d, size_t rows, size_t n) const {
  d.gx = grid_x(rows);
  d.gy = (uint32_t)n;
  if (d.wt.pipe == float_) {  // an invocation per output; from a GEMM tile of tokens on, its GEMM build
    if (n < kGemmTile || !float_mm_) return;
    d.wt.pipe = float_mm_;
    d.gx = (uint32_t)std::min<uint64_t>((rows + kFloatTileRows - 1) / kFloatTileRows, max_groups_x_);
    d.gy = (uint32_t)((n + kFloatTileTokens - 1) / kFloatTileTokens);
    ++st_.gemm_dispatches;
    return;
  }
  const size_t i = (size_t)(std::find(quant_, quant_ + kQuantShaderCount, d.wt.pipe) - quant_);
  if (i == kQuantShaderCount) return;
  if (n >= kGemmTile && quant_mm_[i]) {
    d.wt.pipe = quant_mm_[i];
    d.gx = (uint32_t)std::min<uint64_t>((rows + kGemmRows - 1) / kGemmRows, max_groups_x_);
    d.gy = (uint32_t)((n + kGemmTile - 1) / kGemmTile);
    ++st_.gemm_dispatches;
    return;
  }
  if (!subgroup_) return;
  const uint64_t per = kGroup / info_.subgroup_size;
  d.gx = (uint32_t)std::min<uint64_t>((rows + per - 1) / per, max_groups_x_);
  if (n < kTokenTile) return;
  d.wt.pipe = quant_tiled_[i];
  d.gy = (uint32_t)((n + kTokenTile - 1) / kTokenTile);
}

bool VulkanBackend::linear_fits(const Weight& W, CMat x, Mat y) const {
  return W.device && static_cast<const GpuWeight*>(W.device)->b.buf && x.n != 0 && y.width != 0 &&
         (uint64_t)y.width * sizeof(float) <= io_limit_ && activation_bytes(W.act(), (int64_t)W.cols) <= io_limit_;
}

double VulkanBackend::device_linears(std::span<const LinearItem> items, std::function<void()> meanwhile,
                                     bool defer) const {
  const uint64_t limit = io_limit_;
  ensure_io();
  double s = 0;
  for (size_t i = 0; i < items.size();) {
    Deferred sub = std::exchange(deferred_, Deferred{});
    const size_t carried = sub.ds.size();
    uint8_t* const abuf = static_cast<uint8_t*>(act_.map);
    VkDeviceSize last_act = 0;  // where the item before (in this submission) reads its codes
    uint32_t last_stage = 1;    // and the stage of its linear
    size_t k = i;
    for (; k < items.size(); ++k) {
      const LinearItem& it = items[k];
      const size_t n = it.tokens();
      const LinearItem* prev = k > i ? &items[k - 1] : nullptr;
      const bool reuse = prev && !it.xf && !prev->xf && n == prev->tokens() && it.stride == prev->stride &&
                         (it.x ? it.x == prev->x && it.x_stride == prev->x_stride && it.W->act() == prev->W->act()
                               : !prev->x && it.acts.data() == prev->acts.data());
      const bool quantize = it.x && !reuse;
      const Region* from = quantize ? sub.source_of(CMat{it.x, n, it.W->cols, it.x_stride}) : nullptr;
      const size_t cols = it.W->cols;
      // A SwiGLU before the quantizer: on the device when g and u are this submission's, else
      // on the host, once their writers have run (submitted first when they are in this one).
      const bool glu = quantize && it.glu_g;
      bool glu_host = false;
      if (glu && (!from || sub.source_of(CMat{it.glu_u, n, cols, it.x_stride}) != from || swiglu_ == VK_NULL_HANDLE)) {
        if (k > i && sub_writes(sub, CMat{it.x, n, cols, it.x_stride}, CMat{it.glu_u, n, cols, it.x_stride})) break;
        from = nullptr;
        glu_host = true;  // once the item has room below (a retry must not apply it twice)
      }
      const bool glu_device = glu && from;
      const VkDeviceSize wb = glu_device ? aligned((VkDeviceSize)n * sizeof(float)) : 0;
      const VkDeviceSize f = quantize && !from ? aligned((VkDeviceSize)n * cols * sizeof(float)) : 0;
      // A float weight's rows: in a region of this submission, else staged (cols floats a token).
      const Region* rows_at = it.xf ? sub.source_of(CMat{it.xf, n, cols, it.x_stride}) : nullptr;
      const size_t stride = !it.xf ? it.stride : rows_at ? rows_at->stride * sizeof(float) : cols * sizeof(float);
      const VkDeviceSize a = reuse || rows_at ? 0 : aligned((VkDeviceSize)n * stride);
      // The output: a region of the deferred batch laid out as the tensor's rows (a new one, or
      // the one another item writes other columns of), else n rows of its own.
      Region* into = it.tensor ? sub.region_of(it) : nullptr;
      const VkDeviceSize o = into ? 0
                             : aligned((VkDeviceSize)n * (it.tensor ? it.y_step() : it.rows) * sizeof(float));
      if (sub.ds.size() + (quantize ? 2 : 1) + (glu_device ? 1 : 0) > kSets || sub.act_used + wb + f + a > limit ||
          sub.out_used + o > limit)
        break;
      uint32_t stage = reuse ? last_stage : 1;
      if (glu_host) host_glu(it);
      if (glu_device) {  // the routing weights beside the rows' codes, the SwiGLU a stage after g and u
        std::memcpy(abuf + sub.act_used, it.glu_w, n * sizeof(float));
        Region* r = const_cast<Region*>(from);
        Dispatch sw = swiglu_dispatch(*r, CMat{it.x, n, cols, it.x_stride}, CMat{it.glu_u, n, cols, it.x_stride},
                                      it.glu_limit);
        sw.act_off = sub.act_used;
        sw.push.kind = 1;  // the shader's row_weights
        r->stage = sw.stage;
        sub.ds.push_back(sw);
        sub.act_used += wb;
        ++st_.ops_on_device;
      }
      if (quantize) {  // the f32 rows (staged now, or a region of this submission), then their codes after them
        if (!from)
          for (size_t t = 0; t < n; ++t)
            std::memcpy(abuf + sub.act_used + t * cols * sizeof(float), it.x + t * it.x_stride, cols * sizeof(float));
        const uint32_t units = quantize_units(it.W->act(), cols);
        Dispatch q{DeviceWeight{quantizer(it.W->act()), tables_.buf, 0, tables_.size, 0, 0},
                   from ? from->off : sub.act_used, sub.act_used + f, (VkDeviceSize)n * it.stride,
                   Push{units, (uint32_t)cols, (uint32_t)n, from ? (uint32_t)(it.x - from->row) : 0u,
                        (uint32_t)(from ? from->stride : cols), (uint32_t)it.stride, 0, 0, 0},
                   grid_x(units), (uint32_t)n};
        q.quantize = true;
        q.chained = from != nullptr;
        q.act_bytes = from ? rows_span(n, from->stride * sizeof(float), (size_t)(it.x - from->row + cols) * sizeof(float))
                           : rows_span(n, cols * sizeof(float), cols * sizeof(float));
        q.stage = from ? from->stage + 1 : 0;
        if (from) const_cast<Region*>(from)->read = std::max(from->read, q.stage);
        stage = q.stage + 1;
        sub.ds.push_back(q);
        ++st_.inputs_quantized_on_device;
        if (from) ++st_.inputs_chained;
        last_act = sub.act_used + f;
      } else if (rows_at) {
        last_act = rows_at->off + (VkDeviceSize)(it.xf - rows_at->row) * sizeof(float);
        stage = rows_at->stage + 1;
        const_cast<Region*>(rows_at)->read = std::max(rows_at->read, stage);
      } else if (it.xf) {
        for (size_t t = 0; t < n; ++t)
          std::memcpy(abuf + sub.act_used + t * stride, it.xf + t * it.x_stride, cols * sizeof(float));
        last_act = sub.act_used;
      } else if (!reuse) {
        for (size_t t = 0; t < n; ++t) std::memcpy(abuf + sub.act_used + t * it.stride, it.acts[t], it.stride);
        last_act = sub.act_used;
      }
      sub.act_used += f + a;
      Dispatch d{it.wt, last_act, 0, 0, push_for(it.wt, *it.W, it.row0, n, stride, it.rows, it.round)};
      d.chained = rows_at != nullptr;
      d.act_bytes = rows_span(n, stride, it.xf ? cols * sizeof(float) : stride);
      shape_linear(d, it.rows, n);
      d.stage = last_stage = stage;
      if (it.tensor) {
        if (!into) {
          sub.regions.push_back(Region{it.tensor, it.y_row, n, it.y_step(), sub.out_used, 0, 0, {}});
          into = &sub.regions.back();
          sub.out_used += o;
        }
        const size_t c0 = (size_t)(it.y - it.y_row);
        d.out_off = into->off;
        d.out_bytes = (VkDeviceSize)n * into->stride * sizeof(float);
        d.push.y_off = (uint32_t)c0;
        d.push.y_stride = (uint32_t)into->stride;
        into->stage = std::max(into->stage, stage);
        into->cols.emplace_back(c0, it.rows);
        sub.outs.push_back({into->off + c0 * sizeof(float), it.y, n, it.rows, it.y_step(), into->stride, it.tensor});
      } else {
        d.out_off = sub.out_used;
        d.out_bytes = (VkDeviceSize)n * it.rows * sizeof(float);
        sub.outs.push_back({sub.out_used, it.y, n, it.rows, it.y_step(), it.rows, 0});
        sub.out_used += o;
      }
      sub.ds.push_back(d);
    }
    if (k == i) {
      if (carried) {  // the deferred batch leaves no room: it goes first, alone
        s = add_seconds(s, submit_batch(sub, {}));
        continue;
      }
      if (meanwhile) std::exchange(meanwhile, nullptr)();  // alone, in token groups
      const LinearItem& it = items[i];
      if (it.glu_g) host_glu(it);  // what it reads ran in the submissions before
      if (const float* xs = it.x ? it.x : it.xf) {  // too large to share a submission: the host quantizes, as for any such call
        const ActRows r = quantize_rows(it.W->act(), xs, it.x_stride, it.n_x, it.W->cols);
        std::vector<const uint8_t*> rows(it.n_x);
        for (size_t t = 0; t < it.n_x; ++t) rows[t] = r.row(t);
        s = add_seconds(s, device_linear(it.wt, *it.W, it.row0, rows, r.stride, it.y, it.y_step(), it.rows, it.round));
      } else {
        s = add_seconds(s, device_linear(it.wt, *it.W, it.row0, it.acts, it.stride, it.y, it.y_step(), it.rows, it.round));
      }
      ++i;
      continue;
    }
    i = k;
    if (defer && i == items.size() && !meanwhile) {
      deferred_ = std::move(sub);
      break;
    }
    s = add_seconds(s, submit_batch(sub, std::exchange(meanwhile, nullptr)));
  }
  if (meanwhile) meanwhile();
  return s;
}

}  // namespace sluice::vk_backend
#endif
