// The byte-level BPE tokenizer on DeepSeek's real vocabulary (data/deepseek-v3-vocab.gguf):
// llama.cpp's reference vectors, round trips, added tokens, the streaming decoder, the
// pre-tokenizer's splits, vocabulary validation and the `tokenize` command.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cmd_tokenize.h"
#include "format/gguf.h"
#include "synth/vocab.h"
#include "text/pretokenize.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#include "util/error.h"

#include "test_util.h"

namespace fs = std::filesystem;
using sluice::Error;
using sluice::TokenId;
using sluice::text::StreamDecoder;
using sluice::text::Tokenizer;
using sluice::text::VocabData;
using sluice::test::slurp;
using sluice::test::TempDir;

namespace {

const std::string kVocabPath = std::string(SLUICE_DATA_DIR) + "/deepseek-v3-vocab.gguf";

// DeepSeek's vocabulary, loaded once for the whole binary.
const Tokenizer& deepseek() {
  static const Tokenizer tok = Tokenizer::from_gguf(sluice::gguf::File::open(kVocabPath));
  return tok;
}

struct RefCase {
  std::string input;
  std::vector<TokenId> ids;
};

// tokenizer-tests.inp: every input is followed by "\n__ggml_vocab_test__\n" (so the newline
// before a separator is not part of the input); .out: one line of ids per input.
std::vector<RefCase> reference_cases() {
  const std::string inp = slurp(std::string(SLUICE_TEST_DATA) + "/tokenizer-tests.inp");
  std::ifstream out(std::string(SLUICE_TEST_DATA) + "/tokenizer-tests.out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<RefCase> cases;
  for (size_t pos = 0;;) {
    const size_t e = inp.find(sep, pos);
    if (e == std::string::npos) break;
    RefCase c;
    c.input = inp.substr(pos, e - pos);
    pos = e + sep.size();
    std::string line;
    if (!std::getline(out, line)) break;
    std::istringstream ls(line);
    for (TokenId x; ls >> x;) c.ids.push_back(x);
    cases.push_back(std::move(c));
  }
  return cases;
}

std::vector<std::string> pieces_of(std::string_view s) {
  std::vector<std::pair<uint32_t, uint32_t>> p;
  sluice::text::pretokenize(s, p);
  std::vector<std::string> out;
  for (auto [b, e] : p) out.emplace_back(s.substr(b, e - b));
  return out;
}

// Random well-formed UTF-8 drawn from scripts and classes that exercise every branch of the
// pre-tokenizer: ASCII, digits, whitespace and newlines, Latin with combining marks, CJK and
// kana, Hangul, Arabic, Devanagari, emoji (with ZWJ and variation selectors), fullwidth forms,
// symbols, and the odd control character.
std::string random_text(std::mt19937& rng, size_t n_cps) {
  static const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x20, 0x7E}, {0x20, 0x7E}, {0x20, 0x7E}, {'0', '9'}, {'\n', '\n'}, {'\r', '\r'},
      {'\t', '\t'}, {' ', ' '}, {0xC0, 0x17F}, {0x300, 0x36F}, {0x4E00, 0x9FA5}, {0x3040, 0x30FF},
      {0xAC00, 0xD7A3}, {0x600, 0x6FF}, {0x900, 0x97F}, {0x1F600, 0x1F64F}, {0x1F300, 0x1F5FF},
      {0x200D, 0x200D}, {0xFE0F, 0xFE0F}, {0xFF01, 0xFF5E}, {0x2000, 0x206F}, {0x2190, 0x22FF},
      {0x00A0, 0x00BF}, {0x3000, 0x3003}, {0x1, 0x1F}, {0x10000, 0x1000F}, {0xE000, 0xE00F}};
  std::string s;
  for (size_t i = 0; i < n_cps; ++i) {
    const auto& r = ranges[rng() % ranges.size()];
    sluice::text::append_utf8(s, r.first + (uint32_t)(rng() % (r.second - r.first + 1)));
  }
  return s;
}

// Byte tokens and a few merges / added tokens: a vocabulary small enough to reason about.
VocabData tiny_vocab() {
  VocabData v;
  v.tokens = sluice::gpt2_byte_tokens();  // 256 byte tokens, in GPT-2 order
  v.token_type.assign(v.tokens.size(), 1);
  return v;
}

TokenId add_token(VocabData& v, const std::string& s, int32_t type = 1) {
  v.tokens.push_back(s);
  v.token_type.push_back(type);
  return (TokenId)v.tokens.size() - 1;
}

}  // namespace

TEST(TokenizerReference, EncodesEveryLlamaCppVector) {
  const auto cases = reference_cases();
  ASSERT_EQ(cases.size(), 46u);  // the file's separator count
  const Tokenizer& tok = deepseek();
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_EQ(tok.encode(cases[i].input, /*add_bos=*/false), cases[i].ids)
        << "case " << i << ": \"" << cases[i].input << "\"";
}

TEST(TokenizerReference, DecodeInvertsEncode) {
  const Tokenizer& tok = deepseek();
  for (const auto& c : reference_cases()) {
    EXPECT_EQ(tok.decode(c.ids), c.input);
    EXPECT_EQ(tok.decode(tok.encode(c.input, true)), "<｜begin▁of▁sentence｜>" + c.input);
  }
}

TEST(TokenizerVocab, LoadsDeepSeekVocabulary) {
  const Tokenizer& tok = deepseek();
  EXPECT_EQ(tok.n_vocab(), 129280);
  EXPECT_EQ(tok.n_merges(), 127741u);
  EXPECT_EQ(tok.bos(), 0);
  EXPECT_EQ(tok.eos(), 1);
  EXPECT_TRUE(tok.add_bos_default());
  EXPECT_EQ(tok.find("<｜User｜>"), 128803);
  EXPECT_EQ(tok.find("<｜Assistant｜>"), 128804);
  EXPECT_EQ(tok.type(128803), sluice::text::TokenType::Control);
  EXPECT_EQ(tok.type(128815), sluice::text::TokenType::Unused);
  EXPECT_EQ(tok.token_text(3), "!");
  EXPECT_EQ(tok.token_to_piece(223), " ");  // "Ġ"
  EXPECT_THROW(tok.token_to_piece(129280), Error);
  EXPECT_THROW(tok.token_to_piece(-1), Error);
}

TEST(TokenizerEncode, BosOnlyWhenAsked) {
  const Tokenizer& tok = deepseek();
  EXPECT_EQ(tok.encode("", true), std::vector<TokenId>{0});
  EXPECT_TRUE(tok.encode("", false).empty());
  const auto a = tok.encode("Hello world", true), b = tok.encode("Hello world", false);
  ASSERT_EQ(a.size(), b.size() + 1);
  EXPECT_EQ(a[0], 0);
  EXPECT_EQ(std::vector<TokenId>(a.begin() + 1, a.end()), b);
}

TEST(TokenizerSpecial, AddedTokensAreAtomic) {
  const Tokenizer& tok = deepseek();
  const TokenId user = *tok.find("<｜User｜>"), hi = *tok.find("hi");
  EXPECT_EQ(tok.encode("<｜User｜>hi", false), (std::vector<TokenId>{user, hi}));
  // Between text, at both ends, back to back.
  const auto ids = tok.encode("hi<｜User｜><｜Assistant｜>hi<｜end▁of▁sentence｜>", false);
  EXPECT_EQ(ids, (std::vector<TokenId>{hi, user, 128804, hi, 1}));
  // A special string is never split by BPE, whatever surrounds it.
  const auto ids2 = tok.encode("x<｜User｜>y", false);
  EXPECT_EQ(std::count(ids2.begin(), ids2.end(), user), 1);
  // A near miss is plain text.
  const auto near = tok.encode("<｜User｜", false);
  EXPECT_EQ(std::count(near.begin(), near.end(), user), 0);
  EXPECT_EQ(tok.decode(near), "<｜User｜");
}

TEST(TokenizerSpecial, ParseSpecialOffKeepsControlStringsAsText) {
  const Tokenizer& tok = deepseek();
  const std::string s = "<｜User｜>hi<｜end▁of▁sentence｜>";
  const auto ids = tok.encode(s, false, /*parse_special=*/false);
  for (TokenId id : ids) EXPECT_EQ(tok.type(id), sluice::text::TokenType::Normal);
  EXPECT_EQ(tok.decode(ids), s);
}

TEST(TokenizerSpecial, LeftmostLongestMatch) {
  VocabData v = tiny_vocab();
  const TokenId x = add_token(v, "<x>", 3), xy = add_token(v, "<x>y", 3), u = add_token(v, "yz", 4);
  const Tokenizer tok(v);
  const TokenId z = *tok.find("z");
  EXPECT_EQ(tok.encode("<x>yz", false), (std::vector<TokenId>{xy, z}));
  EXPECT_EQ(tok.encode("<x>z", false), (std::vector<TokenId>{x, z}));
  // User-defined tokens match even when control tokens are off.
  EXPECT_EQ(tok.encode("<x>yz", false, false).back(), u);
}

TEST(TokenizerDecode, RenderSpecialFlag) {
  const Tokenizer& tok = deepseek();
  const std::vector<TokenId> ids = {0, *tok.find("hi"), 1};
  EXPECT_EQ(tok.decode(ids), "<｜begin▁of▁sentence｜>hi<｜end▁of▁sentence｜>");
  EXPECT_EQ(tok.decode(ids, /*render_special=*/false), "hi");
  EXPECT_THROW(tok.decode(std::vector<TokenId>{5, 999999}), Error);
}

TEST(TokenizerRoundTrip, RandomUtf8) {
  const Tokenizer& tok = deepseek();
  std::mt19937 rng(1234);
  for (int i = 0; i < 400; ++i) {
    std::string s = random_text(rng, 1 + rng() % 60);
    if (i % 5 == 0) s += "<｜User｜>" + random_text(rng, 5) + "<｜Assistant｜>";
    ASSERT_TRUE(sluice::text::utf8_valid(s));
    const auto ids = tok.encode(s, i % 2 == 0);
    const std::string back = tok.decode(ids);
    EXPECT_EQ(i % 2 == 0 ? back.substr(std::string("<｜begin▁of▁sentence｜>").size()) : back, s);
    // Splitting the text at a special token never changes the tokens of the parts.
    EXPECT_EQ(tok.encode(s + "<｜User｜>", false).size(), tok.encode(s, false).size() + 1);
  }
}

TEST(TokenizerRoundTrip, ArbitraryBytes) {
  // Not UTF-8 at all: every byte still has a token and comes back.
  const Tokenizer& tok = deepseek();
  std::mt19937 rng(99);
  for (int i = 0; i < 100; ++i) {
    std::string s;
    for (int k = 0, n = 1 + rng() % 40; k < n; ++k) s += (char)(rng() % 256);
    EXPECT_EQ(tok.decode(tok.encode(s, false, false)), s);
  }
}

TEST(TokenizerStream, MatchesDecodeAndNeverSplitsACharacter) {
  const Tokenizer& tok = deepseek();
  std::mt19937 rng(77);
  size_t held = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string s = random_text(rng, 1 + rng() % 50);
    const auto ids = tok.encode(s, false);
    StreamDecoder dec(tok);
    std::string streamed;
    for (TokenId id : ids) {
      const std::string part = dec.push(id);
      EXPECT_TRUE(sluice::text::utf8_valid(part)) << "partial character emitted";
      held += dec.pending_bytes() > 0;
      streamed += part;
    }
    streamed += dec.finish();
    EXPECT_EQ(streamed, tok.decode(ids));
    EXPECT_EQ(streamed, s);
  }
  EXPECT_GT(held, 0u);  // the random text did split characters across tokens
}

TEST(TokenizerStream, HoldsBytesUntilTheCharacterCompletes) {
  const Tokenizer& tok = deepseek();
  // "é" = C3 A9, fed as its two byte tokens.
  const TokenId c3 = *tok.find(sluice::gpt2_byte_token(0xC3)), a9 = *tok.find(sluice::gpt2_byte_token(0xA9));
  StreamDecoder dec(tok);
  EXPECT_EQ(dec.push(*tok.find("a")), "a");
  EXPECT_EQ(dec.push(c3), "");
  EXPECT_EQ(dec.pending_bytes(), 1u);
  EXPECT_EQ(dec.push(a9), "é");
  EXPECT_EQ(dec.pending_bytes(), 0u);
  EXPECT_EQ(dec.finish(), "");
}

TEST(TokenizerStream, IllFormedBytesBecomeReplacementCharacters) {
  const Tokenizer& tok = deepseek();
  auto byte = [&](uint8_t b) { return *tok.find(sluice::gpt2_byte_token(b)); };
  const std::vector<TokenId> ids = {byte(0xE2), byte(0x82), *tok.find("A"), byte(0xFF), byte(0xF0)};
  StreamDecoder dec(tok);
  std::string streamed;
  for (TokenId id : ids) streamed += dec.push(id);
  EXPECT_EQ(dec.pending_bytes(), 1u);  // F0 could still start a character
  streamed += dec.finish();
  // E2 82 (truncated) -> one U+FFFD, FF -> one, F0 at the end -> one.
  EXPECT_EQ(streamed, "\xEF\xBF\xBD" "A" "\xEF\xBF\xBD" "\xEF\xBF\xBD");
  EXPECT_EQ(streamed, sluice::text::utf8_sanitize(tok.decode(ids)));
}

TEST(TokenizerUtf8, SanitizeInPiecesEqualsWhole) {
  std::mt19937 rng(5);
  for (int i = 0; i < 500; ++i) {
    std::string s;
    for (int k = 0, n = rng() % 24; k < n; ++k)
      s += (char)(rng() % 3 == 0 ? 0x80 + rng() % 0x80 : rng() % 2 ? 0xC0 + rng() % 0x40 : 'a');
    std::string pieces, pending;
    for (char ch : s) {
      pending += ch;
      pending.erase(0, sluice::text::utf8_sanitize_append(pending, false, pieces));
      EXPECT_LE(pending.size(), 3u);
    }
    sluice::text::utf8_sanitize_append(pending, true, pieces);
    EXPECT_EQ(pieces, sluice::text::utf8_sanitize(s));
    EXPECT_TRUE(sluice::text::utf8_valid(pieces));
  }
  EXPECT_EQ(sluice::text::utf8_sanitize("a\xC0\xAF" "b"), "a\xEF\xBF\xBD\xEF\xBF\xBD" "b");  // overlong
  EXPECT_EQ(sluice::text::utf8_sanitize("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

TEST(TokenizerPretokenize, ThreePassSplits) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces_of("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces_of("1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(pieces_of("ab12cd"), (V{"ab", "12", "cd"}));
  EXPECT_EQ(pieces_of("我想在apple工作"), (V{"我想在", "apple", "工作"}));
  EXPECT_EQ(pieces_of("it's .cpp"), (V{"it", "'s", " .", "cpp"}));
  EXPECT_EQ(pieces_of("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(pieces_of("x  "), (V{"x", "  "}));
  EXPECT_EQ(pieces_of("  \n  x"), (V{"  \n", " ", " x"}));
  EXPECT_EQ(pieces_of("\t\thello"), (V{"\t", "\thello"}));
  EXPECT_EQ(pieces_of("a!!\n\nb"), (V{"a", "!!\n\n", "b"}));
  EXPECT_EQ(pieces_of("e\xCC\x81t\xC3\xA9"), (V{"e\xCC\x81t\xC3\xA9"}));  // combining mark stays
  EXPECT_EQ(pieces_of("\xE2\x80\x8D\xE2\x80\x8D"), (V{"\xE2\x80\x8D\xE2\x80\x8D"}));  // ZWJ run: a gap
  EXPECT_TRUE(pieces_of("").empty());
}

TEST(TokenizerMerge, RankOrderAndLeftmostTies) {
  VocabData v = tiny_vocab();
  const TokenId ab = add_token(v, "ab"), bc = add_token(v, "bc"), aa = add_token(v, "aa");
  v.merges = {"b c", "a b", "a a"};
  const Tokenizer t1(v);
  EXPECT_EQ(t1.encode("abc", false), (std::vector<TokenId>{*t1.find("a"), bc}));
  EXPECT_EQ(t1.encode("aaa", false), (std::vector<TokenId>{aa, *t1.find("a")}));
  v.merges = {"a b", "b c"};
  const Tokenizer t2(v);
  EXPECT_EQ(t2.encode("abc", false), (std::vector<TokenId>{ab, *t2.find("c")}));
}

TEST(TokenizerValidate, RejectsBrokenVocabularies) {
  {
    VocabData v = tiny_vocab();
    v.token_type.pop_back();
    EXPECT_THROW(Tokenizer{v}, Error);
  }
  {
    VocabData v = tiny_vocab();
    v.token_type[7] = 9;
    EXPECT_THROW(Tokenizer{v}, Error);
  }
  {
    VocabData v = tiny_vocab();
    v.tokens.erase(v.tokens.begin() + 10);
    v.token_type.pop_back();
    EXPECT_THROW(Tokenizer{v}, Error);  // a byte without its token
  }
  for (const char* bad : {"ab", " a", "a ", "a b c", "a zz"}) {
    VocabData v = tiny_vocab();
    add_token(v, "ab");
    v.merges = {bad};
    EXPECT_THROW(Tokenizer{v}, Error) << bad;
  }
  {
    VocabData v = tiny_vocab();
    v.merges = {"a b"};  // "ab" itself is not a token
    try {
      Tokenizer t{v};
      ADD_FAILURE() << "accepted a merge whose result is missing";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("merged token"), std::string::npos) << e.what();
    }
  }
  {
    VocabData v = tiny_vocab();
    v.bos = 256;
    EXPECT_THROW(Tokenizer{v}, Error);
  }
  EXPECT_THROW(Tokenizer{VocabData{}}, Error);
}

namespace {

constexpr const char* kTmpPrefix = "sluice_tok_test";

void write_vocab_gguf(const std::string& path, const std::string& model, const std::string& pre,
                      bool with_types = true, size_t drop_types = 0) {
  using sluice::gguf::Value;
  const sluice::Vocab v = sluice::synthetic_vocab(300);
  sluice::gguf::Writer w;
  w.add("general.architecture", Value::str("deepseek41"));
  w.add("tokenizer.ggml.model", Value::str(model));
  w.add("tokenizer.ggml.pre", Value::str(pre));
  w.add("tokenizer.ggml.tokens", Value::array_str(v.tokens));
  if (with_types) {
    std::vector<int64_t> types(v.token_type.begin(), v.token_type.end() - (ptrdiff_t)drop_types);
    w.add("tokenizer.ggml.token_type", Value::array_i32(types));
  }
  w.add("tokenizer.ggml.merges", Value::array_str(v.merges));
  w.add("tokenizer.ggml.bos_token_id", Value::u32(0));
  w.add("tokenizer.ggml.eos_token_id", Value::u32(1));
  w.write(path, [](const sluice::gguf::TensorInfo&, const sluice::gguf::Writer::Sink&) {});
}

std::string error_of(const std::string& path) {
  try {
    Tokenizer::from_gguf(sluice::gguf::File::open(path));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TokenizerGguf, SyntheticVocabularyFromMakeModel) {
  TempDir dir(kTmpPrefix);
  write_vocab_gguf(dir / "v.gguf", "gpt2", "joyai-llm");
  const Tokenizer tok = Tokenizer::from_gguf(sluice::gguf::File::open(dir / "v.gguf"));
  EXPECT_EQ(tok.n_vocab(), 300);
  const TokenId user = *tok.find("<｜User｜>"), think = *tok.find("<think>");
  const auto ids = tok.encode("<｜User｜>the cat<think>", true);
  EXPECT_EQ(ids.front(), 0);
  EXPECT_EQ(ids[1], user);
  EXPECT_EQ(ids.back(), think);
  EXPECT_EQ(tok.decode(ids), "<｜begin▁of▁sentence｜><｜User｜>the cat<think>");
  EXPECT_EQ(tok.token_to_piece(*tok.find("Ġt")), " t");
}

TEST(TokenizerGguf, RejectsWrongKeys) {
  TempDir dir(kTmpPrefix);
  write_vocab_gguf(dir / "llama.gguf", "llama", "joyai-llm");
  EXPECT_NE(error_of(dir / "llama.gguf").find("tokenizer.ggml.model"), std::string::npos);
  write_vocab_gguf(dir / "pre.gguf", "gpt2", "qwen2");
  EXPECT_NE(error_of(dir / "pre.gguf").find("tokenizer.ggml.pre"), std::string::npos);
  write_vocab_gguf(dir / "types.gguf", "gpt2", "joyai-llm", true, 3);
  const std::string e = error_of(dir / "types.gguf");
  EXPECT_NE(e.find("tokenizer.ggml.token_type"), std::string::npos) << e;
  EXPECT_NE(e.find(dir / "types.gguf"), std::string::npos) << e;
}

TEST(TokenizerPerf, HundredKilobytesWellUnderASecond) {
  const Tokenizer& tok = deepseek();
  std::mt19937 rng(3);
  std::string text;
  const std::string inp = slurp(std::string(SLUICE_TEST_DATA) + "/tokenizer-tests.inp");
  while (text.size() < 100000) text += text.size() % 3 ? inp : random_text(rng, 2000);
  text.resize(100000);
  text += std::string(5000, ' ') + std::string(5000, 'a');  // long single pieces
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok.encode(text, true, false);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(ids.size(), 10000u);
  EXPECT_LT(s, 1.0);
  EXPECT_EQ(tok.decode(ids, false), text);
}

// The tokenize command, run in-process with stdout captured in a file.
namespace {
std::string run_tokenize_cmd(const std::vector<std::string>& args, int* rc) {
  TempDir dir(kTmpPrefix);
  CLI::App app;
  sluice::cli::TokenizeOptions o;
  CLI::App* cmd = sluice::cli::setup_tokenize(app, o);
  std::vector<std::string> argv_s = {"sluice", "tokenize"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  app.parse((int)argv.size(), argv.data());
  EXPECT_TRUE(cmd->parsed());
  const std::string out_path = dir / "out.txt";
  // Restores stdout even when run_tokenize throws.
  struct Redirect {
    int saved;
    FILE* f;
    explicit Redirect(const std::string& path) {
      std::fflush(stdout);
      saved = ::dup(1);
      f = std::fopen(path.c_str(), "w");
      ::dup2(::fileno(f), 1);
    }
    ~Redirect() {
      std::fflush(stdout);
      ::dup2(saved, 1);
      ::close(saved);
      std::fclose(f);
    }
  };
  {
    Redirect r(out_path);
    *rc = sluice::cli::run_tokenize(o);
  }
  return slurp(out_path);
}
}  // namespace

TEST(TokenizerCli, PrintsIdsAndPieces) {
  int rc = -1;
  EXPECT_EQ(run_tokenize_cmd({"-m", kVocabPath, "--text", "Hello world", "--ids", "--no-bos"}, &rc),
            "19923 2058\n");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(run_tokenize_cmd({"-m", kVocabPath, "--text", "Hello\n"}, &rc),
            "0\t'<｜begin▁of▁sentence｜>'\n19923\t'Hello'\n201\t'\\n'\n");
  EXPECT_EQ(rc, 0);
  EXPECT_THROW(run_tokenize_cmd({"-m", "/nonexistent.gguf", "--text", "x"}, &rc), Error);
}
