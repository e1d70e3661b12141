// Q8_0 GEMM edge cases (the generic checks are kernels_gemm_test.cpp): the byte patterns and
// scales a quantizer does not produce but a file or an activation may hold, where a SIMD trick
// could lose exactness: -128 codes on either side, the largest fp16 scales, +-0, subnormal,
// Inf and NaN scales. Every (row, token) must be dot_q8_0_scalar's bits (memcmp), through
// ragged row tiles and across the kernels' K-chunks.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cpu.h"
#include "kernels/types.h"

namespace sluice {
namespace {

constexpr int kBlock = 34;

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// One Q8_0 row of nb blocks: block b has scale scale(b) and codes code(b, j).
std::vector<uint8_t> q8_0_row(int64_t nb, const std::function<uint16_t(int64_t)>& scale,
                              const std::function<int8_t(int64_t, int)>& code) {
  std::vector<uint8_t> v((size_t)nb * kBlock);
  for (int64_t b = 0; b < nb; ++b) {
    const uint16_t s = scale(b);
    std::memcpy(&v[(size_t)b * kBlock], &s, 2);
    for (int j = 0; j < 32; ++j) v[(size_t)b * kBlock + 2 + (size_t)j] = (uint8_t)code(b, j);
  }
  return v;
}

struct Case {
  std::string name;
  std::function<uint16_t(int64_t r, int64_t b)> wscale, ascale;
  std::function<int8_t(int64_t r, int64_t b, int j)> wcode, acode;
};

struct Gemm {
  Isa isa;
  GemmFn fn;
};

std::vector<Gemm> q8_0_gemms() {
  const TypeTraits& t = type_traits(GgmlType::Q8_0);
  std::vector<Gemm> v;
  if (detect_isa() >= Isa::Avx2 && t.gemm_avx2) v.push_back({Isa::Avx2, t.gemm_avx2});
  if (detect_isa() >= Isa::Avx512 && t.gemm_avx512) v.push_back({Isa::Avx512, t.gemm_avx512});
  return v;
}

// rows x tokens products over nb blocks, compared with the scalar dot by memcmp.
void check(const Case& c, int64_t rows, int64_t tokens, int64_t nb) {
  const TypeTraits& t = type_traits(GgmlType::Q8_0);
  const size_t row_bytes = (size_t)nb * kBlock;
  std::vector<uint8_t> w(1 + row_bytes * (size_t)rows);  // rows start one byte off alignment
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = q8_0_row(nb, [&](int64_t b) { return c.wscale(r, b); },
                              [&](int64_t b, int j) { return c.wcode(r, b, j); });
    std::memcpy(&w[1 + (size_t)r * row_bytes], row.data(), row_bytes);
  }
  std::vector<std::vector<uint8_t>> act;
  std::vector<const uint8_t*> ptr;
  for (int64_t k = 0; k < tokens; ++k)
    act.push_back(q8_0_row(nb, [&](int64_t b) { return c.ascale(k, b); },
                           [&](int64_t b, int j) { return c.acode(k, b, j); }));
  for (const auto& a : act) ptr.push_back(a.data());
  for (const Gemm& g : q8_0_gemms()) {
    const size_t ldy = (size_t)rows + 1;
    std::vector<float> y(ldy * (size_t)tokens, -7.0f);
    g.fn(w.data() + 1, row_bytes, rows, ptr.data(), tokens, nb * 32, y.data(), ldy);
    int bad = 0;
    for (int64_t k = 0; k < tokens; ++k)
      for (int64_t r = 0; r < rows && bad < 3; ++r) {
        const float want = t.dot_scalar(w.data() + 1 + (size_t)r * row_bytes, ptr[(size_t)k], nb * 32);
        const float got = y[(size_t)k * ldy + (size_t)r];
        uint32_t wb, gb;
        std::memcpy(&wb, &want, 4);
        std::memcpy(&gb, &got, 4);
        if (wb != gb) {
          ++bad;
          ADD_FAILURE() << c.name << " " << isa_name(g.isa) << " rows=" << rows << " blocks=" << nb << " (r=" << r
                        << ", t=" << k << "): got 0x" << std::hex << gb << " scalar 0x" << wb;
        }
      }
  }
}

void check_shapes(const Case& c) {
  // A ragged row tile, a token count that is not a multiple of the token groups, and a K that
  // spans more than one of the kernels' 32-block chunks.
  check(c, 17, 9, 3);
  check(c, 21, 5, 41);
  // One token (the decode path, rows read in place): a full tile, ragged ones, one row.
  check(c, 16, 1, 7);
  check(c, 37, 1, 41);
  check(c, 1, 1, 3);
}

uint16_t one(int64_t, int64_t) { return 0x3c00; }

TEST(GemmQ8_0, MinusOneTwentyEightCodesOnBothSides) {
  if (q8_0_gemms().empty()) GTEST_SKIP() << "no Q8_0 GEMM on this CPU";
  // All -128 against -128 (the product maddubs cannot hold, and the largest block sum), against
  // +-127, and mixed patterns that put -128 next to every other extreme.
  const int8_t ext[] = {-128, -127, 127, 0, 1, -1};
  check_shapes({"w=-128 x y=-128", one, one, [](int64_t, int64_t, int) { return (int8_t)-128; },
                [](int64_t, int64_t, int) { return (int8_t)-128; }});
  check_shapes({"w=-128 x y=+-127", one, one, [](int64_t, int64_t, int) { return (int8_t)-128; },
                [](int64_t k, int64_t b, int j) { return (int8_t)(((k + b + j) & 1) ? 127 : -127); }});
  check_shapes({"extreme mix", one, one,
                [&](int64_t r, int64_t b, int j) { return ext[mix((uint64_t)(r * 1000 + b * 32 + j)) % 6]; },
                [&](int64_t k, int64_t b, int j) { return ext[mix((uint64_t)(k * 7777 + b * 32 + j)) % 6]; }});
}

TEST(GemmQ8_0, LargestSubnormalAndZeroScales) {
  if (q8_0_gemms().empty()) GTEST_SKIP() << "no Q8_0 GEMM on this CPU";
  // 65504 (max fp16), its negative, the smallest subnormal, +0 and -0, mixed per block, with
  // extreme codes so that the scaled sums reach ~2e15 and cancel.
  const uint16_t sc[] = {0x7bff, 0xfbff, 0x0001, 0x0000, 0x8000, 0x3c00, 0x03ff};
  auto code = [](int64_t x, int64_t b, int j) { return (int8_t)(mix((uint64_t)(x * 131 + b * 32 + j)) & 0xff); };
  check_shapes({"scales mix", [&](int64_t r, int64_t b) { return sc[(r + 2 * b) % 7]; },
                [&](int64_t k, int64_t b) { return sc[(3 * k + b) % 7]; }, code, code});
  check_shapes({"max scales", [](int64_t, int64_t) { return (uint16_t)0x7bff; },
                [](int64_t k, int64_t) { return (uint16_t)(k & 1 ? 0xfbff : 0x7bff); },
                [](int64_t, int64_t, int) { return (int8_t)-128; }, [](int64_t, int64_t, int) { return (int8_t)127; }});
  check_shapes({"zero weight scales", [](int64_t r, int64_t) { return (uint16_t)(r & 1 ? 0x8000 : 0x0000); }, one, code,
                code});
}

TEST(GemmQ8_0, InfAndNanScalesPropagateLikeTheScalar) {
  if (q8_0_gemms().empty()) GTEST_SKIP() << "no Q8_0 GEMM on this CPU";
  // +-Inf weight scales (Inf * 0 sums, Inf - Inf across blocks), a quiet NaN with a payload and a
  // signalling NaN on the weight side only (one NaN operand per operation, so the scalar's
  // payload is defined), and Inf activation scales.
  auto code = [](int64_t x, int64_t b, int j) { return (int8_t)(mix((uint64_t)(x * 31 + b * 32 + j)) % 5) - 2; };
  check_shapes({"inf weight scales", [](int64_t r, int64_t b) { return (uint16_t)(((r + b) % 3 == 0) ? ((r & 1) ? 0xfc00 : 0x7c00) : 0x3c00); },
                one, code, code});
  check_shapes({"nan weight scale", [](int64_t r, int64_t b) { return (uint16_t)(b == r % 3 ? (r & 1 ? 0x7e55 : 0x7c01) : 0x3800); },
                one, code, code});
  check_shapes({"inf act scales", one, [](int64_t k, int64_t b) { return (uint16_t)(b == 1 && k % 2 ? 0xfc00 : 0x3c00); },
                code, code});
}

}  // namespace
}  // namespace sluice
