// gguf::Writer: lays out a GGUF v3 file and streams it to disk. Everything the reader would
// reject is refused at add time, so a file this writer produces always reopens.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "format/gguf.h"
#include "format/gguf_detail.h"
#include "util/error.h"
#include "util/file_size_limit.h"
#include "util/output_file.h"

namespace sluice::gguf {
namespace {

using namespace detail;

// Buffered sequential output to one fd; every failure names the file.
class Out {
 public:
  Out(int fd, const std::string& path) : fd_(fd), path_(path) { buf_.reserve(kBuf); }

  uint64_t pos() const { return pos_; }

  void put(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    if (buf_.size() + n > kBuf) flush();
    if (n >= kBuf) {
      write_all(b, n);
    } else {
      buf_.insert(buf_.end(), b, b + n);
    }
    pos_ += n;
  }
  template <class T>
  void put_le(T v) {
    put(&v, sizeof v);
  }
  void put_string(std::string_view s) {
    put_le<uint64_t>(s.size());
    put(s.data(), s.size());
  }
  void zeros(uint64_t n) {
    static const uint8_t z[4096] = {};
    while (n > 0) {
      size_t m = (size_t)std::min<uint64_t>(n, sizeof z);
      put(z, m);
      n -= m;
    }
  }
  void flush() {
    write_all(buf_.data(), buf_.size());
    buf_.clear();
  }

 private:
  void write_all(const uint8_t* p, size_t n) {
    while (n > 0) {
      ssize_t r = ::write(fd_, p, std::min<size_t>(n, 1u << 30));
      if (r < 0) {
        if (errno == EINTR) continue;
        throw Error("cannot write " + path_ + ": " + write_error_text(errno));
      }
      p += r;
      n -= (size_t)r;
    }
  }

  static constexpr size_t kBuf = 1 << 20;
  int fd_;
  const std::string& path_;
  std::vector<uint8_t> buf_;
  uint64_t pos_ = 0;
};

void put_scalar(Out& o, ValueType t, uint64_t u, int64_t i, double f) {
  switch (t) {
    case ValueType::U8: case ValueType::BOOL: o.put_le<uint8_t>((uint8_t)u); break;
    case ValueType::U16: o.put_le<uint16_t>((uint16_t)u); break;
    case ValueType::U32: o.put_le<uint32_t>((uint32_t)u); break;
    case ValueType::U64: o.put_le<uint64_t>(u); break;
    case ValueType::I8: o.put_le<int8_t>((int8_t)i); break;
    case ValueType::I16: o.put_le<int16_t>((int16_t)i); break;
    case ValueType::I32: o.put_le<int32_t>((int32_t)i); break;
    case ValueType::I64: o.put_le<int64_t>(i); break;
    case ValueType::F32: o.put_le<float>((float)f); break;
    case ValueType::F64: o.put_le<double>(f); break;
    case ValueType::STRING: case ValueType::ARRAY: break;
  }
}

void put_value(Out& o, const Value& v) {
  if (v.type == ValueType::STRING) return o.put_string(v.s);
  if (v.type != ValueType::ARRAY) return put_scalar(o, v.type, v.u, v.i, v.f);
  o.put_le<uint32_t>((uint32_t)v.elem);
  o.put_le<uint64_t>(v.array_size());
  switch (kind_of(v.elem)) {
    case Kind::Unsigned: for (uint64_t x : v.au) put_scalar(o, v.elem, x, 0, 0); break;
    case Kind::Signed: for (int64_t x : v.ai) put_scalar(o, v.elem, 0, x, 0); break;
    case Kind::Float: for (double x : v.af) put_scalar(o, v.elem, 0, 0, x); break;
    case Kind::String: for (const auto& s : v.as) o.put_string(s); break;
    case Kind::Array: break;
  }
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

Writer::Writer(uint32_t alignment) : alignment_(alignment) {
  if (alignment == 0 || !std::has_single_bit(alignment))
    throw Error("GGUF alignment " + std::to_string(alignment) + " is not a nonzero power of two");
}

void Writer::add(std::string key, Value v) {
  if (key.empty()) throw Error("GGUF metadata key is empty");
  if (key.size() > kMaxKeyBytes)
    throw Error("GGUF metadata key of " + std::to_string(key.size()) + " bytes is longer than 65535");
  if (keys_.count(key)) throw Error("duplicate GGUF metadata key '" + key + "'");
  check_value(v, key);
  if (key == "general.alignment" && (v.type != ValueType::U32 || v.u != alignment_))
    throw Error("general.alignment must be a uint32 equal to the writer alignment " + std::to_string(alignment_));
  header_bytes_ += 8 + key.size() + 4 + value_bytes(v);
  keys_.insert(key);
  kvs_.push_back(KV{std::move(key), std::move(v)});
  refresh_file_offsets();
}

void Writer::add_tensor(std::string name, std::vector<uint64_t> dims, GgmlType type) {
  const std::string what = "GGUF tensor '" + name + "'";
  if (name.empty()) throw Error("GGUF tensor name is empty");
  if (name.size() > kMaxTensorName)
    throw Error(what + ": name of " + std::to_string(name.size()) + " bytes is too long (at most 63)");
  if (names_.count(name)) throw Error("duplicate " + what);
  if (dims.empty() || dims.size() > kMaxDims)
    throw Error(what + ": " + std::to_string(dims.size()) + " dimensions, need 1..4");
  const uint64_t max_dim = Limits{}.max_dim;
  for (uint64_t d : dims)
    if (d == 0 || d > max_dim) throw Error(what + ": dimension " + std::to_string(d) + " out of range 1.." +
                                           std::to_string(max_dim));
  if ((uint32_t)type >= kFirstNonGgmlType || !find_type_info((uint32_t)type))
    throw Error(what + ": type id " + std::to_string((uint32_t)type) + " cannot be stored in a GGUF");

  TensorInfo t;
  t.name = std::move(name);
  t.n_dims = (uint32_t)dims.size();
  uint64_t elems = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    t.ne[d] = dims[d];
    if (mul_overflows(elems, dims[d], &elems) || elems > (uint64_t)std::numeric_limits<int64_t>::max())
      throw Error(what + ": element count overflows int64");
  }
  t.type = type;
  uint64_t bytes;
  try {
    bytes = row_bytes(type, t.ne[0]);
  } catch (const Error& e) {
    throw Error(what + ": " + e.what());
  }
  bool over = false;
  for (int d = 1; d < 4; ++d) over = over || mul_overflows(bytes, t.ne[d], &bytes);
  if (over || bytes > (uint64_t)std::numeric_limits<int64_t>::max()) throw Error(what + ": byte size overflows int64");
  t.nbytes = bytes;
  t.offset = align_up(data_bytes_, alignment_);
  if (t.offset < data_bytes_ || t.nbytes > (uint64_t)std::numeric_limits<int64_t>::max() - t.offset)
    throw Error(what + ": data section size overflows int64");
  data_bytes_ = t.offset + t.nbytes;
  header_bytes_ += 8 + t.name.size() + 4 + 8ull * t.n_dims + 4 + 8;
  names_.insert(t.name);
  tensors_.push_back(std::move(t));
  refresh_file_offsets();
}

void Writer::refresh_file_offsets() {
  const uint64_t base = data_offset();
  for (auto& t : tensors_) t.file_offset = base + t.offset;
}

uint64_t Writer::header_bytes() const { return header_bytes_; }
uint64_t Writer::data_offset() const { return align_up(header_bytes_, alignment_); }
uint64_t Writer::file_size() const { return data_offset() + align_up(data_bytes_, alignment_); }

void Writer::write(const std::string& path, const Emit& emit, bool sparse, Existing existing) const {
  if (alignment_ != 32 && !keys_.count("general.alignment"))
    throw Error("cannot write " + path + ": alignment " + std::to_string(alignment_) +
                " needs a general.alignment key (readers assume 32 without it)");
  // Temp file beside `path`, renamed over it only on success (util/output_file.h has the rule).
  AtomicOutputFile file(path, existing);
  const int fd = file.fd();
  Out o(fd, path);
  o.put_le<uint32_t>(kMagic);
  o.put_le<uint32_t>(kVersion);
  o.put_le<uint64_t>(tensors_.size());
  o.put_le<uint64_t>(kvs_.size());
  for (const auto& kv : kvs_) {
    o.put_string(kv.key);
    o.put_le<uint32_t>((uint32_t)kv.value.type);
    put_value(o, kv.value);
  }
  for (const auto& t : tensors_) {
    o.put_string(t.name);
    o.put_le<uint32_t>(t.n_dims);
    for (uint32_t d = 0; d < t.n_dims; ++d) o.put_le<uint64_t>(t.ne[d]);
    o.put_le<uint32_t>((uint32_t)t.type);
    o.put_le<uint64_t>(t.offset);
  }
  if (o.pos() != header_bytes_) throw Error("internal error: GGUF header size mismatch writing " + path);
  if (sparse) {
    o.flush();
    // The payload stays a hole: the file system allocates nothing for it.
    if (::ftruncate(fd, (off_t)file_size()) != 0) throw Error("cannot write " + path + ": " + write_error_text(errno));
  } else {
    const uint64_t base = data_offset();
    for (const auto& t : tensors_) {
      o.zeros(base + t.offset - o.pos());
      uint64_t produced = 0;
      Sink sink = [&](const void* p, size_t n) {
        if (n > t.nbytes - produced)
          throw Error("writing " + path + ": tensor '" + t.name + "' got more than its " +
                      std::to_string(t.nbytes) + " bytes");
        o.put(p, n);
        produced += n;
      };
      emit(t, sink);
      if (produced != t.nbytes)
        throw Error("writing " + path + ": tensor '" + t.name + "' got " + std::to_string(produced) +
                    " bytes, expected " + std::to_string(t.nbytes));
    }
    o.zeros(file_size() - o.pos());
    o.flush();
  }
  file.commit();
}

}  // namespace sluice::gguf
