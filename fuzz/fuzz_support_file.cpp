// libFuzzer target for the checks a DSpark support file passes before anything is loaded from
// it (outside input like the model: `--dspark FILE`, `inspect`, `plan --dspark`). An input that
// starts with "GGUF" is the file itself; any other input edits a valid header-only support file
// for the tiny model (its payload a hole, as `make-model --sparse` writes it). Its first byte
// picks how: even, the file's bytes are damaged (pairs of offset and xor byte inside the header,
// an optional cut); odd, its keys and tensors are (a value changed, a type or a dimension
// changed to another valid one, an entry dropped or renamed) and the file is written again, which
// reaches the schema's key, shape and type checks past a reader that refuses most raw damage. Every check may refuse, but must
// never crash, read out of bounds or run unbounded; what it accepts must be self-consistent (a
// support file accepted against the tiny model has the expert tensors the drafter's store would
// read, inside the file).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/deepseek41/config.h"
#include "model/deepseek41/dspark_schema.h"
#include "storage/expert_geometry.h"
#include "util/error.h"

#include "memfd_input.h"

namespace {

const sluice::ModelConfig& tiny() {
  static const sluice::ModelConfig c = sluice::tiny_config();
  return c;
}

// The valid support file: its keys and tensors, its header bytes (up to its data section) and
// its whole size.
struct Seed {
  std::vector<sluice::gguf::KV> kvs;
  std::vector<sluice::TensorSpec> tensors;
  std::vector<uint8_t> header;
  uint64_t file_size = 0;
  std::string dir;  // where edited files are written
};

// The header and size of the file these keys and tensors make (false: the writer refuses them).
bool serialise(const Seed& s, const std::vector<sluice::gguf::KV>& kvs, const std::vector<sluice::TensorSpec>& tensors,
               std::vector<uint8_t>& header, uint64_t& size) {
  try {
    sluice::gguf::Writer w(16384);
    for (const sluice::gguf::KV& kv : kvs) w.add(kv.key, kv.value);
    for (const sluice::TensorSpec& t : tensors) w.add_tensor(t.name, t.ne, t.type);
    const std::string path = s.dir + "/edit.gguf";
    w.write(path, [](const sluice::gguf::TensorInfo&, const sluice::gguf::Writer::Sink&) {}, /*sparse=*/true,
            sluice::Existing::Replace);
    size = w.file_size();
    header.resize(w.data_offset());
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) std::abort();
    const bool ok = std::fread(header.data(), 1, header.size(), f) == header.size();
    std::fclose(f);
    return ok;
  } catch (const sluice::Error&) {
    return false;
  }
}

constexpr sluice::GgmlType kTypes[] = {sluice::GgmlType::F32,  sluice::GgmlType::F16,     sluice::GgmlType::BF16,
                                       sluice::GgmlType::Q8_0, sluice::GgmlType::Q2_K,    sluice::GgmlType::IQ2_XXS,
                                       sluice::GgmlType::I8,   sluice::GgmlType::MXFP4,   sluice::GgmlType::Q4_K};

// Edits from the input, 4 bytes each: what, which entry, and a value.
void edit(const uint8_t* d, size_t n, std::vector<sluice::gguf::KV>& kvs, std::vector<sluice::TensorSpec>& ts) {
  for (size_t i = 0; i + 4 <= n; i += 4) {
    const uint8_t op = d[i] % 7, v = d[i + 3];
    const size_t k = ((size_t)d[i + 1] | (size_t)d[i + 2] << 8);
    if (op <= 1 && !kvs.empty()) {
      sluice::gguf::KV& kv = kvs[k % kvs.size()];
      if (op == 0) {  // a value: small numbers near the real one, or far
        kv.value.u = v < 128 ? kv.value.u + v - 64 : (uint64_t)v << (v % 40);
        kv.value.i = (int64_t)kv.value.u;
        kv.value.f = (double)(int8_t)v;
        for (uint64_t& e : kv.value.au) e = e + v % 5 - 2;
        if (!kv.value.s.empty()) kv.value.s[v % kv.value.s.size()] ^= (char)(v | 1);
      } else {
        kvs.erase(kvs.begin() + (std::ptrdiff_t)(k % kvs.size()));
      }
    } else if (op == 2 && !kvs.empty()) {  // a key renamed: a near miss or another converter's name
      std::string& key = kvs[k % kvs.size()].key;
      key = v % 2 ? key + "_" : key.substr(0, key.find('.') + 1) + "n_" + key.substr(key.find('.') + 1);
    } else if (op >= 3 && !ts.empty()) {
      sluice::TensorSpec& t = ts[k % ts.size()];
      if (op == 3) t.type = kTypes[v % (sizeof kTypes / sizeof kTypes[0])];
      else if (op == 4) t.ne[v % t.ne.size()] = 1 + v / 2u;  // small, so the hole stays small
      else if (op == 5) ts.erase(ts.begin() + (std::ptrdiff_t)(k % ts.size()));
      else t.name[v % t.name.size()] = (char)('0' + v % 10);
    }
  }
}

const Seed& seed() {
  static const Seed s = [] {
    const sluice::DsparkConfig d = sluice::dspark_defaults(tiny());
    sluice::gguf::Writer w(16384);
    for (sluice::gguf::KV& kv : sluice::dspark_metadata(d, tiny())) w.add(kv.key, std::move(kv.value));
    for (const sluice::TensorSpec& t : sluice::dspark_tensors(d, tiny())) w.add_tensor(t.name, t.ne, t.type);
    char dir[] = "/tmp/fuzz_support_file.XXXXXX";
    if (!::mkdtemp(dir)) std::abort();
    const std::string path = std::string(dir) + "/seed.gguf";
    w.write(path, [](const sluice::gguf::TensorInfo&, const sluice::gguf::Writer::Sink&) {}, /*sparse=*/true);
    Seed r;
    r.kvs = sluice::dspark_metadata(d, tiny());
    r.tensors = sluice::dspark_tensors(d, tiny());
    r.dir = dir;
    static std::string made;  // removed when the fuzzer exits (libFuzzer ends with exit())
    made = dir;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(made, ec);
    });
    r.file_size = w.file_size();
    r.header.resize(w.data_offset());
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f || std::fread(r.header.data(), 1, r.header.size(), f) != r.header.size()) std::abort();
    std::fclose(f);
    // The seed itself must pass, or the damaged inputs test nothing.
    if (!sluice::validate_dspark(sluice::gguf::File::open(path), &tiny()).ok()) std::abort();
    std::filesystem::remove(path);
    return r;
  }();
  return s;
}

void exercise(const sluice::gguf::File& f) {
  for (const sluice::ModelConfig* target : {&tiny(), static_cast<const sluice::ModelConfig*>(nullptr)}) {
    const sluice::DsparkReport r = sluice::validate_dspark(f, target);
    if (!r.ok() || !target) continue;
    // Accepted against the model: the drafter's expert store could be built over it.
    const sluice::storage::ExpertGeometry g =
        sluice::storage::expert_geometry(f, r.config.stages, r.config.expert_count, "mtp.");
    for (const auto& layer : g.layers)
      for (const sluice::storage::ExpertTensor& t : layer)
        if (t.file_offset + t.nbytes > f.file_size()) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= 4 && std::memcmp(data, "GGUF", 4) == 0) {
    fuzz::put_file(data, size, size);
  } else if (size && (data[0] & 1)) {
    const Seed& s = seed();
    std::vector<sluice::gguf::KV> kvs = s.kvs;
    std::vector<sluice::TensorSpec> ts = s.tensors;
    edit(data + 1, size - 1, kvs, ts);
    std::vector<uint8_t> h;
    uint64_t file_size = 0;
    if (!serialise(s, kvs, ts, h, file_size) || file_size > (64ull << 20)) return 0;
    fuzz::put_file(h.data(), h.size(), file_size);
  } else {
    const Seed& s = seed();
    std::vector<uint8_t> h = s.header;
    size_t i = size ? 1 : 0;  // data[0]: bit 1 asks for a cut at the next 4 bytes' offset
    uint64_t cut = h.size();
    if (size && (data[0] & 2) && size >= 5) {
      uint32_t c;
      std::memcpy(&c, data + 1, 4);
      cut = c % (h.size() + 1);
      i = 5;
    }
    for (; i + 3 <= size; i += 3) {
      const uint32_t off = ((uint32_t)data[i] | (uint32_t)data[i + 1] << 8) % (uint32_t)h.size();
      h[off] ^= data[i + 2];
    }
    fuzz::put_file(h.data(), (size_t)cut, cut == h.size() ? s.file_size : cut);
  }
  try {
    const sluice::gguf::File f = sluice::gguf::File::open(fuzz::input_path());
    exercise(f);
  } catch (const sluice::Error&) {
  }
  return 0;
}
