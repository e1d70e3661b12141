// `sluice dump-tensor`: one tensor decoded to little-endian f32, row by row.
#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "format/gguf.h"
#include "kernels/types.h"
#include "util/error.h"
#include "util/output_file.h"

namespace sluice::cli {
namespace {

static_assert(std::endian::native == std::endian::little, "dump-tensor writes host floats as little-endian");

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// How one stored row becomes floats: through a type's dequant (weights, Engram rows) or as
// plain integers / doubles (I8..I64, F64 have no dequant in the type table).
struct RowDecoder {
  GgmlType type = GgmlType::F32;  // storage type of the tensor
  DequantFn dequant = nullptr;
  uint64_t in_bytes = 0;          // bytes of one stored row
  uint64_t out_elems = 0;         // floats produced per row

  void decode(const uint8_t* src, float* dst) const {
    if (dequant) {
      dequant(src, dst, (int64_t)out_elems);
      return;
    }
    for (uint64_t i = 0; i < out_elems; ++i) {
      switch (type) {
        case GgmlType::I8: { int8_t v; std::memcpy(&v, src + i, 1); dst[i] = (float)v; break; }
        case GgmlType::I16: { int16_t v; std::memcpy(&v, src + 2 * i, 2); dst[i] = (float)v; break; }
        case GgmlType::I32: { int32_t v; std::memcpy(&v, src + 4 * i, 4); dst[i] = (float)v; break; }
        case GgmlType::I64: { int64_t v; std::memcpy(&v, src + 8 * i, 8); dst[i] = (float)v; break; }
        case GgmlType::F64: { double v; std::memcpy(&v, src + 8 * i, 8); dst[i] = (float)v; break; }
        default: throw Error("internal: no integer decoding for this type");
      }
    }
  }
};

RowDecoder make_decoder(const gguf::TensorInfo& t) {
  RowDecoder d;
  d.type = t.type;
  d.in_bytes = row_bytes(t.type, t.ne[0]);
  d.out_elems = t.ne[0];
  // Engram tables are stored as I8 [row_bytes, rows]; each row is one ENGRAM_ROW row.
  if (t.type == GgmlType::I8 && ends_with(t.name, ".engram_embd.weight")) {
    const TypeTraits& er = type_traits(GgmlType::ENGRAM_ROW);
    const uint64_t hd = t.ne[0] / (uint64_t)er.block_bytes * (uint64_t)er.block_elems;
    if (hd == 0 || row_bytes(GgmlType::ENGRAM_ROW, hd) != t.ne[0])
      throw Error("Engram table " + t.name + " has rows of " + std::to_string(t.ne[0]) +
                  " bytes, which is not a whole ENGRAM_ROW row");
    if (!er.dequant) throw Error("no decoder for Engram rows (ENGRAM_ROW)");
    d.dequant = er.dequant;
    d.out_elems = hd;
    return d;
  }
  switch (t.type) {
    case GgmlType::I8: case GgmlType::I16: case GgmlType::I32: case GgmlType::I64:
    case GgmlType::F64:
      return d;
    default: break;
  }
  const TypeTraits& tr = type_traits(t.type);
  if (!tr.dequant)
    throw Error("tensor " + t.name + " has type " + std::string(tr.name) +
                ", which sluice cannot decode");
  d.dequant = tr.dequant;
  return d;
}

}  // namespace

CLI::App* setup_dump_tensor(CLI::App& app, DumpTensorOptions& o) {
  CLI::App* sub = app.add_subcommand("dump-tensor", "Write one tensor decoded to little-endian f32");
  sub->footer(
      "Output: ne[0] values per row, rows in file order. Integer tensors are converted value by value;\n"
      "Engram tables (I8 rows) are decoded as Engram rows, giving engram_head_dim values per row.");
  sub->add_option("file", o.file, "GGUF file")->required();
  sub->add_option("name", o.name, "tensor name, e.g. blk.0.attn_norm.weight")->required();
  sub->add_option("out", o.out, "output file (raw f32); must not exist unless --force")->required();
  sub->add_flag("--force", o.force, "replace an existing regular file at OUT (never a link, device or directory)");
  return sub;
}

int run_dump_tensor(const DumpTensorOptions& o) {
  const gguf::File f = open_gguf(o.file);
  const gguf::TensorInfo* t = f.find_tensor(o.name);
  if (!t) throw Error(o.file + " has no tensor named " + o.name);
  const RowDecoder d = make_decoder(*t);
  const uint64_t rows = t->ne[0] == 0 ? 0 : t->n_elements() / t->ne[0];

  // Temp file beside OUT, renamed only when every row is written (util/output_file.h).
  AtomicOutputFile out(o.out, o.force ? Existing::Replace : Existing::Refuse);
  constexpr uint64_t kChunkBytes = 4ull << 20;
  const uint64_t chunk_rows = std::max<uint64_t>(1, kChunkBytes / std::max<uint64_t>(d.in_bytes, 1));
  std::vector<uint8_t> in;
  std::vector<float> vals;
  for (uint64_t r = 0; r < rows; r += chunk_rows) {
    const uint64_t n = std::min(chunk_rows, rows - r);
    in.resize(n * d.in_bytes);
    vals.resize(n * d.out_elems);
    f.read_bytes(*t, r * d.in_bytes, in.data(), in.size());
    for (uint64_t i = 0; i < n; ++i) d.decode(in.data() + i * d.in_bytes, vals.data() + i * d.out_elems);
    out.write(vals.data(), vals.size() * sizeof(float));
  }
  out.commit();
  std::printf("wrote %s: %llu rows x %llu f32 values of %s\n", o.out.c_str(),
              (unsigned long long)rows, (unsigned long long)d.out_elems, o.name.c_str());
  return 0;
}

}  // namespace sluice::cli
