// The SPIR-V the Vulkan backend runs: src/backend/shaders compiled by glslc at build time
// (CMakeLists.txt sluice_spirv) and embedded by vulkan_shaders.cpp. Only the Vulkan backend's
// files include it (built with SLUICE_HAVE_VULKAN).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/types.h"

namespace sluice::vk {

// A SPIR-V module: its words and size.
struct Spirv {
  const uint32_t* code;
  size_t bytes;
};

inline constexpr uint32_t kGroup = 64;  // local_size_x of the linear shaders

// The quantized weight types with a shader of their own: each gives the CPU's bits (the shader's
// header says why). The float formats share linear_float (kind 0/1/2), which needs shaderFloat64.
// A format's four builds (shaders/linear_main.glsl).
struct LinearBuilds {
  Spirv plain;  // an invocation per output
  Spirv sg;     // the subgroup build, one token
  Spirv sgt;    // the subgroup build, a tile of SLUICE_GPU_TOKEN_TILE tokens
  Spirv mm;     // the GEMM build, 64 rows and a tile of SLUICE_GPU_GEMM_TILE tokens per workgroup
};
struct QuantShader {
  GgmlType type;
  const char* name;
  LinearBuilds scalar;  // four codes' products added one by one
  LinearBuilds dot;     // the device's packed 4x8-bit dot product (GpuDevice::int_dot)
};
inline constexpr size_t kQuantShaderCount = 9;
extern const QuantShader kQuantShaders[];  // kQuantShaderCount of them

// Every other shader, one module each.
struct OpShaders {
  Spirv linear_float;
  Spirv linear_float_mm;  // its GEMM build (prefill)
  Spirv quantize_q8_0;
  Spirv quantize_q8_k;
  Spirv rms_norm;
  Spirv swiglu;
  Spirv exp_f32;
  Spirv hc_pre;
  Spirv hc_post;
  Spirv hc_mix;
  Spirv rope;
  Spirv attention;
  Spirv engram_gate;
  Spirv add_round;
  Spirv routed_sum;
  Spirv compress_pool;
  Spirv fake_quant;
  Spirv index_scores;
};
extern const OpShaders kOpShaders;

}  // namespace sluice::vk
