// The sluice subcommands. Each one registers its options on the CLI11 app (setup_*) and runs
// from the parsed options (run_*). run_* returns the process exit code and throws sluice::Error
// for failures the user caused; main() turns those into one `sluice: error: ...` line.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include "format/gguf.h"
#include "model/architecture.h"
#include "model/deepseek41/config.h"
#include "model/deepseek41/load_checks.h"
#include "util/error.h"

namespace sluice::cli {

struct MakeModelOptions {
  std::string config;  // JSON file, or empty when a preset is used
  std::string preset;  // "tiny" | "published"
  std::string out;
  std::string dspark_out;  // DSpark support file for the model, empty: none
  std::string vocab;   // vocabulary GGUF, empty: default for the preset
  uint64_t seed = 0;
  bool sparse = false;
  bool force = false;  // replace an existing regular file at -o
};
CLI::App* setup_make_model(CLI::App& app, MakeModelOptions& o);
int run_make_model(const MakeModelOptions& o);

struct InspectOptions {
  std::string file;
  bool json = false;
  bool tensors = false;  // the tensor table in the text report (--json always has it)
  bool metadata = false; // every metadata key in the text report (default: a short summary)
  std::string dspark;    // a DSpark support file checked against the model FILE
  std::string target;    // FILE is a support file: the model it is checked against
};
CLI::App* setup_inspect(CLI::App& app, InspectOptions& o);
int run_inspect(const InspectOptions& o);

struct DumpTensorOptions {
  std::string file;
  std::string name;
  std::string out;
  bool force = false;  // replace an existing regular file at OUT
};
CLI::App* setup_dump_tensor(CLI::App& app, DumpTensorOptions& o);
int run_dump_tensor(const DumpTensorOptions& o);

// A usage mistake found after parsing (e.g. neither --config nor --preset): exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// gguf::File::open, with the path in the message whatever the reader's wording.
inline gguf::File open_gguf(const std::string& path) {
  try {
    return gguf::File::open(path);
  } catch (const Error& e) {
    throw Error(with_path(path, e.what()));
  }
}

// The model's config from its opened header f (nothing else is read): the architecture check
// first, then config_from_gguf; errors name the path once.
inline ModelConfig read_model_config(const std::string& path, const gguf::File& f) {
  try {
    return architecture_of(f).config(f, nullptr);
  } catch (const Error& e) {
    throw Error(with_path(path, e.what()));
  }
}

}  // namespace sluice::cli
