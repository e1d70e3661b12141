// The two type tables agree: every row of the kernels' table repeats its type's geometry from the
// format table (format/tensor_type.h), and every type the format knows has a kernels row (with
// or without kernels), so a GGUF the reader accepts can always be sized and named.
#include <gtest/gtest.h>

#include "format/tensor_type.h"
#include "kernels/types.h"
#include "util/error.h"

namespace sluice {
namespace {

TEST(TypeTable, GeometryIsTheFormats) {
  int with_kernels = 0, known = 0;
  for (uint32_t id = 0; id <= 1100; ++id) {
    const TypeInfo* f = find_type_info(id);
    const TypeTraits* k = find_type(id);
    ASSERT_EQ(f == nullptr, k == nullptr) << "type id " << id << " is in one table only";
    if (!f) continue;
    ++known;
    EXPECT_EQ(k->type, f->type);
    EXPECT_EQ(k->name, f->name) << "id " << id;
    EXPECT_EQ(k->block_elems, f->block_elems) << f->name;
    EXPECT_EQ(k->block_bytes, f->block_bytes) << f->name;
    EXPECT_EQ(type_from_name(f->name), f->type);
    if (k->has_kernels) {
      ++with_kernels;
      EXPECT_NE(k->dot_scalar, nullptr) << f->name;
      EXPECT_NE(k->dequant, nullptr) << f->name;
    }
  }
  EXPECT_EQ(known, 36);
  EXPECT_EQ(with_kernels, 14);  // F32 F16 BF16 ENGRAM_ROW, Q8_K Q2_K Q3_K Q4_K Q6_K, Q8_0 Q2_0 IQ2_XXS IQ2_XS TQ2_0
  EXPECT_EQ(row_bytes(GgmlType::IQ2_XXS, 512), 132u);
  EXPECT_THROW(row_bytes(GgmlType::Q8_0, 33), Error);
  EXPECT_EQ(find_type_info(4), nullptr);
}

}  // namespace
}  // namespace sluice
