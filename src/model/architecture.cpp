#include "model/architecture.h"

#include "format/gguf.h"
#include "model/deepseek41/config.h"
#include "model/deepseek41/forward.h"
#include "model/deepseek41/load_checks.h"
#include "model/deepseek41/schema.h"
#include "text/deepseek41/chat.h"
#include "text/utf8.h"
#include "util/error.h"

namespace sluice {
namespace {

const Architecture kArchitectures[] = {
    {
        kArchitecture,
        [](const gguf::File& f, std::vector<std::string>* d) { return config_from_gguf(f, d); },
        validate_deepseek41,
        deepseek41_tensors,
        support_problems,
        [](const Model& m, EngineOptions o) { return std::make_unique<Engine>(m, o); },
        text::render_chat_prompt,
    },
};

// " (sluice runs deepseek41)", naming every entry.
std::string runs() {
  std::string s = " (sluice runs ";
  for (size_t i = 0; i < std::size(kArchitectures); ++i) s += (i ? ", " : "") + std::string(kArchitectures[i].name);
  return s + ")";
}

}  // namespace

std::span<const Architecture> architectures() { return kArchitectures; }

const Architecture* find_architecture(std::string_view name) {
  for (const Architecture& a : kArchitectures)
    if (a.name == name) return &a;
  return nullptr;
}

std::optional<std::string> architecture_problem(const gguf::File& f) {
  const gguf::Value* arch = f.find("general.architecture");
  if (!arch) return "general.architecture is missing" + runs();
  if (arch->type != gguf::ValueType::STRING)
    return "general.architecture is a " + std::string(gguf::value_type_name(arch->type)) + ", not a string" + runs();
  if (!find_architecture(arch->s)) {
    // A hostile name could be long: 64 bytes say enough.
    const std::string name = arch->s.size() > 64 ? text::utf8_sanitize(arch->s.substr(0, 64)) + "..." : text::utf8_sanitize(arch->s);
    return "architecture " + name + " is not supported" + runs();
  }
  return std::nullopt;
}

const Architecture& architecture_of(const gguf::File& f) {
  if (auto problem = architecture_problem(f)) throw Error(*problem);
  return *find_architecture(f.find("general.architecture")->s);
}

std::optional<std::string> deepseek41_problem(const gguf::File& f) {
  if (auto problem = architecture_problem(f)) return problem;
  const std::string& name = f.find("general.architecture")->s;
  if (name != kArchitecture) return "a " + name + " file is not read as " + kArchitecture;
  return std::nullopt;
}

void require_deepseek41(const gguf::File& f) {
  if (auto problem = deepseek41_problem(f)) throw Error(*problem);
}

}  // namespace sluice
