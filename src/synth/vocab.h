// Tokenizer metadata for generated deepseek41 files: either copied from a vocabulary GGUF
// (DeepSeek's real one ships as data/deepseek-v3-vocab.gguf) or synthesized for any vocab size.
//
// Synthetic layout (byte-level BPE, GGUF model "gpt2"), exactly vocab_size tokens:
//   0, 1, 2      "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"     (type 3)
//   3 .. 258     the 256 GPT-2 byte tokens in bytes_to_unicode order, as in DeepSeek's
//                vocabulary ("!" is id 3, byte 0x00 -> "Ā" comes after the printable ones) (type 1)
//   259 .. 263   "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜"        (type 3)
//   264 ..       merged tokens of the first DeepSeek merges ("Ġ t" -> "Ġt", "Ġ a", "i n", ...,
//                up to 16, as many as fit; each merge's parts precede it)               (type 1)
//   rest         "<｜place▁holder▁no▁N｜>", N = 0, 1, ...                                (type 3)
// merges = exactly the merges whose merged token is present. vocab_size must be >= 264.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sluice {
namespace gguf { class Writer; }

enum class TokenType : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> token_type;  // one per token (llama.cpp token types)
  std::vector<std::string> merges;  // "left right", priority order
};

// The 256 byte-level token strings, index = position in bytes_to_unicode order (not byte value).
std::vector<std::string> gpt2_byte_tokens();
// The UTF-8 string GPT-2 uses for one raw byte value.
std::string gpt2_byte_token(uint8_t byte);

constexpr uint32_t kSyntheticVocabMin = 264;
Vocab synthetic_vocab(uint32_t vocab_size);  // throws Error when vocab_size < kSyntheticVocabMin

// Reads tokenizer.ggml.tokens / token_type / merges from a GGUF (tensors are ignored).
// Throws Error naming the file and key when one is missing or malformed.
Vocab load_vocab_gguf(const std::string& path);

// SLUICE_DATA_DIR/deepseek-v3-vocab.gguf: DeepSeek's 129,280-token vocabulary.
std::string default_vocab_path();

// The tokenizer keys of the published file: model "gpt2", pre "joyai-llm", tokens, token_type
// (i32[]), merges, bos/eos ids (u32), add_bos_token true, add_eos_token false. No chat template
// and no padding id, like the published converter.
void add_tokenizer_metadata(const Vocab& v, uint32_t bos_token_id, uint32_t eos_token_id,
                            gguf::Writer& w);

}  // namespace sluice
