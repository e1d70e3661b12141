// `sluice make-model`: write a synthetic deepseek41 GGUF for a preset or a config.json.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "model/deepseek41/config.h"
#include "synth/generate.h"
#include "synth/vocab.h"
#include "util/error.h"
#include "util/output_file.h"

namespace sluice::cli {
namespace {

nlohmann::json read_config_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot open config " + path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": invalid JSON: " + e.what());
  }
  return j;
}

ModelConfig load_config_file(const std::string& path, const nlohmann::json& j) {
  try {
    return config_from_json(j);
  } catch (const nlohmann::json::exception& e) {  // a key of the wrong JSON type
    throw Error(path + ": " + e.what());
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

}  // namespace

CLI::App* setup_make_model(CLI::App& app, MakeModelOptions& o) {
  CLI::App* sub = app.add_subcommand(
      "make-model", "Write a deepseek41 GGUF with the published schema and random but valid weights");
  sub->footer(
      "Give exactly one of --config and --preset. The published preset uses DeepSeek's vocabulary\n"
      "(" + default_vocab_path() + "); other configs get a synthetic byte-level\n"
      "vocabulary of exactly vocab_size tokens unless --vocab is given. The same seed gives the same bytes.\n"
      "Output: written to a temporary file beside -o and renamed when complete; an existing -o is\n"
      "refused unless --force, and a link, device, FIFO or directory is never replaced.");
  auto* config = sub->add_option("--config", o.config, "model config.json (spec section 1 keys)");
  auto* preset = sub->add_option("--preset", o.preset, "built-in config: tiny | published")
                     ->check(CLI::IsMember({"tiny", "published"}));
  config->excludes(preset);
  sub->add_option("-o,--output", o.out, "output GGUF path (must not exist unless --force)");
  sub->add_option("--dspark-out", o.dspark_out,
                  "also (or only, without -o) write a DSpark support GGUF for the model (random weights; dspark_* "
                  "keys of the config.json override the published drafter's hyperparameters scaled to the model)");
  sub->add_flag("--force", o.force, "replace an existing regular file at -o (never a link, device or directory)");
  sub->add_option("--seed", o.seed, "seed of the random weights (default 0)");
  sub->add_flag("--sparse", o.sparse, "write headers only; tensor data stays a file hole");
  sub->add_option("--vocab", o.vocab,
                  "vocabulary GGUF to copy tokens/token_type/merges from (size must equal vocab_size)");
  return sub;
}

int run_make_model(const MakeModelOptions& o) {
  if (o.config.empty() == o.preset.empty())
    throw UsageError("make-model needs exactly one of --config FILE or --preset tiny|published");
  if (o.out.empty() && o.dspark_out.empty()) throw UsageError("make-model needs -o FILE, --dspark-out FILE or both");
  if (!o.out.empty() && o.out == o.dspark_out) throw UsageError("-o and --dspark-out name the same file");
  const Existing existing = o.force ? Existing::Replace : Existing::Refuse;
  // Before the (for the published preset, long) generation.
  if (!o.out.empty()) check_output_target(o.out, existing);
  if (!o.dspark_out.empty()) check_output_target(o.dspark_out, existing);
  ModelConfig c;
  nlohmann::json flat = nlohmann::json::object();
  if (!o.config.empty()) {
    const nlohmann::json j = read_config_json(o.config);
    c = load_config_file(o.config, j);
    flat = flatten_config_json(j);
  } else {
    c = o.preset == "published" ? published_config() : tiny_config();
    finalize(c);
  }
  std::string vocab_path = o.vocab;
  if (vocab_path.empty() && o.preset == "published") vocab_path = default_vocab_path();
  Vocab v;
  if (vocab_path.empty()) {
    v = synthetic_vocab(c.vocab_size);
  } else {
    v = load_vocab_gguf(vocab_path);
    if (v.tokens.size() != c.vocab_size)
      throw Error("vocabulary " + vocab_path + " has " + std::to_string(v.tokens.size()) +
                  " tokens but the config's vocab_size is " + std::to_string(c.vocab_size));
  }
  GenerateOptions g;
  g.seed = o.seed;
  g.sparse = o.sparse;
  g.existing = existing;
  auto report = [&](const std::string& path, const GenerateResult& r) {
    std::printf("wrote %s: %llu tensors, %llu bytes (data at %llu)%s\n", path.c_str(), (unsigned long long)r.tensor_count,
                (unsigned long long)r.file_bytes, (unsigned long long)r.data_offset, o.sparse ? ", sparse" : "");
  };
  DsparkConfig d;
  if (!o.dspark_out.empty()) {
    try {
      d = dspark_config_from_json(c, flat);
    } catch (const Error& e) {
      throw Error(o.config + ": " + e.what());
    }
    if (const std::vector<std::string> bad = dspark_generator_problems(d, c); !bad.empty())
      throw Error((o.config.empty() ? std::string("the ") + o.preset + " preset" : o.config) + ": " + bad.front());
  }
  if (!o.out.empty()) report(o.out, generate_model(c, v, o.out, g));
  if (!o.dspark_out.empty()) report(o.dspark_out, generate_dspark(d, c, o.dspark_out, g));
  return 0;
}

}  // namespace sluice::cli
