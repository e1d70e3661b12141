#include "model/deepseek41/engram.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "model/deepseek41/engram_cache.h"
#include "model/deepseek41/primitives.h"
#include "util/error.h"

namespace sluice {

EngramReadStats engram_gather(const gguf::File& f, const gguf::TensorInfo& table, uint32_t head_dim,
                              std::span<const uint64_t> rows, float* out, size_t staging_bytes,
                              EngramRowCache* cache, uint32_t cache_table) {
  EngramReadStats st;
  st.requested = rows.size();
  const uint64_t rb = head_dim + head_dim / 32;
  if (table.ne[0] != rb)
    throw Error("Engram table " + table.name + " has rows of " + std::to_string(table.ne[0]) +
                " bytes, expected " + std::to_string(rb));
  const uint64_t n_rows = table.ne[1];
  // References sorted by row id: equal rows are adjacent (read once), and nearby rows are read
  // in file order.
  std::vector<uint32_t> refs(rows.size());
  for (uint32_t i = 0; i < refs.size(); ++i) refs[i] = i;
  std::sort(refs.begin(), refs.end(), [&](uint32_t a, uint32_t b) {
    return rows[a] != rows[b] ? rows[a] < rows[b] : a < b;
  });
  const size_t batch_rows = std::max<size_t>(1, staging_bytes / rb);
  std::vector<uint8_t> staging(batch_rows * rb);
  std::vector<float> decoded(head_dim);
  size_t i = 0;
  while (i < refs.size()) {
    // Collect up to batch_rows distinct rows: [i, j) references, unique ids in `ids`.
    std::vector<uint64_t> ids;
    size_t j = i;
    while (j < refs.size()) {
      const uint64_t r = rows[refs[j]];
      if (ids.empty() || ids.back() != r) {
        if (ids.size() == batch_rows) break;
        if (r >= n_rows)
          throw Error("Engram table " + table.name + ": row " + std::to_string(r) + " out of range (" +
                      std::to_string(n_rows) + " rows)");
        ids.push_back(r);
      }
      ++j;
    }
    ++st.batches;
    st.unique += ids.size();
    // Cached rows are copied; the rest are read, runs of consecutive missing rows in one pread.
    std::vector<uint8_t> hit(ids.size(), 0);
    if (cache)
      for (size_t a = 0; a < ids.size(); ++a)
        if (const uint8_t* p = cache->find(cache_table, ids[a])) {
          std::memcpy(staging.data() + a * rb, p, rb);
          hit[a] = 1;
          ++st.hits;
        }
    for (size_t a = 0; a < ids.size();) {
      if (hit[a]) {
        ++a;
        continue;
      }
      size_t b = a + 1;
      while (b < ids.size() && !hit[b] && ids[b] == ids[b - 1] + 1) ++b;
      f.read_bytes(table, ids[a] * rb, staging.data() + a * rb, (b - a) * rb);
      ++st.reads;
      st.bytes += (b - a) * rb;
      a = b;
    }
    if (cache)
      for (size_t a = 0; a < ids.size(); ++a)
        if (!hit[a]) cache->insert(cache_table, ids[a], staging.data() + a * rb);
    size_t slot = 0;
    for (size_t k = i; k < j; ++k) {
      const uint64_t r = rows[refs[k]];
      if (k == i || rows[refs[k - 1]] != r) {
        if (k != i) ++slot;
        if (!engram_decode_row(staging.data() + slot * rb, head_dim, decoded.data()))
          throw Error("Engram table " + table.name + ": row " + std::to_string(r) +
                      " has a NaN E4M3 code or an E8M0 scale of 255");
      }
      std::memcpy(out + (size_t)refs[k] * head_dim, decoded.data(), head_dim * sizeof(float));
    }
    i = j;
  }
  return st;
}

}  // namespace sluice
