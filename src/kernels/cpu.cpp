#include "kernels/cpu.h"

#include <atomic>
#include <cpuid.h>
#include <cstdlib>
#include <cstring>

namespace sluice {
namespace {
std::atomic<int> g_override{-1};

// clang does not accept "f16c" in __builtin_cpu_supports; read CPUID leaf 1 (ECX bit 29).
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
}  // namespace

Isa detect_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      has_f16c() && __builtin_cpu_supports("bmi2");
    // The AVX-512 tier is Ice Lake's / Zen 4's: VNNI for the integer dots and VBMI's byte permutes
    // (IQ2 grid decoding); a Skylake-X or Cascade Lake core runs the AVX2 kernels.
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
    return avx512 ? Isa::Avx512 : avx2 ? Isa::Avx2 : Isa::Scalar;
  }();
  return isa;
}

static Isa cap(Isa want) { return (int)want < (int)detect_isa() ? want : detect_isa(); }

Isa active_isa() {
  const int o = g_override.load(std::memory_order_relaxed);
  if (o >= 0) return (Isa)o;
  static const Isa from_env = [] {
    const char* e = std::getenv("SLUICE_ISA");
    if (!e) return detect_isa();
    if (!std::strcmp(e, "scalar")) return Isa::Scalar;
    if (!std::strcmp(e, "avx2")) return cap(Isa::Avx2);
    return detect_isa();
  }();
  return from_env;
}

void set_active_isa(Isa isa) { g_override.store((int)cap(isa), std::memory_order_relaxed); }

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

DotFn dot_for(const TypeTraits& t, Isa isa) {
  isa = cap(isa);
  if (isa == Isa::Avx512 && t.dot_avx512) return t.dot_avx512;
  if (isa >= Isa::Avx2 && t.dot_avx2) return t.dot_avx2;
  return t.dot_scalar;
}

GemmFn gemm_for(const TypeTraits& t, Isa isa) {
  isa = cap(isa);
  if (isa == Isa::Avx512 && t.gemm_avx512) return t.gemm_avx512;
  if (isa >= Isa::Avx2 && t.gemm_avx2) return t.gemm_avx2;
  return nullptr;
}

}  // namespace sluice
