// The Vulkan backend's row ops: the ops recorded in the deferred batch (RMSNorm, SwiGLU, the
// hyper-connection ops, add_round, fake-quant, RoPE, the Engram gate, the compressor's pooling, the
// indexer's scores), the CPU's where they cannot be, and the *_alone entry points.
// Built only with the Vulkan backend (CMakeLists.txt sets SLUICE_HAVE_VULKAN on vulkan_*.cpp).
#if SLUICE_HAVE_VULKAN
#include "backend/vulkan_backend_impl.h"

namespace sluice::vk_backend {

void VulkanBackend::embed(const Weight& table, std::span<const TokenId> tokens, uint32_t copies, Mat X) const {
  settle();
  CpuBackend::embed(table, tokens, copies, X);
}

void VulkanBackend::rms_norm(Mat x, const float* w, float eps) const {
  {
    const std::lock_guard<std::mutex> lk(mu_);
    if (defer_rms_norm(x, w, eps)) return;
    flush_deferred();
  }
  CpuBackend::rms_norm(x, w, eps);
}

void VulkanBackend::rope(Mat x, uint32_t head_dim, RopeTable t, std::span<const uint64_t> pos, bool inverse) const {
  {
    const std::lock_guard<std::mutex> lk(mu_);
    if (defer_rope(x, head_dim, t, pos, inverse)) return;
    flush_deferred();
  }
  CpuBackend::rope(x, head_dim, t, pos, inverse);
}

void VulkanBackend::fake_quant(Mat x, FakeQuant kind) const {
  {
    const std::lock_guard<std::mutex> lk(mu_);
    if (defer_fake_quant(x, kind)) return;
    flush_deferred();
  }
  CpuBackend::fake_quant(x, kind);
}

void VulkanBackend::add_round(CMat a, CMat b, Mat out) const {
  {
    const std::lock_guard<std::mutex> lk(mu_);
    if (defer_add_round(a, b, out)) return;
    if (deferred_writes(a) || deferred_writes(b) || deferred_writes(out)) flush_deferred();
  }
  CpuBackend::add_round(a, b, out);
}

void VulkanBackend::fill_rows(Mat x, std::span<const float> row) const {
  settle();
  CpuBackend::fill_rows(x, row);
}

void VulkanBackend::gather_rows(CMat src, std::span<const uint32_t> rows, Mat dst) const {
  settle();
  CpuBackend::gather_rows(src, rows, dst);
}

void VulkanBackend::scatter_rows(CMat src, std::span<const uint32_t> rows, Mat dst) const {
  settle();
  CpuBackend::scatter_rows(src, rows, dst);
}

void VulkanBackend::add_rows(CMat terms, std::span<const uint32_t> tokens, Mat out) const {
  settle();
  CpuBackend::add_rows(terms, tokens, out);
}

void VulkanBackend::hc_mix(const Weight& fn, const float* base, const float* scale, HcParams p, CMat X, Mat mixes) const {
  {
    const std::lock_guard<std::mutex> lk(mu_);
    if (defer_hc_mix(fn, base, scale, p, X, mixes)) return;
    flush_deferred();
  }
  CpuBackend::hc_mix(fn, base, scale, p, X, mixes);
}

void VulkanBackend::hc_pre_norm(CMat X, CMat pre, const float* norm_w, HcParams p, Mat y) const {
  {
    const std::lock_guard<std::mutex> lk(mu_);
    if (defer_hc_pre(X, pre, p.hc, y)) {
      // The norm a stage after, in place; where the batch has no room for it, the host's.
      if (defer_rms_norm(y, norm_w, p.norm_eps)) return;
      flush_deferred();
      CpuBackend::rms_norm(y, norm_w, p.norm_eps);
      return;
    }
    flush_deferred();
  }
  CpuBackend::hc_pre_norm(X, pre, norm_w, p, y);
}

void VulkanBackend::hc_pre(CMat X, CMat pre, HcParams p, Mat y) const {
  {
    const std::lock_guard<std::mutex> lk(mu_);
    if (defer_hc_pre(X, pre, p.hc, y)) return;
    flush_deferred();
  }
  CpuBackend::hc_pre(X, pre, p, y);
}

void VulkanBackend::hc_mean(CMat X, uint32_t hc, Mat y) const {
  settle();
  CpuBackend::hc_mean(X, hc, y);
}

void VulkanBackend::hc_post(CMat F, CMat X, CMat mixes, uint32_t hc, Mat Y) const {
  {
    const std::lock_guard<std::mutex> lk(mu_);
    if (defer_hc_post(F, X, mixes, hc, Y)) return;
    flush_deferred();
  }
  CpuBackend::hc_post(F, X, mixes, hc, Y);
}

std::vector<uint32_t> VulkanBackend::compress_pool(CMat k, CMat g, uint32_t ratio, uint32_t p0, float* carry_k,
                                                   float* carry_s, Mat latents) const {
  {
    const std::lock_guard<std::mutex> lk(mu_);
    std::vector<uint32_t> groups;
    if (defer_compress_pool(k, g, ratio, p0, carry_k, carry_s, latents, groups)) return groups;
    flush_deferred();
  }
  return CpuBackend::compress_pool(k, g, ratio, p0, carry_k, carry_s, latents);
}

void VulkanBackend::index_select(const IndexSelect& a, std::vector<std::vector<uint8_t>>& cand,
                                 std::vector<std::vector<int32_t>>& sel) const {
  {
    const std::lock_guard<std::mutex> lk(mu_);
    if (device_index_select(a, cand, sel)) return;
    flush_deferred();
  }
  CpuBackend::index_select(a, cand, sel);
}

void VulkanBackend::engram_gate(Mat X, uint32_t hc, CMat kv, const float* q_norm, const float* k_norm, float eps,
                                const uint8_t* masked) const {
  {
    const std::lock_guard<std::mutex> lk(mu_);
    if (defer_engram_gate(X, hc, kv, q_norm, k_norm, eps, masked)) return;
    flush_deferred();
  }
  CpuBackend::engram_gate(X, hc, kv, q_norm, k_norm, eps, masked);
}

void VulkanBackend::rms_norm_alone(float* x, size_t n, size_t width, const float* w, float eps) const {
  const std::lock_guard<std::mutex> lk(mu_);
  flush_deferred();
  if (rms_norm_ == VK_NULL_HANDLE) throw Error("gpu_rms_norm: the device has no rms_norm shader (no shaderFloat64)");
  ensure_io();
  if (n * width * sizeof(float) > out_.size || width * sizeof(float) > act_.size)
    throw Error("gpu_rms_norm: the rows do not fit the staging buffers");
  put_rows(x, n * width * sizeof(float));
  std::memcpy(act_.map, w, width * sizeof(float));
  Dispatch d{DeviceWeight{rms_norm_, act_.buf, 0, aligned(width * sizeof(float)), 0, 0}, 0, 0,
             (VkDeviceSize)(n * width * sizeof(float)),
             Push{(uint32_t)n, (uint32_t)width, 0, (uint32_t)width, std::bit_cast<uint32_t>(eps), 0, 0, 0, 0},
             (uint32_t)n, 1};
  read_back(0, n * width * sizeof(float));
  (void)dispatch(std::span<const Dispatch>(&d, 1));
  std::memcpy(x, rows_out(), n * width * sizeof(float));
}

void VulkanBackend::swiglu_alone(float* gu, size_t n, size_t width, float limit, const float* wk) const {
  const std::lock_guard<std::mutex> lk(mu_);
  flush_deferred();
  if (swiglu_ == VK_NULL_HANDLE) throw Error("gpu_swiglu: the device has no swiglu shader (no shaderFloat64)");
  ensure_io();
  if (n * 2 * width * sizeof(float) > out_.size || n * sizeof(float) > act_.size)
    throw Error("gpu_swiglu: the rows do not fit the staging buffers");
  put_rows(gu, n * 2 * width * sizeof(float));
  if (wk) std::memcpy(act_.map, wk, n * sizeof(float));
  const Region r{0, gu, n, 2 * width, 0, 0, 0, {}};
  Dispatch d = swiglu_dispatch(r, CMat{gu, n, width, 2 * width}, CMat{gu + width, n, width, 2 * width}, limit);
  d.push.kind = wk ? 1 : 0;  // the shader's row_weights
  read_back(0, n * 2 * width * sizeof(float));
  (void)dispatch(std::span<const Dispatch>(&d, 1));
  std::memcpy(gu, rows_out(), n * 2 * width * sizeof(float));
}

std::vector<float> VulkanBackend::engram_gates_alone(const float* X, const float* kv, size_t n, uint32_t hc, size_t H,
                                                     const float* q_norm, const float* k_norm, float eps) const {
  const Tensor xt = tensor(n, hc * H), kt = tensor(n, (hc + 1) * H), gt = tensor(n, hc);
  std::memcpy(xt.m().p, X, xt.bytes());
  std::memcpy(kt.m().p, kv, kt.bytes());
  const std::lock_guard<std::mutex> lk(mu_);
  flush_deferred();
  if (!defer_engram_gate(xt.m(), hc, kt.c(), q_norm, k_norm, eps, nullptr, gt.m()))
    throw Error("gpu_engram_gates: the device has no engram_gate shader (no shaderFloat64) or the rows do not fit");
  flush_deferred();
  return std::vector<float>(gt.c().p, gt.c().p + n * hc);
}

std::vector<float> VulkanBackend::index_scores_alone(const IndexSelect& a, std::vector<std::vector<uint8_t>>& cand) const {
  const std::lock_guard<std::mutex> lk(mu_);
  const GpuIndexer was = std::exchange(indexer_, GpuIndexer::Device);
  std::vector<std::vector<int32_t>> sel;
  std::vector<float> raw;
  const bool ok = device_index_select(a, cand, sel, &raw);
  indexer_ = was;
  if (!ok) throw Error("gpu_index_scores: the device has no index_scores shader (no shaderFloat64) or the keys do not fit");
  return raw;
}

std::vector<uint32_t> VulkanBackend::compress_pool_unrounded(CMat k, CMat g, uint32_t ratio, uint32_t p0,
                                                             float* carry_k, float* carry_s, Mat latents) const {
  const std::lock_guard<std::mutex> lk(mu_);
  flush_deferred();
  std::vector<uint32_t> groups;
  if (!defer_compress_pool(k, g, ratio, p0, carry_k, carry_s, latents, groups, true))
    throw Error("gpu_compress_pool_unrounded: the device has no compress_pool shader (no shaderFloat64) or the rows do not fit");
  flush_deferred();
  return groups;
}

void VulkanBackend::exp_alone(float* x, size_t n) const {
  const std::lock_guard<std::mutex> lk(mu_);
  flush_deferred();
  if (exp_ == VK_NULL_HANDLE) throw Error("gpu_exp: the device has no exp_f32 shader (no shaderFloat64)");
  ensure_io();  // both: every binding names a buffer (binding 1, unread here, the activations')
  if (n * sizeof(float) > out_.size) throw Error("gpu_exp: the values do not fit the staging buffer");
  put_rows(x, n * sizeof(float));
  const uint32_t groups = grid_x(n), gx = std::min<uint32_t>(groups, 32768);
  Dispatch d{DeviceWeight{exp_, exp_consts_.buf, 0, exp_consts_.size, 0, 0}, 0, 0, (VkDeviceSize)(n * sizeof(float)),
             Push{(uint32_t)n, 0, 0, 0, 0, 0, 0, 0, 0}, gx, (groups + gx - 1) / gx};
  read_back(0, n * sizeof(float));
  (void)dispatch(std::span<const Dispatch>(&d, 1));
  std::memcpy(x, rows_out(), n * sizeof(float));
}

bool VulkanBackend::defer_rms_norm(Mat x, const float* w, float eps) const {
  if (rms_norm_ == VK_NULL_HANDLE || x.n == 0 || x.width == 0 || deferred_.ds.size() >= kSets) return false;
  Region* r = in_place_region(x);
  const VkDeviceSize wb = aligned((VkDeviceSize)x.width * sizeof(float));
  if (!r || deferred_.act_used + wb > io_limit_) return false;
  std::memcpy(static_cast<uint8_t*>(act_.map) + deferred_.act_used, w, x.width * sizeof(float));
  Dispatch d{DeviceWeight{rms_norm_, act_.buf, deferred_.act_used, wb, 0, 0}, 0, r->off,
             (VkDeviceSize)r->n * r->stride * sizeof(float),
             Push{(uint32_t)x.n, (uint32_t)x.width, (uint32_t)(x.p - r->row), (uint32_t)r->stride,
                  std::bit_cast<uint32_t>(eps), 0, 0, 0, 0},
             (uint32_t)x.n, 1};
  d.stage = std::max(r->stage, r->read) + 1;
  r->stage = d.stage;  // readers of the rows come after it
  deferred_.act_used += wb;
  deferred_.ds.push_back(d);
  ++st_.ops_on_device;
  return true;
}

bool VulkanBackend::defer_swiglu(Mat g, CMat u, float limit) const {
  if (swiglu_ == VK_NULL_HANDLE || g.n == 0 || g.width == 0 || deferred_.ds.size() >= kSets) return false;
  Region* r = const_cast<Region*>(deferred_.source_of(g));
  if (!r || deferred_.source_of(u) != r || u.width != g.width) return false;
  deferred_.ds.push_back(swiglu_dispatch(*r, g, u, limit));
  r->stage = deferred_.ds.back().stage;  // readers of h come after it
  ++st_.ops_on_device;
  return true;
}

VulkanBackend::Dispatch VulkanBackend::swiglu_dispatch(const Region& r, CMat g, CMat u, float limit) const {
  Dispatch d{DeviceWeight{swiglu_, exp_consts_.buf, 0, exp_consts_.size, 0, 0}, 0, r.off,
             (VkDeviceSize)r.n * r.stride * sizeof(float),
             Push{(uint32_t)g.n, (uint32_t)g.width, (uint32_t)(g.p - r.row), (uint32_t)r.stride,
                  std::bit_cast<uint32_t>(limit), (uint32_t)(u.p - r.row), 0, 0, 0},
             grid_x(g.width), (uint32_t)g.n};
  d.stage = std::max(r.stage, r.read) + 1;
  d.act_bytes = rows_span(g.n, sizeof(float), sizeof(float));  // the row weights, when the shader reads them
  return d;
}

bool VulkanBackend::defer_hc_pre(CMat X, CMat pre, uint32_t hc, Mat y) const {
  const size_t H = y.width, n = y.n;
  if (hc_pre_ == VK_NULL_HANDLE || n == 0 || H == 0 || hc == 0 || X.n != n || pre.n != n || X.width != hc * H ||
      pre.width < hc || deferred_.ds.size() + 2 > kSets)
    return false;
  const RowSpans sp = row_spans();
  Operand x, w;
  if (!operand(X, x) || !operand(pre.cols(0, hc), w)) return false;
  return defer_row_op(hc_pre_, {&x, &w}, y, {(uint32_t)n, (uint32_t)H, hc, x.at, x.stride, w.at, w.stride}, grid_x(H), sp);
}

bool VulkanBackend::defer_hc_post(CMat F, CMat X, CMat mixes, uint32_t hc, Mat Y) const {
  const size_t H = F.width, n = Y.n, nmix = hc_mix_width(hc);
  if (hc_post_ == VK_NULL_HANDLE || n == 0 || H == 0 || hc == 0 || F.n != n || X.n != n || mixes.n != n ||
      X.width != hc * H || Y.width != hc * H || mixes.width < nmix || deferred_.ds.size() + 1 > kSets)
    return false;
  const RowSpans sp = row_spans();
  Operand f, x, m;
  if (!operand(F, f) || !operand(X, x) || !operand(mixes.cols(0, nmix), m)) return false;
  return defer_row_op(hc_post_, {&f, &x, &m}, Y,
                      {(uint32_t)n, (uint32_t)H, hc, f.at, f.stride, x.at, x.stride, m.at, m.stride}, grid_x(H), sp);
}

bool VulkanBackend::defer_hc_mix(const Weight& fn, const float* base, const float* scale, HcParams p, CMat X, Mat mixes) const {
  const size_t n = X.n, nmix = fn.rows;
  if (hc_mix_ == VK_NULL_HANDLE || n == 0 || p.hc == 0 || p.hc > 8 || nmix != hc_mix_width(p.hc) || mixes.n != n ||
      mixes.width < nmix || X.width != fn.cols || !linear_fits(fn, X, mixes) ||
      static_cast<const GpuWeight*>(fn.device)->pipe != float_ || deferred_.ds.size() + 2 > kSets)
    return false;
  const GpuWeight& gw = *static_cast<const GpuWeight*>(fn.device);
  RowSpans sp = row_spans();
  Operand x;
  if (!operand(X, x)) return false;
  // The linear binds X's rows at an offset: a region's must suit one (a whole tensor's rows do).
  const VkDeviceSize x_off = (VkDeviceSize)(x.at & ~kInOut) * sizeof(float);
  if (x_off % offset_align() != 0) return false;
  std::vector<float> prm(base, base + nmix);
  prm.insert(prm.end(), scale, scale + 3);
  prm.push_back(p.hc_eps);
  prm.push_back(p.norm_eps);
  const uint32_t pa = stage_rows(CMat{prm.data(), 1, prm.size(), prm.size()});
  const VkDeviceSize rb = aligned((VkDeviceSize)n * nmix * sizeof(float)), raw_off = deferred_.out_used;
  if (pa == UINT32_MAX || raw_off + rb > io_limit_) return false;
  deferred_.out_used += rb;
  const int mr = output_region(mixes.cols(0, nmix));
  if (mr < 0) return false;
  const DeviceWeight wt{float_, gw.b.buf, 0, gw.b.size, gw.kind, gw.w_off};
  Dispatch lin{wt, x_off, raw_off, rb, push_for(wt, fn, 0, n, (size_t)x.stride * sizeof(float), nmix, false)};
  lin.chained = x.region >= 0;
  lin.act_bytes = rows_span(n, (size_t)x.stride * sizeof(float), X.width * sizeof(float));
  shape_linear(lin, nmix, n);
  lin.stage = x.stage + 1;
  deferred_.ds.push_back(lin);
  ++st_.linear_on_device;
  Region& r = deferred_.regions[(size_t)mr];
  const uint32_t stage = lin.stage + 1;
  reads(sp, x);
  reads_floats(sp, raw_off / sizeof(float), (raw_off + rb) / sizeof(float));
  writes(sp, r);
  deferred_.ds.push_back(row_op(hc_mix_,
                                {(uint32_t)n, (uint32_t)X.width, p.hc, p.sinkhorn_iters, kInOut | (uint32_t)(raw_off / sizeof(float)),
                                 (uint32_t)nmix, x.at, x.stride, pa, out_place(r, mixes), (uint32_t)r.stride},
                                (uint32_t)((n + kGroup - 1) / kGroup), 1, stage, sp));
  r.stage = stage;
  mark_read(x, stage);
  return true;
}

bool VulkanBackend::defer_engram_gate(Mat X, uint32_t hc, CMat kv, const float* q_norm, const float* k_norm, float eps,
                                      const uint8_t* masked, Mat gates) const {
  const size_t n = X.n, H = hc ? X.width / hc : 0;
  if (engram_gate_ == VK_NULL_HANDLE || n == 0 || H == 0 || X.width != hc * H || kv.n != n || kv.width < (hc + 1) * H ||
      deferred_.ds.size() + 1 > kSets)
    return false;
  RowSpans sp = row_spans();
  Operand x, k;
  if (!operand(X, x) || !operand(kv.cols(0, (hc + 1) * H), k)) return false;
  std::vector<float> prm;
  prm.reserve(3 + 2 * hc * H + n);
  prm.push_back((float)(1.0 / std::sqrt((double)H)));  // the CPU's inv_sqrt_h
  prm.push_back(eps);
  prm.push_back(masked ? 1.0f : 0.0f);
  prm.insert(prm.end(), q_norm, q_norm + hc * H);
  prm.insert(prm.end(), k_norm, k_norm + hc * H);
  for (size_t i = 0; i < n; ++i) prm.push_back(masked && masked[i] ? 1.0f : 0.0f);
  const uint32_t pa = stage_rows(CMat{prm.data(), 1, prm.size(), prm.size()});
  if (pa == UINT32_MAX) return false;
  // In place on its region (a stage after its last reader), or a new one.
  int yr = gates.p ? output_region(gates) : x.region >= 0 && !stored_from(x.region) ? x.region : -1;
  if (yr < 0 && (yr = output_region(X)) < 0) return false;
  Region& r = deferred_.regions[(size_t)yr];
  const uint32_t stage = std::max({x.stage, k.stage, r.read}) + 1;
  reads(sp, x);
  reads(sp, k);
  writes(sp, r);
  deferred_.ds.push_back(row_op(engram_gate_,
                                {(uint32_t)n, (uint32_t)H, hc, x.at, x.stride, k.at, k.stride, pa,
                                 gates.p ? out_place(r, gates) : out_place(r, X), (uint32_t)r.stride, gates.p ? 1u : 0u},
                                hc, (uint32_t)n, stage, sp));
  r.stage = stage;
  mark_read(k, stage);
  return true;
}

bool VulkanBackend::defer_add_round(CMat a, CMat b, Mat out) const {
  const size_t n = out.n, w = out.width;
  if (add_round_ == VK_NULL_HANDLE || n == 0 || w == 0 || a.n != n || b.n != n || a.width != w || b.width != w ||
      (!deferred_.source_of(a) && !deferred_.source_of(b)) || deferred_.ds.size() + 1 > kSets)
    return false;
  const RowSpans sp = row_spans();
  Operand oa, ob;
  if (!operand(a, oa) || !operand(b, ob)) return false;
  return defer_row_op(add_round_, {&oa, &ob}, out, {(uint32_t)n, (uint32_t)w, oa.at, oa.stride, ob.at, ob.stride},
                      grid_x(w), sp);
}

bool VulkanBackend::defer_compress_pool(CMat k, CMat g, uint32_t ratio, uint32_t p0, float* carry_k, float* carry_s,
                                        Mat latents, std::vector<uint32_t>& groups, bool unrounded) const {
  const size_t n = k.n, hd = k.width;
  if (compress_ == VK_NULL_HANDLE || n == 0 || hd == 0 || ratio == 0 || (ratio > 1 && (g.n != n || g.width != hd)) ||
      latents.width != hd || deferred_.ds.size() + 1 > kSets)
    return false;
  const size_t cw = (size_t)(ratio - 1) * hd;  // floats of each carry
  // A carry the batch still writes (a second chunk of the sequence in one batch) is not staged.
  if (ratio > 1 && (deferred_writes(CMat{carry_k, 1, cw, cw}) || deferred_writes(CMat{carry_s, 1, cw, cw})))
    return false;
  RowSpans sp = row_spans();
  Operand ko, go;
  if (!operand(k, ko) || (ratio > 1 && !operand(g, go))) return false;
  std::vector<uint32_t> done;  // the chunk's rows completing a group
  bool reads_carry = false;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t t = p0 + i;
    if (ratio > 1 && t % ratio + 1 < ratio) continue;
    done.push_back(i);
    reads_carry = reads_carry || i + 1 < ratio;
  }
  const uint32_t G = (uint32_t)done.size();
  if (G > latents.n) return false;
  uint32_t ck = 0, cs = 0;
  if (reads_carry) {
    ck = stage_rows(CMat{carry_k, 1, cw, cw});
    cs = stage_rows(CMat{carry_s, 1, cw, cw});
    if (ck == UINT32_MAX || cs == UINT32_MAX) return false;
  }
  // Per group, per member in position order: (k place, s place).
  std::vector<uint32_t> members;
  members.reserve((size_t)G * 2 * ratio);
  for (const uint32_t i : done)
    for (uint32_t a = 0; a < ratio; ++a) {
      const bool carried = i + a + 1 < ratio;  // position p0 + i - (ratio - 1) + a is before p0
      const uint32_t row = i + a + 1 - ratio;
      members.push_back(carried ? ck + a * (uint32_t)hd : ko.at + row * ko.stride);
      members.push_back(ratio == 1 ? 0u : carried ? cs + a * (uint32_t)hd : go.at + row * go.stride);
    }
  const uint32_t m_at = G ? stage_words(members) : 0;
  if (m_at == UINT32_MAX) return false;
  // The open group's members become the carry (the latest row of each slot).
  std::vector<int64_t> last(ratio > 1 ? ratio - 1 : 0, -1);
  for (uint32_t i = 0; i < n && ratio > 1; ++i)
    if ((p0 + i) % ratio + 1 < ratio) last[(p0 + i) % ratio] = i;
  if (G) {
    const int yr = output_region(latents.rows(0, G));
    if (yr < 0) return false;
    Region& r = deferred_.regions[(size_t)yr];
    const uint32_t stage = std::max(ko.stage, go.stage) + 1;
    reads(sp, ko);
    reads(sp, go);
    writes(sp, r);
    deferred_.ds.push_back(row_op(compress_, {G, (uint32_t)hd, ratio, m_at, out_place(r, latents), (uint32_t)r.stride, unrounded ? 1u : 0u},
                                  grid_x(hd), G, stage, sp));
    r.stage = stage;
    mark_read(ko, stage);
    mark_read(go, stage);
  }
  for (uint32_t j = 0; j < last.size(); ++j) {
    if (last[j] < 0) continue;
    const uint32_t i = (uint32_t)last[j];
    for (const auto& [o, src, dst] : {std::tuple{ko, k, carry_k}, std::tuple{go, g, carry_s}}) {
      float* const d = dst + (size_t)j * hd;
      if (o.region < 0) {
        std::memcpy(d, src.row(i), hd * sizeof(float));
        continue;
      }
      const uint32_t place = (o.at & ~kInOut) + i * o.stride;
      deferred_.outs.push_back({(VkDeviceSize)place * sizeof(float), d, 1, hd, hd, hd, 0});
    }
  }
  groups.clear();
  for (const uint32_t i : done) groups.push_back((p0 + i) / ratio);
  return true;
}

bool VulkanBackend::defer_fake_quant(Mat x, FakeQuant kind) const {
  const size_t block = kind == FakeQuant::Nvfp4 ? 16 : 32;
  if (fake_quant_ == VK_NULL_HANDLE || x.n == 0 || x.width == 0 || x.width % block != 0 || deferred_.ds.size() + 1 > kSets)
    return false;
  Region* r = in_place_region(x);
  if (!r) return false;
  const uint32_t stage = std::max(r->stage, r->read) + 1;
  const uint32_t k = kind == FakeQuant::Fp8Window ? 0u : kind == FakeQuant::Nvfp4 ? 1u : 2u;
  RowSpans sp = row_spans();
  writes(sp, *r);  // its binding 2 is the region: x's place counted from the region's start
  deferred_.ds.push_back(row_op(fake_quant_,
                                {(uint32_t)x.n, (uint32_t)x.width, (uint32_t)(x.p - r->row), (uint32_t)r->stride, k},
                                (uint32_t)((x.width / block + kGroup - 1) / kGroup), (uint32_t)x.n, stage, sp));
  r->stage = stage;
  return true;
}

bool VulkanBackend::defer_rope(Mat x, uint32_t head_dim, RopeTable t, std::span<const uint64_t> pos, bool inverse) const {
  const size_t n = x.n, half = t.pairs;
  if (rope_ == VK_NULL_HANDLE || n == 0 || half == 0 || head_dim == 0 || x.width % head_dim != 0 || 2 * half > head_dim ||
      pos.size() < n || deferred_.ds.size() + 1 > kSets)
    return false;
  Region* r = in_place_region(x);
  if (!r) return false;
  RowSpans sp = row_spans();
  const std::span<const double> freqs(t.freqs, t.pairs);
  std::vector<float> tab(n * 2 * half);
  for (size_t i = 0; i < n; ++i) {
    const RopeAngles a = rope_angles(freqs, pos[i]);
    std::copy(a.cos.begin(), a.cos.end(), tab.begin() + (ptrdiff_t)(i * 2 * half));
    std::copy(a.sin.begin(), a.sin.end(), tab.begin() + (ptrdiff_t)(i * 2 * half + half));
  }
  const uint32_t at = stage_rows(CMat{tab.data(), 1, tab.size(), tab.size()});
  if (at == UINT32_MAX) return false;
  const uint32_t heads = (uint32_t)(x.width / head_dim), stage = std::max(r->stage, r->read) + 1;
  writes(sp, *r);
  deferred_.ds.push_back(row_op(rope_,
                                {(uint32_t)n, (uint32_t)half, head_dim, heads, out_place(*r, x), (uint32_t)r->stride, at,
                                 inverse ? 1u : 0u},
                                (uint32_t)((heads * half + kGroup - 1) / kGroup), (uint32_t)n, stage, sp));
  r->stage = stage;
  return true;
}

bool VulkanBackend::device_index_select(const IndexSelect& a, std::vector<std::vector<uint8_t>>& cand,
                                        std::vector<std::vector<int32_t>>& sel, std::vector<float>* raw) const {
  const uint32_t n = (uint32_t)a.q.n, heads = a.heads, hd = a.head_dim;
  if (index_scores_ == VK_NULL_HANDLE || indexer_ == GpuIndexer::Cpu || n == 0 || heads == 0 || hd == 0 ||
      hd % 32 != 0 || hd > kIndexMaxDim || a.ratio == 0 || a.keys.grid != Fp4Grid::Mxfp4 ||
      a.q.width < (size_t)heads * hd || a.w.n != n || a.w.width < heads || (a.candidate_consumer && a.block == 0) ||
      ((a.candidate_source || a.candidate_consumer) && cand.size() < n))
    return false;
  const uint32_t n_vis_max = (a.p0 + n) / a.ratio;
  if (n_vis_max == 0) return false;  // nothing to score: the CPU's empty selections
  if (indexer_ == GpuIndexer::Auto &&
      (info_.kind == "cpu" || (uint64_t)n * n_vis_max * heads * hd < kIndexDeviceMacs))
    return false;
  const uint32_t units = a.candidate_consumer ? (n_vis_max + a.block - 1) / a.block : 0;
  // What one group stages (the keys, the shape, per query its queries, weights and kept blocks,
  // each part aligned) and writes (its scores) must fit the empty staging buffers.
  const VkDeviceSize keys = aligned((VkDeviceSize)n_vis_max * fp4_row_bytes(Fp4Grid::Mxfp4, hd));
  const VkDeviceSize per_query = ((VkDeviceSize)heads * hd + heads + units) * 4, fixed = keys + 5 * offset_align();
  const VkDeviceSize scores_row = (VkDeviceSize)n_vis_max * sizeof(float);
  ensure_io();
  if (fixed + per_query > io_limit_ || scores_row + offset_align() > io_limit_ || (n_vis_max + 63) / 64 > max_groups_x_)
    return false;
  const uint32_t group = (uint32_t)std::min<VkDeviceSize>(
      {n, (io_limit_ - fixed) / per_query, (io_limit_ - offset_align()) / scores_row});
  std::vector<float> scores;
  sel.assign(n, {});
  if (raw) raw->assign((size_t)n * n_vis_max, 0.0f);
  for (uint32_t g0 = 0; g0 < n; g0 += group) {
    const uint32_t gn = std::min(group, n - g0);
    VkDeviceSize at = 0;
    if (!defer_index_scores(a, cand, g0, gn, n_vis_max, at)) {
      flush_deferred();
      if (!defer_index_scores(a, cand, g0, gn, n_vis_max, at)) {
        if (g0 == 0) return false;
        throw Error("vulkan: the indexer's queries " + std::to_string(g0) + ".. did not fit the staging buffers");
      }
    }
    flush_deferred();
    ++st_.index_on_device;
    const float* const out = reinterpret_cast<const float*>(rows_out() + at);
    for (uint32_t t = 0; t < gn; ++t) {
      const uint32_t i = g0 + t, n_vis = (a.p0 + i + 1) / a.ratio;
      scores.assign(out + (size_t)t * n_vis_max, out + (size_t)t * n_vis_max + n_vis);
      if (raw) std::copy(scores.begin(), scores.end(), raw->begin() + (ptrdiff_t)i * n_vis_max);
      if (a.candidate_source) cand[i] = candidate_blocks(scores, n_vis, a.block, a.keep_blocks);
      sel[i] = topk_ascending(scores, a.topk);
    }
  }
  return true;
}

bool VulkanBackend::defer_index_scores(const IndexSelect& a, const std::vector<std::vector<uint8_t>>& cand, uint32_t g0,
                                       uint32_t gn, uint32_t n_vis_max, VkDeviceSize& at) const {
  const uint32_t heads = a.heads, hd = a.head_dim;
  const size_t rb = fp4_row_bytes(Fp4Grid::Mxfp4, hd);
  if (deferred_.ds.size() + 1 > kSets) return false;
  const uint32_t first = std::min(a.keys.first, n_vis_max);
  RowSpans sp = row_spans();
  // Keys a pending store writes: per key, the place of its f32 row (kInOut | place) or ~0u.
  std::vector<uint32_t> pend;
  uint32_t after = 0;
  std::vector<int> read;
  for (const HostStore& h : deferred_.stores) {
    if (!h.fp4 || !((first && h.writes(a.keys.row(0), first * rb)) ||
                    (n_vis_max > first && h.writes(a.keys.row(first), (n_vis_max - first) * rb))))
      continue;
    if (h.grid != Fp4Grid::Mxfp4 || h.width != hd) return false;  // not rows of these keys' shape
    if (pend.empty()) pend.assign(n_vis_max, 0xffffffffu);
    // The visible keys are two runs of packed rows (from row 0 and from row `first`); the
    // store's rows meet each run in one range of keys, found by arithmetic on the addresses.
    const uintptr_t s0 = reinterpret_cast<uintptr_t>(h.fp4), s1 = s0 + h.n * rb;
    for (const auto& [j0, j1] : {std::pair<uint32_t, uint32_t>{0, first}, {first, n_vis_max}}) {
      if (j1 <= j0) continue;
      const uintptr_t b0 = reinterpret_cast<uintptr_t>(a.keys.row(j0)), b1 = b0 + (uintptr_t)(j1 - j0) * rb;
      const uintptr_t lo = std::max(b0, s0), hi = std::min(b1, s1);
      if (lo >= hi) continue;
      if ((b0 > s0 ? b0 - s0 : s0 - b0) % rb != 0) return false;  // straddles rows: not worked out here
      for (uint32_t j = j0 + (uint32_t)((lo - b0) / rb), end = j0 + (uint32_t)((hi - b0) / rb); j < end; ++j)
        pend[j] = kInOut | (uint32_t)(h.place + (b0 + (uintptr_t)(j - j0) * rb - s0) / rb * h.src_stride);
    }
    after = std::max(after, deferred_.regions[(size_t)h.region].stage);
    read.push_back(h.region);
  }
  const VkDeviceSize out_bytes = aligned((VkDeviceSize)gn * n_vis_max * sizeof(float));
  if (deferred_.out_used + out_bytes > io_limit_) return false;
  Operand q, w;
  if (!operand(CMat{a.q.row(g0), gn, (size_t)heads * hd, a.q.stride}, q) ||
      !operand(CMat{a.w.row(g0), gn, heads, a.w.stride}, w))
    return false;
  const uint32_t units = a.candidate_consumer ? (n_vis_max + a.block - 1) / a.block : 0;
  const uint32_t pend_at = pend.empty() ? 0xffffffffu : stage_words(pend);
  if (pend_at == UINT32_MAX && !pend.empty()) return false;
  const std::array<uint32_t, 8> shape = {a.p0 + g0, a.ratio, a.candidate_consumer ? a.block : 1u, units,
                                         std::bit_cast<uint32_t>(a.denom), heads, hd, pend_at};
  const uint32_t h_at = stage_words(shape);
  uint32_t m_at = 0xffffffffu;
  if (a.candidate_consumer) {
    std::vector<uint32_t> m((size_t)gn * units, 0);
    for (uint32_t t = 0; t < gn; ++t) {
      const std::vector<uint8_t>& keep = cand[g0 + t];
      for (uint32_t u = 0; u < units && u < keep.size(); ++u) m[(size_t)t * units + u] = keep[u] ? 1u : 0u;
    }
    m_at = stage_words(m);
    if (m_at == UINT32_MAX) return false;
  }
  const VkDeviceSize kb = aligned((VkDeviceSize)n_vis_max * rb);
  if (h_at == UINT32_MAX || deferred_.act_used + kb > io_limit_) return false;
  const VkDeviceSize k_at = deferred_.act_used;
  uint8_t* const keys = static_cast<uint8_t*>(act_.map) + k_at;
  if (first) std::memcpy(keys, a.keys.row(0), first * rb);
  if (n_vis_max > first) std::memcpy(keys + first * rb, a.keys.row(first), (n_vis_max - first) * rb);
  deferred_.act_used += kb;
  at = deferred_.out_used;
  deferred_.out_used += out_bytes;
  const uint32_t stage = std::max({q.stage, w.stage, after}) + 1;
  for (const int r : read) {
    deferred_.regions[(size_t)r].read = std::max(deferred_.regions[(size_t)r].read, stage);
    reads_region(sp, r);
  }
  reads(sp, q);
  reads(sp, w);
  sp.out_off = at;
  sp.out_bytes = out_bytes;
  deferred_.ds.push_back(row_op(index_scores_,
                                {gn, h_at, q.at, q.stride, w.at, w.stride, (uint32_t)k_at, (uint32_t)rb, m_at,
                                 (uint32_t)(at / sizeof(float)), n_vis_max},
                                (n_vis_max + 63) / 64, gn, stage, sp));
  mark_read(q, stage);
  mark_read(w, stage);
  read_back(at, out_bytes);
  return true;
}

}  // namespace sluice::vk_backend
#endif
