#include "util/hash.h"

#include <cstring>

namespace sluice {
namespace {

constexpr uint64_t K1 = 0x9E3779B97F4A7C15ull, K2 = 0xC2B2AE3D27D4EB4Full, K3 = 0x165667B19E3779F9ull,
                   K4 = 0xD6E8FEB86659FD93ull;

constexpr uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Every input bit reaches every output bit (the splitmix64 finalizer).
constexpr uint64_t fmix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

constexpr uint64_t step(uint64_t acc, uint64_t w) { return rotl(acc ^ (w * K1), 31) * K2; }

Hasher::Hasher(uint64_t seed) {
  for (uint64_t i = 0; i < 4; ++i) acc_[i] = fmix(seed + (i + 1) * K3 + K4);
}

void Hasher::word(uint64_t w) {
  uint64_t& a = acc_[words_ & 3];
  a = step(a, w);
  ++words_;
}

void Hasher::update(const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  len_ += n;
  while (n && tail_n_) {  // finish a partial word first
    tail_ |= (uint64_t)*p++ << (8 * tail_n_);
    --n;
    if (++tail_n_ == 8) word(tail_), tail_ = 0, tail_n_ = 0;
  }
  while (n >= 8 && (words_ & 3)) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian hosts (x86-64, arm64)
    word(w);
    p += 8, n -= 8;
  }
  uint64_t a0 = acc_[0], a1 = acc_[1], a2 = acc_[2], a3 = acc_[3];
  for (; n >= 32; p += 32, n -= 32) {
    uint64_t w[4];
    std::memcpy(w, p, 32);
    a0 = step(a0, w[0]), a1 = step(a1, w[1]), a2 = step(a2, w[2]), a3 = step(a3, w[3]);
    words_ += 4;
  }
  acc_[0] = a0, acc_[1] = a1, acc_[2] = a2, acc_[3] = a3;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    word(w);
  }
  for (; n; --n) tail_ |= (uint64_t)*p++ << (8 * tail_n_++);
}

Digest128 Hasher::digest() const {
  Hasher h = *this;
  h.word(h.tail_ ^ ((uint64_t)h.tail_n_ << 56));
  h.word(h.len_);
  const uint64_t* a = h.acc_;
  const uint64_t x = fmix(fmix(fmix(fmix(a[0] ^ K3) + a[1]) ^ a[2]) + a[3]);
  const uint64_t y = fmix(fmix(fmix(fmix(a[3] ^ K4) + a[2]) ^ a[1]) + a[0]);
  Digest128 d;
  std::memcpy(d.data(), &x, 8);
  std::memcpy(d.data() + 8, &y, 8);
  return d;
}

bool parse_digest_hex(std::string_view hex, Digest128* d) {
  if (hex.size() != 32) return false;
  auto nibble = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  for (size_t i = 0; i < 16; ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*d)[i] = (uint8_t)(hi << 4 | lo);
  }
  return true;
}

std::array<char, 33> digest_hex(const Digest128& d) {
  static const char* hex = "0123456789abcdef";
  std::array<char, 33> s{};
  for (size_t i = 0; i < 16; ++i) s[2 * i] = hex[d[i] >> 4], s[2 * i + 1] = hex[d[i] & 15];
  return s;
}

}  // namespace sluice
