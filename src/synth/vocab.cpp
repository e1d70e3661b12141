#include "synth/vocab.h"

#include <array>
#include <utility>

#include "format/gguf.h"
#include "util/error.h"

namespace sluice {
namespace {

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += (char)cp;
  } else if (cp < 0x800) {
    s += (char)(0xC0 | (cp >> 6));
    s += (char)(0x80 | (cp & 0x3F));
  } else {
    s += (char)(0xE0 | (cp >> 12));
    s += (char)(0x80 | ((cp >> 6) & 0x3F));
    s += (char)(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2 keeps printable Latin-1 bytes as their own code point and moves the rest to 256+.
bool printable_byte(uint32_t b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

// Byte values in bytes_to_unicode order: the printable ones first, then the others.
std::array<uint8_t, 256> byte_order() {
  std::array<uint8_t, 256> order{};
  size_t n = 0;
  for (uint32_t b = 0; b < 256; ++b)
    if (printable_byte(b)) order[n++] = (uint8_t)b;
  for (uint32_t b = 0; b < 256; ++b)
    if (!printable_byte(b)) order[n++] = (uint8_t)b;
  return order;
}

// The first merges of DeepSeek's vocabulary (as "left right"); every part is a byte token or
// the result of an earlier merge in this list, so any prefix is self-consistent.
constexpr std::array<std::pair<const char*, const char*>, 16> kMerges = {{
    {"Ġ", "t"}, {"Ġ", "a"}, {"i", "n"}, {"Ġ", "Ġ"}, {"h", "e"}, {"e", "r"}, {"o", "n"}, {"r", "e"},
    {"e", "n"}, {"a", "t"}, {"Ġ", "s"}, {"Ġt", "he"}, {"Ċ", "Ċ"}, {"o", "r"}, {"e", "s"}, {"Ġ", "c"},
}};

const std::vector<std::string>& string_array(const gguf::File& f, const std::string& key,
                                             const std::string& path) {
  const gguf::Value* v = f.find(key);
  if (!v || !v->is_array() || v->elem != gguf::ValueType::STRING)
    throw Error(path + ": vocabulary key " + key + (v ? " is not a string array" : " is missing"));
  return v->as;
}

}  // namespace

std::string gpt2_byte_token(uint8_t byte) {
  if (printable_byte(byte)) return utf8(byte);
  uint32_t n = 0;
  for (uint32_t b = 0; b < byte; ++b) n += printable_byte(b) ? 0 : 1;
  return utf8(256 + n);
}

std::vector<std::string> gpt2_byte_tokens() {
  std::vector<std::string> out;
  out.reserve(256);
  for (uint8_t b : byte_order()) out.push_back(gpt2_byte_token(b));
  return out;
}

Vocab synthetic_vocab(uint32_t vocab_size) {
  if (vocab_size < kSyntheticVocabMin)
    throw Error("vocab_size " + std::to_string(vocab_size) +
                " is too small for the synthetic vocabulary (needs at least " +
                std::to_string(kSyntheticVocabMin) + " tokens; pass --vocab)");
  Vocab v;
  v.tokens.reserve(vocab_size);
  v.token_type.reserve(vocab_size);
  auto push = [&](std::string s, TokenType t) {
    v.tokens.push_back(std::move(s));
    v.token_type.push_back((int32_t)t);
  };
  push("<｜begin▁of▁sentence｜>", TokenType::Control);
  push("<｜end▁of▁sentence｜>", TokenType::Control);
  push("<｜▁pad▁｜>", TokenType::Control);
  for (auto& s : gpt2_byte_tokens()) push(std::move(s), TokenType::Normal);
  for (const char* s : {"<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜"})
    push(s, TokenType::Control);
  for (const auto& [l, r] : kMerges) {
    if (v.tokens.size() >= vocab_size) break;
    push(std::string(l) + r, TokenType::Normal);
    v.merges.push_back(std::string(l) + " " + r);
  }
  for (uint32_t n = 0; v.tokens.size() < vocab_size; ++n)
    push("<｜place▁holder▁no▁" + std::to_string(n) + "｜>", TokenType::Control);
  return v;
}

Vocab load_vocab_gguf(const std::string& path) {
  gguf::File f = gguf::File::open(path);
  Vocab v;
  v.tokens = string_array(f, "tokenizer.ggml.tokens", path);
  v.merges = string_array(f, "tokenizer.ggml.merges", path);
  const gguf::Value* tt = f.find("tokenizer.ggml.token_type");
  if (!tt || !tt->is_array())
    throw Error(path + ": vocabulary key tokenizer.ggml.token_type " +
                (tt ? "is not an array" : "is missing"));
  if (tt->array_size() != v.tokens.size())
    throw Error(path + ": tokenizer.ggml.token_type has " + std::to_string(tt->array_size()) +
                " entries but tokenizer.ggml.tokens has " + std::to_string(v.tokens.size()));
  v.token_type.reserve(v.tokens.size());
  if (!tt->ai.empty()) {
    for (int64_t x : tt->ai) v.token_type.push_back((int32_t)x);
  } else if (!tt->au.empty() || v.tokens.empty()) {
    for (uint64_t x : tt->au) v.token_type.push_back((int32_t)x);
  } else {
    throw Error(path + ": tokenizer.ggml.token_type is not an integer array");
  }
  return v;
}

std::string default_vocab_path() { return std::string(SLUICE_DATA_DIR) + "/deepseek-v3-vocab.gguf"; }

void add_tokenizer_metadata(const Vocab& v, uint32_t bos_token_id, uint32_t eos_token_id,
                            gguf::Writer& w) {
  if (v.token_type.size() != v.tokens.size())
    throw Error("vocabulary has " + std::to_string(v.tokens.size()) + " tokens but " +
                std::to_string(v.token_type.size()) + " token types");
  w.add("tokenizer.ggml.model", gguf::Value::str("gpt2"));
  w.add("tokenizer.ggml.pre", gguf::Value::str("joyai-llm"));
  w.add("tokenizer.ggml.tokens", gguf::Value::array_str(v.tokens));
  w.add("tokenizer.ggml.token_type",
        gguf::Value::array_i32(std::vector<int64_t>(v.token_type.begin(), v.token_type.end())));
  w.add("tokenizer.ggml.merges", gguf::Value::array_str(v.merges));
  w.add("tokenizer.ggml.bos_token_id", gguf::Value::u32(bos_token_id));
  w.add("tokenizer.ggml.eos_token_id", gguf::Value::u32(eos_token_id));
  w.add("tokenizer.ggml.add_bos_token", gguf::Value::boolean(true));
  w.add("tokenizer.ggml.add_eos_token", gguf::Value::boolean(false));
}

}  // namespace sluice
