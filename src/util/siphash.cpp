#include "util/siphash.h"

#include <bit>

namespace sluice {

namespace {

uint64_t load_le(const uint8_t* p) {
  uint64_t w = 0;
  for (int i = 7; i >= 0; --i) w = (w << 8) | p[i];
  return w;
}

void round(uint64_t* v) {
  v[0] += v[1], v[1] = std::rotl(v[1], 13), v[1] ^= v[0], v[0] = std::rotl(v[0], 32);
  v[2] += v[3], v[3] = std::rotl(v[3], 16), v[3] ^= v[2];
  v[0] += v[3], v[3] = std::rotl(v[3], 21), v[3] ^= v[0];
  v[2] += v[1], v[1] = std::rotl(v[1], 17), v[1] ^= v[2], v[2] = std::rotl(v[2], 32);
}

}  // namespace

SipHash128::SipHash128(const SipKey& key) {
  const uint64_t k0 = load_le(key.data()), k1 = load_le(key.data() + 8);
  v_[0] = k0 ^ 0x736f6d6570736575ull;
  v_[1] = k1 ^ 0x646f72616e646f6dull ^ 0xee;  // 0xee: the 128-bit variant
  v_[2] = k0 ^ 0x6c7967656e657261ull;
  v_[3] = k1 ^ 0x7465646279746573ull;
}

void SipHash128::compress(uint64_t m) {
  v_[3] ^= m;
  round(v_);
  round(v_);
  v_[0] ^= m;
}

void SipHash128::update(const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  len_ += n;
  while (n > 0 && tail_n_ > 0) {  // finish a partial word first
    tail_ |= (uint64_t)*p++ << (8 * tail_n_);
    --n;
    if (++tail_n_ == 8) {
      compress(tail_);
      tail_ = 0, tail_n_ = 0;
    }
  }
  for (; n >= 8; n -= 8, p += 8) compress(load_le(p));
  for (; n > 0; --n) tail_ |= (uint64_t)*p++ << (8 * tail_n_++);
}

Digest128 SipHash128::digest() const {
  SipHash128 h = *this;
  h.compress(h.tail_ | (h.len_ << 56));
  h.v_[2] ^= 0xee;
  for (int i = 0; i < 4; ++i) round(h.v_);
  const uint64_t lo = h.v_[0] ^ h.v_[1] ^ h.v_[2] ^ h.v_[3];
  h.v_[1] ^= 0xdd;
  for (int i = 0; i < 4; ++i) round(h.v_);
  const uint64_t hi = h.v_[0] ^ h.v_[1] ^ h.v_[2] ^ h.v_[3];
  Digest128 d;
  for (int i = 0; i < 8; ++i) d[i] = (uint8_t)(lo >> (8 * i)), d[8 + i] = (uint8_t)(hi >> (8 * i));
  return d;
}

}  // namespace sluice
