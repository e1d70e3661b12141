// One validation for sampling settings and tool declarations (issue 9, item 11): `sluice run`,
// `sluice serve` flags and both HTTP APIs refuse the same values with the same message, because
// they all call sluice::check_sampling; malformed OpenAI tools, tool_choice and response_format
// are 400s like Anthropic's.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server_harness.h"
#include "test_util.h"

namespace {

using namespace sluice::test;

class SamplingValidation : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new Server({}); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static json openai(json extra) {
    json b = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 2}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b;
  }
  static json anthropic(json extra) {
    json b = {{"model", "tiny"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 2}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b;
  }
  // Both APIs answer 400 with `message` in the error.
  static void expect_both_400(const json& extra, const std::string& message) {
    const Response o = server_->post("/v1/chat/completions", openai(extra));
    EXPECT_EQ(o.status, 400) << extra << " " << o.body;
    EXPECT_NE(o.body.find(message), std::string::npos) << extra << " " << o.body;
    const Response a = server_->post("/v1/messages", anthropic(extra));
    EXPECT_EQ(a.status, 400) << extra << " " << a.body;
    EXPECT_NE(a.body.find(message), std::string::npos) << extra << " " << a.body;
  }
  static inline Server* server_ = nullptr;
};

TEST_F(SamplingValidation, RangesAreTheSameInBothApis) {
  expect_both_400({{"top_p", 1.5}}, "top_p must be in [0, 1] (got 1.5)");
  expect_both_400({{"top_p", -0.1}}, "top_p must be in [0, 1]");
  expect_both_400({{"temperature", -1}}, "temperature must be in [0, 100] (got -1)");
  expect_both_400({{"temperature", 101}}, "temperature must be in [0, 100]");
  expect_both_400({{"top_k", -1}}, "top_k must be an integer in [0, 1073741824]");
  expect_both_400({{"top_k", 2.5}}, "'top_k' must be an integer");
  expect_both_400({{"min_p", 2}}, "min_p must be in [0, 1] (got 2)");
  expect_both_400({{"max_tokens", 0}}, "max_tokens must be at least 1 (got 0)");
  expect_both_400({{"max_tokens", 1.5}}, "'max_tokens' must be an integer");
  expect_both_400({{"seed", -5}}, "'seed' must be an integer in [0, 2^64)");
  expect_both_400({{"seed", "x"}}, "'seed' must be an integer");
  // top_p 0 is accepted everywhere (OpenAI's range is [0, 1]): only the most likely token.
  for (const char* path : {"/v1/chat/completions", "/v1/messages"}) {
    const json body = std::string(path) == "/v1/messages" ? anthropic({{"top_p", 0}, {"temperature", 1}, {"top_k", 5}, {"min_p", 0.1}})
                                                          : openai({{"top_p", 0}, {"temperature", 1}, {"top_k", 5}, {"min_p", 0.1}});
    EXPECT_EQ(server_->post(path, body).status, 200) << path;
  }
  // Integers beyond what the JSON number can say are refused, not wrapped.
  const Response huge = server_->roundtrip(request_text(
      "POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":1e400})"));
  EXPECT_EQ(huge.status, 400) << huge.body;
  const Response big = server_->roundtrip(request_text(
      "POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":18446744073709551615})"));
  EXPECT_EQ(big.status, 400) << big.body;
}

TEST_F(SamplingValidation, OpenAiToolDeclarationsAreChecked) {
  const json tool = {{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}};
  auto post = [](const json& extra) { return server_->post("/v1/chat/completions", openai(extra)); };
  EXPECT_EQ(post({{"tools", json::array({tool})}}).status, 200);
  auto expect_400 = [&](const json& extra, const std::string& message) {
    const Response r = post(extra);
    EXPECT_EQ(r.status, 400) << extra << " " << r.body;
    EXPECT_NE(r.body.find(message), std::string::npos) << extra << " " << r.body;
  };
  expect_400({{"tools", json::array({{{"type", "function"}}})}}, "tools[0] needs a 'function' object");
  expect_400({{"tools", json::array({{{"type", "function"}, {"function", {{"parameters", json::object()}}}}})}},
             "tools[0].function needs a 'name'");
  expect_400({{"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", 5}}}}})}},
             "tools[0].function.parameters must be a JSON object");
  expect_400({{"tools", json::array({tool})}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}},
             "tool_choice names the function 'g', which is not in 'tools'");
  expect_400({{"tool_choice", "sometimes"}}, "unknown tool_choice 'sometimes'");
  expect_400({{"response_format", {{"type", "json_schema"}, {"json_schema", 5}}}}, "'response_format.json_schema' must be an object");
  expect_400({{"response_format", {{"type", "yaml"}}}}, "unknown response_format type");
  // Anthropic's side, which already refused a nameless tool, now also checks tool_choice.
  const Response a = server_->post("/v1/messages", anthropic({{"tools", json::array({{{"name", "f"}}})},
                                                                {"tool_choice", {{"type", "tool"}, {"name", "g"}}}}));
  EXPECT_EQ(a.status, 400) << a.body;
  EXPECT_NE(a.body.find("which is not in 'tools'"), std::string::npos) << a.body;
}

// The CLI says exactly what the server says.
TEST(SamplingValidationCli, RunChatAndServeFlagsUseTheSameCheck) {
  TempDir dir("sluice_sampling_cli");
  const std::string model = dir / "tiny.gguf";
  ASSERT_EQ(run_sluice(dir, "make-model --preset tiny -o " + q(model)).rc, 0);
  const std::string base = "-m " + q(model) + " -t 1 --allow-swap ";
  const CmdResult ok = run_sluice(dir, "run " + base + "-p hi -n 2 --temp 1 --top-p 0 --top-k 3 --min-p 0.1");
  EXPECT_EQ(ok.rc, 0) << "top_p 0 is accepted by run as by the server: " << ok.err;
  for (const char* cmd : {"run -p hi -n 2 ", "chat ", "serve --port 0 "}) {
    const CmdResult bad = run_sluice(dir, std::string(cmd) + base + "--top-p 1.5 </dev/null");
    EXPECT_EQ(bad.rc, 2) << cmd << bad.err;
    EXPECT_NE(bad.err.find("top_p must be in [0, 1] (got 1.5)"), std::string::npos) << cmd << bad.err;
    const CmdResult bad_t = run_sluice(dir, std::string(cmd) + base + "--temp -1 </dev/null");
    EXPECT_NE(bad_t.err.find("temperature must be in [0, 100] (got -1)"), std::string::npos) << cmd << bad_t.err;
    const CmdResult bad_k = run_sluice(dir, std::string(cmd) + base + "--top-k -2 </dev/null");
    EXPECT_NE(bad_k.err.find("top_k must be an integer in [0, 1073741824] (got -2)"), std::string::npos) << cmd << bad_k.err;
  }
}

}  // namespace
