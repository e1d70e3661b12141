// Shared by the linear shaders: the bindings, the push constants and exact bit-level helpers.
// Every output y[t][r] has the CPU backend's per-(row, token) operation sequence (docs/numerics.md
// 1-3): linear_float and the plain build of the others give it one invocation, the subgroup
// build (linear_main.glsl) a subgroup. Weights and activations are bound as raw bytes (uint
// words): Q8_0 blocks are 34 bytes, so nothing is aligned, and no 8/16-bit storage feature is
// required of the device.
#ifdef LINEAR_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_ballot : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#ifdef INT_DOT
#extension GL_EXT_spirv_intrinsics : require
#endif
layout(local_size_x = 64) in;

layout(std430, set = 0, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, set = 0, binding = 1) readonly buffer Acts { uint a[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Out { float y[]; };
// The IQ2 grids (kernels/iq_tables.h), uploaded once: words [0, 512) iq2xxs_grid, [512, 1536)
// iq2xs_grid, each entry two words (little-endian halves of the uint64).
layout(std430, set = 0, binding = 3) readonly buffer Tables { uint tables[]; };

layout(push_constant) uniform Push {
  uint rows;         // outputs per token (y row length)
  uint cols;         // the weight's columns
  uint n;            // tokens
  uint row0;         // first weight row
  uint w_row_bytes;  // bytes per weight row
  uint a_stride;     // bytes per activation row
  uint kind;         // linear_float: 0 F32, 1 F16, 2 BF16 weights (unused by the others)
  uint round_out;    // 1: round each output to BF16
  uint w_off;        // bytes from the binding's start to the weight's first row (imported pages)
  uint y_off;        // the first output's index in the binding (a column block of a wider row)
  uint y_stride;     // floats from one token's outputs to the next's
} p;

// The tokens a quantized linear's invocation or subgroup computes (linear_main.glsl): one, or a
// tile of TOKENS, each weight value decoded once for all of them.
#ifndef TOKENS
#define TOKENS 1
#endif

#ifdef LINEAR_GEMM
// The GEMM build (linear_main.glsl) reads the formats' bytes from workgroup memory, where the
// workgroup stages one block of GEMM_ROWS rows and of the tile's TOKENS tokens at a time: a
// block's bytes start anywhere in a word, so each takes its size in words plus two.
#define GEMM_ROWS 64u
#define W_WORDS (W_BLOCK / 4u + 2u)
#define A_WORDS (A_BLOCK / 4u + 2u)
shared uint sw[GEMM_ROWS * W_WORDS];
shared uint sa[TOKENS * A_WORDS];
uint w_byte(uint off) { return (sw[off >> 2] >> ((off & 3u) << 3)) & 0xffu; }
uint a_byte(uint off) { return (sa[off >> 2] >> ((off & 3u) << 3)) & 0xffu; }
int w_sbyte(uint off) { return bitfieldExtract(int(sw[off >> 2]), int((off & 3u) << 3), 8); }
int a_sbyte(uint off) { return bitfieldExtract(int(sa[off >> 2]), int((off & 3u) << 3), 8); }
uint w_word(uint off) {
  const uint i = off >> 2, sh = (off & 3u) << 3;
  return sh == 0u ? sw[i] : (sw[i] >> sh) | (sw[i + 1u] << (32u - sh));
}
uint a_word(uint off) {
  const uint i = off >> 2, sh = (off & 3u) << 3;
  return sh == 0u ? sa[i] : (sa[i] >> sh) | (sa[i + 1u] << (32u - sh));
}
#else
uint w_byte(uint off) { return (w[off >> 2] >> ((off & 3u) << 3)) & 0xffu; }
uint a_byte(uint off) { return (a[off >> 2] >> ((off & 3u) << 3)) & 0xffu; }
// Signed bytes (Q8_0 codes), sign-extended by bitfieldExtract.
int w_sbyte(uint off) { return bitfieldExtract(int(w[off >> 2]), int((off & 3u) << 3), 8); }
int a_sbyte(uint off) { return bitfieldExtract(int(a[off >> 2]), int((off & 3u) << 3), 8); }
// The four bytes from byte `off` on, whatever its alignment (the next word is read only when the
// bytes reach into it, so never past the block).
uint w_word(uint off) {
  const uint i = off >> 2, sh = (off & 3u) << 3;
  return sh == 0u ? w[i] : (w[i] >> sh) | (w[i + 1u] << (32u - sh));
}
uint a_word(uint off) {
  const uint i = off >> 2, sh = (off & 3u) << 3;
  return sh == 0u ? a[i] : (a[i] >> sh) | (a[i + 1u] << (32u - sh));
}
#endif

// The exact integer dot of four signed bytes packed in a word with four others: the formats form
// their weight codes four to a word (each code as a signed byte) and dot them with four
// activation codes at once. The INT_DOT builds use the device's instruction, OpSDot of
// SPV_KHR_integer_dot_product on 4x8-bit packed operands (opcode 4450; capabilities DotProduct
// 6019 and DotProductInput4x8BitPacked 6018; packed format 0, 4x8Bit): Debian 12's glslc has no
// GL_EXT_integer_dot_product, so it is declared through GL_EXT_spirv_intrinsics. The others add
// the four products. Both are exact integer sums, so the builds agree bit for bit.
#ifdef INT_DOT
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot_packed(int x, int y, spirv_literal int format);
int dot4(uint x, uint y) { return sdot_packed(int(x), int(y), 0); }
#else
int dot4(uint x, uint y) {
  int s = 0;
  for (int i = 0; i < 32; i += 8) s += bitfieldExtract(int(x), i, 8) * bitfieldExtract(int(y), i, 8);
  return s;
}
#endif
// Each byte of v minus the byte of c, no borrow crossing bytes: valid where every byte of v is
// below 128 and every byte of c at most 128 (the formats' codes less their offset: Q3_K's 4,
// Q6_K's 32, the ternary formats' 1), the result a signed byte.
uint sub_bytes(uint v, uint c) { return ((v | 0x80808080u) - c) ^ 0x80808080u; }
uint w_u16(uint off) { return w_byte(off) | (w_byte(off + 1u) << 8); }
uint a_u16(uint off) { return a_byte(off) | (a_byte(off + 1u) << 8); }
uint w_u32(uint off) { return w_u16(off) | (w_u16(off + 2u) << 16); }
uint a_u32(uint off) { return a_u16(off) | (a_u16(off + 2u) << 16); }
int a_s16(uint off) { return bitfieldExtract(int(a_u16(off)), 0, 16); }
// A Q8_K row's f32 scale (its bits, whatever the alignment).
float a_f32(uint off) { return uintBitsToFloat(a_u32(off)); }

// fp16 bits -> f32, exact for every value (subnormals built from their integer significand, so a
// device that flushes denormals in arithmetic still converts them right).
float half_to_float(uint h) {
  const uint s = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0u) {
    const float v = float(m) * 5.9604644775390625e-8;  // m * 2^-24: exact (m < 2^10)
    return s != 0u ? -v : v;
  }
  if (e == 31u) return uintBitsToFloat(s | 0x7f800000u | (m << 13));
  return uintBitsToFloat(s | ((e + 112u) << 23) | (m << 13));
}

#include "bf16.glsl"

// The one-scale block term of Q8_0, Q3_K, Q6_K, TQ2_0 and the IQ2 formats (kernels/iquant_types.h
// step_q8_0, step_iq2, step_tq2_0; kquant_blocks.h scaled_tail): (x * y) * isum, each operation
// correctly rounded and kept in order by `precise` (the two scales' product is the same float
// whichever comes first). The step adds it to the running sum (linear_main.glsl add_term).
float scaled_term(float x, float y, int isum) {
  precise float dd = x * y;
  precise float t = dd * float(isum);
  return t;
}

// Where each token of the tile has its activation row (bytes into Acts; in the GEMM build, its
// staged block in workgroup memory), and its codes.
uint tok[TOKENS];
uint a_tok4(uint t, uint off) { return a_word(tok[t] + off); }  // four codes from off on
int a16_tok(uint t, uint off) { return a_s16(tok[t] + off); }

void store_out(uint r, uint t, float v) { y[p.y_off + t * p.y_stride + r] = p.round_out != 0u ? round_bf16(v) : v; }
