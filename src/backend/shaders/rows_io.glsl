// The operands of the row ops a deferred batch records (hc_pre, hc_post, hc_mix, compress_pool,
// the attention, the routed sums): rows the host staged with the batch in the activation buffer
// (binding 1), or rows the batch's earlier stages wrote in the output buffer (binding 2), where
// the op writes its own. An operand's place is a float index, bit 31 set for the output buffer
// (VulkanBackend::Operand). The activation buffer is seen as words too (su), for the lists and
// tables the host stages beside the rows and for BF16 rows two a word.
layout(std430, set = 0, binding = 1) readonly buffer Staged { float staged[]; };
layout(std430, set = 0, binding = 1) readonly buffer StagedWords { uint su[]; };
layout(std430, set = 0, binding = 2) buffer Rows { float rows[]; };

float rd(uint at) { return (at & 0x80000000u) != 0u ? rows[at & 0x7fffffffu] : staged[at]; }
