#include "text/utf8.h"

namespace sluice::text {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// Sequence length announced by a lead byte and the allowed range of the second byte
// (the ranges exclude overlong forms, surrogates and code points above U+10FFFF).
struct Lead {
  uint8_t len;  // 0: not a lead byte
  uint8_t lo, hi;
};

Lead lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Examines the sequence at s[i]. Returns the number of bytes that form a well-formed
// character (>0, *bad = false), or the length of the maximal ill-formed subpart (*bad = true),
// or 0 when the bytes run out before the sequence can be judged (*bad = false).
size_t examine(std::string_view s, size_t i, bool* bad) {
  const uint8_t b = (uint8_t)s[i];
  const Lead l = lead_info(b);
  *bad = false;
  if (l.len == 0) {
    *bad = true;
    return 1;
  }
  for (size_t k = 1; k < l.len; ++k) {
    if (i + k >= s.size()) return 0;
    const uint8_t c = (uint8_t)s[i + k];
    const uint8_t lo = k == 1 ? l.lo : 0x80, hi = k == 1 ? l.hi : 0xBF;
    if (c < lo || c > hi) {
      *bad = true;
      return k;
    }
  }
  return l.len;
}

}  // namespace

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += (char)cp;
  } else if (cp < 0x800) {
    out += (char)(0xC0 | (cp >> 6));
    out += (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += (char)(0xE0 | (cp >> 12));
    out += (char)(0x80 | ((cp >> 6) & 0x3F));
    out += (char)(0x80 | (cp & 0x3F));
  } else {
    out += (char)(0xF0 | (cp >> 18));
    out += (char)(0x80 | ((cp >> 12) & 0x3F));
    out += (char)(0x80 | ((cp >> 6) & 0x3F));
    out += (char)(0x80 | (cp & 0x3F));
  }
}

size_t decode_utf8(std::string_view s, size_t i, uint32_t& cp) {
  bool bad = false;
  const size_t n = examine(s, i, &bad);
  if (bad || n == 0) return 0;
  const uint8_t b = (uint8_t)s[i];
  static constexpr uint8_t kLeadMask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  cp = b & kLeadMask[n];
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | ((uint8_t)s[i + k] & 0x3F);
  return n;
}

size_t utf8_sanitize_append(std::string_view s, bool final, std::string& out) {
  size_t i = 0;
  while (i < s.size()) {
    // Runs of ASCII are the common case: copy them in one go.
    size_t j = i;
    while (j < s.size() && (uint8_t)s[j] < 0x80) ++j;
    if (j > i) {
      out.append(s.data() + i, j - i);
      i = j;
      continue;
    }
    bool bad = false;
    const size_t n = examine(s, i, &bad);
    if (n == 0) {  // truncated at the end of the input
      if (!final) return i;
      out += kReplacement;
      return s.size();
    }
    if (bad) out += kReplacement;
    else out.append(s.data() + i, n);
    i += n;
  }
  return i;
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  utf8_sanitize_append(s, true, out);
  return out;
}

bool utf8_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const size_t n = decode_utf8(s, i, cp);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string Utf8Stream::push(std::string_view piece) {
  pending_.append(piece);
  std::string out;
  pending_.erase(0, utf8_sanitize_append(pending_, false, out));
  return out;
}

std::string Utf8Stream::finish() {
  std::string out;
  utf8_sanitize_append(pending_, true, out);
  pending_.clear();
  return out;
}

}  // namespace sluice::text
