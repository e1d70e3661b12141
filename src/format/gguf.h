// GGUF v3: metadata values, tensor records, a hostile-input-safe reader and a streaming writer.
// The reader parses the header region only (bounded reads through pread); tensor payload is
// never mapped or read unless a caller asks for specific bytes with read_bytes().
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/tensor_type.h"
#include "util/output_file.h"

namespace sluice::gguf {

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8,
  ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
std::string_view value_type_name(ValueType t);  // "uint32", "string", ...; "unknown" otherwise

// align_up(x, a) = x rounded up to a multiple of a (a > 0). Callers guarantee no overflow.
inline uint64_t align_up(uint64_t x, uint64_t a) { return x + (a - x % a) % a; }

// One metadata value. Scalars live in the scalar fields; arrays keep their elements in one
// flat vector of the matching kind (numbers widened, strings as strings).
struct Value {
  ValueType type = ValueType::U32;
  ValueType elem = ValueType::U32;   // element type when type == ARRAY
  uint64_t u = 0;                    // U8/U16/U32/U64/BOOL
  int64_t i = 0;                     // I8/I16/I32/I64
  double f = 0;                      // F32/F64
  std::string s;                     // STRING
  std::vector<uint64_t> au;          // unsigned / bool array elements
  std::vector<int64_t> ai;           // signed array elements
  std::vector<double> af;            // float array elements
  std::vector<std::string> as;       // string array elements

  static Value u32(uint32_t v);
  static Value u64(uint64_t v);
  static Value i32(int32_t v);
  static Value f32(float v);
  static Value boolean(bool v);
  static Value str(std::string v);
  static Value array_u32(std::vector<uint64_t> v);
  static Value array_u64(std::vector<uint64_t> v);
  static Value array_i32(std::vector<int64_t> v);
  static Value array_f32(std::vector<double> v);
  static Value array_str(std::vector<std::string> v);

  bool is_array() const { return type == ValueType::ARRAY; }
  size_t array_size() const;
  // Numeric reads that accept any integer width/signedness (throws Error when the value is
  // not an integer, is negative, or does not fit).
  uint64_t as_uint() const;
  double as_float() const;  // any integer or float type
};

// Throws Error naming `key` when v cannot be written as-is: unknown type ids, nested arrays,
// scalars or elements out of range of their declared width, BOOL other than 0/1, array
// elements stored in the wrong vector. Writer::add() calls it.
void check_value(const Value& v, std::string_view key);

struct KV {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  std::array<uint64_t, 4> ne{1, 1, 1, 1};  // ne[0] is the contiguous (row) dimension
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;       // relative to the data section, as stored in the file
  uint64_t file_offset = 0;  // absolute
  uint64_t nbytes = 0;
  uint64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  uint64_t row_bytes() const { return n_dims == 0 ? 0 : nbytes / (n_elements() / ne[0]); }
};

// Hard caps on what a header may ask the reader to allocate. Defaults admit the published
// DeepSeek-V4.1 file (5.8 MB of metadata, 1,046 tensors) with wide margins.
struct Limits {
  uint64_t max_header_bytes = 256ull << 20;  // whole KV + tensor-record region
  uint64_t max_kv = 1u << 16;
  uint64_t max_tensors = 1u << 20;
  uint64_t max_string = 1u << 24;            // one string, bytes
  uint64_t max_array = 1u << 26;             // elements of one array
  uint64_t max_dim = 1ull << 40;             // one dimension
};

class File {
 public:
  // Opens and validates a GGUF file. Throws Error when the path cannot be opened or is not a
  // regular file. Throws FormatError (field + offset) on any violation:
  // bad magic/version, counts, lengths and offsets out of file or overflowing, unknown value or
  // tensor types, nested arrays, duplicate keys or tensor names, dims, misalignment,
  // overlapping or out-of-file tensors, general.alignment of the wrong type or not a power of 2.
  static File open(const std::string& path, const Limits& limits = {});
  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }   // start of the data section
  uint64_t file_size() const { return file_size_; }
  const std::vector<KV>& kvs() const { return kvs_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  const Value* find(std::string_view key) const;
  const TensorInfo* find_tensor(std::string_view name) const;
  // Typed lookups; throw Error naming the key when missing or of the wrong kind.
  const Value& get(std::string_view key) const;
  uint64_t get_uint(std::string_view key) const;
  double get_float(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;

  // Explicit payload access: reads exactly n bytes at `offset` within tensor t (pread).
  void read_bytes(const TensorInfo& t, uint64_t offset, void* dst, uint64_t n) const;
  int fd() const { return fd_; }

 private:
  File() = default;
  std::string path_;
  int fd_ = -1;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
  std::vector<KV> kvs_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Streaming writer. Add metadata and tensor records, then write(): the header is serialised,
// the data section laid out with every tensor at an `alignment` multiple, and each tensor's
// payload produced by the callback in chunks (so multi-GB tensors never sit in memory).
// With sparse = true no payload is written: the file is extended with holes (ftruncate).
class Writer {
 public:
  explicit Writer(uint32_t alignment = 32);     // throws unless a nonzero power of two
  // Throws on a duplicate or empty key and on a value check_value() refuses.
  void add(std::string key, Value v);
  // dims: ne[0] first. Throws when ne[0] is not a whole number of blocks of `type`, and on
  // anything the reader would refuse: duplicate / empty / >= 64-byte names, 0 or > 4 dims, a
  // dim of 0, an unknown type, a byte size overflowing int64.
  void add_tensor(std::string name, std::vector<uint64_t> dims, GgmlType type);
  uint32_t alignment() const { return alignment_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  uint64_t header_bytes() const;   // size of header + KV + records, before padding
  uint64_t data_offset() const;    // align_up(header_bytes(), alignment)
  uint64_t file_size() const;      // data_offset() + aligned tensor data
  // tensors()[i].offset and nbytes are final once added; file_offset is kept current
  // (it moves when later add() / add_tensor() calls grow the header).

  // emit(tensor, sink): call sink(bytes, n) repeatedly to produce exactly tensor.nbytes bytes.
  using Sink = std::function<void(const void*, size_t)>;
  using Emit = std::function<void(const TensorInfo&, const Sink&)>;
  // Writes a temporary file beside `path` and renames it over `path` only when everything
  // succeeded (AtomicOutputFile, util/output_file.h): a failure (I/O error, emit throwing or
  // producing the wrong byte count) never leaves a partial file under the final name, and only
  // an absent path or (Existing::Replace) a regular file is ever replaced. Throws Error when
  // alignment != 32 and general.alignment was not added (or does not match), and on any I/O
  // error or refused target (message names the path).
  void write(const std::string& path, const Emit& emit, bool sparse = false,
             Existing existing = Existing::Refuse) const;

 private:
  void refresh_file_offsets();
  uint32_t alignment_;
  std::vector<KV> kvs_;
  std::vector<TensorInfo> tensors_;
  uint64_t data_bytes_ = 0;     // end of the last tensor, relative to the data section
  uint64_t header_bytes_ = 24;  // running size of header + KVs + records
  std::set<std::string, std::less<>> keys_, names_;
};

}  // namespace sluice::gguf
