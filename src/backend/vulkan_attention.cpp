// The Vulkan backend's attention: sparse attention in the deferred batch, the rows the device
// keeps (--gpu-kv), and the stores that wait for the batch.
// Built only with the Vulkan backend (CMakeLists.txt sets SLUICE_HAVE_VULKAN on vulkan_*.cpp).
#if SLUICE_HAVE_VULKAN
#include "backend/vulkan_backend_impl.h"

namespace sluice::vk_backend {

void VulkanBackend::store_bf16(CMat x, uint16_t* dst, size_t dst_stride) const {
  {
    const std::lock_guard<std::mutex> lk(mu_);
    if (const Region* r = x.n && x.width ? deferred_.source_of(x) : nullptr) {
      deferred_.stores.push_back(
          HostStore{dst, x.n, x.width, dst_stride, r->stride, out_place(*r, x), (int)(r - deferred_.regions.data())});
      return;
    }
    flush_deferred();
  }
  CpuBackend::store_bf16(x, dst, dst_stride);
}

void VulkanBackend::drop_pending() const noexcept {
  const std::lock_guard<std::mutex> lk(mu_);
  deferred_ = Deferred{};
}

void VulkanBackend::store_fp4(CMat x, Fp4Grid grid, uint8_t* dst) const {
  {
    const std::lock_guard<std::mutex> lk(mu_);
    if (const Region* r = x.n && x.width ? deferred_.source_of(x) : nullptr) {
      HostStore h{nullptr, x.n, x.width, 0, r->stride, out_place(*r, x), (int)(r - deferred_.regions.data())};
      h.fp4 = dst;
      h.grid = grid;
      deferred_.stores.push_back(h);
      return;
    }
    flush_deferred();
  }
  CpuBackend::store_fp4(x, grid, dst);
}

void VulkanBackend::sparse_attention(const SparseAttention& a, Mat o) const {
  {
    const std::lock_guard<std::mutex> lk(mu_);
    if (defer_sparse_attention(std::span(&a, 1), std::span(&o, 1))) return;
    flush_deferred();
    ++st_.attention_on_host;
  }
  CpuBackend::sparse_attention(a, o);
}

void VulkanBackend::sparse_attentions(std::span<const SparseAttention> as, std::span<const Mat> outs) const {
  if (as.size() > 1) {
    const std::lock_guard<std::mutex> lk(mu_);
    if (defer_sparse_attention(as, outs)) return;
  }
  Backend::sparse_attentions(as, outs);
}

void VulkanBackend::attend_rows(const RowAttention& a, Mat o) const {
  {
    const std::lock_guard<std::mutex> lk(mu_);
    std::vector<uint32_t> one(a.rows.size());
    for (uint32_t k = 0; k < one.size(); ++k) one[k] = k;
    if (defer_attention(a.q, a.heads, a.head_dim, a.sinks, o, a.rows, [&](uint32_t) -> const std::vector<uint32_t>& { return one; }, 0))
      return;
    flush_deferred();
  }
  CpuBackend::attend_rows(a, o);
}

bool VulkanBackend::defer_sparse_attention(std::span<const SparseAttention> as, std::span<const Mat> outs) const {
  if (attention_ == VK_NULL_HANDLE || as.empty() || as.size() != outs.size()) return false;
  const SparseAttention& a0 = as[0];
  size_t n_all = 0;
  for (size_t k = 0; k < as.size(); ++k) {
    const SparseAttention& a = as[k];
    if (a.q.n == 0 || outs[k].n != a.q.n || a.heads != a0.heads || a.head_dim != a0.head_dim || a.sinks != a0.sinks ||
        a.q.p != a0.q.p + n_all * a0.q.stride || a.q.stride != a0.q.stride || a.q.width != a0.q.width ||
        outs[k].p != outs[0].p + n_all * outs[0].stride || outs[k].stride != outs[0].stride || outs[k].width != outs[0].width)
      return false;
    n_all += a.q.n;
  }
  const uint32_t hd = a0.head_dim;
  std::vector<const uint16_t*> rows;            // distinct rows, in first-use order (null: a compressed one)
  std::vector<const uint8_t*> packed;           // a compressed row's bytes, by its index in rows (else null)
  std::vector<Fp4Grid> grids;                   // and its grid
  std::vector<KeptRow> kept;                    // what names each row among the kept ones (DeviceRows)
  std::vector<std::vector<uint32_t>> lists(n_all);  // per query, indices into rows
  uint32_t after = 0;              // the stage after which the batch's rows read here are written
  std::vector<int> read;           // and their regions
  size_t q0 = 0;                   // the part's first query among all
  for (const SparseAttention& a : as) {
    const uint32_t n = (uint32_t)a.q.n, W = a.window.window;
    std::map<const uint16_t*, uint32_t> window_ids;
    std::map<int32_t, uint32_t> comp_ids;
    for (uint32_t i = 0; i < n; ++i) {
      std::vector<uint32_t>& list = lists[q0 + i];
      const uint32_t t = a.p0 + i;
      for (uint32_t p = t + 1 > W ? t + 1 - W : 0; p <= t; ++p) {
        const uint16_t* r = a.window.row(p);
        // A row a store_bf16 of this batch will write (the chunk's new window rows): read where
        // the batch holds it (its values are BF16 already, so the same).
        if (const HostStore* h = pending_store(r)) {
          const size_t j = (size_t)(r - h->dst) / h->dst_stride;
          list.push_back(kInOut | (uint32_t)(h->place + j * h->src_stride));
          after = std::max(after, deferred_.regions[(size_t)h->region].stage);
          read.push_back(h->region);
          continue;
        }
        auto [it, fresh] = window_ids.emplace(r, (uint32_t)rows.size());
        if (fresh) {
          rows.push_back(r);
          packed.push_back(nullptr);
          grids.push_back(a.comp.grid);
          kept.push_back({reinterpret_cast<const uint8_t*>(r), (uint32_t)hd * 2, kRawRow});
        }
        list.push_back(it->second);
      }
      if (!a.sel) continue;
      const uint32_t n_vis = (t + 1) / a.comp_ratio;
      for (int32_t g : (*a.sel)[i]) {
        if ((uint32_t)g >= n_vis) continue;
        auto [it, fresh] = comp_ids.emplace(g, (uint32_t)rows.size());
        if (fresh) {
          const uint8_t* b = a.comp.row((uint32_t)g);
          // A compressed row a store_fp4 of this batch writes (a KV source's fresh rows) is read on the host.
          if (std::any_of(deferred_.stores.begin(), deferred_.stores.end(),
                          [&](const HostStore& h) { return h.fp4 && h.writes(b, a.comp.row_bytes()); }))
            return false;
          rows.push_back(nullptr);
          packed.push_back(b);
          grids.push_back(a.comp.grid);
          // Kept packed where the shader unpacks them (NVFP4, the compressed rows' grid): a
          // quarter of the bytes to copy and to hold, and nothing for the host to unpack.
          kept.push_back({b, (uint32_t)a.comp.row_bytes(), 1u + (uint32_t)a.comp.grid, a.comp.grid == Fp4Grid::Nvfp4});
        }
        list.push_back(it->second);
      }
    }
    q0 += n;
  }
  const CMat q{a0.q.p, n_all, a0.q.width, a0.q.stride};
  const Mat o{outs[0].p, n_all, outs[0].width, outs[0].stride};
  const size_t at = deferred_.ds.size();
  if (!defer_attention(q, a0.heads, hd, a0.sinks, o, rows, [&](uint32_t i) -> const std::vector<uint32_t>& { return lists[i]; },
                       after, [&](uint32_t k, uint16_t* dst) {
                         if (packed[k]) fp4_unpacker()(grids[k], packed[k], hd, dst);
                         else std::memcpy(dst, rows[k], hd * sizeof(uint16_t));
                       }, kept))
    return false;
  const uint32_t stage = deferred_.ds[at].stage;
  for (const int r : read) deferred_.regions[(size_t)r].read = std::max(deferred_.regions[(size_t)r].read, stage);
  return true;
}

const VulkanBackend::HostStore* VulkanBackend::pending_store(const uint16_t* r) const {
  for (const HostStore& h : deferred_.stores) {
    if (h.fp4 || r < h.dst || r >= h.dst + h.n * h.dst_stride) continue;
    const size_t off = (size_t)(r - h.dst);
    if (off % h.dst_stride == 0) return &h;
  }
  return nullptr;
}

bool VulkanBackend::keep_row(const KeptRow& r, uint32_t hd, uint32_t k,
                             const std::function<void(uint32_t, uint16_t*)>& fill,
                             std::span<const uint16_t* const> rows, uint32_t& slot) const {
  if (!kv_.buf) return false;
  const VkDeviceSize bytes = (VkDeviceSize)hd * sizeof(uint16_t);
  if (kv_hd_ == 0 && bytes <= staging_bytes_ && kv_.size / bytes > 0) {
    kv_hd_ = hd;
    kv_rows_ = DeviceRows(kv_.size / bytes, bytes);
    st_.kv_slots = kv_rows_.slots();
    st_.kv_host_bytes = kv_rows_.host_bytes();
  }
  DeviceRows::Found f;
  if (hd != kv_hd_ || !kv_rows_.find({r.p, r.bytes}, r.tag, f)) {
    ++st_.kv_staged;
    return false;
  }
  slot = f.slot;
  if (f.hit) {
    ++st_.kv_hits;
    return true;
  }
  const VkDeviceSize up = r.packed ? r.bytes : bytes;
  stage_copy(kv_.buf, (VkDeviceSize)slot * bytes, up, [&](uint8_t* dst) {
    if (r.packed)
      std::memcpy(dst, r.p, r.bytes);
    else if (fill)
      fill(k, reinterpret_cast<uint16_t*>(dst));
    else
      std::memcpy(dst, rows[k], bytes);
  });
  kv_pending_.push_back(slot);
  ++st_.kv_misses;
  st_.kv_upload_bytes += up;
  return true;
}

template <class List>
bool VulkanBackend::defer_attention(CMat q, uint32_t heads, uint32_t hd, const float* sinks, Mat o,
                                    std::span<const uint16_t* const> rows, List&& list, uint32_t after,
                                    const std::function<void(uint32_t, uint16_t*)>& fill,
                                    std::span<const KeptRow> kept) const {
  const size_t n = q.n;
  if (attention_ == VK_NULL_HANDLE || n == 0 || heads == 0 || hd == 0 || hd % 2 != 0 || o.n != n ||
      q.width != (size_t)heads * hd || o.width != q.width || deferred_.ds.size() + 1 > kSets)
    return false;
  size_t ids = 0;
  uint32_t in_lo = UINT32_MAX, in_hi = 0;  // the rows it reads in the output buffer: their lowest and highest places
  for (uint32_t i = 0; i < n; ++i) {
    const std::vector<uint32_t>& l = list(i);
    if (l.size() > kAttentionRows) return false;
    ids += l.size();
    for (const uint32_t e : l)
      if (e & kInOut) {
        in_lo = std::min(in_lo, e);
        in_hi = std::max(in_hi, e);
      }
  }
  // [scale][sinks][first, count per query][ids], then the rows.
  const size_t words = 1 + heads + 2 * n + ids;
  const VkDeviceSize lb = aligned(words * 4);
  RowSpans sp = row_spans();
  Operand x;
  if (!operand(q, x)) return false;
  // Each row's id in the lists: its slot (a kept row) or its place among the staged ones.
  std::vector<uint32_t> id(rows.size());
  uint32_t staged = 0;
  for (uint32_t k = 0; k < rows.size(); ++k) {
    uint32_t slot = 0;
    id[k] = k < kept.size() && keep_row(kept[k], hd, k, fill, rows, slot) ? kKept | (kept[k].packed ? kPacked : 0) | slot
                                                                          : staged++;
  }
  const VkDeviceSize rb = aligned((VkDeviceSize)staged * hd * sizeof(uint16_t));
  if (deferred_.act_used + lb + rb > io_limit_) return false;
  // The regions holding the lowest and the highest, and what lies between.
  if (in_hi && (!reads_place(sp, in_lo) || !reads_place(sp, in_hi))) return false;
  const int yr = output_region(o);
  if (yr < 0) return false;
  uint8_t* const abuf = static_cast<uint8_t*>(act_.map);
  uint32_t* const w = reinterpret_cast<uint32_t*>(abuf + deferred_.act_used);
  const uint32_t list_at = (uint32_t)(deferred_.act_used / 4), kv_at = (uint32_t)((deferred_.act_used + lb) / 4);
  w[0] = std::bit_cast<uint32_t>((float)(1.0 / std::sqrt((double)hd)));  // the CPU's scale
  for (uint32_t h = 0; h < heads; ++h) w[1 + h] = std::bit_cast<uint32_t>(sinks[h]);
  uint32_t first = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const std::vector<uint32_t>& l = list(i);
    w[1 + heads + 2 * i] = first;
    w[1 + heads + 2 * i + 1] = (uint32_t)l.size();
    for (size_t j = 0; j < l.size(); ++j) w[1 + heads + 2 * n + first + j] = l[j] & kInOut ? l[j] : id[l[j]];
    first += (uint32_t)l.size();
  }
  uint16_t* const kv = reinterpret_cast<uint16_t*>(abuf + deferred_.act_used + lb);
  for (uint32_t k = 0; k < rows.size(); ++k) {
    if (id[k] & kKept) continue;
    uint16_t* const dst = kv + (size_t)id[k] * hd;
    if (fill)
      fill(k, dst);
    else
      std::memcpy(dst, rows[k], hd * sizeof(uint16_t));
  }
  deferred_.act_used += lb + rb;
  Region& r = deferred_.regions[(size_t)yr];
  const uint32_t stage = std::max(x.stage, after) + 1;
  reads(sp, x);
  writes(sp, r);
  deferred_.ds.push_back(row_op(attention_,
                                {(uint32_t)n, heads, hd, x.at, x.stride, kv_at, list_at, out_place(r, o), (uint32_t)r.stride},
                                heads, (uint32_t)n, stage, sp));
  if (kv_.buf) deferred_.ds.back().kept = kv_.buf;
  r.stage = stage;
  mark_read(x, stage);
  return true;
}

}  // namespace sluice::vk_backend
#endif
