// The CPU backend's attention ops: compressor pooling, the lightning indexer with the
// candidate pool, sparse attention with sinks (spec 3.4, docs/numerics.md 4-6).
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu_backend.h"
#include "kernels/exp_f32.h"
#include "kernels/fp.h"
#include "kernels/numerics.h"

namespace sluice {

// Ratio m: a per-channel softmax over the group's gate logits weights its projections; ratio 1:
// the projection itself. The open group's f32 projections are the carry.
std::vector<uint32_t> CpuBackend::compress_pool(CMat k, CMat g, uint32_t ratio, uint32_t p0, float* carry_k,
                                                float* carry_s, Mat latents) const {
  const size_t hd = k.width;
  std::vector<uint32_t> groups;
  std::vector<float> pooled(hd), ex((size_t)ratio * hd);
  for (size_t i = 0; i < k.n; ++i) {
    const uint32_t t = p0 + (uint32_t)i;
    const float* ki = k.row(i);
    if (ratio == 1) {
      std::copy(ki, ki + hd, pooled.begin());
    } else {
      const uint32_t j = t % ratio;
      const float* gi = g.row(i);
      if (j + 1 < ratio) {  // group still open: carry the f32 projections
        std::copy(ki, ki + hd, carry_k + (size_t)j * hd);
        std::copy(gi, gi + hd, carry_s + (size_t)j * hd);
        continue;
      }
      // Per-channel softmax over the group's members (in position order), then the weighted sum.
      auto kv_of = [&](uint32_t a) { return a + 1 < ratio ? carry_k + (size_t)a * hd : ki; };
      auto s_of = [&](uint32_t a) { return a + 1 < ratio ? carry_s + (size_t)a * hd : gi; };
      for (size_t d = 0; d < hd; ++d) {
        float mx = s_of(0)[d];
        for (uint32_t a = 1; a < ratio; ++a) mx = std::max(mx, s_of(a)[d]);
        float den = 0.0f;
        for (uint32_t a = 0; a < ratio; ++a) {
          ex[(size_t)a * hd + d] = exp_f32(s_of(a)[d] - mx);
          den += ex[(size_t)a * hd + d];
        }
        float acc = 0.0f;
        for (uint32_t a = 0; a < ratio; ++a) acc += kv_of(a)[d] * (ex[(size_t)a * hd + d] / den);
        pooled[d] = acc;
      }
    }
    float* lat = latents.row(groups.size());
    for (size_t d = 0; d < hd; ++d) lat[d] = round_bf16(pooled[d]);  // bf16(pooled)
    groups.push_back(t / ratio);
  }
  return groups;
}

// The scores of one query. Its rows go to the threads in units (rows of kIndexUnit, or the
// candidate blocks of a consumer: only the kept ones are scored, the rest stay -inf, which is what
// masking after scoring would leave). A run of rows contiguous in memory is scored by the integer
// kernel when the query is on the grid (kernels/index_scores.h: the float path's bits), its
// fallback keys and everything else by the float path: unpack, 32 f32 dots, relu, weight.
void CpuBackend::index_select(const IndexSelect& a, std::vector<std::vector<uint8_t>>& cand,
                              std::vector<std::vector<int32_t>>& sel) const {
  constexpr uint32_t kIndexUnit = 256;
  const uint32_t inh = a.heads, ihd = a.head_dim;
  sel.assign(a.q.n, {});
  std::vector<float> scores, wi(inh);
  IndexQuery iq;
  for (size_t i = 0; i < a.q.n; ++i) {
    const uint32_t t = a.p0 + (uint32_t)i;
    const float* q = a.q.row(i);
    for (uint32_t h = 0; h < inh; ++h) wi[h] = a.w.row(i)[h] / a.denom;  // w' (numerics.md 6)
    const uint32_t n_vis = (t + 1) / a.ratio;
    const bool consumer = a.candidate_consumer;
    scores.assign(n_vis, consumer ? -std::numeric_limits<float>::infinity() : 0.0f);
    prepare_index_query(q, wi.data(), inh, ihd, iq);
    const IndexScoresFn integer = iq.integer ? index_scores_ : nullptr;
    const uint32_t unit = consumer ? a.block : kIndexUnit;
    const uint32_t units = (n_vis + unit - 1) / unit;
    const uint8_t* keep = consumer ? cand[i].data() : nullptr;
    pool_.parallel_for(units, [&](size_t ub, size_t ue) {
      std::vector<uint16_t> key(ihd);
      uint32_t fallback[kIndexUnit];
      auto float_score = [&](uint32_t j) {
        unpack_fp4_(a.keys.grid, a.keys.row(j), ihd, key.data());  // exact: the BF16 bits
        float acc = 0.0f;
        for (uint32_t h = 0; h < inh; ++h) acc += std::max(dot_bf16_(key.data(), q + (size_t)h * ihd, ihd), 0.0f) * wi[h];
        scores[j] = acc;
      };
      auto score_run = [&](uint32_t b, uint32_t e) {  // rows [b, e), contiguous in memory
        if (!integer) {
          for (uint32_t j = b; j < e; ++j) float_score(j);
          return;
        }
        for (uint32_t p = b; p < e; p += kIndexUnit) {
          const uint32_t len = std::min(kIndexUnit, e - p);
          const size_t nf = integer(iq, a.keys.row(p), len, scores.data() + p, fallback);
          for (size_t f = 0; f < nf; ++f) float_score(p + fallback[f]);
        }
      };
      for (size_t u = ub; u < ue;) {
        if (keep && !keep[u]) {
          ++u;
          continue;
        }
        size_t v = u + 1;  // a run of kept units
        while (v < ue && (!keep || keep[v])) ++v;
        const uint32_t b = (uint32_t)u * unit, e = std::min<uint32_t>((uint32_t)v * unit, n_vis);
        const uint32_t split = std::clamp(a.keys.first, b, e);  // committed rows, then the chunk's
        if (b < split) score_run(b, split);
        if (split < e) score_run(split, e);
        u = v;
      }
    }, consumer ? 64 : 1);
    if (a.candidate_source) cand[i] = candidate_blocks(scores, n_vis, a.block, a.keep_blocks);
    sel[i] = topk_ascending(scores, a.topk);
  }
}

void CpuBackend::sparse_attention(const SparseAttention& a, Mat o) const {
  const uint32_t n = (uint32_t)a.q.n, hd = a.head_dim, W = a.window.window;
  const float scale = (float)(1.0 / std::sqrt((double)hd));
  // Queries go in groups of kAttentionGroup: the compressed rows any of them selected are
  // unpacked once (BF16, exactly the cached values) into a buffer bounded by the group, then
  // each (query, head) attends its rows as one function, whatever the group.
  std::vector<int32_t> wanted;
  std::vector<uint16_t> unpacked;
  std::vector<std::vector<const uint16_t*>> rows(std::min(n, kAttentionGroup));
  for (uint32_t i0 = 0; i0 < n; i0 += kAttentionGroup) {
    const uint32_t gn = std::min(n - i0, kAttentionGroup);
    wanted.clear();
    if (a.sel)
      for (uint32_t i = i0; i < i0 + gn; ++i) {
        const uint32_t n_vis = (a.p0 + i + 1) / a.comp_ratio;
        for (int32_t g : (*a.sel)[i])
          if ((uint32_t)g < n_vis) wanted.push_back(g);
      }
    std::sort(wanted.begin(), wanted.end());
    wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
    unpacked.resize(wanted.size() * hd);
    pool_.parallel_for(wanted.size(), [&](size_t b, size_t e) {
      for (size_t k = b; k < e; ++k) unpack_fp4_(a.comp.grid, a.comp.row((uint32_t)wanted[k]), hd, unpacked.data() + k * hd);
    }, 16);
    // Rows per query: window rows ascending, then the selected compressed rows ascending.
    for (uint32_t i = i0; i < i0 + gn; ++i) {
      std::vector<const uint16_t*>& rw = rows[i - i0];
      rw.clear();
      const uint32_t t = a.p0 + i;
      for (uint32_t p = t + 1 > W ? t + 1 - W : 0; p <= t; ++p) rw.push_back(a.window.row(p));
      if (a.sel) {
        const uint32_t n_vis = (t + 1) / a.comp_ratio;
        for (int32_t g : (*a.sel)[i])
          if ((uint32_t)g < n_vis) {
            const size_t k = (size_t)(std::lower_bound(wanted.begin(), wanted.end(), g) - wanted.begin());
            rw.push_back(unpacked.data() + k * hd);
          }
      }
    }
    attend_group(a, i0, gn, rows, scale, o);
  }
}

void CpuBackend::attend_rows(const RowAttention& a, Mat o) const {
  SparseAttention sa;
  sa.heads = a.heads;
  sa.head_dim = a.head_dim;
  sa.sinks = a.sinks;
  sa.q = a.q;
  const float scale = (float)(1.0 / std::sqrt((double)a.head_dim));
  const uint32_t n = (uint32_t)a.q.n;
  const std::vector<const uint16_t*> list(a.rows.begin(), a.rows.end());
  for (uint32_t i0 = 0; i0 < n; i0 += kAttentionGroup) {
    const uint32_t gn = std::min(n - i0, kAttentionGroup);
    const std::vector<std::vector<const uint16_t*>> rows(gn, list);
    attend_group(sa, i0, gn, rows, scale, o);
  }
}

void CpuBackend::attend_group(const SparseAttention& a, uint32_t i0, uint32_t gn,
                              const std::vector<std::vector<const uint16_t*>>& rows, float scale, Mat o) const {
  const uint32_t nh = a.heads, hd = a.head_dim;
  pool_.parallel_for((size_t)gn * nh, [&](size_t b, size_t e) {
    std::vector<float> sc, acc(hd);
    for (size_t th = b; th < e; ++th) {
      const size_t i = i0 + th / nh, h = th % nh;
      const float* qh = a.q.row(i) + h * hd;
      const std::vector<const uint16_t*>& rw = rows[th / nh];
      sc.resize(rw.size());
      float mx = -std::numeric_limits<float>::infinity();
      for (size_t k = 0; k < rw.size(); ++k) {
        sc[k] = dot_bf16_(rw[k], qh, hd) * scale;
        mx = std::max(mx, sc[k]);
      }
      float den = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (size_t k = 0; k < rw.size(); ++k) {
        const float p = exp_f32(sc[k] - mx);
        den += p;
        const float pb = round_bf16(p);  // BF16 probability in the numerator only
        for (uint32_t d = 0; d < hd; ++d) acc[d] += pb * bf16_to_f32(rw[k][d]);
      }
      den += exp_f32(a.sinks[h] - mx);
      float* oh = o.row(i) + h * hd;
      for (uint32_t d = 0; d < hd; ++d) oh[d] = round_bf16(acc[d] / den);
    }
  }, 1);
}

}  // namespace sluice
