#include "model/deepseek41/load_checks.h"

#include "format/gguf.h"
#include "kernels/types.h"
#include "model/architecture.h"
#include "model/deepseek41/schema.h"
#include "text/tokenizer.h"
#include "util/error.h"

namespace sluice {

std::vector<std::string> support_problems(const ModelConfig& c) {
  std::vector<std::string> out;
  auto require = [&](bool ok, const std::string& what) {
    if (!ok) out.push_back("unsupported model: " + what);
  };
  require(c.num_key_value_heads == 1, "num_key_value_heads must be 1 (MQA, K = V)");
  require(c.scoring_func == "sqrtsoftplus", "scoring_func " + c.scoring_func);
  require(c.hidden_act == "silu", "hidden_act " + c.hidden_act);
  require(c.n_shared_experts == 1, "n_shared_experts must be 1");
  require(c.qk_rope_head_dim % 2 == 0 && c.qk_rope_head_dim <= c.head_dim && c.qk_rope_head_dim <= c.index_head_dim,
          "qk_rope_head_dim must be even and fit the heads");
  require(c.head_dim % 32 == 0 && c.index_head_dim % 32 == 0, "head_dim and index_head_dim must be multiples of 32");
  require(c.o_groups != 0 && c.num_attention_heads % c.o_groups == 0,
          "num_attention_heads must be a multiple of o_groups");
  // Every matrix type the config names is computed with; a type sluice can size but has no
  // kernels for would fail at load.
  TensorTypes types = c.types;
  for (const std::string& field : tensor_type_fields()) {
    const TypeTraits* t = find_type((uint32_t)tensor_type_field(types, field));
    require(t && t->has_kernels, field + " tensors have type " + (t ? std::string(t->name) : std::string("?")) +
                                     ", which has no kernels");
  }
  return out;
}

std::string vocab_fit_problem(const text::Tokenizer& tok, const ModelConfig& c) {
  if ((uint64_t)tok.n_vocab() <= c.vocab_size) return "";
  return "the tokenizer has " + std::to_string(tok.n_vocab()) + " tokens but vocab_size is " + std::to_string(c.vocab_size);
}

std::vector<std::string> tokenizer_problems(const gguf::File& f, const ModelConfig& c) {
  try {
    const text::Tokenizer tok = text::Tokenizer::from_gguf(f);
    if (std::string p = vocab_fit_problem(tok, c); !p.empty()) return {p};
  } catch (const Error& e) {
    return {e.what()};
  }
  return {};
}

std::vector<std::string> load_problems(const gguf::File& f) {
  // A file of another architecture: that is the one problem; its keys mean something else.
  if (auto problem = architecture_problem(f)) return {*problem};
  const Architecture& arch = architecture_of(f);
  std::vector<std::string> out;
  try {
    out = arch.validate(f).errors;
  } catch (const Error& e) {  // the schema check lists problems, but never let it abort the list
    out.push_back(e.what());
  }
  ModelConfig c;
  try {
    c = arch.config(f, nullptr);
  } catch (const Error&) {
    return out;  // the schema check has reported why
  }
  for (auto& p : arch.support_problems(c)) out.push_back(std::move(p));
  for (auto& p : tokenizer_problems(f, c)) out.push_back(std::move(p));
  return out;
}

}  // namespace sluice
