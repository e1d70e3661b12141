// gguf::Value factories, numeric conversions and the writer-side validity check.
#include <cmath>
#include <limits>
#include <string>

#include "format/gguf.h"
#include "format/gguf_detail.h"
#include "util/error.h"

namespace sluice::gguf {

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "uint8";
    case ValueType::I8: return "int8";
    case ValueType::U16: return "uint16";
    case ValueType::I16: return "int16";
    case ValueType::U32: return "uint32";
    case ValueType::I32: return "int32";
    case ValueType::F32: return "float32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::U64: return "uint64";
    case ValueType::I64: return "int64";
    case ValueType::F64: return "float64";
  }
  return "unknown";
}

namespace detail {

bool known_type(uint32_t id) { return id <= (uint32_t)ValueType::F64; }

uint64_t encoded_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::STRING: return 8;  // the length prefix: the least a string can take
    case ValueType::ARRAY: return 12;  // element type + count
  }
  return 0;
}

Kind kind_of(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64:
    case ValueType::BOOL: return Kind::Unsigned;
    case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64:
      return Kind::Signed;
    case ValueType::F32: case ValueType::F64: return Kind::Float;
    case ValueType::STRING: return Kind::String;
    case ValueType::ARRAY: return Kind::Array;
  }
  return Kind::Array;
}

uint64_t unsigned_max(ValueType t) {
  switch (t) {
    case ValueType::U8: return 0xFF;
    case ValueType::U16: return 0xFFFF;
    case ValueType::U32: return 0xFFFFFFFFu;
    case ValueType::BOOL: return 1;
    default: return std::numeric_limits<uint64_t>::max();
  }
}

int64_t signed_min(ValueType t) {
  switch (t) {
    case ValueType::I8: return -128;
    case ValueType::I16: return -32768;
    case ValueType::I32: return std::numeric_limits<int32_t>::min();
    default: return std::numeric_limits<int64_t>::min();
  }
}

int64_t signed_max(ValueType t) {
  switch (t) {
    case ValueType::I8: return 127;
    case ValueType::I16: return 32767;
    case ValueType::I32: return std::numeric_limits<int32_t>::max();
    default: return std::numeric_limits<int64_t>::max();
  }
}

uint64_t value_bytes(const Value& v) {
  if (v.type == ValueType::STRING) return 8 + v.s.size();
  if (v.type != ValueType::ARRAY) return encoded_size(v.type);
  uint64_t n = 12;
  if (v.elem == ValueType::STRING) {
    for (const auto& s : v.as) n += 8 + s.size();
  } else {
    n += v.array_size() * encoded_size(v.elem);
  }
  return n;
}

}  // namespace detail

using namespace detail;

Value Value::u32(uint32_t v) { Value r; r.type = ValueType::U32; r.u = v; return r; }
Value Value::u64(uint64_t v) { Value r; r.type = ValueType::U64; r.u = v; return r; }
Value Value::i32(int32_t v) { Value r; r.type = ValueType::I32; r.i = v; return r; }
Value Value::f32(float v) { Value r; r.type = ValueType::F32; r.f = v; return r; }
Value Value::boolean(bool v) { Value r; r.type = ValueType::BOOL; r.u = v ? 1 : 0; return r; }
Value Value::str(std::string v) { Value r; r.type = ValueType::STRING; r.s = std::move(v); return r; }

static Value array_of(ValueType elem) {
  Value r;
  r.type = ValueType::ARRAY;
  r.elem = elem;
  return r;
}

Value Value::array_u32(std::vector<uint64_t> v) {
  for (uint64_t x : v)
    if (x > 0xFFFFFFFFu) throw Error("array_u32: element " + std::to_string(x) + " does not fit in uint32");
  Value r = array_of(ValueType::U32);
  r.au = std::move(v);
  return r;
}
Value Value::array_u64(std::vector<uint64_t> v) {
  Value r = array_of(ValueType::U64);
  r.au = std::move(v);
  return r;
}
Value Value::array_i32(std::vector<int64_t> v) {
  for (int64_t x : v)
    if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max())
      throw Error("array_i32: element " + std::to_string(x) + " does not fit in int32");
  Value r = array_of(ValueType::I32);
  r.ai = std::move(v);
  return r;
}
Value Value::array_f32(std::vector<double> v) {
  Value r = array_of(ValueType::F32);
  // Stored as float32 in the file: keep what a reader will see.
  for (double& x : v) x = (double)(float)x;
  r.af = std::move(v);
  return r;
}
Value Value::array_str(std::vector<std::string> v) {
  Value r = array_of(ValueType::STRING);
  r.as = std::move(v);
  return r;
}

size_t Value::array_size() const {
  if (type != ValueType::ARRAY) return 0;
  switch (kind_of(elem)) {
    case Kind::Unsigned: return au.size();
    case Kind::Signed: return ai.size();
    case Kind::Float: return af.size();
    case Kind::String: return as.size();
    case Kind::Array: return 0;
  }
  return 0;
}

uint64_t Value::as_uint() const {
  switch (type) {
    case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64:
      return u;
    case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64:
      if (i < 0) throw Error("value " + std::to_string(i) + " is negative, expected an unsigned integer");
      return (uint64_t)i;
    default:
      throw Error("value of type " + std::string(value_type_name(type)) + " is not an integer");
  }
}

double Value::as_float() const {
  switch (kind_of(type)) {
    case Kind::Float: return f;
    case Kind::Signed: return (double)i;
    case Kind::Unsigned:
      if (type != ValueType::BOOL) return (double)u;
      break;
    default: break;
  }
  throw Error("value of type " + std::string(value_type_name(type)) + " is not a number");
}

void check_value(const Value& v, std::string_view key) {
  auto fail = [&](const std::string& why) {
    throw Error("metadata key '" + std::string(key) + "': " + why);
  };
  if (!known_type((uint32_t)v.type)) fail("unknown value type id " + std::to_string((uint32_t)v.type));
  ValueType t = v.type;
  if (t == ValueType::ARRAY) {
    if (!known_type((uint32_t)v.elem))
      fail("unknown array element type id " + std::to_string((uint32_t)v.elem));
    if (v.elem == ValueType::ARRAY) fail("nested arrays are not supported");
    t = v.elem;
    Kind k = kind_of(t);
    // Exactly one element vector may be used: anything else is a caller mix-up that would
    // silently drop data.
    if ((k != Kind::Unsigned && !v.au.empty()) || (k != Kind::Signed && !v.ai.empty()) ||
        (k != Kind::Float && !v.af.empty()) || (k != Kind::String && !v.as.empty()))
      fail("array elements stored in the wrong vector for element type " +
           std::string(value_type_name(t)));
    for (uint64_t x : v.au)
      if (x > unsigned_max(t))
        fail("array element " + std::to_string(x) + " out of range for " + std::string(value_type_name(t)));
    for (int64_t x : v.ai)
      if (x < signed_min(t) || x > signed_max(t))
        fail("array element " + std::to_string(x) + " out of range for " + std::string(value_type_name(t)));
    return;
  }
  switch (kind_of(t)) {
    case Kind::Unsigned:
      if (v.u > unsigned_max(t))
        fail("value " + std::to_string(v.u) + " out of range for " + std::string(value_type_name(t)));
      break;
    case Kind::Signed:
      if (v.i < signed_min(t) || v.i > signed_max(t))
        fail("value " + std::to_string(v.i) + " out of range for " + std::string(value_type_name(t)));
      break;
    default: break;
  }
}

}  // namespace sluice::gguf
