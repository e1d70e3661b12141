// The one entry point for what differs between model architectures, chosen from a GGUF's
// general.architecture. sluice runs one (deepseek41); a second is one more Architecture in
// architecture.cpp, and the commands reach it only through architecture_of() / find_architecture():
// the config reader, the schema check, the tensor list admission sizes a model from, the engine
// and the chat format. A file of any other architecture gets one error naming it ("architecture
// llama is not supported (sluice runs deepseek41)") before anything else reads it, instead of
// failing later with whatever the next reader trips over (a tokenizer key, a missing tensor).
//
// The types are still deepseek41's (ModelConfig, Engine, SchemaReport): a second architecture
// would first make them its own or common ones. What this fixes now is the seam: one lookup,
// one table, no command testing the name itself.
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sluice {
// Declared only: the readers of the table include what they call (model/deepseek41/config.h,
// schema.h, model/deepseek41/forward.h, text/deepseek41/chat.h), and the files that only check a name stay light.
namespace gguf { class File; }
namespace text { struct ChatMessage; struct ChatOptions; struct PromptText; }
struct ModelConfig;
struct SchemaReport;
struct TensorSpec;
struct EngineOptions;
class Engine;
class Model;

inline constexpr const char* kArchitecture = "deepseek41";

struct Architecture {
  std::string_view name;  // general.architecture
  // Hyperparameters from the metadata (keys the file disagrees on to *disagreements, if given).
  ModelConfig (*config)(const gguf::File& f, std::vector<std::string>* disagreements);
  // Keys, tensor names, shapes and types against the schema of the file's own config.
  SchemaReport (*validate)(const gguf::File& f);
  // Every tensor a config implies, with its byte class: the footprint admission plans from
  // without a file (runtime/admission.h footprint_from_specs).
  std::vector<TensorSpec> (*tensors)(const ModelConfig& c);
  // What this engine does not implement of a valid config ("unsupported model: ..." lines).
  std::vector<std::string> (*support_problems)(const ModelConfig& c);
  // The forward pass over a loaded model.
  std::unique_ptr<Engine> (*make_engine)(const Model& m, EngineOptions o);
  // The chat format: messages rendered as the prompt text the model was trained on.
  // Messages' own text is data in it (text/prompt_text.h): it never becomes a control token.
  text::PromptText (*render_chat)(const std::vector<text::ChatMessage>& messages, const text::ChatOptions& options);
};

// Every architecture sluice runs.
std::span<const Architecture> architectures();
// The entry named `name`, or nullptr.
const Architecture* find_architecture(std::string_view name);
// Why `f` is not a file of an architecture sluice runs ("architecture llama is not supported
// (sluice runs deepseek41)", a missing or non-string general.architecture), or nullopt.
std::optional<std::string> architecture_problem(const gguf::File& f);
// f's entry; throws Error with architecture_problem's text (without the path; callers add it once).
const Architecture& architecture_of(const gguf::File& f);
// deepseek41's own readers (its config, its schema) refuse any other file: why f is not a
// deepseek41 file (architecture_problem's text for an unknown one), or nullopt.
std::optional<std::string> deepseek41_problem(const gguf::File& f);
// Throws Error with deepseek41_problem's text.
void require_deepseek41(const gguf::File& f);

}  // namespace sluice
