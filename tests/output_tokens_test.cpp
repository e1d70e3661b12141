// Control tokens never reach the user's text, whichever way it is generated (one rule,
// text/token_text.h): the tiny model's vocabulary is mostly <｜place▁holder▁no▁N｜> control
// tokens, so a hot sampler emits many of them. Checked on `sluice chat`, `sluice run` and both
// server APIs (raw sockets).
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server_harness.h"
#include "test_util.h"

namespace {

using namespace sluice::test;

// Text of any of the tiny vocabulary's control tokens besides the chat markup.
bool has_control_text(const std::string& s) {
  for (const char* t : {"place▁holder", "begin▁of▁sentence", "end▁of▁sentence", "▁pad▁", "<｜User｜>", "<｜Assistant｜>"})
    if (s.find(t) != std::string::npos) return true;
  return false;
}

TEST(OutputTokens, ServerHidesControlTokensInBothApis) {
  Server s({});
  const json msgs = json::array({{{"role", "user"}, {"content", "say anything"}}});
  for (bool thinking : {false, true}) {
    const json body = {{"messages", msgs}, {"max_tokens", 64}, {"temperature", 3.0}, {"seed", 11},
                       {"ignore_eos", true}, {"thinking", {{"type", thinking ? "enabled" : "disabled"}}}};
    const Response r = s.post("/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const json msg = json::parse(r.body)["choices"][0]["message"];
    const std::string content = msg["content"].is_string() ? msg["content"].get<std::string>() : "";
    const std::string reasoning = msg.value("reasoning_content", "");
    EXPECT_FALSE(has_control_text(content)) << content;
    EXPECT_FALSE(has_control_text(reasoning)) << reasoning;
    EXPECT_GT(json::parse(r.body)["usage"]["completion_tokens"].get<int>(), 32) << "the tokens were generated";
  }
  const json anthropic = {{"model", "tiny"}, {"max_tokens", 64}, {"temperature", 3.0},
                          {"messages", msgs}, {"thinking", {{"type", "enabled"}}}};
  const Response a = s.post("/v1/messages", anthropic);
  ASSERT_EQ(a.status, 200) << a.body;
  // Keep the parsed body alive: a range-for over json::parse(...)["content"] would walk a
  // destroyed temporary.
  const json answer = json::parse(a.body);
  for (const json& block : answer["content"]) {
    EXPECT_FALSE(has_control_text(block.value("text", ""))) << block;
    EXPECT_FALSE(has_control_text(block.value("thinking", ""))) << block;
  }
  const Response c = s.post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 64}, {"temperature", 3.0},
                                                {"seed", 5}, {"ignore_eos", true}});
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_FALSE(has_control_text(json::parse(c.body)["choices"][0]["text"].get<std::string>())) << c.body;
}

TEST(OutputTokens, ChatAndRunHideControlTokens) {
  TempDir dir("sluice_output_tokens");
  const std::string model = dir / "tiny.gguf";
  ASSERT_EQ(run_sluice(dir, "make-model --preset tiny -o " + q(model)).rc, 0);
  {
    std::ofstream in(dir / "in.txt");
    in << "say anything\n";
  }
  const CmdResult chat = run_sluice(dir, "chat -m " + q(model) + " -n 64 --temp 3 --seed 11 -t 1 --allow-swap < " +
                                             q(dir / "in.txt"));
  ASSERT_EQ(chat.rc, 0) << chat.err;
  EXPECT_GT(chat.out.size(), 16u) << "the reply has text";
  EXPECT_FALSE(has_control_text(chat.out)) << chat.out;
  const CmdResult run = run_sluice(dir, "run -m " + q(model) + " -p hello -n 64 --temp 3 --seed 11 -t 1 --ignore-eos --allow-swap");
  ASSERT_EQ(run.rc, 0) << run.err;
  EXPECT_FALSE(has_control_text(run.out)) << run.out;
}

}  // namespace
