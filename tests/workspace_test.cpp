// The forward pass allocates its activation tensors once, from the shapes it reports
// (model/deepseek41/forward_workspace.h): a backend that counts what it is asked to allocate sees exactly
// workspace_bytes(config, chunk) when the Engine is made, and nothing more while it evaluates.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu_backend.h"
#include "model/deepseek41/forward.h"
#include "model/deepseek41/forward_workspace.h"
#include "model/model.h"
#include "test_util.h"

namespace sluice {
namespace {

class CountingBackend final : public CpuBackend {
 public:
  CountingBackend() : CpuBackend(2) {}
  Tensor tensor(size_t n, size_t width) const override {
    bytes += (uint64_t)n * width * sizeof(float);
    ++count;
    return CpuBackend::tensor(n, width);
  }
  mutable uint64_t bytes = 0, count = 0;
};

TEST(Workspace, AllocatedBytesAreTheReportedShapes) {
  test::TempDir dir("sluice_workspace");
  for (const std::string config : {"tiny", "tiny-alt"}) {
    const std::string gguf = dir / (config + ".gguf");
    const std::string cmd = test::q(SLUICE_BINARY) + " make-model --config " +
                            test::q(std::string(SLUICE_TEST_DATA) + "/../../configs/" + config + ".json") + " -o " +
                            test::q(gguf) + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const std::unique_ptr<Model> m = load_model(gguf);
    for (const uint32_t chunk : {1u, 7u, 64u}) {
      SCOPED_TRACE(config + " chunk " + std::to_string(chunk));
      CountingBackend be;
      EngineOptions o;
      o.ctx = 96;
      o.chunk = chunk;
      o.backend = &be;
      Engine eng(*m, o);
      EXPECT_EQ(be.bytes, workspace_bytes(m->config, chunk));
      EXPECT_GT(be.bytes, 0u);
      const uint64_t after_make = be.count;
      SequenceState s = eng.new_sequence();
      std::vector<uint32_t> toks(70);
      for (size_t i = 0; i < toks.size(); ++i) toks[i] = (uint32_t)(i * 37 % m->config.vocab_size);
      std::vector<float> logits(toks.size() * m->config.vocab_size);
      eng.eval(s, toks, logits.data());
      EXPECT_EQ(be.count, after_make) << "eval() allocated backend tensors beyond the workspace";
    }
  }
}

}  // namespace
}  // namespace sluice
