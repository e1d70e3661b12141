// gguf::File: parses and validates the header region of a GGUF file that may be hostile.
// Every length and count is checked against the bytes that remain before anything is
// allocated, every loop is bounded by such a checked count, and only the header region is read
// (through pread, in small chunks); tensor payload is touched only by read_bytes().
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
#include <utility>

#include "format/gguf.h"
#include "format/gguf_detail.h"
#include "util/error.h"

namespace sluice::gguf {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF decoding assumes a little-endian host");
using namespace detail;

// Minimum encoded sizes, used to reject counts that could not possibly fit before reserving.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;              // key len, 1 key byte, type, 1-byte value
constexpr uint64_t kMinTensorBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name len, 1 byte, n_dims, 1 dim, type, offset

// Keys and names come from the file: keep messages printable and short.
std::string printable(std::string_view s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < s.size() && out.size() < 96; ++i) {
    unsigned char ch = (unsigned char)s[i];
    if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
      out += (char)ch;
    } else {
      out += "\\x";
      out += hex[ch >> 4];
      out += hex[ch & 15];
    }
  }
  if (out.size() >= 96) out += "...";
  return out;
}

std::string errno_text(int e) { return std::strerror(e); }

// Sequential reader over [0, limit) of the file, limit = min(file size, max_header_bytes),
// buffered in 64 KiB chunks read with pread.
class Cursor {
 public:
  Cursor(int fd, uint64_t file_size, uint64_t max_header, const std::string& path)
      : fd_(fd), file_size_(file_size), limit_(std::min(file_size, max_header)), path_(path) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return limit_ - pos_; }

  // "the remaining N bytes of ..." for messages about counts and lengths that do not fit.
  std::string room() const {
    if (limit_ < file_size_)
      return "the remaining " + std::to_string(remaining()) + " bytes allowed by max_header_bytes (" +
             std::to_string(limit_) + ")";
    return "the remaining " + std::to_string(remaining()) + " bytes of the file (truncated or corrupt)";
  }

  void need(uint64_t n, std::string_view field) const {
    if (n <= remaining()) return;
    if (limit_ < file_size_ && n <= file_size_ - pos_)
      throw FormatError(std::string(field), pos_,
                        "header region exceeds the max_header_bytes limit of " + std::to_string(limit_));
    throw FormatError(std::string(field), pos_,
                      "truncated: needs " + std::to_string(n) + " bytes but only " +
                          std::to_string(file_size_ - pos_) + " remain in the file of " +
                          std::to_string(file_size_) + " bytes");
  }

  void read(void* dst, uint64_t n, std::string_view field) {
    need(n, field);
    auto* out = static_cast<uint8_t*>(dst);
    while (n > 0) {
      if (pos_ < buf_start_ || pos_ >= buf_start_ + buf_len_) refill();
      uint64_t off = pos_ - buf_start_;
      uint64_t take = std::min<uint64_t>(n, buf_len_ - off);
      std::memcpy(out, buf_.data() + off, take);
      out += take;
      pos_ += take;
      n -= take;
    }
  }

  template <class T>
  T get(std::string_view field) {
    T v;
    read(&v, sizeof v, field);
    return v;
  }

 private:
  void refill() {
    if (buf_.empty()) buf_.resize(kChunk);
    uint64_t want = std::min<uint64_t>(kChunk, limit_ - pos_);
    uint64_t got = 0;
    while (got < want) {
      ssize_t r = ::pread(fd_, buf_.data() + got, want - got, (off_t)(pos_ + got));
      if (r < 0) {
        if (errno == EINTR) continue;
        throw Error(path_ + ": read error at offset " + std::to_string(pos_ + got) + ": " + errno_text(errno));
      }
      if (r == 0) break;
      got += (uint64_t)r;
    }
    if (got == 0)
      throw Error(path_ + ": unexpected end of file at offset " + std::to_string(pos_) +
                  " (file shrank while being read?)");
    buf_start_ = pos_;
    buf_len_ = got;
  }

  static constexpr uint64_t kChunk = 64 << 10;
  int fd_;
  uint64_t file_size_;
  uint64_t limit_;
  const std::string& path_;
  uint64_t pos_ = 0;
  std::vector<uint8_t> buf_;
  uint64_t buf_start_ = 0;
  uint64_t buf_len_ = 0;
};

class Parser {
 public:
  Parser(Cursor& c, const Limits& l) : c_(c), lim_(l) {}

  // A string whose length must not exceed max_len (too_long names that limit in messages).
  std::string read_string(const std::string& field, uint64_t max_len, const char* what) {
    uint64_t at = c_.pos();
    uint64_t n = c_.get<uint64_t>(field);
    if (n > max_len)
      throw FormatError(field, at, std::string(what) + " length " + std::to_string(n) +
                                       " exceeds the limit of " + std::to_string(max_len) + " bytes");
    if (n > c_.remaining())
      throw FormatError(field, at, std::string(what) + " of " + std::to_string(n) +
                                       " bytes runs past " + c_.room());
    std::string s(n, '\0');
    c_.read(s.data(), n, field);
    return s;
  }

  Value read_value(ValueType t, const std::string& field) {
    Value v;
    v.type = t;
    uint64_t at = c_.pos();
    switch (t) {
      case ValueType::U8: v.u = c_.get<uint8_t>(field); break;
      case ValueType::I8: v.i = c_.get<int8_t>(field); break;
      case ValueType::U16: v.u = c_.get<uint16_t>(field); break;
      case ValueType::I16: v.i = c_.get<int16_t>(field); break;
      case ValueType::U32: v.u = c_.get<uint32_t>(field); break;
      case ValueType::I32: v.i = c_.get<int32_t>(field); break;
      case ValueType::U64: v.u = c_.get<uint64_t>(field); break;
      case ValueType::I64: v.i = c_.get<int64_t>(field); break;
      case ValueType::F32: v.f = c_.get<float>(field); break;
      case ValueType::F64: v.f = c_.get<double>(field); break;
      case ValueType::BOOL:
        v.u = c_.get<uint8_t>(field);
        if (v.u > 1) throw FormatError(field, at, "bool value " + std::to_string(v.u) + " is not 0 or 1");
        break;
      case ValueType::STRING: v.s = read_string(field, lim_.max_string, "string"); break;
      case ValueType::ARRAY: read_array(v, field); break;
    }
    return v;
  }

 private:
  void read_array(Value& v, const std::string& field) {
    uint64_t at = c_.pos();
    uint32_t et = c_.get<uint32_t>(field + ".element_type");
    if (!known_type(et))
      throw FormatError(field + ".element_type", at, "unknown array element type id " + std::to_string(et));
    v.elem = (ValueType)et;
    if (v.elem == ValueType::ARRAY)
      throw FormatError(field + ".element_type", at, "nested array (element type array) is not supported");
    at = c_.pos();
    uint64_t n = c_.get<uint64_t>(field + ".count");
    if (n > lim_.max_array)
      throw FormatError(field + ".count", at, "array of " + std::to_string(n) +
                                                  " elements exceeds the limit of " + std::to_string(lim_.max_array));
    const uint64_t esize = encoded_size(v.elem);
    if (n > c_.remaining() / esize)
      throw FormatError(field + ".count", at, "array of " + std::to_string(n) + " " +
                                                  std::string(value_type_name(v.elem)) +
                                                  " elements cannot fit in " + c_.room());
    const std::string elem_field = field + "[]";
    switch (kind_of(v.elem)) {
      case Kind::String:
        v.as.reserve(n);
        for (uint64_t k = 0; k < n; ++k) v.as.push_back(read_string(elem_field, lim_.max_string, "string"));
        return;
      case Kind::Unsigned: v.au.reserve(n); break;
      case Kind::Signed: v.ai.reserve(n); break;
      case Kind::Float: v.af.reserve(n); break;
      case Kind::Array: return;
    }
    // Fixed-size elements: decode in chunks straight from the cursor.
    uint8_t chunk[4096];
    const uint64_t per = sizeof chunk / esize;
    for (uint64_t k = 0; k < n;) {
      uint64_t m = std::min(per, n - k);
      uint64_t chunk_at = c_.pos();
      c_.read(chunk, m * esize, elem_field);
      for (uint64_t j = 0; j < m; ++j) decode_element(v, chunk + j * esize, elem_field, chunk_at + j * esize);
      k += m;
    }
  }

  static void decode_element(Value& v, const uint8_t* p, const std::string& field, uint64_t at) {
    auto load = [p](auto x) {
      std::memcpy(&x, p, sizeof x);
      return x;
    };
    switch (v.elem) {
      case ValueType::U8: v.au.push_back(load(uint8_t{})); break;
      case ValueType::U16: v.au.push_back(load(uint16_t{})); break;
      case ValueType::U32: v.au.push_back(load(uint32_t{})); break;
      case ValueType::U64: v.au.push_back(load(uint64_t{})); break;
      case ValueType::I8: v.ai.push_back(load(int8_t{})); break;
      case ValueType::I16: v.ai.push_back(load(int16_t{})); break;
      case ValueType::I32: v.ai.push_back(load(int32_t{})); break;
      case ValueType::I64: v.ai.push_back(load(int64_t{})); break;
      case ValueType::F32: v.af.push_back(load(float{})); break;
      case ValueType::F64: v.af.push_back(load(double{})); break;
      case ValueType::BOOL: {
        uint8_t b = load(uint8_t{});
        if (b > 1) throw FormatError(field, at, "bool value " + std::to_string(b) + " is not 0 or 1");
        v.au.push_back(b);
        break;
      }
      case ValueType::STRING:
      case ValueType::ARRAY: break;
    }
  }

  Cursor& c_;
  const Limits& lim_;
};

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

File::File(File&& o) noexcept { *this = std::move(o); }

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    version_ = o.version_;
    alignment_ = o.alignment_;
    data_offset_ = o.data_offset_;
    file_size_ = o.file_size_;
    kvs_ = std::move(o.kvs_);
    tensors_ = std::move(o.tensors_);
    kv_index_ = std::move(o.kv_index_);
    tensor_index_ = std::move(o.tensor_index_);
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

File File::open(const std::string& path, const Limits& lim) {
  File f;
  f.path_ = path;
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is rejected just below.
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (f.fd_ < 0) throw Error("cannot open " + path + ": " + errno_text(errno));
  struct stat st {};
  if (::fstat(f.fd_, &st) != 0) throw Error("cannot stat " + path + ": " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) throw Error(path + " is not a regular file");
  f.file_size_ = (uint64_t)st.st_size;

  Cursor c(f.fd_, f.file_size_, lim.max_header_bytes, f.path_);
  Parser p(c, lim);

  uint32_t magic = c.get<uint32_t>("magic");
  if (magic != kMagic) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%08x", magic);
    throw FormatError("magic", 0, std::string("bad magic ") + hex + ", not a GGUF file");
  }
  f.version_ = c.get<uint32_t>("version");
  // A big-endian writer stores version 2 or 3 byte-swapped (0x02000000, 0x03000000); every
  // other field is swapped too, so the file is unreadable here, and "version 50331648" would
  // send the user looking for a GGUF version that does not exist.
  if (const uint32_t swapped = __builtin_bswap32(f.version_); swapped == 2 || swapped == kVersion)
    throw FormatError("version", 4, "big-endian GGUF is not supported (version field reads " +
                                        std::to_string(swapped) + " byte-swapped); sluice reads little-endian GGUF");
  // Low 16 bits zero is how a byte-swapped (big-endian) version shows up.
  if (f.version_ < 2 || f.version_ > kVersion || (f.version_ & 0xFFFF) == 0)
    throw FormatError("version", 4, "unsupported GGUF version " + std::to_string(f.version_) + " (need 2 or 3)");
  const uint64_t n_tensors = c.get<uint64_t>("tensor_count");
  const uint64_t n_kv = c.get<uint64_t>("kv_count");
  if (n_tensors > lim.max_tensors)
    throw FormatError("tensor_count", 8, "tensor_count " + std::to_string(n_tensors) +
                                             " exceeds the limit of " + std::to_string(lim.max_tensors));
  if (n_tensors > c.remaining() / kMinTensorBytes)
    throw FormatError("tensor_count", 8, "tensor_count " + std::to_string(n_tensors) + " cannot fit in " + c.room());
  if (n_kv > lim.max_kv)
    throw FormatError("kv_count", 16, "kv_count " + std::to_string(n_kv) + " exceeds the limit of " +
                                          std::to_string(lim.max_kv));
  if (n_kv > (c.remaining() - n_tensors * kMinTensorBytes) / kMinKvBytes)
    throw FormatError("kv_count", 16, "kv_count " + std::to_string(n_kv) + " cannot fit in " + c.room());

  // ---- metadata ----
  f.kvs_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string base = "kv[" + std::to_string(i) + "]";
    uint64_t key_at = c.pos();
    std::string key = p.read_string(base + ".key", std::min<uint64_t>(lim.max_string, kMaxKeyBytes), "key");
    if (key.empty()) throw FormatError(base + ".key", key_at, "empty key");
    const std::string field = base + "(" + printable(key) + ")";
    if (f.kv_index_.count(key)) throw FormatError(field + ".key", key_at, "duplicate key '" + printable(key) + "'");
    uint64_t type_at = c.pos();
    uint32_t t = c.get<uint32_t>(field + ".type");
    if (!known_type(t)) throw FormatError(field + ".type", type_at, "unknown value type id " + std::to_string(t));
    uint64_t value_at = c.pos();
    Value v = p.read_value((ValueType)t, field + ".value");
    if (key == "general.alignment") {
      if (v.type != ValueType::U32)
        throw FormatError(field + ".type", type_at, "general.alignment must be uint32, got " +
                                                        std::string(value_type_name(v.type)));
      if (v.u == 0 || !std::has_single_bit(v.u))
        throw FormatError(field + ".value", value_at,
                          "general.alignment " + std::to_string(v.u) + " is not a nonzero power of two");
      f.alignment_ = v.u;
    }
    f.kv_index_.emplace(key, f.kvs_.size());
    f.kvs_.push_back(KV{std::move(key), std::move(v)});
  }

  // ---- tensor records ----
  if (n_tensors > c.remaining() / kMinTensorBytes)
    throw FormatError("tensor_count", 8, "tensor_count " + std::to_string(n_tensors) + " cannot fit in " + c.room());
  f.tensors_.reserve(n_tensors);
  std::vector<uint64_t> offset_at;  // where each record's offset field sits, for messages
  offset_at.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const std::string base = "tensor[" + std::to_string(i) + "]";
    TensorInfo t;
    uint64_t at = c.pos();
    uint64_t len = c.get<uint64_t>(base + ".name");
    if (len == 0) throw FormatError(base + ".name", at, "empty tensor name");
    if (len > kMaxTensorName)
      throw FormatError(base + ".name", at, "tensor name of " + std::to_string(len) + " bytes is too long (at most " +
                                                std::to_string(kMaxTensorName) + ")");
    t.name.resize(len);
    c.read(t.name.data(), len, base + ".name");
    const std::string field = base + "(" + printable(t.name) + ")";
    if (f.tensor_index_.count(t.name))
      throw FormatError(field + ".name", at, "duplicate tensor name '" + printable(t.name) + "'");

    at = c.pos();
    t.n_dims = c.get<uint32_t>(field + ".n_dims");
    if (t.n_dims < 1 || t.n_dims > kMaxDims)
      throw FormatError(field + ".n_dims", at, "n_dims " + std::to_string(t.n_dims) + " out of range 1..4");
    const uint64_t dims_at = c.pos();
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      at = c.pos();
      t.ne[d] = c.get<uint64_t>(field + ".ne[" + std::to_string(d) + "]");
      if (t.ne[d] == 0 || t.ne[d] > lim.max_dim)
        throw FormatError(field + ".ne[" + std::to_string(d) + "]", at,
                          "dimension ne[" + std::to_string(d) + "] = " + std::to_string(t.ne[d]) +
                              " out of range 1.." + std::to_string(lim.max_dim));
    }
    uint64_t elems = 1;
    for (uint64_t d : t.ne)
      if (mul_overflows(elems, d, &elems) || elems > (uint64_t)std::numeric_limits<int64_t>::max())
        throw FormatError(field + ".ne", dims_at, "element count overflows int64");

    at = c.pos();
    uint32_t type_id = c.get<uint32_t>(field + ".type");
    const TypeInfo* tt = type_id < kFirstNonGgmlType ? find_type_info(type_id) : nullptr;
    if (!tt) throw FormatError(field + ".type", at, "unknown tensor type id " + std::to_string(type_id));
    t.type = tt->type;
    if (t.ne[0] % (uint64_t)tt->block_elems != 0)
      throw FormatError(field + ".type", at, "ne[0] = " + std::to_string(t.ne[0]) + " is not a multiple of the " +
                                                 std::string(tt->name) + " block size " +
                                                 std::to_string(tt->block_elems));
    uint64_t bytes = t.ne[0] / (uint64_t)tt->block_elems;
    bool over = mul_overflows(bytes, (uint64_t)tt->block_bytes, &bytes);
    for (int d = 1; d < 4; ++d) over = over || mul_overflows(bytes, t.ne[d], &bytes);
    if (over || bytes > (uint64_t)std::numeric_limits<int64_t>::max())
      throw FormatError(field + ".type", at, "byte size overflows int64");
    t.nbytes = bytes;

    offset_at.push_back(c.pos());
    t.offset = c.get<uint64_t>(field + ".offset");
    f.tensor_index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }

  // ---- data section ----
  f.data_offset_ = align_up(c.pos(), f.alignment_);
  for (size_t i = 0; i < f.tensors_.size(); ++i) {
    TensorInfo& t = f.tensors_[i];
    const std::string field = "tensor[" + std::to_string(i) + "](" + printable(t.name) + ").offset";
    if (t.offset > std::numeric_limits<uint64_t>::max() - f.data_offset_ ||
        t.nbytes > std::numeric_limits<uint64_t>::max() - f.data_offset_ - t.offset)
      throw FormatError(field, offset_at[i], "offset " + std::to_string(t.offset) + " + data_offset " +
                                                 std::to_string(f.data_offset_) + " + size " +
                                                 std::to_string(t.nbytes) + " overflows");
    if (t.offset % f.alignment_ != 0)
      throw FormatError(field, offset_at[i], "offset " + std::to_string(t.offset) +
                                                 " is not a multiple of the alignment " + std::to_string(f.alignment_));
    t.file_offset = f.data_offset_ + t.offset;
    if (t.file_offset + t.nbytes > f.file_size_)
      throw FormatError(field, offset_at[i], "tensor '" + printable(t.name) + "' data [" +
                                                 std::to_string(t.file_offset) + ", " +
                                                 std::to_string(t.file_offset + t.nbytes) +
                                                 ") runs past the end of the file (" + std::to_string(f.file_size_) +
                                                 " bytes)");
  }
  std::vector<size_t> order(f.tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return f.tensors_[a].offset < f.tensors_[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& prev = f.tensors_[order[k - 1]];
    const TensorInfo& cur = f.tensors_[order[k]];
    if (prev.offset + prev.nbytes > cur.offset)
      throw FormatError("tensor[" + std::to_string(order[k]) + "](" + printable(cur.name) + ").offset",
                        offset_at[order[k]],
                        "tensor '" + printable(cur.name) + "' at data offset " + std::to_string(cur.offset) +
                            " overlaps tensor '" + printable(prev.name) + "' [" + std::to_string(prev.offset) +
                            ", " + std::to_string(prev.offset + prev.nbytes) + ")");
  }
  return f;
}

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const Value& File::get(std::string_view key) const {
  const Value* v = find(key);
  if (!v) throw Error(path_ + ": metadata key '" + std::string(key) + "' not found");
  return *v;
}

uint64_t File::get_uint(std::string_view key) const {
  const Value& v = get(key);
  try {
    return v.as_uint();
  } catch (const Error& e) {
    throw Error(path_ + ": metadata key '" + std::string(key) + "': " + e.what());
  }
}

double File::get_float(std::string_view key) const {
  const Value& v = get(key);
  try {
    return v.as_float();
  } catch (const Error& e) {
    throw Error(path_ + ": metadata key '" + std::string(key) + "': " + e.what());
  }
}

const std::string& File::get_string(std::string_view key) const {
  const Value& v = get(key);
  if (v.type != ValueType::STRING)
    throw Error(path_ + ": metadata key '" + std::string(key) + "' is " + std::string(value_type_name(v.type)) +
                ", expected string");
  return v.s;
}

void File::read_bytes(const TensorInfo& t, uint64_t offset, void* dst, uint64_t n) const {
  const std::string where = "tensor '" + printable(t.name) + "'";
  if (fd_ < 0) throw Error("read of " + where + " from a closed GGUF file");
  if (offset > t.nbytes || n > t.nbytes - offset)
    throw Error(path_ + ": read of " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                " is outside " + where + " (" + std::to_string(t.nbytes) + " bytes)");
  if (t.file_offset > file_size_ || t.nbytes > file_size_ - t.file_offset)
    throw Error(path_ + ": " + where + " lies outside the file");
  auto* out = static_cast<uint8_t*>(dst);
  uint64_t pos = t.file_offset + offset;
  while (n > 0) {
    size_t want = (size_t)std::min<uint64_t>(n, 1u << 30);
    ssize_t r = ::pread(fd_, out, want, (off_t)pos);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw Error(path_ + ": read error in " + where + " at file offset " + std::to_string(pos) + ": " +
                  errno_text(errno));
    }
    if (r == 0)
      throw Error(path_ + ": short read in " + where + " at file offset " + std::to_string(pos) +
                  " (file truncated after it was opened?)");
    out += r;
    pos += (uint64_t)r;
    n -= (uint64_t)r;
  }
}

}  // namespace sluice::gguf
