// Engram (spec 4): per-token row ids from the hashed n-gram history, rows read from the file,
// the gated residual update of the four streams. docs/numerics.md 8.
#include <cmath>

#include "kernels/fp.h"
#include "model/engram.h"
#include "model/forward_impl.h"
#include "model/linear.h"

namespace sluice {

void Engine::Impl::engram_ids(Chunk& ch, const SequenceState& s) const {
  const size_t ne = c.engram_layer_ids.size();
  const uint32_t cols = c.engram_columns(), N = c.engram_max_ngram_size;
  const int64_t pad = c.engram_pad_compressed();
  ch.tail = s.engram_tail;  // working copy: committed with the chunk
  ch.engram_rows.assign(ne, std::vector<uint64_t>((size_t)ch.n * cols));
  std::vector<int64_t> ids(N);
  for (uint32_t i = 0; i < ch.n; ++i) {
    // spec 4.3: a masked (non-text) position is DEAD, which makes all of its ids pad.
    const int64_t cur = ch.is_masked(i) ? kEngramDead : engram_compress(c, ch.tokens[i]);
    ids[0] = cur;
    for (uint32_t j = 1; j < N; ++j) ids[j] = ch.tail[j - 1];
    for (size_t e = 0; e < ne; ++e) {
      const std::span<const uint64_t> primes(c.engram_primes.data() + e * cols, cols);
      const std::span<const uint64_t> mult(c.engram_multipliers.data() + e * N, N);
      const std::vector<uint64_t> rows = engram_hash(ids, pad, primes, mult, c.engram_n_heads);
      std::copy(rows.begin(), rows.end(), ch.engram_rows[e].begin() + (size_t)i * cols);
      if (ch.tracing) ch.trace[i].engram_rows[e] = rows;
    }
    for (uint32_t j = N - 1; j > 1; --j) ch.tail[j - 1] = ch.tail[j - 2];
    if (N > 1) ch.tail[0] = cur;
  }
}

void Engine::Impl::engram(Chunk& ch, uint32_t L, float* X) const {
  const LayerWeights& w = m.layers[L];
  const int e = roles[L].engram_index;
  const uint32_t n = ch.n, H = c.hidden_size, hc = c.hc_mult, cols = c.engram_columns();
  const size_t ecols = (size_t)cols * c.engram_head_dim, kvw = (size_t)(hc + 1) * H;
  std::vector<float> E(n * ecols);
  engram_gather(m.file, *w.engram_table, c.engram_head_dim, ch.engram_rows[(size_t)e], E.data());
  std::vector<float> kv(n * kvw);
  lin(pool, w.engram_kv, E.data(), ecols, n, kv.data(), kvw, /*round=*/true);
  const float inv_sqrt_h = (float)(1.0 / std::sqrt((double)H));
  std::vector<float> wq(H);
  for (uint32_t h = 0; h < hc; ++h) {
    // The elementwise product of the two norm weights is formed first (spec 4.5).
    for (uint32_t k = 0; k < H; ++k) wq[k] = w.engram_q_norm[(size_t)h * H + k] * w.engram_k_norm[(size_t)h * H + k];
    for (uint32_t i = 0; i < n; ++i) {
      float* x = X + ((size_t)i * hc + h) * H;
      const float* key = kv.data() + i * kvw + (size_t)h * H;
      const float* val = kv.data() + i * kvw + (size_t)hc * H;
      float dot = 0.0f;
      for (uint32_t k = 0; k < H; ++k) dot += (x[k] * wq[k]) * key[k];
      dot *= rms_factor(x, H, c.rms_norm_eps);
      dot *= rms_factor(key, H, c.rms_norm_eps);
      dot *= inv_sqrt_h;
      const float sgn = dot > 0.0f ? 1.0f : (dot < 0.0f ? -1.0f : 0.0f);
      const float gate = ch.is_masked(i) ? 0.0f : sigmoid(sgn * std::sqrt(std::max(std::fabs(dot), 1e-6f)));
      for (uint32_t k = 0; k < H; ++k) x[k] = round_bf16(x[k] + gate * val[k]);
    }
  }
}

}  // namespace sluice
