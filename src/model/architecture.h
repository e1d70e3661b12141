// The one check every command makes first on a model file: general.architecture must be
// deepseek41. Without it, a GGUF of another architecture fails later with whatever the next
// reader trips over (a tokenizer key, a missing expert tensor), which names the wrong cause.
#pragma once
#include <optional>
#include <string>

namespace sluice {
namespace gguf { class File; }

inline constexpr const char* kArchitecture = "deepseek41";

// Why `f` is not a deepseek41 file ("architecture llama is not supported (sluice runs
// deepseek41)"), or nullopt when it is.
std::optional<std::string> architecture_problem(const gguf::File& f);
// Throws Error with architecture_problem's text (without the path; callers add it once).
void require_deepseek41(const gguf::File& f);

}  // namespace sluice
