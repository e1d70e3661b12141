// `sluice serve --backend vulkan` as agents use it: several streams at once, batched into shared
// steps, then a request reusing a cached prefix. Greedy text must be the CPU backend's, request by
// request: the device runs the linears, the routed experts in slots, the attention over rows it
// keeps between steps (--gpu-kv, in memory the host does not map; enough slots that the window
// ring's rows are still there when the ring wraps and rewrites them).
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "server_harness.h"
#include "test_util.h"

namespace sluice::test {
namespace {

// A sample of /metrics without labels (the server's own tests parse the whole format).
double metric(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no metric " << name;
    return -1;
  }
  return std::stod(text.substr(at + name.size() + 2));
}

json completion(const std::string& prompt) {
  return {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
}

// Three requests at once, then one sharing the first one's prompt as its prefix: each answer's
// text and token counts.
std::vector<json> answers(const Server& s) {
  const std::vector<std::string> prompts = {"the first stream asks about rivers and the sea",
                                            "a second stream, about mountains", "third: numbers 1 2 3 4 5 6 7"};
  std::vector<json> out(prompts.size() + 1);
  std::vector<std::thread> th;
  for (size_t i = 0; i < prompts.size(); ++i)
    th.emplace_back([&, i] {
      const Response r = s.post("/v1/completions", completion(prompts[i]));
      out[i] = r.status == 200 ? json::parse(r.body) : json{{"status", r.status}, {"body", r.body}};
    });
  for (std::thread& t : th) t.join();
  const Response r = s.post("/v1/completions", completion(prompts[0] + ", and then about the rain"));
  out.back() = r.status == 200 ? json::parse(r.body) : json{{"status", r.status}, {"body", r.body}};
  return out;
}

TEST(VulkanServe, SeveralStreamsAtOnceGetTheCpusText) {
  if (!kVulkanBuilt) GTEST_SKIP() << "built without the Vulkan backend";
  const std::vector<std::string> common = {"--parallel", "3", "-c", "256", "--threads", "2"};
  std::vector<json> cpu, gpu;
  {
    const Server s(common);
    cpu = answers(s);
  }
  std::vector<std::string> flags = common;
  for (const char* f : {"--backend", "vulkan", "--gpu-experts", "64", "--gpu-kv", "64KiB"}) flags.push_back(f);
  const Server s(flags);
  gpu = answers(s);
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    ASSERT_TRUE(cpu[i].contains("choices")) << cpu[i].dump();
    ASSERT_TRUE(gpu[i].contains("choices")) << gpu[i].dump();
    EXPECT_EQ(gpu[i]["choices"][0]["text"], cpu[i]["choices"][0]["text"]);
    EXPECT_EQ(gpu[i]["usage"]["completion_tokens"], 24);
    EXPECT_EQ(gpu[i]["usage"]["prompt_tokens"], cpu[i]["usage"]["prompt_tokens"]);
  }
  EXPECT_GT(gpu.back()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0)
      << "the fourth request did not reuse the first one's prefix";
  const std::string m = s.get("/metrics").body;
  EXPECT_GT(metric(m, "sluice_batch_sequences_sum"), metric(m, "sluice_batch_sequences_count"))
      << "no step batched two streams";
  EXPECT_EQ(metric(m, "sluice_gpu_kv_slots"), 512);
  EXPECT_GT(metric(m, "sluice_gpu_kv_hits_total"), 0);
  EXPECT_GT(metric(m, "sluice_gpu_expert_hits_total"), 0) << m;
  EXPECT_GT(metric(m, "sluice_gpu_expert_upload_seconds_total"), 0) << "the slot tier's stall is not reported";
}

}  // namespace
}  // namespace sluice::test
