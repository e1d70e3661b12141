// Every sublayer of the tiny model on the Vulkan backend, against the CPU backend's, through the
// named intermediates (`--dump-tensors`) and the routing trace (`--trace`): each intermediate of
// every layer (the hc mixes, the attention's queries, kept rows and heads, the FFN's input, its
// routed sum, the Engram output...) has the CPU's bits, and so every sublayer, given the CPU's
// input, gives the CPU's output. The GPU's precision contract (docs/numerics.md) is exact, so
// the tolerance is zero and the count of routing choices allowed to differ on a small top-k
// margin is zero too: the routed experts, their weights, the indexer's selected rows and the
// Engram rows must be the CPU's at every position.
//
// Prefill in chunks of 8 and decode-only (chunks of 1, with attention rows kept on the device
// and fewer expert slots than a layer reads) must both equal the CPU's chunked prefill.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace sluice::test {
namespace {

const std::string kPrompt = "0,17,33,2,250,4,99,123,7,7,7,300,45,46,47,511,3,18,200,64";

std::map<std::string, nlohmann::json> tensors_in(const std::string& dir) {
  const nlohmann::json index = nlohmann::json::parse(slurp(dir + "/index.json"));
  std::map<std::string, nlohmann::json> m;
  for (const nlohmann::json& t : index.at("tensors"))
    m[t.at("name").get<std::string>()] = t;
  return m;
}

TEST(VulkanSublayers, EveryNamedIntermediateAndEveryRoutingChoiceIsTheCpus) {
  if (!kVulkanBuilt) GTEST_SKIP() << "built without the Vulkan backend";
  const TempDir dir("sluice_vulkan_sublayers");
  const std::string model = dir / "tiny.gguf";
  ASSERT_EQ(run_sluice(dir, "make-model --preset tiny --seed 1 -o " + q(model)).rc, 0);
  auto run = [&](const std::string& name, const std::string& flags) {
    const CmdResult r = run_sluice(dir, "run -m " + q(model) + " --allow-swap --tokens " + kPrompt +
                                            " -n 3 --ignore-eos -t 2 --dump-tensors " + q(dir / (name + ".t")) +
                                            " --trace " + q(dir / (name + ".r")) + " " + flags);
    EXPECT_EQ(r.rc, 0) << name << ": " << r.err;
    return r;
  };
  run("cpu", "--chunk 8");
  const CmdResult prefill = run("gpu8", "--chunk 8 --backend vulkan --gpu-experts 64");
  const CmdResult decode = run("gpu1", "--chunk 1 --backend vulkan --gpu-experts 7 --gpu-kv 1MiB");
  // The device did the work: linears, routed experts and (decode) kept rows all ran there.
  for (const CmdResult* r : {&prefill, &decode}) {
    EXPECT_NE(r->err.find(", 0 on the CPU"), std::string::npos) << "a linear ran on the CPU: " << r->err;
    EXPECT_NE(r->err.find("routed experts on the device"), std::string::npos) << r->err;
  }
  EXPECT_NE(decode.err.find("attention rows kept on the device"), std::string::npos) << decode.err;

  const std::map<std::string, nlohmann::json> cpu = tensors_in(dir / "cpu.t");
  ASSERT_GT(cpu.size(), 40u);
  const std::string cpu_routing = slurp(dir / "cpu.r/trace.jsonl");
  ASSERT_NE(cpu_routing.find("\"experts\""), std::string::npos);
  ASSERT_NE(cpu_routing.find("\"selected_rows\""), std::string::npos);
  for (const char* gpu : {"gpu8", "gpu1"}) {
    SCOPED_TRACE(gpu);
    const std::map<std::string, nlohmann::json> dev = tensors_in(dir / (std::string(gpu) + ".t"));
    ASSERT_EQ(dev.size(), cpu.size());
    size_t differ = 0;
    for (const auto& [name, t] : cpu) {
      ASSERT_TRUE(dev.count(name)) << name;
      const std::string f = t.at("file").get<std::string>();
      const std::string a = slurp(dir / ("cpu.t/" + f)), b = slurp(dir / (std::string(gpu) + ".t/" + f));
      ASSERT_EQ(a.size(), 22 * t.at("width").get<size_t>() * sizeof(float)) << name;
      if (a != b) {
        ++differ;
        ADD_FAILURE() << name << " differs from the CPU's";
      }
    }
    EXPECT_EQ(differ, 0u) << "of " << cpu.size() << " intermediates";
    EXPECT_EQ(slurp(dir / (std::string(gpu) + ".r/trace.jsonl")), cpu_routing)
        << "a routing choice (experts, weights, selected rows, Engram rows) differs from the CPU's";
  }
}

}  // namespace
}  // namespace sluice::test
