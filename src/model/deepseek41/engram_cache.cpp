#include "model/deepseek41/engram_cache.h"

#include <cstring>

#include "util/error.h"

namespace sluice {

uint64_t engram_cache_bytes(uint64_t rows_per_table, uint64_t n_tables, uint64_t row_bytes) {
  // Per row: its bytes, its key and two links, and an unordered_map node (next pointer, key,
  // value, cached hash: 32 bytes, rounded up to the allocator's 48) plus its bucket (8).
  const uint64_t per_row = row_bytes + 8 + 2 * 4 + 48 + 8;
  return n_tables * rows_per_table * per_row;
}

EngramRowCache::EngramRowCache(uint64_t rows_per_table, uint32_t n_tables, uint32_t row_bytes)
    : cap_(rows_per_table), row_bytes_(row_bytes), tables_(n_tables) {
  if (rows_per_table >= kNone) throw Error("Engram row cache: too many rows per table");
  for (Table& t : tables_) {
    t.slab.resize(cap_ * row_bytes_);
    t.key.resize(cap_);
    t.prev.resize(cap_);
    t.next.resize(cap_);
    t.index.reserve(cap_);
  }
}

void EngramRowCache::unlink(Table& t, uint32_t s) {
  if (t.prev[s] != kNone) t.next[t.prev[s]] = t.next[s];
  else t.head = t.next[s];
  if (t.next[s] != kNone) t.prev[t.next[s]] = t.prev[s];
  else t.tail = t.prev[s];
}

void EngramRowCache::push_front(Table& t, uint32_t s) {
  t.prev[s] = kNone;
  t.next[s] = t.head;
  if (t.head != kNone) t.prev[t.head] = s;
  t.head = s;
  if (t.tail == kNone) t.tail = s;
}

const uint8_t* EngramRowCache::find(uint32_t table, uint64_t row) {
  Table& t = tables_[table];
  const auto it = t.index.find(row);
  if (it == t.index.end()) return nullptr;
  const uint32_t s = it->second;
  if (t.head != s) {
    unlink(t, s);
    push_front(t, s);
  }
  return t.slab.data() + (size_t)s * row_bytes_;
}

void EngramRowCache::insert(uint32_t table, uint64_t row, const uint8_t* bytes) {
  if (cap_ == 0) return;
  Table& t = tables_[table];
  uint32_t s;
  if (t.used < cap_) {
    s = (uint32_t)t.used++;
  } else {  // the least recently used row gives up its slot
    s = t.tail;
    unlink(t, s);
    t.index.erase(t.key[s]);
  }
  t.key[s] = row;
  std::memcpy(t.slab.data() + (size_t)s * row_bytes_, bytes, row_bytes_);
  t.index.emplace(row, s);
  push_front(t, s);
}

}  // namespace sluice
