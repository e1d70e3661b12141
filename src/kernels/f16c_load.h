// fp16 at p as f32 through F16C's vcvtph2ps (exact), for files compiled with -mf16c only: an
// inlined conversion instead of a call into kquant_f16(), whose vzeroupper and spills cost about
// as much as the rest of a Q2_K block's arithmetic in the GEMV.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace sluice {
namespace {

inline float f16c_at(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return _cvtsh_ss(v);
}

}  // namespace
}  // namespace sluice
