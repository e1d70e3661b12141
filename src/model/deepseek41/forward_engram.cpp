// Engram (spec 4): per-token row ids from the hashed n-gram history, rows read from the file,
// the gated residual update of the four streams. docs/numerics.md 8.
#include "model/deepseek41/engram.h"
#include "model/deepseek41/forward_impl.h"

namespace sluice {

void Engine::Impl::engram_ids(Pass& p) const {
  const size_t ne = c.engram_layer_ids.size();
  const uint32_t cols = c.engram_columns(), N = c.engram_max_ngram_size;
  const int64_t pad = c.engram_pad_compressed();
  p.engram_rows.assign(ne, std::vector<uint64_t>((size_t)p.n * cols));
  std::vector<int64_t> ids(N);
  for (size_t k = 0; k < p.parts.size(); ++k) {
    Chunk& ch = *p.parts[k];
    ch.tail = p.states[k]->engram_tail;  // working copy: committed with the chunk
    for (uint32_t i = 0; i < ch.n; ++i) {
      // spec 4.3: a masked (non-text) position is DEAD, which makes all of its ids pad.
      const int64_t cur = ch.is_masked(i) ? kEngramDead : engram_compress(c, ch.tokens[i]);
      ids[0] = cur;
      for (uint32_t j = 1; j < N; ++j) ids[j] = ch.tail[j - 1];
      for (size_t e = 0; e < ne; ++e) {
        const std::span<const uint64_t> primes(c.engram_primes.data() + e * cols, cols);
        const std::span<const uint64_t> mult(c.engram_multipliers.data() + e * N, N);
        const std::vector<uint64_t> rows = engram_hash(ids, pad, primes, mult, c.engram_n_heads);
        std::copy(rows.begin(), rows.end(), p.engram_rows[e].begin() + (size_t)(ch.row0 + i) * cols);
        if (ch.tracing) ch.trace[i].engram_rows[e] = rows;
      }
      for (uint32_t j = N - 1; j > 1; --j) ch.tail[j - 1] = ch.tail[j - 2];
      if (N > 1) ch.tail[0] = cur;
    }
  }
}

void Engine::Impl::engram(Pass& p, uint32_t L, Mat X) const {
  const LayerWeights& w = m.layers[L];
  const int e = roles[L].engram_index;
  const uint32_t n = p.n, hc = c.hc_mult;
  const Mat rows = ws(Ws::EngramRows, n), kv = ws(Ws::EngramKv, n);
  engram_stats += engram_gather(m.file, *w.engram_table, c.engram_head_dim, p.engram_rows[(size_t)e], rows.p,
                                kEngramStagingBytes, engram_cache.get(), (uint32_t)e);  // host-visible
  be.linear(w.engram_kv, rows, kv, /*round=*/true);
  be.engram_gate(X, hc, kv, w.engram_q_norm.data(), w.engram_k_norm.data(), c.rms_norm_eps, p.mask());
}

}  // namespace sluice
