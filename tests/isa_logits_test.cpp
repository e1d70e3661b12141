// The whole forward pass at each ISA the CPU has (SLUICE_ISA, chosen when the model loads: the
// weights' kernels are picked then): the tiny model's logits, a chunked prompt and one-token decode
// steps, are the same bytes at AVX2 and with the scalar reference as at the best ISA. The tiny model
// holds every routed type (IQ2_XXS gate/up, Q2_K down) and Q8_0, so this runs each type's GEMM,
// one-token path and dot through a real forward. (Each kernel also has its own scalar-reference
// tests at odd sizes.)
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "kernels/cpu.h"
#include "test_util.h"

namespace {

using namespace sluice;
using namespace sluice::test;

std::string logits_at(const TempDir& dir, const std::string& model, const char* isa) {
  const std::string out = (dir.path / (std::string("logits_") + (isa ? isa : "best") + ".bin")).string();
  if (isa) ::setenv("SLUICE_ISA", isa, 1);
  const CmdResult r = run_sluice(dir, "run -m " + q(model) + " --tokens 5,17,200,33,9,81,64,3,250,12,7,99 -n 6 "
                                      "--chunk 5 --allow-swap --dump-logits " + q(out));
  ::unsetenv("SLUICE_ISA");
  EXPECT_EQ(r.rc, 0) << (isa ? isa : "best") << ": " << r.err;
  return slurp(out);
}

TEST(IsaLogits, EveryIsaGivesTheSameLogitsBytes) {
  if (std::getenv("SLUICE_ISA")) GTEST_SKIP() << "SLUICE_ISA is set for the whole run";
  TempDir dir("isa_logits");
  const std::string model = (dir.path / "tiny.gguf").string();
  ASSERT_EQ(run_sluice(dir, "make-model --preset tiny -o " + q(model)).rc, 0);
  const std::string best = logits_at(dir, model, nullptr);
  ASSERT_GT(best.size(), 4u * 512 * 6);
  int compared = 0;
  for (const char* isa : {"avx2", "scalar"}) {
    if (std::string(isa) == "avx2" && detect_isa() < Isa::Avx2) continue;
    EXPECT_TRUE(logits_at(dir, model, isa) == best) << isa << ": the logits differ from " << isa_name(detect_isa());
    ++compared;
  }
  EXPECT_GE(compared, 1);
}

}  // namespace
