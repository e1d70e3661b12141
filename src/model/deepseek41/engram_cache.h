// A bounded cache of Engram rows, as the file holds them (E4M3 codes + E8M0 scales, not
// decoded), least recently used first out, one share per table so a busy table cannot evict the
// other's rows. Hashed n-grams repeat wherever text does (code, an agent's re-sent context), and
// each miss is a random small read from a 189 GiB table, so rows that came from the disk once are
// kept: a hit is a copy, never a different value. Every byte is allocated at construction
// (engram_cache_bytes() is what admission accounts).
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace sluice {

// What an EngramRowCache of rows_per_table rows in each of n_tables tables of row_bytes holds:
// the row slab, keys and LRU links, and the index's nodes and buckets (an upper bound).
uint64_t engram_cache_bytes(uint64_t rows_per_table, uint64_t n_tables, uint64_t row_bytes);

class EngramRowCache {
 public:
  EngramRowCache(uint64_t rows_per_table, uint32_t n_tables, uint32_t row_bytes);
  // The cached bytes of the row (valid until the next insert), or null. A hit becomes the most
  // recently used row of its table.
  const uint8_t* find(uint32_t table, uint64_t row);
  // A copy of the row's row_bytes; evicts the table's least recently used row when it is full.
  // The row must not be cached already.
  void insert(uint32_t table, uint64_t row, const uint8_t* bytes);
  uint64_t rows_per_table() const { return cap_; }
  uint64_t size(uint32_t table) const { return tables_[table].used; }

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  struct Table {
    std::vector<uint8_t> slab;       // cap x row_bytes
    std::vector<uint64_t> key;       // row id per slot
    std::vector<uint32_t> prev, next;  // LRU list: head = most recent
    std::unordered_map<uint64_t, uint32_t> index;
    uint32_t head = kNone, tail = kNone;
    uint64_t used = 0;
  };
  void unlink(Table& t, uint32_t s);
  void push_front(Table& t, uint32_t s);
  uint64_t cap_;
  uint32_t row_bytes_;
  std::vector<Table> tables_;
};

}  // namespace sluice
