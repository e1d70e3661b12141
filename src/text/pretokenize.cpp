#include "text/pretokenize.h"

#include <unicode/uchar.h>

#include "text/utf8.h"

namespace sluice::text {
namespace {

// Category bits of one code point, as the three regexes see them.
enum : uint8_t {
  kL = 1,      // \p{L}
  kM = 2,      // \p{M}
  kN = 4,      // \p{N}
  kPS = 8,     // \p{P} or \p{S}
  kWS = 16,    // \s (Unicode White_Space)
  kCRLF = 32,  // \r or \n
  kCJK = 64,   // pass 2 class
  kAsciiPunct = 128,  // first class of pass 3's first alternative (ASCII P and S)
};

struct Unit {
  uint32_t off;  // byte offset of the unit in the text
  uint8_t cat;
  bool ascii_alpha;
};

bool white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

uint8_t categorize(uint32_t cp) {
  uint8_t c = 0;
  switch (u_charType((UChar32)cp)) {
    case U_UPPERCASE_LETTER: case U_LOWERCASE_LETTER: case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER: case U_OTHER_LETTER:
      c |= kL;
      break;
    case U_NON_SPACING_MARK: case U_ENCLOSING_MARK: case U_COMBINING_SPACING_MARK:
      c |= kM;
      break;
    case U_DECIMAL_DIGIT_NUMBER: case U_LETTER_NUMBER: case U_OTHER_NUMBER:
      c |= kN;
      break;
    case U_CONNECTOR_PUNCTUATION: case U_DASH_PUNCTUATION: case U_START_PUNCTUATION:
    case U_END_PUNCTUATION: case U_INITIAL_PUNCTUATION: case U_FINAL_PUNCTUATION:
    case U_OTHER_PUNCTUATION: case U_MATH_SYMBOL: case U_CURRENCY_SYMBOL:
    case U_MODIFIER_SYMBOL: case U_OTHER_SYMBOL:
      c |= kPS;
      if (cp < 0x80) c |= kAsciiPunct;
      break;
    default:
      break;
  }
  if (white_space(cp)) c |= kWS;
  if (cp == '\r' || cp == '\n') c |= kCRLF;
  if ((cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x30FF)) c |= kCJK;
  return c;
}

// The category table for ASCII, built once (u_charType is cheap, but ASCII dominates).
struct AsciiTable {
  uint8_t cat[128];
  AsciiTable() {
    for (uint32_t cp = 0; cp < 128; ++cp) cat[cp] = categorize(cp);
  }
};

void decode_units(std::string_view text, std::vector<Unit>& units) {
  static const AsciiTable ascii;
  units.clear();
  units.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    const uint8_t b = (uint8_t)text[i];
    if (b < 0x80) {
      const bool alpha = (b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z');
      units.push_back({(uint32_t)i, ascii.cat[b], alpha});
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const size_t n = decode_utf8(text, i, cp);
    if (n == 0) {  // ill-formed byte: a unit of its own that no class matches
      units.push_back({(uint32_t)i, 0, false});
      ++i;
      continue;
    }
    units.push_back({(uint32_t)i, categorize(cp), false});
    i += n;
  }
  units.push_back({(uint32_t)text.size(), 0, false});  // sentinel: end offset
}

// Runs `match` at every position of [b, e); matches and the gaps between them become
// pieces, passed to `emit` in order. match(i, e) returns the end of a match starting at i,
// or i when none starts there.
template <class Match, class Emit>
void split(size_t b, size_t e, const Match& match, const Emit& emit) {
  size_t gap = b;
  for (size_t i = b; i < e;) {
    const size_t m = match(i, e);
    if (m == i) {
      ++i;
      continue;
    }
    if (gap < i) emit(gap, i);
    emit(i, m);
    i = gap = m;
  }
  if (gap < e) emit(gap, e);
}

struct Scanner {
  const std::vector<Unit>& u;
  std::string_view text;
  bool is(size_t i, uint8_t bits) const { return (u[i].cat & bits) != 0; }

  // Pass 1: \p{N}{1,3}
  size_t digits(size_t i, size_t e) const {
    size_t j = i;
    while (j < e && j < i + 3 && is(j, kN)) ++j;
    return j;
  }

  // Pass 2: CJK / kana run.
  size_t cjk(size_t i, size_t e) const {
    size_t j = i;
    while (j < e && is(j, kCJK)) ++j;
    return j;
  }

  size_t run(size_t i, size_t e, uint8_t bits) const {
    while (i < e && is(i, bits)) ++i;
    return i;
  }

  // Pass 3, alternatives tried in order; the first that matches wins (not the longest).
  size_t words(size_t i, size_t e) const {
    // [ASCII punct][A-Za-z]+
    if (is(i, kAsciiPunct) && i + 1 < e && u[i + 1].ascii_alpha) {
      size_t j = i + 1;
      while (j < e && u[j].ascii_alpha) ++j;
      return j;
    }
    // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ : with the optional char when the next one is a
    // letter/mark, otherwise without it.
    if (!is(i, kCRLF | kL | kPS) && i + 1 < e && is(i + 1, kL | kM)) return run(i + 1, e, kL | kM);
    if (is(i, kL | kM)) return run(i, e, kL | kM);
    //  ?[\p{P}\p{S}]+[\r\n]*
    {
      size_t j = i;
      if (is_space_char(i) && j + 1 < e && is(j + 1, kPS)) ++j;
      if (is(j, kPS)) {
        j = run(j, e, kPS);
        return run(j, e, kCRLF);
      }
    }
    if (!is(i, kWS)) return i;
    const size_t ws_end = run(i, e, kWS);
    // \s*[\r\n]+ : greedy \s* backs off to the last \r or \n of the whitespace run.
    for (size_t k = ws_end; k > i; --k)
      if (is(k - 1, kCRLF)) return k;
    // \s+(?!\S) : the whole run at the end of the piece, else all but its last char.
    if (ws_end == e) return ws_end;
    if (ws_end - i >= 2) return ws_end - 1;
    // \s+
    return ws_end;
  }

  // The optional prefix of the third alternative is a plain ASCII space, not any \s.
  bool is_space_char(size_t i) const { return text[u[i].off] == ' '; }
};

}  // namespace

void pretokenize(std::string_view text, std::vector<std::pair<uint32_t, uint32_t>>& pieces) {
  if (text.empty()) return;
  std::vector<Unit> units;
  decode_units(text, units);
  Scanner s{units, text};
  auto emit = [&](size_t b, size_t e) { pieces.emplace_back(units[b].off, units[e].off); };
  auto pass3 = [&](size_t b, size_t e) {
    split(b, e, [&](size_t i, size_t end) { return s.words(i, end); }, emit);
  };
  auto pass2 = [&](size_t b, size_t e) {
    split(b, e, [&](size_t i, size_t end) { return s.cjk(i, end); }, pass3);
  };
  split(0, units.size() - 1, [&](size_t i, size_t end) { return s.digits(i, end); }, pass2);
}

}  // namespace sluice::text
