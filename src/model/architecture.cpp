#include "model/architecture.h"

#include "format/gguf.h"
#include "text/utf8.h"
#include "util/error.h"

namespace sluice {

std::optional<std::string> architecture_problem(const gguf::File& f) {
  const std::string runs = std::string(" (sluice runs ") + kArchitecture + ")";
  const gguf::Value* arch = f.find("general.architecture");
  if (!arch) return "general.architecture is missing" + runs;
  if (arch->type != gguf::ValueType::STRING)
    return "general.architecture is a " + std::string(gguf::value_type_name(arch->type)) + ", not a string" + runs;
  if (arch->s != kArchitecture) {
    // A hostile name could be long: 64 bytes say enough.
    const std::string name = arch->s.size() > 64 ? text::utf8_sanitize(arch->s.substr(0, 64)) + "..." : text::utf8_sanitize(arch->s);
    return "architecture " + name + " is not supported" + runs;
  }
  return std::nullopt;
}

void require_deepseek41(const gguf::File& f) {
  if (auto problem = architecture_problem(f)) throw Error(*problem);
}

}  // namespace sluice
