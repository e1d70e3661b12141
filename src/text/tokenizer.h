// Byte-level BPE tokenizer for DeepSeek vocabularies (GGUF tokenizer model "gpt2", pre-tokenizer
// "deepseek-v3" / "joyai-llm"), plus the detokenizer and a streaming decoder.
//
// encode(): added tokens (token_type 3 control, 4 user-defined) are cut out first, as whole
// units, leftmost-longest; the text between them goes through the three-pass pre-tokenizer
// (text/pretokenize.h), each piece is mapped byte -> GPT-2 unicode char -> initial symbol and
// merged by rank (lowest first, leftmost on ties), like the Hugging Face BPE model.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/prompt_text.h"
#include "util/token_id.h"

namespace sluice::gguf { class File; }

namespace sluice::text {

// llama.cpp token types, as stored in tokenizer.ggml.token_type.
enum class TokenType : int32_t {
  Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

// What a vocabulary file holds, before validation.
struct VocabData {
  std::vector<std::string> tokens;
  std::vector<int32_t> token_type;   // empty: every token Normal
  std::vector<std::string> merges;   // "left right", highest priority first
  std::optional<TokenId> bos, eos;
  bool add_bos = true;
};

class Tokenizer {
 public:
  // Validates and indexes the vocabulary. Throws Error naming the problem: sizes that do not
  // match, an unknown token type, a byte without its GPT-2 token, a merge that is not
  // "left right" or whose parts / result are not tokens, bos/eos out of range.
  explicit Tokenizer(VocabData v);

  // Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,bos_token_id,eos_token_id,
  // add_bos_token}. Throws Error (message names the file and key) when the model is not
  // "gpt2", the pre-tokenizer is not one this tokenizer implements, or a key is malformed.
  static Tokenizer from_gguf(const gguf::File& f);

  // parse_special = false: control tokens in the text are ordinary text (user-defined ones
  // still match, as in llama.cpp). add_bos prepends bos() when the vocabulary has one.
  // Throws Error when the text is 4 GiB or larger.
  // `data`: byte ranges (text/prompt_text.h, sorted and disjoint) where no added token is read,
  // of any type: their bytes are BPE text whatever they spell.
  std::vector<TokenId> encode(std::string_view text, bool add_bos, bool parse_special = true,
                              std::span<const TextRange> data = {}) const;
  std::vector<TokenId> encode(const PromptText& p, bool add_bos) const {
    return encode(p.text, add_bos, /*parse_special=*/true, p.data);
  }
  // Length of the longest added token (any type) the encoder would read at text[i] with no
  // byte at or past `limit`; 0 for none.
  size_t added_token_at(std::string_view text, size_t i, size_t limit) const;
  // Whether `id` is an added token (one the encoder cuts out before BPE: control, user-defined).
  bool is_added(TokenId id) const;

  // Concatenated token bytes. render_special = false drops control/unused/unknown tokens
  // (user-defined ones are text and always render). Throws Error on an id out of range.
  // The result may end inside a UTF-8 character (or hold ill-formed bytes) when the ids
  // do; see StreamDecoder and utf8_sanitize.
  std::string decode(std::span<const TokenId> ids, bool render_special = true) const;

  // The bytes one token stands for (see decode for render_special). Throws on a bad id.
  std::string_view token_to_piece(TokenId id, bool render_special = true) const;

  int32_t n_vocab() const { return (int32_t)text_.size(); }
  std::optional<TokenId> bos() const { return bos_; }
  std::optional<TokenId> eos() const { return eos_; }
  bool add_bos_default() const { return add_bos_; }
  TokenType type(TokenId id) const;                       // throws on a bad id
  const std::string& token_text(TokenId id) const;         // as stored in the vocabulary
  std::optional<TokenId> find(std::string_view token_text) const;  // exact vocabulary string
  size_t n_merges() const { return merges_.size(); }

 private:
  struct Merge {
    uint32_t rank;
    TokenId result;
  };
  struct TrieNode {
    std::vector<std::pair<uint8_t, int32_t>> next;  // byte -> node index
    std::optional<TokenId> token;                   // token ending here
    bool needs_special = false;                     // control token: only with parse_special
  };

  void check_id(TokenId id) const;
  void bpe(std::string_view piece, std::vector<TokenId>& out) const;
  // Length of the longest added token starting at text[i] (0: none), its id in *id.
  // Only bytes before `limit` count.
  size_t match_added(std::string_view text, size_t i, size_t limit, bool parse_special, TokenId* id) const;

  std::vector<std::string> text_;    // token strings as in the vocabulary
  std::vector<std::string> bytes_;   // the bytes each token decodes to
  std::vector<TokenType> type_;
  std::unordered_map<std::string, TokenId> ids_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  TokenId byte_token_[256];
  std::vector<TrieNode> trie_;       // added tokens; node 0 is the root
  bool first_byte_[256] = {};        // some added token starts with this byte
  std::optional<TokenId> bos_, eos_;
  bool add_bos_ = true;
};

// Turns a stream of token ids into text that never ends inside a UTF-8 character: bytes of an
// incomplete character are held until a later token completes them, and ill-formed bytes
// become U+FFFD. The concatenation of all push() results and finish() equals
// utf8_sanitize(tokenizer.decode(ids)) (which is decode(ids) itself for well-formed text).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool render_special = true)
      : tok_(&tok), render_special_(render_special) {}
  std::string push(TokenId id);   // throws Error on a bad id
  std::string finish();           // flushes held bytes (as U+FFFD) and resets
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool render_special_;
  std::string pending_;
};

}  // namespace sluice::text
