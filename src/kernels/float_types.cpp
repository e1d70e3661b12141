// STUB: to be replaced by the real implementation of this format group.
#include "kernels/groups.h"

namespace sluice {
std::span<const TypeTraits> float_type_rows() { return {}; }
}  // namespace sluice
