// The operands of the row ops a deferred batch records (hc_pre, hc_post, hc_mix, compress_pool,
// the attention, the routed sums): rows the host staged with the batch in the activation buffer
// (binding 1), or rows the batch's earlier stages wrote in the output buffer (binding 4, read
// only), where the op writes its own (binding 2). An operand's place is a float index into its
// buffer, bit 31 set for the output buffer (VulkanBackend::Operand). The activation buffer is
// seen as words too (SU), for the lists and tables the host stages beside the rows and for BF16
// rows two a word.
//
// Each binding spans only what the op reads or writes there (the host's row_op), so that the
// dispatches of one stage bind disjoint ranges; places stay indices into the whole buffers, and
// the push constants say where each binding starts (base_staged, base_in, base_out: floats).
// Included after the shader's push constants, which end with those three.
layout(std430, set = 0, binding = 1) readonly buffer Staged { float staged[]; };
layout(std430, set = 0, binding = 1) readonly buffer StagedWords { uint su[]; };
layout(std430, set = 0, binding = 2) buffer Rows { float rows[]; };
layout(std430, set = 0, binding = 4) readonly buffer RowsIn { float rows_in[]; };

#define SU(i) su[(i) - p.base_staged]
#define IN(i) rows_in[(i) - p.base_in]
#define OUT(i) rows[(i) - p.base_out]

float rd(uint at) { return (at & 0x80000000u) != 0u ? IN(at & 0x7fffffffu) : staged[at - p.base_staged]; }
