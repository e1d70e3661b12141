// GGUF writer/reader round trips, exact encodings, accessors, sparse files and the writer's
// refusal of input the reader would reject.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "util/error.h"

namespace fs = std::filesystem;
using namespace sluice;
using gguf::Value;
using gguf::ValueType;

namespace {

fs::path tmp_dir() { return fs::temp_directory_path() / ("sluice_gguf_test_" + std::to_string(::getpid())); }

// Removes this process's scratch files when the test binary exits.
struct TmpDirCleanup {
  ~TmpDirCleanup() {
    std::error_code ec;
    fs::remove_all(tmp_dir(), ec);
  }
} tmp_dir_cleanup;

std::string tmp_path(const std::string& name) {
  fs::create_directories(tmp_dir());
  return (tmp_dir() / name).string();
}

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Deterministic payload byte k of a tensor, distinct per tensor.
uint8_t pattern(const std::string& name, uint64_t k) {
  uint64_t h = name.size() * 131 + (uint8_t)name[0];
  return (uint8_t)((k * 2654435761u + h) >> 3);
}

gguf::Writer::Emit pattern_emit() {
  return [](const gguf::TensorInfo& t, const gguf::Writer::Sink& sink) {
    // Odd chunk sizes exercise the sink's buffering.
    std::vector<uint8_t> chunk;
    for (uint64_t k = 0; k < t.nbytes;) {
      uint64_t n = std::min<uint64_t>(t.nbytes - k, 1000 + k % 7);
      chunk.resize(n);
      for (uint64_t j = 0; j < n; ++j) chunk[j] = pattern(t.name, k + j);
      sink(chunk.data(), n);
      k += n;
    }
  };
}

const gguf::Writer::Emit no_payload = [](const gguf::TensorInfo&, const gguf::Writer::Sink&) {};

Value scalar_u(ValueType t, uint64_t u) {
  Value v;
  v.type = t;
  v.u = u;
  return v;
}
Value scalar_i(ValueType t, int64_t i) {
  Value v;
  v.type = t;
  v.i = i;
  return v;
}
Value scalar_f(ValueType t, double f) {
  Value v;
  v.type = t;
  v.f = f;
  return v;
}
Value array_of(ValueType elem) {
  Value v;
  v.type = ValueType::ARRAY;
  v.elem = elem;
  return v;
}

}  // namespace

TEST(Gguf, ExactBytesOfASmallFile) {
  gguf::Writer w;
  w.add("a", Value::u32(7));
  w.add_tensor("t", {4}, GgmlType::I8);
  const std::string path = tmp_path("exact.gguf");
  w.write(path, [](const gguf::TensorInfo&, const gguf::Writer::Sink& s) { s("\x01\x02\x03\x04", 4); });
  // Hand-encoded: header, KV "a" = u32 7, record "t" [4] I8 @0, zero padding to 96, payload, padding.
  std::vector<uint8_t> want = {'G', 'G', 'U', 'F', 3, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                               1, 0, 0, 0, 0, 0, 0, 0, 'a', 4, 0, 0, 0, 7, 0, 0, 0,
                               1, 0, 0, 0, 0, 0, 0, 0, 't', 1, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 24, 0, 0, 0,
                               0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(w.header_bytes(), want.size());
  want.resize(96, 0);
  want.insert(want.end(), {1, 2, 3, 4});
  want.resize(128, 0);
  EXPECT_EQ(w.data_offset(), 96u);
  EXPECT_EQ(w.file_size(), 128u);
  EXPECT_EQ(slurp(path), want);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(Gguf, EveryValueTypeRoundTrips) {
  gguf::Writer w;
  w.add("u8", scalar_u(ValueType::U8, 255));
  w.add("i8", scalar_i(ValueType::I8, -128));
  w.add("u16", scalar_u(ValueType::U16, 65535));
  w.add("i16", scalar_i(ValueType::I16, -32768));
  w.add("u32", Value::u32(4294967295u));
  w.add("i32", Value::i32(-2147483647 - 1));
  w.add("f32", Value::f32(-3.25f));
  w.add("bool_t", Value::boolean(true));
  w.add("bool_f", Value::boolean(false));
  w.add("str", Value::str(std::string("h\xc3\xa9llo\0x\0", 9)));  // UTF-8 and NULs
  w.add("str_empty", Value::str(""));
  w.add("u64", Value::u64(18446744073709551615ull));
  w.add("i64", scalar_i(ValueType::I64, std::numeric_limits<int64_t>::min()));
  w.add("f64", scalar_f(ValueType::F64, 0.1));
  // Arrays of every element type, plus an empty array of each.
  const std::vector<ValueType> elems = {ValueType::U8,  ValueType::I8,     ValueType::U16, ValueType::I16,
                                        ValueType::U32, ValueType::I32,    ValueType::F32, ValueType::BOOL,
                                        ValueType::STRING, ValueType::U64, ValueType::I64, ValueType::F64};
  for (ValueType e : elems) {
    Value full = array_of(e), empty = array_of(e);
    switch (e) {
      case ValueType::U8: full.au = {0, 1, 255}; break;
      case ValueType::U16: full.au = {0, 65535}; break;
      case ValueType::U32: full.au = {4294967295u, 5}; break;
      case ValueType::U64: full.au = {18446744073709551615ull, 0, 9}; break;
      case ValueType::BOOL: full.au = {1, 0, 1, 1}; break;
      case ValueType::I8: full.ai = {-128, 127, 0}; break;
      case ValueType::I16: full.ai = {-32768, 32767}; break;
      case ValueType::I32: full.ai = {-2147483647 - 1, 2147483647}; break;
      case ValueType::I64: full.ai = {std::numeric_limits<int64_t>::min(), -1}; break;
      case ValueType::F32: full.af = {1.5, -0.0, 3e38}; break;
      case ValueType::F64: full.af = {0.1, -1e300, 5e-324}; break;
      case ValueType::STRING: full.as = {"", "x", std::string(300, 'z')}; break;
      default: break;
    }
    w.add("arr." + std::string(gguf::value_type_name(e)), full);
    w.add("arr_empty." + std::string(gguf::value_type_name(e)), empty);
  }
  const std::string path = tmp_path("values.gguf");
  w.write(path, no_payload);
  gguf::File f = gguf::File::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.tensors().size(), 0u);
  EXPECT_EQ(f.kvs().size(), 14u + 2 * elems.size());
  EXPECT_EQ(f.kvs()[0].key, "u8");  // order kept

  auto check_u = [&](const char* k, ValueType t, uint64_t u) {
    const Value* v = f.find(k);
    ASSERT_NE(v, nullptr) << k;
    EXPECT_EQ(v->type, t) << k;
    EXPECT_EQ(v->u, u) << k;
  };
  auto check_i = [&](const char* k, ValueType t, int64_t i) {
    const Value* v = f.find(k);
    ASSERT_NE(v, nullptr) << k;
    EXPECT_EQ(v->type, t) << k;
    EXPECT_EQ(v->i, i) << k;
  };
  check_u("u8", ValueType::U8, 255);
  check_i("i8", ValueType::I8, -128);
  check_u("u16", ValueType::U16, 65535);
  check_i("i16", ValueType::I16, -32768);
  check_u("u32", ValueType::U32, 4294967295u);
  check_i("i32", ValueType::I32, -2147483647 - 1);
  check_u("bool_t", ValueType::BOOL, 1);
  check_u("bool_f", ValueType::BOOL, 0);
  check_u("u64", ValueType::U64, 18446744073709551615ull);
  check_i("i64", ValueType::I64, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.get("f32").type, ValueType::F32);
  EXPECT_EQ(f.get("f32").f, -3.25);
  EXPECT_EQ(f.get("f64").type, ValueType::F64);
  EXPECT_EQ(f.get("f64").f, 0.1);
  EXPECT_EQ(f.get_string("str"), std::string("h\xc3\xa9llo\0x\0", 9));
  EXPECT_EQ(f.get_string("str_empty"), "");

  for (ValueType e : elems) {
    const std::string name(gguf::value_type_name(e));
    const Value& a = f.get("arr." + name);
    const Value& z = f.get("arr_empty." + name);
    EXPECT_EQ(a.type, ValueType::ARRAY);
    EXPECT_EQ(a.elem, e) << name;
    EXPECT_EQ(z.type, ValueType::ARRAY);
    EXPECT_EQ(z.elem, e) << name;
    EXPECT_EQ(z.array_size(), 0u) << name;
  }
  EXPECT_EQ(f.get("arr.uint8").au, (std::vector<uint64_t>{0, 1, 255}));
  EXPECT_EQ(f.get("arr.uint16").au, (std::vector<uint64_t>{0, 65535}));
  EXPECT_EQ(f.get("arr.uint32").au, (std::vector<uint64_t>{4294967295u, 5}));
  EXPECT_EQ(f.get("arr.uint64").au, (std::vector<uint64_t>{18446744073709551615ull, 0, 9}));
  EXPECT_EQ(f.get("arr.bool").au, (std::vector<uint64_t>{1, 0, 1, 1}));
  EXPECT_EQ(f.get("arr.int8").ai, (std::vector<int64_t>{-128, 127, 0}));
  EXPECT_EQ(f.get("arr.int16").ai, (std::vector<int64_t>{-32768, 32767}));
  EXPECT_EQ(f.get("arr.int32").ai, (std::vector<int64_t>{-2147483647 - 1, 2147483647}));
  EXPECT_EQ(f.get("arr.int64").ai, (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), -1}));
  EXPECT_EQ(f.get("arr.float32").af, (std::vector<double>{1.5, -0.0, (double)3e38f}));
  EXPECT_TRUE(std::signbit(f.get("arr.float32").af[1]));
  EXPECT_EQ(f.get("arr.float64").af, (std::vector<double>{0.1, -1e300, 5e-324}));
  EXPECT_EQ(f.get("arr.string").as, (std::vector<std::string>{"", "x", std::string(300, 'z')}));
  EXPECT_EQ(f.get("arr.string").array_size(), 3u);
  EXPECT_FALSE(f.get("u8").is_array());
}

TEST(Gguf, ValueFactoriesAndConversions) {
  EXPECT_EQ(Value::u32(5).type, ValueType::U32);
  EXPECT_EQ(Value::u64(5).type, ValueType::U64);
  EXPECT_EQ(Value::i32(-5).i, -5);
  EXPECT_EQ(Value::f32(0.5f).f, 0.5);
  EXPECT_EQ(Value::boolean(true).u, 1u);
  EXPECT_EQ(Value::str("x").s, "x");
  EXPECT_EQ(Value::array_u32({1, 2}).elem, ValueType::U32);
  EXPECT_EQ(Value::array_u64({1, 2, 3}).array_size(), 3u);
  EXPECT_EQ(Value::array_i32({-1}).ai, (std::vector<int64_t>{-1}));
  EXPECT_EQ(Value::array_f32({0.1}).af[0], (double)0.1f);  // rounded as the file will store it
  EXPECT_EQ(Value::array_str({"a", "b"}).as.size(), 2u);
  EXPECT_THROW(Value::array_u32({1ull << 32}), Error);
  EXPECT_THROW(Value::array_i32({1ll << 31}), Error);

  EXPECT_EQ(scalar_u(ValueType::U8, 200).as_uint(), 200u);
  EXPECT_EQ(scalar_u(ValueType::U16, 60000).as_uint(), 60000u);
  EXPECT_EQ(Value::u64(1ull << 40).as_uint(), 1ull << 40);
  EXPECT_EQ(scalar_i(ValueType::I8, 100).as_uint(), 100u);
  EXPECT_EQ(Value::i32(7).as_uint(), 7u);
  EXPECT_EQ(scalar_i(ValueType::I64, 1ll << 50).as_uint(), 1ull << 50);
  EXPECT_THROW(Value::i32(-1).as_uint(), Error);
  EXPECT_THROW(Value::f32(1.0f).as_uint(), Error);
  EXPECT_THROW(Value::str("1").as_uint(), Error);
  EXPECT_THROW(Value::array_u32({1}).as_uint(), Error);
  EXPECT_EQ(Value::u32(3).as_float(), 3.0);
  EXPECT_EQ(Value::i32(-3).as_float(), -3.0);
  EXPECT_EQ(scalar_f(ValueType::F64, 0.25).as_float(), 0.25);
  EXPECT_THROW(Value::str("1").as_float(), Error);
  EXPECT_THROW(Value::boolean(true).as_float(), Error);
}

TEST(Gguf, TypedAccessors) {
  gguf::Writer w;
  w.add("n.u16", scalar_u(ValueType::U16, 300));
  w.add("n.i32", Value::i32(42));
  w.add("n.neg", Value::i32(-1));
  w.add("n.f", Value::f32(2.5f));
  w.add("name", Value::str("deepseek4"));
  const std::string path = tmp_path("accessors.gguf");
  w.write(path, no_payload);
  gguf::File f = gguf::File::open(path);
  EXPECT_EQ(f.get_uint("n.u16"), 300u);
  EXPECT_EQ(f.get_uint("n.i32"), 42u);
  EXPECT_EQ(f.get_float("n.f"), 2.5);
  EXPECT_EQ(f.get_float("n.i32"), 42.0);
  EXPECT_EQ(f.get_string("name"), "deepseek4");
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_EQ(f.find_tensor("missing"), nullptr);
  auto message_of = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message_of([&] { f.get("missing.key"); }).find("missing.key"), std::string::npos);
  EXPECT_NE(message_of([&] { f.get_uint("n.neg"); }).find("n.neg"), std::string::npos);
  EXPECT_NE(message_of([&] { f.get_uint("name"); }).find("name"), std::string::npos);
  EXPECT_NE(message_of([&] { f.get_float("name"); }).find("name"), std::string::npos);
  EXPECT_NE(message_of([&] { f.get_string("n.i32"); }).find("n.i32"), std::string::npos);
}

// Tensors of several types at alignment 32 and 16384: offsets, sizes and payload round trip.
class GgufLayout : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufLayout, TensorsRoundTrip) {
  const uint32_t align = GetParam();
  gguf::Writer w(align);
  w.add("general.architecture", Value::str("test"));
  if (align != 32) w.add("general.alignment", Value::u32(align));
  struct Spec {
    const char* name;
    std::vector<uint64_t> dims;
    GgmlType type;
    uint64_t nbytes;  // by hand from quant-formats.md section 0
  };
  std::vector<Spec> specs = {
      {"tok_embd", {7, 3}, GgmlType::I32, 7 * 3 * 4},
      {"blk.0.attn_q", {64, 5}, GgmlType::Q4_0, 2 * 18 * 5},
      {"blk.0.ffn_down", {512, 2, 3}, GgmlType::Q5_K, 2 * 176 * 6},
      {"ids", {3, 1, 2, 2}, GgmlType::I8, 12},
      {"big", {100000}, GgmlType::I16, 200000},
  };
  specs.push_back({"norm", {33}, GgmlType::F32, 132});
  specs.push_back({"q8", {96, 2}, GgmlType::Q8_0, 3 * 34 * 2});
  for (const auto& s : specs) w.add_tensor(s.name, s.dims, s.type);

  EXPECT_EQ(w.data_offset() % align, 0u);
  EXPECT_GE(w.data_offset(), w.header_bytes());
  EXPECT_LT(w.data_offset() - w.header_bytes(), align);
  uint64_t expect_off = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& t = w.tensors()[i];
    EXPECT_EQ(t.nbytes, specs[i].nbytes) << t.name;
    EXPECT_EQ(t.offset, expect_off) << t.name;  // contiguous in add order, each aligned
    EXPECT_EQ(t.file_offset, w.data_offset() + t.offset);
    expect_off += (specs[i].nbytes + align - 1) / align * align;
  }
  EXPECT_EQ(w.file_size(), w.data_offset() + expect_off);

  const std::string path = tmp_path("layout_" + std::to_string(align) + ".gguf");
  w.write(path, pattern_emit());
  EXPECT_EQ(fs::file_size(path), w.file_size());

  gguf::File f = gguf::File::open(path);
  EXPECT_EQ(f.alignment(), align);
  EXPECT_EQ(f.data_offset(), w.data_offset());
  EXPECT_EQ(f.file_size(), w.file_size());
  ASSERT_EQ(f.tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const gguf::TensorInfo* t = f.find_tensor(specs[i].name);
    ASSERT_NE(t, nullptr) << specs[i].name;
    EXPECT_EQ(t, &f.tensors()[i]);
    EXPECT_EQ(t->type, specs[i].type);
    EXPECT_EQ(t->n_dims, specs[i].dims.size());
    for (size_t d = 0; d < 4; ++d) EXPECT_EQ(t->ne[d], d < specs[i].dims.size() ? specs[i].dims[d] : 1u);
    EXPECT_EQ(t->nbytes, specs[i].nbytes);
    EXPECT_EQ(t->offset, w.tensors()[i].offset);
    EXPECT_EQ(t->file_offset % align, 0u);
    std::vector<uint8_t> got(t->nbytes);
    f.read_bytes(*t, 0, got.data(), got.size());
    for (uint64_t k = 0; k < got.size(); ++k)
      if (got[k] != pattern(t->name, k)) {
        ADD_FAILURE() << t->name << " byte " << k;
        break;
      }
    // A partial read from the middle.
    if (t->nbytes >= 10) {
      uint8_t part[5];
      f.read_bytes(*t, t->nbytes - 7, part, 5);
      for (int k = 0; k < 5; ++k) EXPECT_EQ(part[k], pattern(t->name, t->nbytes - 7 + k));
    }
  }
  // Padding between tensors and before the data section is zero.
  auto bytes = slurp(path);
  for (uint64_t k = f.tensors()[0].file_offset - 1; k >= w.header_bytes(); --k) ASSERT_EQ(bytes[k], 0) << k;
  const auto& q = f.tensors()[1];
  for (uint64_t k = q.file_offset + q.nbytes; k < f.tensors()[2].file_offset; ++k) ASSERT_EQ(bytes[k], 0) << k;
  if (align == 32) {
    EXPECT_EQ(f.find("general.alignment"), nullptr);
  } else {
    EXPECT_EQ(f.get_uint("general.alignment"), align);
  }
}

INSTANTIATE_TEST_SUITE_P(Alignments, GgufLayout, ::testing::Values(32u, 16384u));

TEST(Gguf, ReadBytesChecksTheRange) {
  gguf::Writer w;
  w.add_tensor("w.one", {16, 2}, GgmlType::I8);
  const std::string path = tmp_path("range.gguf");
  w.write(path, pattern_emit());
  gguf::File f = gguf::File::open(path);
  const gguf::TensorInfo& t = f.tensors()[0];
  uint8_t buf[64];
  EXPECT_NO_THROW(f.read_bytes(t, 32, buf, 0));
  EXPECT_NO_THROW(f.read_bytes(t, 0, buf, 32));
  try {
    f.read_bytes(t, 30, buf, 3);
    FAIL() << "read past the tensor accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w.one"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("30"), std::string::npos) << e.what();
  }
  EXPECT_THROW(f.read_bytes(t, 33, buf, 0), Error);
  EXPECT_THROW(f.read_bytes(t, 1, buf, std::numeric_limits<uint64_t>::max()), Error);

  // A file cut short after it was opened: a short read is an Error naming the tensor.
  ASSERT_EQ(::truncate(path.c_str(), (off_t)(t.file_offset + 10)), 0);
  try {
    f.read_bytes(t, 0, buf, 32);
    FAIL() << "short read not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w.one"), std::string::npos) << e.what();
  }
}

TEST(Gguf, FileIsMoveOnlyAndClosesItsFd) {
  gguf::Writer w;
  w.add("k", Value::u32(1));
  const std::string path = tmp_path("move.gguf");
  w.write(path, no_payload);
  int fd;
  {
    gguf::File a = gguf::File::open(path);
    fd = a.fd();
    ASSERT_GE(fd, 0);
    gguf::File b = std::move(a);
    EXPECT_EQ(b.fd(), fd);
    EXPECT_EQ(a.fd(), -1);
    EXPECT_EQ(b.get_uint("k"), 1u);
    gguf::File c = gguf::File::open(path);
    c = std::move(b);
    EXPECT_EQ(c.fd(), fd);
    EXPECT_NE(::fcntl(fd, F_GETFD), -1);
  }
  EXPECT_EQ(::fcntl(fd, F_GETFD), -1);  // closed on destruction
  static_assert(!std::is_copy_constructible_v<gguf::File>);
}

TEST(Gguf, SparseWriteLeavesHoles) {
  gguf::Writer w;
  w.add("general.architecture", Value::str("sparse"));
  w.add_tensor("huge", {1ull << 20, 256}, GgmlType::I8);  // 256 MiB
  w.add_tensor("small", {5}, GgmlType::I32);
  const std::string path = tmp_path("sparse.gguf");
  bool called = false;
  w.write(path, [&](const gguf::TensorInfo&, const gguf::Writer::Sink&) { called = true; }, true);
  EXPECT_FALSE(called);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ((uint64_t)st.st_size, w.file_size());
  EXPECT_EQ(w.file_size(), w.data_offset() + (256ull << 20) + 32);
  EXPECT_LT((uint64_t)st.st_blocks * 512, 1ull << 20) << "payload was written, not left as a hole";
  gguf::File f = gguf::File::open(path);
  EXPECT_EQ(f.tensors()[0].nbytes, 256ull << 20);
  uint8_t buf[16];
  f.read_bytes(*f.find_tensor("small"), 4, buf, 16);
  for (uint8_t b : buf) EXPECT_EQ(b, 0);
  fs::remove(path);
}

TEST(Gguf, WriterRefusesBadInput) {
  EXPECT_THROW(gguf::Writer(0), Error);
  EXPECT_THROW(gguf::Writer(48), Error);
  gguf::Writer w;
  w.add("a", Value::u32(1));
  EXPECT_THROW(w.add("a", Value::u32(2)), Error);
  EXPECT_THROW(w.add("", Value::u32(2)), Error);
  EXPECT_THROW(w.add(std::string(65536, 'k'), Value::u32(2)), Error);
  EXPECT_THROW(w.add("u8", scalar_u(ValueType::U8, 256)), Error);
  EXPECT_THROW(w.add("i16", scalar_i(ValueType::I16, 40000)), Error);
  EXPECT_THROW(w.add("b", scalar_u(ValueType::BOOL, 2)), Error);
  EXPECT_THROW(w.add("t", scalar_u((ValueType)13, 0)), Error);
  Value nested = array_of(ValueType::ARRAY);
  EXPECT_THROW(w.add("nested", nested), Error);
  Value wrong_vec = array_of(ValueType::U32);
  wrong_vec.ai = {1};
  EXPECT_THROW(w.add("wrong", wrong_vec), Error);
  Value big_elem = array_of(ValueType::U16);
  big_elem.au = {70000};
  EXPECT_THROW(w.add("big", big_elem), Error);
  EXPECT_THROW(w.add("general.alignment", Value::u64(32)), Error);   // must be uint32
  EXPECT_THROW(w.add("general.alignment", Value::u32(64)), Error);   // must match the writer
  EXPECT_EQ(w.header_bytes(), 24u + 8 + 1 + 4 + 4);  // refused values left no trace

  w.add_tensor("t", {32}, GgmlType::Q4_0);
  EXPECT_THROW(w.add_tensor("t", {32}, GgmlType::Q4_0), Error);               // duplicate
  EXPECT_THROW(w.add_tensor("", {32}, GgmlType::Q4_0), Error);                // empty name
  EXPECT_THROW(w.add_tensor(std::string(64, 'n'), {32}, GgmlType::I8), Error);  // name too long
  EXPECT_NO_THROW(w.add_tensor(std::string(63, 'n'), {32}, GgmlType::I8));
  EXPECT_THROW(w.add_tensor("d0", {}, GgmlType::I8), Error);
  EXPECT_THROW(w.add_tensor("d5", {1, 1, 1, 1, 1}, GgmlType::I8), Error);
  EXPECT_THROW(w.add_tensor("dz", {4, 0}, GgmlType::I8), Error);
  EXPECT_THROW(w.add_tensor("blk", {33}, GgmlType::Q4_0), Error);  // not whole blocks
  EXPECT_THROW(w.add_tensor("t4", {32}, (GgmlType)4), Error);       // removed id
  EXPECT_THROW(w.add_tensor("t31", {32}, (GgmlType)31), Error);
  EXPECT_THROW(w.add_tensor("engram", {32}, GgmlType::ENGRAM_ROW), Error);  // not a GGUF id
  EXPECT_THROW(w.add_tensor("ovf", {1ull << 40, 1ull << 40}, GgmlType::I8), Error);
  EXPECT_EQ(w.tensors().size(), 2u);

  // Alignment other than 32 without general.alignment: refused, nothing written.
  gguf::Writer w64(64);
  w64.add_tensor("x", {4}, GgmlType::I8);
  const std::string path = tmp_path("refused.gguf");
  fs::remove(path);
  EXPECT_THROW(w64.write(path, pattern_emit()), Error);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  w64.add("general.alignment", Value::u32(64));
  w64.write(path, pattern_emit());
  EXPECT_EQ(gguf::File::open(path).alignment(), 64u);
}

TEST(Gguf, FailedWriteLeavesNoFile) {
  gguf::Writer w;
  w.add_tensor("a", {100}, GgmlType::I8);
  w.add_tensor("b", {10}, GgmlType::I32);
  const std::string path = tmp_path("failed.gguf");
  auto check_refused = [&](const gguf::Writer::Emit& emit, const char* needle) {
    fs::remove(path);
    try {
      w.write(path, emit);
      ADD_FAILURE() << "write succeeded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(path));
    EXPECT_FALSE(fs::exists(path + ".tmp"));
  };
  std::vector<uint8_t> zeros(1000);
  check_refused([&](const gguf::TensorInfo& t, const gguf::Writer::Sink& s) { s(zeros.data(), t.nbytes - 1); },
                "'a' got 99 bytes, expected 100");
  check_refused([&](const gguf::TensorInfo& t, const gguf::Writer::Sink& s) { s(zeros.data(), t.nbytes + 1); },
                "more than");
  check_refused([&](const gguf::TensorInfo& t, const gguf::Writer::Sink& s) {
    if (t.name == "b") throw Error("emit failed for b");
    s(zeros.data(), t.nbytes);
  }, "emit failed for b");

  // An existing file under the final name survives a failed rewrite untouched.
  w.write(path, [&](const gguf::TensorInfo& t, const gguf::Writer::Sink& s) { s(zeros.data(), t.nbytes); });
  auto before = slurp(path);
  EXPECT_THROW(w.write(path, [](const gguf::TensorInfo&, const gguf::Writer::Sink&) { throw Error("boom"); }), Error);
  EXPECT_EQ(slurp(path), before);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // I/O errors name the path.
  const std::string bad = tmp_path("no_such_dir") + "/x.gguf";
  try {
    w.write(bad, no_payload, true);
    ADD_FAILURE() << "write into a missing directory succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

TEST(Gguf, WriteErrorsNameThePathAndLeaveNoFile) {
  // A file-size limit makes write() fail with EFBIG, standing in for ENOSPC.
  gguf::Writer w;
  w.add_tensor("a", {1 << 20}, GgmlType::I8);
  const std::string path = tmp_path("too_big.gguf");
  fs::remove(path);
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 64 << 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string dense_error, sparse_error;
  try {
    w.write(path, pattern_emit());
  } catch (const Error& e) {
    dense_error = e.what();
  }
  try {
    w.write(path, no_payload, true);
  } catch (const Error& e) {
    sparse_error = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(dense_error.find(path), std::string::npos) << dense_error;
  EXPECT_NE(sparse_error.find(path), std::string::npos) << sparse_error;
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(Gguf, ReadsAFileWrittenByAnIndependentEncoder) {
  // valid_basic.gguf comes from tests/make_gguf_corpus.py (Python struct), not from gguf::Writer.
  gguf::File f = gguf::File::open(std::string(SLUICE_TEST_DATA) + "/gguf_corpus/valid_basic.gguf");
  EXPECT_EQ(f.get_string("general.architecture"), "test");
  EXPECT_EQ(f.get_uint("general.alignment"), 32u);
  EXPECT_EQ(f.get_uint("test.count"), 12345u);
  EXPECT_EQ(f.get("test.names").as, (std::vector<std::string>{"a", "", "tri-gram"}));
  EXPECT_EQ(f.get("test.scales").af, (std::vector<double>{0.5, -1.25}));
  ASSERT_EQ(f.tensors().size(), 4u);
  const gguf::TensorInfo* q = f.find_tensor("blk.0.q");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, GgmlType::Q4_0);
  EXPECT_EQ(q->nbytes, 2u * 18 * 2);
  EXPECT_EQ(q->offset, 96u);  // after tok.weight's 96 bytes
  EXPECT_EQ(q->row_bytes(), 36u);
  const gguf::TensorInfo* ids = f.find_tensor("ids");
  ASSERT_NE(ids, nullptr);
  EXPECT_EQ(ids->n_dims, 4u);
  EXPECT_EQ(ids->ne[3], 2u);
  EXPECT_EQ(ids->n_elements(), 10u);
  // The generator's data section is bytes i * 7 % 251 from the data offset.
  uint8_t b[4];
  f.read_bytes(*q, 1, b, 4);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(b[k], (q->offset + 1 + k) * 7 % 251);
  // Version 2 is accepted and otherwise identical.
  gguf::File v2 = gguf::File::open(std::string(SLUICE_TEST_DATA) + "/gguf_corpus/valid_v2.gguf");
  EXPECT_EQ(v2.version(), 2u);
  EXPECT_EQ(v2.tensors().size(), 4u);
}
