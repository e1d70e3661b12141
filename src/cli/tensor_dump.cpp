#include "cli/tensor_dump.h"

#include <bit>

#include "cli/commands.h"
#include "util/error.h"

namespace sluice::cli {
namespace {

static_assert(std::endian::native == std::endian::little, "--dump-tensors writes host floats as little-endian");

// Tensor names are short; no useful filter comes near this.
constexpr size_t kMaxFilterBytes = 1024;

// A linear-time matcher (util/linear_regex.h): std::regex backtracks, and nested quantifiers ran
// for minutes on one name. Empty: every name (wants() does not ask it).
LinearRegex compile_filter(const std::string& text) {
  if (text.size() > kMaxFilterBytes)
    throw UsageError("--dump-filter: " + std::to_string(text.size()) + " bytes; at most " +
                     std::to_string(kMaxFilterBytes) + " are accepted");
  try {
    return LinearRegex(text);
  } catch (const Error& e) {
    throw UsageError("--dump-filter: '" + text + "' is not a regular expression of the supported subset: " + e.what() +
                     " (docs/numerics.md lists it)");
  }
}

}  // namespace

TensorDump::TensorDump(const std::string& dir, const std::string& filter, Existing existing)
    : filter_text_(filter),
      filter_(compile_filter(filter)),
      dir_(dir, existing, "--dump-tensors directory", "index.json and the tensor files"),
      existing_(existing),
      index_(dir_.file("index.json"), existing) {}

bool TensorDump::wants(std::string_view name) const {
  if (filter_text_.empty() || filter_.search(name)) return true;
  if (skipped_.find(name) == skipped_.end()) skipped_.emplace(name);
  return false;
}

// The tensor's name with anything but [A-Za-z0-9._-] as '_' (names come from the engine, but a
// file name must not become a path), made unique, + ".f32"; never "index.json".
std::string TensorDump::file_name_for(std::string_view name) {
  std::string base;
  for (const char c : name.substr(0, 200)) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    base.push_back(ok ? c : '_');
  }
  if (base.empty() || base[0] == '.') base.insert(base.begin(), '_');
  std::string f = base + ".f32";
  for (int k = 2; files_.count(f); ++k) f = base + "-" + std::to_string(k) + ".f32";
  files_.insert(f);
  return f;
}

void TensorDump::observe(std::string_view name, uint32_t p0, uint32_t n, const float* data, size_t width,
                         size_t stride) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    Tensor t;
    t.name = std::string(name);
    t.file = file_name_for(name);
    t.width = width;
    t.first = p0;
    t.out = std::make_unique<AtomicOutputFile>(dir_.file(t.file), existing_);
    tensors_.push_back(std::move(t));
    it = by_name_.emplace(std::string(name), tensors_.size() - 1).first;
  }
  Tensor& t = tensors_[it->second];
  // One row per position, each once and in order: the file is [position][width] with no index
  // of its own. Anything else (a session that rolled back and evaluated positions again) would
  // make it wrong, so it is an error, not a silently mixed file.
  if (width != t.width)
    throw Error("--dump-tensors: tensor " + t.name + " was " + std::to_string(t.width) + " floats wide, now " +
                std::to_string(width));
  if ((uint64_t)p0 != t.first + t.count)
    throw Error("--dump-tensors: tensor " + t.name + " got position " + std::to_string(p0) + " after positions " +
                std::to_string(t.first) + ".." + std::to_string(t.first + t.count) +
                " (exclusive); a dump holds each position once, in order");
  const size_t row = width * sizeof(float);
  if (stride == width) {
    t.out->write(data, (size_t)n * row);
  } else {
    for (uint32_t i = 0; i < n; ++i) t.out->write(data + (size_t)i * stride, row);
  }
  t.count += n;
  bytes_ += (uint64_t)n * row;
}

size_t TensorDump::finish(nlohmann::json info) {
  nlohmann::json list = nlohmann::json::array();
  for (const Tensor& t : tensors_) {
    nlohmann::json j;
    j["name"] = t.name;
    j["file"] = t.file;
    j["dtype"] = "f32";
    j["width"] = t.width;
    j["first"] = t.first;
    j["count"] = t.count;
    j["bytes"] = t.count * t.width * sizeof(float);
    list.push_back(std::move(j));
  }
  info["format"] = "sluice-tensor-dump";
  info["version"] = 1;
  info["byte_order"] = "little";
  info["layout"] = "row-major [count][width] f32; row i is position first + i";
  info["filter"] = filter_text_;
  info["filter_match"] = "ECMAScript subset, searched (unanchored) in linear time; empty: every tensor";
  info["tensors"] = std::move(list);
  info["not_dumped"] = skipped_;
  index_.write(info.dump(1) + "\n");
  for (Tensor& t : tensors_) t.out->commit();
  index_.commit();
  dir_.keep();
  return tensors_.size();
}

}  // namespace sluice::cli
