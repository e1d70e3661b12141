// Internals shared by the GGUF reader, writer and value helpers (not part of the public API).
#pragma once
#include <cstdint>

#include "format/gguf.h"

namespace sluice::gguf::detail {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint32_t kVersion = 3;
constexpr uint64_t kMaxTensorName = 63;  // ggml: name length < GGML_MAX_NAME (64, incl. NUL)
constexpr uint64_t kMaxKeyBytes = 65535;
constexpr uint32_t kMaxDims = 4;
constexpr uint32_t kFirstNonGgmlType = 1000;  // sluice-private ids (ENGRAM_ROW) never come from a file

// Which Value vector an element type lives in.
enum class Kind { Unsigned, Signed, Float, String, Array };

bool known_type(uint32_t id);
// Bytes of one encoded scalar; for STRING the 8-byte length prefix (its minimum size).
uint64_t encoded_size(ValueType t);
Kind kind_of(ValueType t);
uint64_t unsigned_max(ValueType t);
int64_t signed_min(ValueType t);
int64_t signed_max(ValueType t);
// Bytes the value takes in a file (after the type id).
uint64_t value_bytes(const Value& v);

}  // namespace sluice::gguf::detail
