// text/token_text.h, the one path between text and ids for run, chat and the server: the
// tokens that end generation never show (whatever their type), chat markup is kept only for
// the chat parser, and each prompt kind is tokenized with its own BOS and special-token rule.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "format/gguf.h"
#include "synth/vocab.h"
#include "text/token_text.h"
#include "text/tokenizer.h"

namespace {

using sluice::TokenId;
using namespace sluice::text;

const Tokenizer& deepseek() {
  static const Tokenizer tok =
      Tokenizer::from_gguf(sluice::gguf::File::open(std::string(SLUICE_DATA_DIR) + "/deepseek-v3-vocab.gguf"));
  return tok;
}

TEST(TokenText, EndTokensNeverShowEvenWhenTheyAreText) {
  VocabData v;
  v.tokens = sluice::gpt2_byte_tokens();
  v.tokens.push_back("hi");
  const Tokenizer tok(std::move(v));
  const TokenId hi = *tok.find("hi");
  OutputDecoder plain(tok, OutputMode::Plain);
  EXPECT_TRUE(plain.shows(hi));
  EXPECT_EQ(plain.push(hi), "hi");
  OutputDecoder ending(tok, OutputMode::Plain, {hi});
  EXPECT_FALSE(ending.shows(hi));
  EXPECT_EQ(ending.push(hi), "");
  EXPECT_EQ(ending.push(*tok.find("a")), "a");
}

TEST(TokenText, ChatMarkupShowsOnlyForTheChatParser) {
  VocabData v;
  v.tokens = sluice::gpt2_byte_tokens();
  v.token_type.assign(v.tokens.size(), 1);
  for (const char* control : {"<think>", "<｜User｜>"}) {
    v.tokens.push_back(control);
    v.token_type.push_back(3);
  }
  const Tokenizer tok(std::move(v));
  const TokenId think = *tok.find("<think>"), user = *tok.find("<｜User｜>");
  OutputDecoder plain(tok, OutputMode::Plain), chat(tok, OutputMode::Chat);
  EXPECT_EQ(plain.push(think), "");
  EXPECT_EQ(chat.push(think), "<think>");
  // A control token that is not markup shows in neither.
  EXPECT_EQ(plain.push(user), "");
  EXPECT_EQ(chat.push(user), "");
}

TEST(TokenText, EachPromptKindHasItsOwnBosAndSpecialRule) {
  const Tokenizer& tok = deepseek();
  ASSERT_TRUE(tok.add_bos_default());
  const TokenId bos = *tok.bos(), user = *tok.find("<｜User｜>"), hi = *tok.find("hi");
  EXPECT_EQ(encode_prompt_text(tok, "<｜User｜>hi", SpecialTokens::Parse), (std::vector<TokenId>{bos, user, hi}));
  const std::vector<TokenId> as_text = encode_prompt_text(tok, "<｜User｜>hi", SpecialTokens::AsText);
  ASSERT_GT(as_text.size(), 3u);
  EXPECT_EQ(as_text[0], bos);
  for (TokenId id : as_text) EXPECT_NE(id, user);
  // The rendered chat carries its own BOS: none is added.
  EXPECT_EQ(encode_chat_text(tok, PromptText{"<｜begin▁of▁sentence｜><｜User｜>hi", {}}), (std::vector<TokenId>{bos, user, hi}));
  EXPECT_EQ(count_text_tokens(tok, "hi"), 1u);
  EXPECT_EQ(count_text_tokens(tok, "<｜User｜>"), as_text.size() - 2);
}

}  // namespace
