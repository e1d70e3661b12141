// What `run` refuses a file for before it reads any payload, as one list, so `inspect` reports
// exactly what `run` would stop at (it used to pass files run rejects: a tokenizer whose token
// types do not match its tokens, a vocabulary larger than vocab_size, an engine limit).
//
//   validate_deepseek41   architecture, keys, tensor names, shapes and types (schema.h)
//   support_problems      what this engine implements (MQA, sqrtsoftplus, kernels, head sizes)
//   tokenizer_problems    the tokenizer builds (tokenizer.ggml.*) and fits vocab_size
#pragma once
#include <string>
#include <vector>

#include "model/deepseek41/config.h"

namespace sluice {
namespace gguf { class File; }

// Engine limits a config must meet; "unsupported model: ..." lines, empty when it is runnable.
std::vector<std::string> support_problems(const ModelConfig& c);
namespace text { class Tokenizer; }
// A tokenizer with more tokens than the model has rows for; "" when it fits.
std::string vocab_fit_problem(const text::Tokenizer& tok, const ModelConfig& c);
// The tokenizer of `f` built as run builds it, and checked against c.vocab_size.
std::vector<std::string> tokenizer_problems(const gguf::File& f, const ModelConfig& c);
// Everything above (schema first; the others only when the config could be read).
std::vector<std::string> load_problems(const gguf::File& f);

}  // namespace sluice
