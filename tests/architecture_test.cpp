// model/architecture.h: the one entry point chosen from general.architecture. The deepseek41
// entry gives what the deepseek41 functions give (config, schema, tensor list, support checks,
// an engine with the same logits, the chat format); any other name, a missing key or a
// non-string one is one clear error naming it.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/gguf.h"
#include "model/architecture.h"
#include "model/deepseek41/config.h"
#include "model/deepseek41/forward.h"
#include "model/deepseek41/load_checks.h"
#include "model/model.h"
#include "model/deepseek41/schema.h"
#include "text/deepseek41/chat.h"
#include "util/error.h"

#include "test_util.h"

namespace gguf = sluice::gguf;
using sluice::test::CmdResult;
using sluice::test::q;
using sluice::test::run_sluice;
using sluice::test::TempDir;

namespace {

// A header-only GGUF whose general.architecture is `arch` (omitted when null), or a number.
std::string write_header(const TempDir& dir, const std::string& name, const char* arch, bool as_number = false) {
  const std::string path = dir / name;
  gguf::Writer w(32);
  if (as_number) w.add("general.architecture", gguf::Value::u32(41));
  else if (arch) w.add("general.architecture", gguf::Value::str(arch));
  w.add("general.name", gguf::Value::str("test"));
  w.write(path, {}, /*sparse=*/true);
  return path;
}

std::string error_of(const std::string& path) {
  try {
    sluice::architecture_of(gguf::File::open(path));
  } catch (const sluice::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Architecture, TheTableHasDeepseek41AndNothingByPrefix) {
  ASSERT_EQ(sluice::architectures().size(), 1u);
  const sluice::Architecture* a = sluice::find_architecture("deepseek41");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->name, "deepseek41");
  EXPECT_EQ(a, &sluice::architectures()[0]);
  for (const char* other : {"", "deepseek4", "deepseek41x", "DeepSeek41", "llama", "deepseek2"})
    EXPECT_EQ(sluice::find_architecture(other), nullptr) << other;
}

TEST(Architecture, OtherFilesGetOneErrorNamingTheCause) {
  TempDir dir("sluice_architecture_test");
  EXPECT_EQ(error_of(write_header(dir, "llama.gguf", "llama")), "architecture llama is not supported (sluice runs deepseek41)");
  EXPECT_EQ(error_of(write_header(dir, "none.gguf", nullptr)), "general.architecture is missing (sluice runs deepseek41)");
  EXPECT_NE(error_of(write_header(dir, "num.gguf", nullptr, true)).find("not a string"), std::string::npos);
  EXPECT_EQ(error_of(write_header(dir, "prefix.gguf", "deepseek4")),
            "architecture deepseek4 is not supported (sluice runs deepseek41)");
  // load_problems (inspect, plan, serve) reports only that.
  EXPECT_EQ(sluice::load_problems(gguf::File::open(dir / "llama.gguf")),
            std::vector<std::string>{"architecture llama is not supported (sluice runs deepseek41)"});
  // deepseek41's own config reader refuses it too.
  EXPECT_THROW(sluice::config_from_gguf(gguf::File::open(dir / "llama.gguf")), sluice::Error);
}

TEST(Architecture, Deepseek41EntryIsTheDeepseek41Functions) {
  TempDir dir("sluice_architecture_entry");
  const std::string model = dir / "tiny.gguf";
  const CmdResult r = run_sluice(dir, "make-model --preset tiny --seed 1 -o " + q(model));
  ASSERT_EQ(r.rc, 0) << r.err;
  const gguf::File f = gguf::File::open(model);
  const sluice::Architecture& a = sluice::architecture_of(f);
  EXPECT_EQ(a.name, "deepseek41");

  const sluice::ModelConfig c = a.config(f, nullptr);
  EXPECT_EQ(sluice::config_to_json(c), sluice::config_to_json(sluice::config_from_gguf(f)));
  EXPECT_TRUE(a.validate(f).errors.empty());
  EXPECT_TRUE(a.support_problems(c).empty());
  const std::vector<sluice::TensorSpec> t = a.tensors(c), want = sluice::deepseek41_tensors(c);
  ASSERT_EQ(t.size(), want.size());
  ASSERT_EQ(t.size(), f.tensors().size());
  for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(t[i].name, f.tensors()[i].name) << i;

  const std::vector<sluice::text::ChatMessage> msgs = {{"system", "be brief", "", {}, ""}, {"user", "hi", "", {}, ""}};
  sluice::text::ChatOptions co;
  co.thinking = true;
  EXPECT_EQ(a.render_chat(msgs, co).text, sluice::text::render_chat(msgs, co));

  // The factory's engine computes what an Engine built directly does, bit for bit.
  const std::unique_ptr<sluice::Model> m = sluice::load_model(model);
  sluice::EngineOptions eo;
  eo.ctx = 16;
  eo.chunk = 4;
  const std::unique_ptr<sluice::Engine> e = a.make_engine(*m, eo);
  ASSERT_NE(e, nullptr);
  const sluice::Engine direct(*m, eo);
  const std::vector<uint32_t> toks = {0, 17, 33, 2, 250, 4};
  std::vector<float> la(toks.size() * c.vocab_size), lb(la.size());
  sluice::SequenceState sa = e->new_sequence(), sb = direct.new_sequence();
  e->eval(sa, toks, la.data());
  direct.eval(sb, toks, lb.data());
  EXPECT_TRUE(la == lb);
}
