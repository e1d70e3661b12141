// Edge cases for the GEMMs of the routed experts' types, IQ2_XXS and Q2_K (x Q8_K): extreme
// codes and scales (every sub-block scale 15, grid index 255, every sign set, activation codes
// 127 / -127 / -128, zero / subnormal / max / infinite / NaN scales) and shapes that cross the
// kernels' K-chunks (8 blocks) and token groups (64 tokens). Every (row, token) must equal the
// scalar dot's bits, NaN payloads included: the GEMM repeats the scalar's float operations in its
// operand order, so even a NaN scale's payload comes out the same (iquant_types.h does not
// promise that across fp16 decoders, but both paths here use the same ones).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/types.h"

namespace sluice {
namespace {

constexpr int kQ8kBytes = 292;

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A Q8_K activation row of nb blocks: code(block, e), scale d(block); bsums are the codes' sums.
std::vector<uint8_t> q8k_row(int64_t nb, const std::function<int(int64_t, int)>& code,
                             const std::function<float(int64_t)>& d) {
  std::vector<uint8_t> a((size_t)nb * kQ8kBytes);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = a.data() + b * kQ8kBytes;
    const float db = d(b);
    std::memcpy(p, &db, 4);
    for (int k = 0; k < 16; ++k) {
      int16_t s = 0;
      for (int e = 16 * k; e < 16 * k + 16; ++e) {
        const int c = code(b, e);
        p[4 + e] = (uint8_t)(int8_t)c;
        s = (int16_t)(s + c);
      }
      std::memcpy(p + 260 + 2 * k, &s, 2);
    }
  }
  return a;
}

void put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
void put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

const TypeTraits& row_of(GgmlType t) { return type_traits(t); }

// The type's GEMMs this CPU can run, by ISA name.
std::vector<std::pair<std::string, GemmFn>> gemms_of(const TypeTraits& t) {
  std::vector<std::pair<std::string, GemmFn>> v;
  if (detect_isa() >= Isa::Avx2 && t.gemm_avx2) v.emplace_back("avx2", t.gemm_avx2);
  if (detect_isa() >= Isa::Avx512 && t.gemm_avx512) v.emplace_back("avx512", t.gemm_avx512);
  return v;
}

// Runs each of the type's GEMMs on all rows x all activations and compares with dot_scalar.
void expect_scalar_bits(const TypeTraits& t, const std::vector<uint8_t>& w, int64_t rows,
                        const std::vector<std::vector<uint8_t>>& acts, int64_t n, const std::string& what) {
  const auto gemms = gemms_of(t);
  ASSERT_FALSE(gemms.empty()) << t.name;
  for (const auto& [isa, gemm] : gemms) {
    const size_t stride = (size_t)(n / 256) * (size_t)t.block_bytes;
    ASSERT_EQ(w.size(), stride * (size_t)rows);
    std::vector<const uint8_t*> ptrs;
    for (const auto& a : acts) ptrs.push_back(a.data());
    const size_t ldy = (size_t)rows + 1;
    std::vector<float> y(ldy * acts.size(), -3.0f);
    gemm(w.data(), stride, rows, ptrs.data(), (int64_t)acts.size(), n, y.data(), ldy);
    // And each activation alone, as a decode step calls them (AVX-512: the one-token kernels,
    // gemv_*_avx512.cpp; AVX2: the tile path with one token).
    std::vector<float> one((size_t)rows);
    for (size_t tk = 0; tk < acts.size(); ++tk) {
      gemm(w.data(), stride, rows, &ptrs[tk], 1, n, one.data(), ldy);
      for (int64_t r = 0; r < rows; ++r) {
        const float a = one[(size_t)r], b = y[tk * ldy + (size_t)r];
        if (std::memcmp(&a, &b, 4) != 0 && !(std::isnan(a) && std::isnan(b))) {
          ADD_FAILURE() << t.name << " " << isa << " " << what << ", one token at (r=" << r << ", t=" << tk << "): got "
                        << std::hexfloat << a << " in a batch " << b;
          break;
        }
      }
    }
    int bad = 0;
    for (size_t tk = 0; tk < acts.size(); ++tk)
      for (int64_t r = 0; r < rows && bad < 4; ++r) {
        const float want = t.dot_scalar(w.data() + (size_t)r * stride, ptrs[tk], n);
        const float got = y[tk * ldy + (size_t)r];
        // Bits, except between NaNs: when two NaNs meet (Inf - Inf's default NaN and a propagated
        // one), which one an add or multiply returns depends on its operand order, and the
        // compiler may swap commutative operands (seen: the -O2 sanitizer build's scalar gave +nan
        // where the -O3 build and the GEMM give -nan). NaN must still be NaN on both sides.
        const bool same = std::memcmp(&want, &got, 4) == 0 || (std::isnan(want) && std::isnan(got));
        if (!same) {
          ++bad;
          ADD_FAILURE() << t.name << " " << isa << " " << what << " at (r=" << r << ", t=" << tk << "): got "
                        << std::hexfloat << got << " scalar " << want;
        }
      }
  }
}


// The activation sets: saturated codes of each sign, alternating 127 / -128, and random codes,
// with ordinary, zero, huge, infinite and NaN scales.
std::vector<std::vector<uint8_t>> extreme_acts(int64_t nb) {
  const int64_t last = nb - 1;  // the special scale sits in the last block (past a K-chunk for nb = 9)
  std::vector<std::vector<uint8_t>> v;
  const auto one = [](int64_t) { return 1.0f; };
  for (int c : {-128, 127, -127}) v.push_back(q8k_row(nb, [c](int64_t, int) { return c; }, one));
  v.push_back(q8k_row(nb, [](int64_t, int e) { return e % 2 ? -128 : 127; }, one));
  v.push_back(q8k_row(nb, [](int64_t b, int e) { return e % 3 ? 127 : (b % 2 ? -128 : -127); }, one));
  const float ds[] = {0.0f, -0.0f, 3e38f, INFINITY, -INFINITY, NAN, 1e-38f, -0.75f};
  for (float d : ds)
    v.push_back(q8k_row(
        nb, [](int64_t b, int e) { return (int)(mix((uint64_t)(b * 256 + e)) % 256) - 128; },
        [d, last](int64_t b) { return b == last ? d : 0.5f; }));
  return v;
}

// fp16 scales for row r: ordinary, zero, -0, subnormal, max, infinite, NaN.
uint16_t row_scale(int64_t r) {
  const uint16_t s[] = {0x3c00, 0x0000, 0x8000, 0x0001, 0x7bff, 0x7c00, 0xfc00, 0x7e00, 0xbc00};
  return s[r % 9];
}

// IQ2_XXS row-major weight: per block and sub-block the 4 grid indices, 4 sign indices and scale.
std::vector<uint8_t> iq2_weight(int64_t rows, int64_t nb, const std::function<uint16_t(int64_t, int64_t)>& d,
                                const std::function<void(int64_t, int64_t, int, int g[4], int s[4], int& sc)>& f) {
  std::vector<uint8_t> w((size_t)(rows * nb) * 66);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* p = w.data() + (size_t)(r * nb + b) * 66;
      put16(p, d(r, b));
      for (int ib = 0; ib < 8; ++ib) {
        int g[4], s[4], sc;
        f(r, b, ib, g, s, sc);
        uint32_t w0 = 0, w1 = (uint32_t)sc << 28;
        for (int l = 0; l < 4; ++l) {
          w0 |= (uint32_t)g[l] << (8 * l);
          w1 |= (uint32_t)s[l] << (7 * l);
        }
        put32(p + 2 + 8 * ib, w0);
        put32(p + 6 + 8 * ib, w1);
      }
    }
  return w;
}

TEST(GemmIq2, Iq2xxsExtremeCodesAndScales) {
  const TypeTraits& t = row_of(GgmlType::IQ2_XXS);
  if (gemms_of(t).empty()) GTEST_SKIP() << "no IQ2_XXS GEMM on this CPU";
  for (int64_t nb : {1, 9}) {
    const auto acts = extreme_acts(nb);
    // Every sub-block scale 15, grid index 255, sign index 127 (all eight signs set).
    const auto wmax = iq2_weight(17, nb, [](int64_t, int64_t) { return (uint16_t)0x3c00; },
                                 [](int64_t, int64_t, int, int g[4], int s[4], int& sc) {
                                   for (int l = 0; l < 4; ++l) g[l] = 255, s[l] = 127;
                                   sc = 15;
                                 });
    expect_scalar_bits(t, wmax, 17, acts, 256 * nb, "max codes");
    // Mixed: every grid and sign index over the rows, scales 0 and 15, special fp16 scales.
    const auto wmix = iq2_weight(
        33, nb, [](int64_t r, int64_t b) { return b == 0 ? row_scale(r) : (uint16_t)0x3800; },
        [](int64_t r, int64_t b, int ib, int g[4], int s[4], int& sc) {
          for (int l = 0; l < 4; ++l) {
            g[l] = (int)((r * 37 + b * 11 + ib * 4 + l) & 255);
            s[l] = (int)((r * 5 + ib * 4 + l) & 127);
          }
          sc = (ib + (int)r) % 2 ? 15 : 0;
        });
    expect_scalar_bits(t, wmix, 33, acts, 256 * nb, "mixed codes, special scales");
  }
}

// Q2_K row-major weight: scales byte (min << 4 | scale) and 2-bit codes per element.
std::vector<uint8_t> q2k_weight(int64_t rows, int64_t nb, const std::function<void(int64_t, int64_t, uint8_t*)>& f) {
  std::vector<uint8_t> w((size_t)(rows * nb) * 84);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < nb; ++b) f(r, b, w.data() + (size_t)(r * nb + b) * 84);
  return w;
}

TEST(GemmIq2, Q2kExtremeCodesAndScales) {
  const TypeTraits& t = row_of(GgmlType::Q2_K);
  if (gemms_of(t).empty()) GTEST_SKIP() << "no Q2_K GEMM on this CPU";
  for (int64_t nb : {1, 9}) {
    const auto acts = extreme_acts(nb);
    // Every scale and min 15, every code 3.
    const auto wmax = q2k_weight(17, nb, [](int64_t, int64_t, uint8_t* p) {
      std::memset(p, 0xff, 80);
      put16(p + 80, 0x3c00);
      put16(p + 82, 0x3c00);
    });
    expect_scalar_bits(t, wmax, 17, acts, 256 * nb, "max codes");
    // Mixed codes and scales, special d and dmin.
    const auto wmix = q2k_weight(33, nb, [](int64_t r, int64_t b, uint8_t* p) {
      for (int i = 0; i < 80; ++i) p[i] = (uint8_t)mix((uint64_t)(r * 1000 + b * 100 + i));
      p[0] = 0xff;
      p[1] = 0x0f;
      p[2] = 0xf0;
      put16(p + 80, b == 0 ? row_scale(r) : (uint16_t)0x3800);
      put16(p + 82, b == 0 ? row_scale(r + 4) : (uint16_t)0x3400);
    });
    expect_scalar_bits(t, wmix, 33, acts, 256 * nb, "mixed codes, special scales");
  }
}

// Random valid blocks over shapes that cross the K-chunks and the 64-token groups, with
// activation bsums that disagree with the codes (the Q2_K scalar reads the stored ones).
TEST(GemmIq2, RandomAcrossChunksAndTokenGroups) {
  if (gemms_of(row_of(GgmlType::IQ2_XXS)).empty() && gemms_of(row_of(GgmlType::Q2_K)).empty())
    GTEST_SKIP() << "no IQ2_XXS or Q2_K GEMM on this CPU";
  for (GgmlType ty : {GgmlType::IQ2_XXS, GgmlType::Q2_K}) {
    const TypeTraits& t = row_of(ty);
    if (gemms_of(t).empty()) continue;
    for (int64_t nb : {8, 9, 17}) {
      const int64_t rows = 35;
      std::vector<uint8_t> w((size_t)(rows * nb) * (size_t)t.block_bytes);
      t.random(w.data(), rows * nb, (uint64_t)nb, 0.5f);
      for (int64_t tokens : {4, 64, 70}) {
        std::vector<std::vector<uint8_t>> acts;
        for (int64_t k = 0; k < tokens; ++k) {
          auto a = q8k_row(
              nb, [k](int64_t b, int e) { return (int)(mix((uint64_t)(k * 7777 + b * 256 + e)) % 256) - 128; },
              [k](int64_t b) { return 0.01f * (float)(1 + (k + b) % 7); });
          if (k % 5 == 2) a[260] ^= 0x55;  // a bsum that is not the codes' sum
          acts.push_back(std::move(a));
        }
        expect_scalar_bits(t, w, rows, acts, 256 * nb,
                           std::string(t.name) + " nb=" + std::to_string(nb) + " tokens=" + std::to_string(tokens));
      }
    }
  }
}

}  // namespace
}  // namespace sluice
