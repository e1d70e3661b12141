#include "synth/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "kernels/types.h"
#include "util/error.h"

namespace sluice {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t row_seed(uint64_t tseed, uint64_t row) { return splitmix64(tseed ^ splitmix64(row)); }

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }
bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

// Uniform noise of rms `scale` around `center` (uniform on [-a, a] has rms a/sqrt(3)).
void uniform_row(float* dst, uint64_t n, uint64_t seed, float center, float scale) {
  const float a = scale * std::sqrt(3.0f);
  uint64_t state = seed;
  for (uint64_t i = 0; i < n; ++i) {
    state = splitmix64(state);
    const float u = (float)(state >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    dst[i] = center + a * (2.0f * u - 1.0f);
  }
}

const TypeTraits& random_traits(const TensorSpec& t, GgmlType type) {
  const TypeTraits& tr = type_traits(type);
  if (!tr.random)
    throw Error("cannot generate tensor " + t.name + ": type " + std::string(tr.name) +
                " has no random-block generator");
  return tr;
}

}  // namespace

InitRule init_rule(const TensorSpec& t) {
  const std::string_view n = t.name;
  const uint64_t fan_in = t.ne.empty() ? 1 : std::max<uint64_t>(t.ne[0], 1);
  const float linear = 1.0f / std::sqrt((float)fan_in);
  InitRule r;
  if (t.cls == ByteClass::Engram) {
    r.kind = InitKind::EngramRows;
    r.scale = 0.5f;
    return r;
  }
  if (contains(n, "_norm.") || contains(n, "output_norm") || ends_with(n, ".norm.weight")) {
    r.center = 1.0f;
    r.scale = 0.05f;
  } else if (contains(n, "attn_sinks") || ends_with(n, ".bias")) {
    r.scale = 0.01f;
  } else if (contains(n, "hc_") && (ends_with(n, "_base.weight") || ends_with(n, "_scale.weight"))) {
    r.scale = 0.1f;
  } else if (contains(n, "hc_") && ends_with(n, "_fn.weight")) {
    r.scale = 0.1f * linear;
  } else if (n == "token_embd.weight") {
    r.scale = 1.0f;
  } else {
    r.scale = linear;
  }
  // Only F32 can carry a non-zero center; a norm stored quantized gets rms ~1 instead.
  if (t.type == GgmlType::F32) {
    r.kind = InitKind::Uniform;
  } else {
    r.kind = InitKind::Blocks;
    if (r.center != 0) r.scale = r.center, r.center = 0;
  }
  return r;
}

uint64_t tensor_seed(uint64_t seed, std::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a over the name
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001B3ull;
  return splitmix64(h ^ splitmix64(seed));
}

uint64_t tensor_rows(const TensorSpec& t) {
  uint64_t rows = 1;
  for (size_t i = 1; i < t.ne.size(); ++i) rows *= t.ne[i];
  return rows;
}

uint64_t tensor_row_bytes(const TensorSpec& t) {
  if (t.ne.empty()) throw Error("tensor " + t.name + " has no dimensions");
  return row_bytes(t.type, t.ne[0]);
}

void generate_rows(const ModelConfig& c, const TensorSpec& t, uint64_t seed, uint64_t first_row,
                   uint64_t n_rows, void* dst) {
  const InitRule rule = init_rule(t);
  const uint64_t tseed = tensor_seed(seed, t.name);
  const uint64_t rb = tensor_row_bytes(t);
  auto* out = static_cast<uint8_t*>(dst);
  switch (rule.kind) {
    case InitKind::Uniform: {
      // The output buffer is only byte-aligned: draw into a float row, then copy.
      std::vector<float> row(t.ne[0]);
      for (uint64_t r = 0; r < n_rows; ++r) {
        uniform_row(row.data(), t.ne[0], row_seed(tseed, first_row + r), rule.center, rule.scale);
        std::memcpy(out + r * rb, row.data(), rb);
      }
      break;
    }
    case InitKind::Blocks: {
      const TypeTraits& tr = random_traits(t, t.type);
      const int64_t nblocks = (int64_t)(t.ne[0] / (uint64_t)tr.block_elems);
      for (uint64_t r = 0; r < n_rows; ++r)
        tr.random(out + r * rb, nblocks, row_seed(tseed, first_row + r), rule.scale);
      break;
    }
    case InitKind::EngramRows: {
      const TypeTraits& tr = random_traits(t, GgmlType::ENGRAM_ROW);
      const uint64_t hd = c.engram_head_dim;
      if (row_bytes(GgmlType::ENGRAM_ROW, hd) != rb)
        throw Error("Engram table " + t.name + " has rows of " + std::to_string(rb) +
                    " bytes but engram_head_dim " + std::to_string(hd) + " needs " +
                    std::to_string(row_bytes(GgmlType::ENGRAM_ROW, hd)));
      const int64_t nblocks = (int64_t)(hd / (uint64_t)tr.block_elems);
      for (uint64_t r = 0; r < n_rows; ++r)
        tr.random(out + r * rb, nblocks, row_seed(tseed, first_row + r), rule.scale);
      break;
    }
  }
}

gguf::Writer model_writer(const ModelConfig& c, const Vocab& v) {
  if (v.tokens.size() != c.vocab_size)
    throw Error("the vocabulary has " + std::to_string(v.tokens.size()) +
                " tokens but the config's vocab_size is " + std::to_string(c.vocab_size));
  gguf::Writer w(kDeepseek41Alignment);
  add_deepseek41_metadata(c, w);
  add_tokenizer_metadata(v, c.bos_token_id, c.eos_token_id, w);
  for (const TensorSpec& t : deepseek41_tensors(c)) w.add_tensor(t.name, t.ne, t.type);
  return w;
}

namespace {

// Writes w's tensors with the payload of specs (looked up by name), in chunks of whole rows of
// about 4 MiB, so a multi-GB tensor never sits in memory.
GenerateResult write_tensors(const ModelConfig& c, const gguf::Writer& w, const std::vector<TensorSpec>& specs,
                             const std::string& path, const GenerateOptions& o) {
  std::map<std::string, const TensorSpec*, std::less<>> by_name;
  for (const TensorSpec& t : specs) by_name[t.name] = &t;
  constexpr uint64_t kChunkBytes = 4ull << 20;
  std::vector<uint8_t> buf;
  auto emit = [&](const gguf::TensorInfo& info, const gguf::Writer::Sink& sink) {
    auto it = by_name.find(info.name);
    if (it == by_name.end()) throw Error("writer asked for unknown tensor " + info.name);
    const TensorSpec& t = *it->second;
    const uint64_t rb = tensor_row_bytes(t), rows = tensor_rows(t);
    if (rb * rows != info.nbytes)
      throw Error("tensor " + t.name + ": " + std::to_string(info.nbytes) +
                  " bytes in the writer, " + std::to_string(rb * rows) + " from the schema");
    const uint64_t chunk_rows = std::max<uint64_t>(1, kChunkBytes / std::max<uint64_t>(rb, 1));
    for (uint64_t r = 0; r < rows; r += chunk_rows) {
      const uint64_t n = std::min(chunk_rows, rows - r);
      buf.resize(n * rb);
      generate_rows(c, t, o.seed, r, n, buf.data());
      sink(buf.data(), buf.size());
    }
  };
  // The writer goes through a temporary file and renames it, so a failure leaves no output.
  w.write(path, emit, o.sparse, o.existing);
  GenerateResult r;
  r.file_bytes = w.file_size();
  r.data_offset = w.data_offset();
  r.tensor_count = w.tensors().size();
  return r;
}

}  // namespace

GenerateResult generate_model(const ModelConfig& c, const Vocab& v, const std::string& path,
                              const GenerateOptions& o) {
  return write_tensors(c, model_writer(c, v), deepseek41_tensors(c), path, o);
}

GenerateResult generate_dspark(const DsparkConfig& d, const ModelConfig& c, const std::string& path,
                               const GenerateOptions& o) {
  if (const std::vector<std::string> bad = dspark_generator_problems(d, c); !bad.empty()) throw Error(bad.front());
  gguf::Writer w(kDeepseek41Alignment);
  for (gguf::KV& kv : dspark_metadata(d, c)) w.add(std::move(kv.key), std::move(kv.value));
  const std::vector<TensorSpec> specs = dspark_tensors(d, c);
  for (const TensorSpec& t : specs) w.add_tensor(t.name, t.ne, t.type);
  // Its own seed stream: a support file made with the model's seed is not a copy of its layers.
  GenerateOptions so = o;
  so.seed = o.seed ^ 0x64737061726bull;  // "dspark"
  return write_tensors(c, w, specs, path, so);
}

}  // namespace sluice
