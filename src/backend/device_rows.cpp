#include "backend/device_rows.h"

#include <cstring>

#include "util/error.h"

namespace sluice {

DeviceRows::DeviceRows(uint64_t slots, size_t copy_bytes)
    : slots_(slots), copies_(slots * copy_bytes), copy_bytes_(copy_bytes) {
  if (slots >= (1u << 29)) throw Error("device rows: " + std::to_string(slots) + " slots, more than a list can name");
  index_.reserve(slots);
}

bool DeviceRows::find(std::span<const uint8_t> bytes, uint32_t tag, Found& out) {
  if (slots_.empty() || bytes.size() > copy_bytes_) return false;
  const Key key{bytes.data(), tag};
  uint8_t* copy = nullptr;
  if (auto it = index_.find(key); it != index_.end()) {
    Slot& s = slots_[it->second];
    copy = copies_.data() + (size_t)it->second * copy_bytes_;
    if (s.bytes == bytes.size() && std::memcmp(copy, bytes.data(), bytes.size()) == 0) {
      hold(s);
      s.recent = true;
      out = Found{it->second, true};
      return true;
    }
    // Rewritten since: a new slot, unless this batch does not read the old one (then refilled
    // in place; a batch that does keeps the old bytes where it reads them).
    if (s.batch != batch_) {
      std::memcpy(copy, bytes.data(), bytes.size());
      s.bytes = (uint32_t)bytes.size();
      hold(s);
      s.recent = true;
      out = Found{it->second, false};
      return true;
    }
    s.named = false;
    index_.erase(it);
  }
  // The clock: a slot this batch reads is passed over, a recently read one gets a second chance.
  // Two turns see every slot clear its mark, so a slot the batch does not read is found within them.
  if (held_ == slots_.size()) return false;
  for (size_t step = 0; step < 2 * slots_.size(); ++step) {
    ++steps_;
    const size_t i = hand_;
    hand_ = (hand_ + 1) % slots_.size();
    Slot& s = slots_[i];
    if (s.batch == batch_) continue;
    if (s.recent) {
      s.recent = false;
      continue;
    }
    if (s.named) index_.erase(s.key);
    s = Slot{key, (uint32_t)bytes.size(), 0, true, true};
    hold(s);
    std::memcpy(copies_.data() + i * copy_bytes_, bytes.data(), bytes.size());
    index_.emplace(key, (uint32_t)i);
    out = Found{(uint32_t)i, false};
    return true;
  }
  return false;
}

void DeviceRows::hold(Slot& s) {
  if (s.batch == batch_) return;
  s.batch = batch_;
  ++held_;
}

void DeviceRows::forget(uint32_t slot) {
  if (slot >= slots_.size()) return;
  Slot& s = slots_[slot];
  if (s.named) index_.erase(s.key);
  s.named = false;
  s.bytes = 0;
}

}  // namespace sluice
