// Which attention rows a GPU keeps in slots of its own memory (--gpu-kv): the raw window rows
// and the compressed rows (unpacked to BF16) that each decode step reads again. Without it, a
// batch stages every row its attention reads, which on a discrete card crosses the bus each
// step (a token of the published model reads about 640 rows a layer).
//
// A row is named by where its bytes lie in host memory and how they are read (a tag: raw BF16,
// or packed on a grid), and kept only with a copy of those bytes: a lookup is a hit only when
// the row's bytes are still the ones the slot was filled from. The sequence state is the host's
// and anything may rewrite it (the window ring wraps, a prefix restore or a rollback copies rows
// back); comparing the bytes makes a stale slot impossible without asking every writer to say
// so. The copies cost the host as much memory as the slots cost the device (a compressed row's
// copy is its packed bytes, smaller), and the plan counts both.
//
// A slot the batch being recorded reads is never given to another row before that batch is
// submitted (next_batch); among the others the clock hand picks one not used since it last
// passed (a second chance for rows read every step, the window's). No Vulkan here: the backend
// fills the slots, this only decides which.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace sluice {

class DeviceRows {
 public:
  DeviceRows() = default;
  // `slots` rows whose bytes (what a lookup compares) are at most `copy_bytes` each.
  DeviceRows(uint64_t slots, size_t copy_bytes);

  uint64_t slots() const { return slots_.size(); }
  uint64_t host_bytes() const { return copies_.size(); }

  struct Found {
    uint32_t slot = 0;
    bool hit = false;  // false: the caller fills the slot from `bytes` before the batch reads it
  };
  // The slot of the row whose bytes are `bytes` (at most copy_bytes) read as `tag`, kept for the
  // batch being recorded. A miss takes a slot and keeps the bytes as its copy. False when every
  // slot is kept for this batch (the caller stages the row instead).
  bool find(std::span<const uint8_t> bytes, uint32_t tag, Found& out);
  // The batch being recorded was submitted or dropped: its slots may be taken again.
  void next_batch() {
    ++batch_;
    held_ = 0;
  }
  // The slot's bytes never arrived (a failed submission carried its copy): forget its row.
  void forget(uint32_t slot);
  // Slots the clock hand has passed, over all lookups (what a miss costs; tests bound it).
  uint64_t clock_steps() const { return steps_; }

 private:
  struct Key {
    const uint8_t* p;
    uint32_t tag;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const noexcept {
      return std::hash<const void*>()(k.p) ^ ((size_t)k.tag * 0x9e3779b97f4a7c15ull);
    }
  };
  struct Slot {
    Key key{nullptr, 0};
    uint32_t bytes = 0;
    uint64_t batch = 0;  // the last batch that read it
    bool named = false, recent = false;
  };
  void hold(Slot& s);

  std::vector<Slot> slots_;
  std::vector<uint8_t> copies_;  // slot i's bytes at i * copy_bytes_
  size_t copy_bytes_ = 0;
  std::unordered_map<Key, uint32_t, KeyHash> index_;
  uint64_t batch_ = 1;
  uint64_t held_ = 0;  // slots the batch being recorded reads: all of them, and a miss is refused at once
  uint64_t steps_ = 0;
  size_t hand_ = 0;
};

}  // namespace sluice
