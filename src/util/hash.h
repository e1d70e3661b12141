// A streaming 128-bit hash (four 64-bit accumulators, word i of the 8-byte little-endian words
// going to accumulator i mod 4, so four multiply chains run at once) for
// content addresses and file checksums. Not cryptographic: it catches flipped bytes, truncation
// and accidental collisions; whatever is found by its address is verified against what it
// claims to hold (runtime/state_file.h compares the tokens).
#pragma once
#include <array>
#include <string_view>
#include <cstddef>
#include <cstdint>

namespace sluice {

using Digest128 = std::array<uint8_t, 16>;

class Hasher {
 public:
  explicit Hasher(uint64_t seed = 0);
  void update(const void* data, size_t n);
  // Of everything given so far; the hasher can go on (a digest of each prefix of one stream).
  Digest128 digest() const;

 private:
  void word(uint64_t w);
  uint64_t acc_[4];
  uint64_t words_ = 0, len_ = 0, tail_ = 0;  // words_: full words taken
  unsigned tail_n_ = 0;  // bytes in tail_
};

// Lowercase hex, 32 characters.
std::array<char, 33> digest_hex(const Digest128& d);
// The inverse: false unless hex is exactly 32 lowercase hex digits.
bool parse_digest_hex(std::string_view hex, Digest128* d);

}  // namespace sluice
