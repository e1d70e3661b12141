// numpy.random.default_rng(seed).integers(0, high, size=n, dtype=np.int64), bit for bit.
// The Engram hash multipliers are defined by this call in DeepSeek's reference, so sluice must
// reproduce NumPy's SeedSequence -> PCG64 -> bounded-integer chain exactly (numpy >= 1.17).
#include <cstdint>
#include <vector>

#include "model/deepseek41/config.h"
#include "util/error.h"

namespace sluice {
namespace {

__extension__ typedef unsigned __int128 u128;  // g++/clang builtin; -Wpedantic needs the marker

// SeedSequence: entropy words are hashed into a pool of 4 uint32 words, and generate_state
// hashes the pool again into the requested number of words (NumPy's hashmix/mix constants).
constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;
constexpr size_t kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

std::vector<uint64_t> seed_sequence_state_u64(uint64_t seed, size_t n_words64) {
  // An integer seed becomes its little-endian uint32 words (0 -> [0]).
  std::vector<uint32_t> entropy;
  if (seed == 0) entropy.push_back(0);
  for (uint64_t s = seed; s != 0; s >>= 32) entropy.push_back((uint32_t)s);

  uint32_t pool[kPoolSize];
  uint32_t hc = kInitA;
  for (size_t i = 0; i < kPoolSize; ++i) pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0, hc);
  for (size_t src = 0; src < kPoolSize; ++src)
    for (size_t dst = 0; dst < kPoolSize; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hc));
  for (size_t src = kPoolSize; src < entropy.size(); ++src)
    for (size_t dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src], hc));

  std::vector<uint64_t> out(n_words64, 0);
  uint32_t hb = kInitB;
  for (size_t i = 0; i < 2 * n_words64; ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= hb;
    hb *= kMultB;
    v *= hb;
    v ^= v >> kXShift;
    out[i / 2] |= (uint64_t)v << (32 * (i % 2));  // uint32 pairs viewed as little-endian uint64
  }
  return out;
}

// PCG64 (PCG-XSL-RR 128/64) as NumPy seeds it: state words [s_hi, s_lo, inc_hi, inc_lo].
struct Pcg64 {
  u128 state = 0, inc = 0;
  bool has_u32 = false;
  uint32_t u32_buf = 0;

  static constexpr u128 kMult = ((u128)0x2360ed051fc65da4ull << 64) | 0x4385df649fccf645ull;

  explicit Pcg64(uint64_t seed) {
    std::vector<uint64_t> w = seed_sequence_state_u64(seed, 4);
    u128 init_state = ((u128)w[0] << 64) | w[1];
    u128 init_seq = ((u128)w[2] << 64) | w[3];
    inc = (init_seq << 1) | 1;
    step();
    state += init_state;
    step();
  }
  void step() { state = state * kMult + inc; }
  uint64_t next64() {
    step();
    uint64_t x = (uint64_t)(state >> 64) ^ (uint64_t)state;
    unsigned rot = (unsigned)(state >> 122);
    return (x >> rot) | (x << ((64 - rot) & 63));
  }
  // NumPy hands out a 64-bit draw as two 32-bit draws, low half first.
  uint32_t next32() {
    if (has_u32) {
      has_u32 = false;
      return u32_buf;
    }
    uint64_t v = next64();
    has_u32 = true;
    u32_buf = (uint32_t)(v >> 32);
    return (uint32_t)v;
  }
};

// Lemire's nearly-divisionless bounded draw in [0, rng], as in NumPy's distributions.c.
uint64_t bounded_lemire_u64(Pcg64& g, uint64_t rng) {
  const uint64_t excl = rng + 1;
  u128 m = (u128)g.next64() * excl;
  uint64_t left = (uint64_t)m;
  if (left < excl) {
    const uint64_t threshold = (UINT64_MAX - rng) % excl;
    while (left < threshold) {
      m = (u128)g.next64() * excl;
      left = (uint64_t)m;
    }
  }
  return (uint64_t)(m >> 64);
}

uint32_t bounded_lemire_u32(Pcg64& g, uint32_t rng) {
  const uint32_t excl = rng + 1;
  uint64_t m = (uint64_t)g.next32() * excl;
  uint32_t left = (uint32_t)m;
  if (left < excl) {
    const uint32_t threshold = (UINT32_MAX - rng) % excl;
    while (left < threshold) {
      m = (uint64_t)g.next32() * excl;
      left = (uint32_t)m;
    }
  }
  return (uint32_t)(m >> 32);
}

}  // namespace

std::vector<uint64_t> numpy_default_rng_integers(uint64_t seed, uint64_t high, size_t n) {
  if (high == 0 || high > (uint64_t)INT64_MAX + 1)
    throw Error("numpy integers: high " + std::to_string(high) + " out of range for int64 [0, high)");
  Pcg64 g(seed);
  const uint64_t rng = high - 1;  // inclusive range, as NumPy computes it
  std::vector<uint64_t> out(n);
  for (auto& v : out) {
    // NumPy's dispatch: a zero range draws nothing; ranges that fit 32 bits use 32-bit draws.
    if (rng == 0) v = 0;
    else if (rng == 0xFFFFFFFFull) v = g.next32();
    else if (rng < 0xFFFFFFFFull) v = bounded_lemire_u32(g, (uint32_t)rng);
    else if (rng == UINT64_MAX) v = g.next64();
    else v = bounded_lemire_u64(g, rng);
  }
  return out;
}

}  // namespace sluice
