// Built only with the Vulkan backend (CMakeLists.txt sets SLUICE_HAVE_VULKAN on vulkan_*.cpp).
#if SLUICE_HAVE_VULKAN
#include "backend/vulkan_shaders.h"

#include <iterator>

namespace sluice::vk {

namespace {

// SPIR-V compiled from src/backend/shaders at build time (glslc -mfmt=num).
const uint32_t kLinearQ8_0[] = {
#include "linear_q8_0.spv.inc"
};
const uint32_t kLinearFloat[] = {
#include "linear_float.spv.inc"
};
const uint32_t kLinearFloatMm[] = {
#include "linear_float_mm.spv.inc"
};
const uint32_t kLinearQ2_K[] = {
#include "linear_q2_k.spv.inc"
};
const uint32_t kLinearQ3_K[] = {
#include "linear_q3_k.spv.inc"
};
const uint32_t kLinearQ4_K[] = {
#include "linear_q4_k.spv.inc"
};
const uint32_t kLinearQ6_K[] = {
#include "linear_q6_k.spv.inc"
};
const uint32_t kLinearIq2Xxs[] = {
#include "linear_iq2_xxs.spv.inc"
};
const uint32_t kLinearIq2Xs[] = {
#include "linear_iq2_xs.spv.inc"
};
const uint32_t kLinearTq2_0[] = {
#include "linear_tq2_0.spv.inc"
};
const uint32_t kLinearQ2_0[] = {
#include "linear_q2_0.spv.inc"
};
// Their subgroup builds (shaders/linear_main.glsl): a subgroup per output, and per row and tile of
// kTokenTile tokens.
const uint32_t kLinearQ8_0Sg[] = {
#include "linear_q8_0_sg.spv.inc"
};
const uint32_t kLinearQ2_KSg[] = {
#include "linear_q2_k_sg.spv.inc"
};
const uint32_t kLinearQ3_KSg[] = {
#include "linear_q3_k_sg.spv.inc"
};
const uint32_t kLinearQ4_KSg[] = {
#include "linear_q4_k_sg.spv.inc"
};
const uint32_t kLinearQ6_KSg[] = {
#include "linear_q6_k_sg.spv.inc"
};
const uint32_t kLinearIq2XxsSg[] = {
#include "linear_iq2_xxs_sg.spv.inc"
};
const uint32_t kLinearIq2XsSg[] = {
#include "linear_iq2_xs_sg.spv.inc"
};
const uint32_t kLinearTq2_0Sg[] = {
#include "linear_tq2_0_sg.spv.inc"
};
const uint32_t kLinearQ2_0Sg[] = {
#include "linear_q2_0_sg.spv.inc"
};
const uint32_t kLinearQ8_0Sgt[] = {
#include "linear_q8_0_sgt.spv.inc"
};
const uint32_t kLinearQ2_KSgt[] = {
#include "linear_q2_k_sgt.spv.inc"
};
const uint32_t kLinearQ3_KSgt[] = {
#include "linear_q3_k_sgt.spv.inc"
};
const uint32_t kLinearQ4_KSgt[] = {
#include "linear_q4_k_sgt.spv.inc"
};
const uint32_t kLinearQ6_KSgt[] = {
#include "linear_q6_k_sgt.spv.inc"
};
const uint32_t kLinearIq2XxsSgt[] = {
#include "linear_iq2_xxs_sgt.spv.inc"
};
const uint32_t kLinearIq2XsSgt[] = {
#include "linear_iq2_xs_sgt.spv.inc"
};
const uint32_t kLinearTq2_0Sgt[] = {
#include "linear_tq2_0_sgt.spv.inc"
};
const uint32_t kLinearQ2_0Sgt[] = {
#include "linear_q2_0_sgt.spv.inc"
};
// Their GEMM builds: a workgroup per 64 rows and tile of kGemmTile tokens.
const uint32_t kLinearQ8_0Mm[] = {
#include "linear_q8_0_mm.spv.inc"
};
const uint32_t kLinearQ2_KMm[] = {
#include "linear_q2_k_mm.spv.inc"
};
const uint32_t kLinearQ3_KMm[] = {
#include "linear_q3_k_mm.spv.inc"
};
const uint32_t kLinearQ4_KMm[] = {
#include "linear_q4_k_mm.spv.inc"
};
const uint32_t kLinearQ6_KMm[] = {
#include "linear_q6_k_mm.spv.inc"
};
const uint32_t kLinearIq2XxsMm[] = {
#include "linear_iq2_xxs_mm.spv.inc"
};
const uint32_t kLinearIq2XsMm[] = {
#include "linear_iq2_xs_mm.spv.inc"
};
const uint32_t kLinearTq2_0Mm[] = {
#include "linear_tq2_0_mm.spv.inc"
};
const uint32_t kLinearQ2_0Mm[] = {
#include "linear_q2_0_mm.spv.inc"
};
// The same four builds with the device's integer dot product (INT_DOT, shaders/linear_common.glsl dot4).
const uint32_t kLinearQ8_0Dp[] = {
#include "linear_q8_0_dp.spv.inc"
};
const uint32_t kLinearQ8_0SgDp[] = {
#include "linear_q8_0_sg_dp.spv.inc"
};
const uint32_t kLinearQ8_0SgtDp[] = {
#include "linear_q8_0_sgt_dp.spv.inc"
};
const uint32_t kLinearQ8_0MmDp[] = {
#include "linear_q8_0_mm_dp.spv.inc"
};
const uint32_t kLinearQ2_KDp[] = {
#include "linear_q2_k_dp.spv.inc"
};
const uint32_t kLinearQ2_KSgDp[] = {
#include "linear_q2_k_sg_dp.spv.inc"
};
const uint32_t kLinearQ2_KSgtDp[] = {
#include "linear_q2_k_sgt_dp.spv.inc"
};
const uint32_t kLinearQ2_KMmDp[] = {
#include "linear_q2_k_mm_dp.spv.inc"
};
const uint32_t kLinearQ3_KDp[] = {
#include "linear_q3_k_dp.spv.inc"
};
const uint32_t kLinearQ3_KSgDp[] = {
#include "linear_q3_k_sg_dp.spv.inc"
};
const uint32_t kLinearQ3_KSgtDp[] = {
#include "linear_q3_k_sgt_dp.spv.inc"
};
const uint32_t kLinearQ3_KMmDp[] = {
#include "linear_q3_k_mm_dp.spv.inc"
};
const uint32_t kLinearQ4_KDp[] = {
#include "linear_q4_k_dp.spv.inc"
};
const uint32_t kLinearQ4_KSgDp[] = {
#include "linear_q4_k_sg_dp.spv.inc"
};
const uint32_t kLinearQ4_KSgtDp[] = {
#include "linear_q4_k_sgt_dp.spv.inc"
};
const uint32_t kLinearQ4_KMmDp[] = {
#include "linear_q4_k_mm_dp.spv.inc"
};
const uint32_t kLinearQ6_KDp[] = {
#include "linear_q6_k_dp.spv.inc"
};
const uint32_t kLinearQ6_KSgDp[] = {
#include "linear_q6_k_sg_dp.spv.inc"
};
const uint32_t kLinearQ6_KSgtDp[] = {
#include "linear_q6_k_sgt_dp.spv.inc"
};
const uint32_t kLinearQ6_KMmDp[] = {
#include "linear_q6_k_mm_dp.spv.inc"
};
const uint32_t kLinearIq2XxsDp[] = {
#include "linear_iq2_xxs_dp.spv.inc"
};
const uint32_t kLinearIq2XxsSgDp[] = {
#include "linear_iq2_xxs_sg_dp.spv.inc"
};
const uint32_t kLinearIq2XxsSgtDp[] = {
#include "linear_iq2_xxs_sgt_dp.spv.inc"
};
const uint32_t kLinearIq2XxsMmDp[] = {
#include "linear_iq2_xxs_mm_dp.spv.inc"
};
const uint32_t kLinearIq2XsDp[] = {
#include "linear_iq2_xs_dp.spv.inc"
};
const uint32_t kLinearIq2XsSgDp[] = {
#include "linear_iq2_xs_sg_dp.spv.inc"
};
const uint32_t kLinearIq2XsSgtDp[] = {
#include "linear_iq2_xs_sgt_dp.spv.inc"
};
const uint32_t kLinearIq2XsMmDp[] = {
#include "linear_iq2_xs_mm_dp.spv.inc"
};
const uint32_t kLinearTq2_0Dp[] = {
#include "linear_tq2_0_dp.spv.inc"
};
const uint32_t kLinearTq2_0SgDp[] = {
#include "linear_tq2_0_sg_dp.spv.inc"
};
const uint32_t kLinearTq2_0SgtDp[] = {
#include "linear_tq2_0_sgt_dp.spv.inc"
};
const uint32_t kLinearTq2_0MmDp[] = {
#include "linear_tq2_0_mm_dp.spv.inc"
};
const uint32_t kLinearQ2_0Dp[] = {
#include "linear_q2_0_dp.spv.inc"
};
const uint32_t kLinearQ2_0SgDp[] = {
#include "linear_q2_0_sg_dp.spv.inc"
};
const uint32_t kLinearQ2_0SgtDp[] = {
#include "linear_q2_0_sgt_dp.spv.inc"
};
const uint32_t kLinearQ2_0MmDp[] = {
#include "linear_q2_0_mm_dp.spv.inc"
};
const uint32_t kQuantizeQ8_0[] = {
#include "quantize_q8_0.spv.inc"
};
const uint32_t kQuantizeQ8_K[] = {
#include "quantize_q8_k.spv.inc"
};
const uint32_t kRmsNorm[] = {
#include "rms_norm.spv.inc"
};
const uint32_t kSwiglu[] = {
#include "swiglu.spv.inc"
};
const uint32_t kExpF32[] = {
#include "exp_f32.spv.inc"
};
const uint32_t kHcPre[] = {
#include "hc_pre.spv.inc"
};
const uint32_t kHcPost[] = {
#include "hc_post.spv.inc"
};
const uint32_t kHcMix[] = {
#include "hc_mix.spv.inc"
};
const uint32_t kRope[] = {
#include "rope.spv.inc"
};
const uint32_t kAttention[] = {
#include "attention.spv.inc"
};
const uint32_t kEngramGate[] = {
#include "engram_gate.spv.inc"
};
const uint32_t kAddRound[] = {
#include "add_round.spv.inc"
};
const uint32_t kRoutedSum[] = {
#include "routed_sum.spv.inc"
};
const uint32_t kCompressPool[] = {
#include "compress_pool.spv.inc"
};
const uint32_t kFakeQuant[] = {
#include "fake_quant.spv.inc"
};
const uint32_t kIndexScores[] = {
#include "index_scores.spv.inc"
};

}  // namespace

#define SLUICE_SPIRV(words) Spirv{words, sizeof words}
#define SLUICE_BUILDS(c, d) \
  LinearBuilds { SLUICE_SPIRV(kLinear##c##d), SLUICE_SPIRV(kLinear##c##Sg##d), SLUICE_SPIRV(kLinear##c##Sgt##d), SLUICE_SPIRV(kLinear##c##Mm##d) }
#define SLUICE_QUANT(t, n, c) QuantShader{GgmlType::t, n, SLUICE_BUILDS(c, ), SLUICE_BUILDS(c, Dp)}
const QuantShader kQuantShaders[] = {
    SLUICE_QUANT(Q8_0, "linear_q8_0", Q8_0),
    SLUICE_QUANT(Q2_K, "linear_q2_k", Q2_K),
    SLUICE_QUANT(Q3_K, "linear_q3_k", Q3_K),
    SLUICE_QUANT(Q4_K, "linear_q4_k", Q4_K),
    SLUICE_QUANT(Q6_K, "linear_q6_k", Q6_K),
    SLUICE_QUANT(IQ2_XXS, "linear_iq2_xxs", Iq2Xxs),
    SLUICE_QUANT(IQ2_XS, "linear_iq2_xs", Iq2Xs),
    SLUICE_QUANT(TQ2_0, "linear_tq2_0", Tq2_0),
    SLUICE_QUANT(Q2_0, "linear_q2_0", Q2_0),
};
#undef SLUICE_QUANT
#undef SLUICE_BUILDS
#undef SLUICE_SPIRV
static_assert(std::size(kQuantShaders) == kQuantShaderCount);

#define SLUICE_SPIRV(words) Spirv{words, sizeof words}
const OpShaders kOpShaders{
    .linear_float = SLUICE_SPIRV(kLinearFloat),
    .linear_float_mm = SLUICE_SPIRV(kLinearFloatMm),
    .quantize_q8_0 = SLUICE_SPIRV(kQuantizeQ8_0),
    .quantize_q8_k = SLUICE_SPIRV(kQuantizeQ8_K),
    .rms_norm = SLUICE_SPIRV(kRmsNorm),
    .swiglu = SLUICE_SPIRV(kSwiglu),
    .exp_f32 = SLUICE_SPIRV(kExpF32),
    .hc_pre = SLUICE_SPIRV(kHcPre),
    .hc_post = SLUICE_SPIRV(kHcPost),
    .hc_mix = SLUICE_SPIRV(kHcMix),
    .rope = SLUICE_SPIRV(kRope),
    .attention = SLUICE_SPIRV(kAttention),
    .engram_gate = SLUICE_SPIRV(kEngramGate),
    .add_round = SLUICE_SPIRV(kAddRound),
    .routed_sum = SLUICE_SPIRV(kRoutedSum),
    .compress_pool = SLUICE_SPIRV(kCompressPool),
    .fake_quant = SLUICE_SPIRV(kFakeQuant),
    .index_scores = SLUICE_SPIRV(kIndexScores),
};
#undef SLUICE_SPIRV

}  // namespace sluice::vk
#endif
