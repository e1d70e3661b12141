// `sluice inspect`: a short summary (shape, size, byte classes, type mix, the checks run makes);
// every metadata key (--metadata) and the tensor table (--tensors) on request.
#include <algorithm>
#include <optional>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "format/gguf.h"
#include "kernels/types.h"
#include "model/architecture.h"
#include "model/deepseek41/dspark_schema.h"
#include "model/deepseek41/load_checks.h"
#include "model/deepseek41/schema.h"
#include "util/error.h"
#include "util/format_bytes.h"

namespace sluice::cli {
namespace {

using gguf::Value;
using gguf::ValueType;

std::string type_label(const Value& v) {
  if (v.is_array()) return "arr[" + std::string(gguf::value_type_name(v.elem)) + "]";
  return std::string(gguf::value_type_name(v.type));
}

std::string tensor_type_name(GgmlType t) {
  const TypeTraits* tr = find_type((uint32_t)t);
  return tr ? std::string(tr->name) : "type" + std::to_string((uint32_t)t);
}

// One line of printable text: control bytes escaped, at most `limit` bytes of the original
// (cut on a UTF-8 boundary), so a hostile file cannot garble the terminal. Quotes are left
// as they are: this is a report for people, where an escaped quote reads as \"llama\" (the
// --json output is the one to parse).
std::string printable(const std::string& s, size_t limit = std::string::npos) {
  size_t cut = std::min(limit, s.size());
  while (cut < s.size() && cut > 0 && ((unsigned char)s[cut] & 0xC0) == 0x80) --cut;
  std::string out;
  for (size_t i = 0; i < cut; ++i) {
    const unsigned char ch = (unsigned char)s[i];
    if (ch == '\n') out += "\\n";
    else if (ch == '\t') out += "\\t";
    else if (ch < 0x20 || ch == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", ch);
      out += buf;
    } else out += (char)ch;
  }
  if (cut < s.size()) out += "...";
  return out;
}

std::string short_string(const std::string& s) {
  std::string out = "\"" + printable(s, 60) + "\"";
  if (s.size() > 60) out += " (" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::string short_value(const Value& v) {
  switch (v.type) {
    case ValueType::ARRAY: return "length " + std::to_string(v.array_size());
    case ValueType::STRING: return short_string(v.s);
    case ValueType::BOOL: return v.u ? "true" : "false";
    case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64:
      return std::to_string(v.i);
    case ValueType::F32: case ValueType::F64: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.9g", v.f);
      return buf;
    }
    default: return std::to_string(v.u);
  }
}

std::string dims(const gguf::TensorInfo& t) {
  std::string s = "[";
  for (uint32_t d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
  return s + "]";
}

nlohmann::ordered_json value_json(const Value& v) {
  nlohmann::ordered_json j;
  j["type"] = type_label(v);
  switch (v.type) {
    case ValueType::ARRAY: j["length"] = v.array_size(); break;
    case ValueType::STRING: j["value"] = v.s; break;
    case ValueType::BOOL: j["value"] = v.u != 0; break;
    case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64:
      j["value"] = v.i; break;
    case ValueType::F32: case ValueType::F64: j["value"] = v.f; break;
    default: j["value"] = v.u; break;
  }
  return j;
}

double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

// After the report: 0 when run would accept the file, else the first problem as the error.
int verdict(const std::string& path, const std::vector<std::string>& problems) {
  if (problems.empty()) return 0;
  std::fflush(stdout);
  std::string more;
  if (problems.size() > 1) more = " (and " + std::to_string(problems.size() - 1) + " more problem(s), listed in the report)";
  throw Error(with_path(path, problems.front()) + more);
}

}  // namespace

CLI::App* setup_inspect(CLI::App& app, InspectOptions& o) {
  CLI::App* sub = app.add_subcommand(
      "inspect", "Summarise a GGUF: the model's shape and size, byte classes, type mix and the checks run makes");
  sub->footer(
      "The checks are the ones `sluice run` makes before loading: architecture deepseek41, the\n"
      "schema (keys, tensor names, shapes, types), what the engine supports, and the tokenizer.\n"
      "Exit status: 0 when the file passes them; 1 when it parses as GGUF but fails one (the report\n"
      "still goes to stdout, problems listed, with --json under \"errors\"; the first problem is the\n"
      "one error line on stderr); 1 when it does not parse (one error line, no report).");
  sub->add_option("file", o.file, "GGUF file")->required();
  sub->add_flag("--json", o.json, "print one JSON object instead of the text report (always with every tensor)");
  sub->add_flag("--tensors", o.tensors, "include the tensor table in the text report (one row per tensor)");
  sub->add_flag("--metadata", o.metadata,
                "every metadata key in the text report (the default is a short summary; --json always has them)");
  auto* ds = sub->add_option("--dspark", o.dspark, "also check this DSpark support file against the model FILE");
  auto* tg = sub->add_option("--target", o.target,
                             "FILE is a DSpark support file: check its shapes and hyperparameters against this model");
  ds->excludes(tg);
  return sub;
}

namespace {

// A DSpark support file and, when given, the model it is checked against (spec 6.2).
struct DsparkCheck {
  std::string path;
  DsparkReport rep;
  bool against_model = false;
};

DsparkCheck check_dspark(const std::string& support_path, const std::string& model_path) {
  DsparkCheck d;
  d.path = support_path;
  const gguf::File sf = open_gguf(support_path);
  std::optional<ModelConfig> target;
  if (!model_path.empty()) {
    const gguf::File mf = open_gguf(model_path);
    if (const std::vector<std::string> p = load_problems(mf); !p.empty())
      throw Error(with_path(model_path, "the target model fails its own checks: " + p.front()));
    target = architecture_of(mf).config(mf, nullptr);
  }
  d.rep = validate_dspark(sf, target ? &*target : nullptr);
  d.against_model = target.has_value();
  return d;
}

void print_dspark(const DsparkCheck& d, const std::string& model_path) {
  const DsparkConfig& c = d.rep.config;
  std::string targets;
  for (uint32_t l : c.target_layers) targets += (targets.empty() ? "" : ", ") + std::to_string(l);
  std::printf("\nDSpark support %s (%s)\n", d.path.c_str(), printable(d.rep.architecture, 40).c_str());
  std::printf("  drafter      %u stages, blocks of %u rows (anchor + %u noise rows of token %u), drafts from the\n"
              "               mean of the streams entering target layers [%s]; Markov rank %u; %u routed experts, top-%u\n",
              c.stages, c.block_size, c.block_size ? c.block_size - 1 : 0, c.noise_token, targets.c_str(), c.markov_rank,
              c.expert_count, c.expert_used);
  std::printf("  bytes        resident %.3f GiB, routed experts %.3f GiB (%llu bytes per expert and stage)\n",
              gib(d.rep.resident_bytes), gib(d.rep.routed_expert_bytes), (unsigned long long)d.rep.expert_bytes_per_stage);
  if (!d.against_model)
    std::printf("  shapes       not checked: they are the target model's widths (give --target MODEL)\n");
  if (d.rep.ok())
    std::printf("  check        OK%s\n", d.against_model ? (" against " + model_path).c_str() : "");
  else
    for (const std::string& e : d.rep.errors) std::printf("  - %s\n", printable(e).c_str());
}


uint64_t tensor_data_bytes(const gguf::File& f) {
  uint64_t n = 0;
  for (const auto& t : f.tensors()) n += t.nbytes;
  return n;
}

// "25.6M" parameters, "1.28T": what people call a model's size.
std::string count_label(uint64_t n) {
  char buf[32];
  if (n >= 1000000000000ull) std::snprintf(buf, sizeof buf, "%.3gT", (double)n / 1e12);
  else if (n >= 1000000000ull) std::snprintf(buf, sizeof buf, "%.3gB", (double)n / 1e9);
  else if (n >= 1000000ull) std::snprintf(buf, sizeof buf, "%.3gM", (double)n / 1e6);
  else std::snprintf(buf, sizeof buf, "%llu", (unsigned long long)n);
  return buf;
}

// The short report's head: what the file is, the model's shape, its size and its type mix.
void print_summary(const gguf::File& f, const std::string& path, const SchemaReport& rep, const Value* arch,
                   bool has_arch) {
  std::printf("file         %s\n", path.c_str());
  std::printf("gguf         v%u, %s (%llu bytes), %zu metadata keys, %zu tensors\n", f.version(),
              format_bytes(f.file_size()).c_str(), (unsigned long long)f.file_size(), f.kvs().size(),
              f.tensors().size());
  const Value* name = f.find("general.name");
  std::printf("architecture %s%s\n", has_arch ? printable(arch->s, 60).c_str() : "(none)",
              name && name->type == ValueType::STRING ? (" (" + printable(name->s, 60) + ")").c_str() : "");
  if (has_arch && !is_dspark_architecture(f) && rep.errors.empty()) {
    const ModelConfig c = architecture_of(f).config(f, nullptr);
    std::printf("shape        %u layers, hidden %u, vocab %u, context up to %llu; %u routed experts (top-%u) + %u shared"
                " per layer\n",
                c.num_hidden_layers, c.hidden_size, c.vocab_size, (unsigned long long)c.max_position_embeddings,
                c.n_routed_experts, c.num_experts_per_tok, c.n_shared_experts);
  }
  uint64_t params = 0;
  for (const auto& t : f.tensors()) params += t.n_elements();
  std::printf("parameters   %s in %s of tensor data\n", count_label(params).c_str(),
              format_bytes(tensor_data_bytes(f)).c_str());
  // The type mix: tensors and bytes per storage type, largest first.
  std::vector<std::pair<std::string, std::pair<size_t, uint64_t>>> mix;
  for (const auto& t : f.tensors()) {
    const std::string n = tensor_type_name(t.type);
    auto it = std::find_if(mix.begin(), mix.end(), [&](const auto& m) { return m.first == n; });
    if (it == mix.end()) it = mix.insert(mix.end(), {n, {0, 0}});
    it->second.first += 1;
    it->second.second += t.nbytes;
  }
  std::sort(mix.begin(), mix.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  std::string types;
  for (const auto& [n, cb] : mix)
    types += (types.empty() ? "" : "; ") + n + ": " + std::to_string(cb.first) + " tensors, " + format_bytes(cb.second);
  std::printf("types        %s\n", types.empty() ? "(no tensors)" : types.c_str());
}

// The long report's head: the file's layout and every metadata key.
void print_metadata(const gguf::File& f, const std::string& path, const Value* arch, bool has_arch) {
  std::printf("file         %s\n", path.c_str());
  std::printf("gguf         v%u, alignment %llu, data offset %llu, %llu bytes\n", f.version(),
              (unsigned long long)f.alignment(), (unsigned long long)f.data_offset(),
              (unsigned long long)f.file_size());
  std::printf("architecture %s\n", has_arch ? printable(arch->s, 60).c_str() : "(none)");
  std::printf("\nmetadata (%zu keys)\n", f.kvs().size());
  for (const auto& kv : f.kvs())
    std::printf("  %-58s %-12s %s\n", printable(kv.key).c_str(), type_label(kv.value).c_str(),
                short_value(kv.value).c_str());
}

void print_tensor_table(const gguf::File& f) {
  std::printf("\ntensors (%zu, %llu bytes)\n", f.tensors().size(), (unsigned long long)tensor_data_bytes(f));
  std::printf("  %-40s %-8s %-24s %14s %16s\n", "name", "type", "ne", "bytes", "offset");
  for (const auto& t : f.tensors())
    std::printf("  %-40s %-8s %-24s %14llu %16llu\n", printable(t.name).c_str(), tensor_type_name(t.type).c_str(),
                dims(t).c_str(), (unsigned long long)t.nbytes, (unsigned long long)t.offset);
}

void print_byte_classes(const gguf::File& f, const SchemaReport& rep) {
  const auto line = [](const char* name, uint64_t b) {
    std::printf("  %-15s %10s  %16llu bytes\n", name, format_bytes(b).c_str(), (unsigned long long)b);
  };
  std::printf("\nbyte classes (tensor bytes, unaligned)\n");
  line("resident", rep.resident_bytes);
  line("routed experts", rep.routed_expert_bytes);
  line("engram tables", rep.engram_bytes);
  if (!is_dspark_architecture(f))
    std::printf("  one expert in one layer: gate %s + up %s + down %s = %s (%u layers x %u experts)\n",
                format_bytes(rep.expert_gate_bytes).c_str(), format_bytes(rep.expert_up_bytes).c_str(),
                format_bytes(rep.expert_down_bytes).c_str(), format_bytes(rep.expert_bytes_per_layer).c_str(),
                rep.n_layer, rep.n_expert);
}

}  // namespace

int run_inspect(const InspectOptions& o) {
  const gguf::File f = open_gguf(o.file);
  SchemaReport rep;  // the byte classes; the problems are load_problems', what run refuses
  try {
    rep = validate_deepseek41(f);
  } catch (const Error&) {
  }
  // A support file is checked as one (its byte classes are its own), against --target if given.
  std::optional<DsparkCheck> ds;
  if (is_dspark_architecture(f)) {
    ds = check_dspark(o.file, o.target);
    rep = SchemaReport{};
    rep.resident_bytes = ds->rep.resident_bytes;
    rep.routed_expert_bytes = ds->rep.routed_expert_bytes;
    rep.errors = ds->rep.errors;
  } else {
    if (!o.target.empty()) throw UsageError(o.file + " is not a DSpark support file; --target is for one");
    rep.errors = load_problems(f);
    if (!o.dspark.empty()) {
      ds = check_dspark(o.dspark, rep.errors.empty() ? o.file : std::string());
      for (const std::string& e : ds->rep.errors) rep.errors.push_back(o.dspark + ": " + e);
    }
  }
  const std::string model_path = is_dspark_architecture(f) ? o.target : o.file;
  const Value* arch = f.find("general.architecture");
  const bool has_arch = arch && arch->type == ValueType::STRING;
  const uint64_t tensor_data = tensor_data_bytes(f);

  if (o.json) {
    nlohmann::ordered_json j;
    j["path"] = o.file;
    j["version"] = f.version();
    j["architecture"] = has_arch ? nlohmann::ordered_json(arch->s) : nlohmann::ordered_json(nullptr);
    j["alignment"] = f.alignment();
    j["data_offset"] = f.data_offset();
    j["file_bytes"] = f.file_size();
    j["kv_count"] = f.kvs().size();
    j["tensor_count"] = f.tensors().size();
    j["tensor_data_bytes"] = tensor_data;
    j["resident_bytes"] = rep.resident_bytes;
    j["routed_expert_bytes"] = rep.routed_expert_bytes;
    j["engram_bytes"] = rep.engram_bytes;
    j["expert_bytes_per_layer"] = rep.expert_bytes_per_layer;
    j["expert_gate_bytes"] = rep.expert_gate_bytes;
    j["expert_up_bytes"] = rep.expert_up_bytes;
    j["expert_down_bytes"] = rep.expert_down_bytes;
    j["n_layer"] = rep.n_layer;
    j["n_expert"] = rep.n_expert;
    if (ds) {
      const DsparkConfig& c = ds->rep.config;
      nlohmann::ordered_json d;
      d["path"] = ds->path;
      d["architecture"] = ds->rep.architecture;
      d["checked_against_model"] = ds->against_model;
      d["stages"] = c.stages;
      d["block_size"] = c.block_size;
      d["noise_token_id"] = c.noise_token;
      d["target_layer_ids"] = c.target_layers;
      d["markov_rank"] = c.markov_rank;
      d["expert_count"] = c.expert_count;
      d["expert_used_count"] = c.expert_used;
      d["resident_bytes"] = ds->rep.resident_bytes;
      d["routed_expert_bytes"] = ds->rep.routed_expert_bytes;
      d["errors"] = ds->rep.errors;
      j["dspark"] = std::move(d);
    }
    j["valid"] = rep.errors.empty();
    j["errors"] = rep.errors;
    auto& meta = j["metadata"] = nlohmann::ordered_json::array();
    for (const auto& kv : f.kvs()) {
      auto e = value_json(kv.value);
      e["key"] = kv.key;
      meta.push_back(std::move(e));
    }
    auto& tensors = j["tensors"] = nlohmann::ordered_json::array();
    for (const auto& t : f.tensors()) {
      nlohmann::ordered_json e;
      e["name"] = t.name;
      e["type"] = tensor_type_name(t.type);
      e["ne"] = std::vector<uint64_t>(t.ne.begin(), t.ne.begin() + t.n_dims);
      e["bytes"] = t.nbytes;
      e["offset"] = t.offset;
      e["file_offset"] = t.file_offset;
      tensors.push_back(std::move(e));
    }
    // Strings in a hostile file need not be UTF-8: replace bad bytes instead of throwing.
    std::puts(j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
    return verdict(o.file, rep.errors);
  }

  if (o.metadata) print_metadata(f, o.file, arch, has_arch);
  else print_summary(f, o.file, rep, arch, has_arch);
  if (o.tensors) print_tensor_table(f);
  print_byte_classes(f, rep);
  if (ds) print_dspark(*ds, model_path);
  if (ds && is_dspark_architecture(f)) {
    // The support file's problems were listed with it.
  } else if (rep.errors.empty()) {
    std::printf("\nschema deepseek41: OK\n");
  } else {
    std::printf("\nschema deepseek41: %zu problem(s)\n", rep.errors.size());
    for (const auto& e : rep.errors) std::printf("  - %s\n", printable(e).c_str());
  }
  if (!o.metadata || !o.tensors)
    std::printf("\n%s%s%s\n", o.metadata ? "" : "every metadata key with --metadata",
                o.metadata || o.tensors ? "" : ", ", o.tensors ? "" : "the tensor table with --tensors");
  return verdict(o.file, rep.errors);
}

}  // namespace sluice::cli
