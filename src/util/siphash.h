// SipHash-2-4 with a 128-bit tag (Aumasson and Bernstein), streaming: a keyed PRF, so a tag
// made with a secret key cannot be forged by whoever can write the tagged bytes. The state
// directory signs its files with it (runtime/state_disk.h); util/hash.h's Hasher, which is
// not keyed and not cryptographic, names them.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

#include "util/hash.h"

namespace sluice {

using SipKey = std::array<uint8_t, 16>;

class SipHash128 {
 public:
  explicit SipHash128(const SipKey& key);
  void update(const void* data, size_t n);
  Digest128 digest() const;  // of everything so far; the hasher can go on

 private:
  void compress(uint64_t m);
  uint64_t v_[4];
  uint64_t tail_ = 0, len_ = 0;
  unsigned tail_n_ = 0;
};

}  // namespace sluice
