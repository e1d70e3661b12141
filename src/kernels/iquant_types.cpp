// STUB: to be replaced by the real implementation of this format group.
#include "kernels/groups.h"

namespace sluice {
std::span<const TypeTraits> iquant_type_rows() { return {}; }
}  // namespace sluice
namespace sluice { void quantize_row_q8_0(const float*, void*, int64_t) {} }
