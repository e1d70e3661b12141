// What run and chat print as text is valid UTF-8 whatever the model emits: a random (or hostile)
// model produces arbitrary bytes, and token boundaries fall inside characters. Ill-formed parts
// are shown as U+FFFD (text::Utf8Stream, text::StreamDecoder).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "text/utf8.h"

#include "test_util.h"

using sluice::test::CmdResult;
using sluice::test::q;
using sluice::test::run_sluice;
using sluice::test::TempDir;
using sluice::text::Utf8Stream;
using sluice::text::utf8_sanitize;
using sluice::text::utf8_valid;

TEST(Utf8Stream, PiecesCutInsideCharactersGiveTheWholeStringsSanitizing) {
  // "é" split across pieces, a stray continuation byte, a truncated 3-byte lead at the end.
  const std::string text = "a\xC3\xA9 b \x80 c \xE2\x82\xAC d \xF0\x9F\x98\x80 \xE2\x82";
  const std::string want = utf8_sanitize(text);
  ASSERT_TRUE(utf8_valid(want));
  EXPECT_NE(want.find("\xEF\xBF\xBD"), std::string::npos);
  for (size_t cut = 1; cut <= 4; ++cut) {
    Utf8Stream s;
    std::string got;
    for (size_t i = 0; i < text.size(); i += cut) {
      const std::string part = s.push(std::string_view(text).substr(i, cut));
      EXPECT_TRUE(utf8_valid(part)) << "cut " << cut << " at " << i;
      got += part;
    }
    got += s.finish();
    EXPECT_EQ(got, want) << "cut " << cut;
  }
}

// The tiny model's random weights produce arbitrary byte tokens when sampled.
TEST(TerminalText, ChatAndRunPrintOnlyValidUtf8) {
  TempDir dir("sluice_terminal_text");
  const std::string model = dir / "tiny.gguf", in = dir / "in.txt";
  ASSERT_EQ(run_sluice(dir, "make-model --preset tiny --seed 1 -o " + q(model)).rc, 0);
  std::ofstream(in) << "hello there\nwhat is this\n";
  bool replaced = false;
  for (const char* seed : {"0", "1", "2"}) {
    SCOPED_TRACE(seed);
    const CmdResult c = run_sluice(dir, "chat -m " + q(model) + " --allow-swap -n 64 --temp 1 --seed " +
                                            std::string(seed) + " <" + q(in));
    ASSERT_EQ(c.rc, 0) << c.err;
    EXPECT_TRUE(utf8_valid(c.out)) << c.out;
    EXPECT_TRUE(utf8_valid(c.err)) << c.err;
    const CmdResult r = run_sluice(dir, "run -m " + q(model) + " --allow-swap -p hello -n 64 --ignore-eos --temp 1 --seed " +
                                            std::string(seed));
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_TRUE(utf8_valid(r.out)) << r.out;
    replaced = replaced || c.out.find("\xEF\xBF\xBD") != std::string::npos;
  }
  EXPECT_TRUE(replaced) << "the random model never produced an ill-formed byte: the test shows nothing";
}
