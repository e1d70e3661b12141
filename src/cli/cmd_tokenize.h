// `sluice tokenize`: runs the model's tokenizer on text and prints the tokens.
// Registered like the other subcommands (see commands.h): setup_tokenize on the app, then
// run_tokenize when the subcommand was parsed.
#pragma once
#include <string>

#include <CLI/CLI.hpp>

namespace sluice::cli {

struct TokenizeOptions {
  std::string model;      // GGUF with tokenizer.ggml.* keys (a model or a vocabulary file)
  std::string text;       // used when text_given, else stdin is read
  bool text_given = false;
  bool ids_only = false;  // one line of space-separated ids
  bool no_bos = false;
  bool no_special = false;  // control-token strings in the text are plain text
};
CLI::App* setup_tokenize(CLI::App& app, TokenizeOptions& o);
int run_tokenize(const TokenizeOptions& o);

}  // namespace sluice::cli
