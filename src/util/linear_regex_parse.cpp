// The parser of util/linear_regex.h's subset: recursive descent over the pattern's bytes into a
// regex_syntax::Node tree. Nesting is bounded (kMaxDepth), so no pattern overflows the stack.
#include <cctype>
#include <string>

#include "util/error.h"
#include "util/linear_regex.h"
#include "util/linear_regex_syntax.h"

namespace sluice::regex_syntax {
namespace {

constexpr int kMaxDepth = 100;

using Set = std::bitset<256>;

Set byte_set(unsigned char c) {
  Set s;
  s.set(c);
  return s;
}

Set range_set(int lo, int hi) {
  Set s;
  for (int c = lo; c <= hi; ++c) s.set((size_t)c);
  return s;
}

// \d \s \w and their complements (ECMAScript, in bytes: \s is libstdc++'s space class).
bool class_escape(char e, Set& out) {
  Set s;
  switch (std::tolower((unsigned char)e)) {
    case 'd': s = range_set('0', '9'); break;
    case 's': for (const char c : {' ', '\t', '\n', '\v', '\f', '\r'}) s.set((unsigned char)c); break;
    case 'w': s = range_set('0', '9') | range_set('A', 'Z') | range_set('a', 'z') | byte_set('_'); break;
    default: return false;
  }
  out = std::isupper((unsigned char)e) ? ~s : s;
  return true;
}

Node leaf(Kind k, Set s = {}) {
  Node n;
  n.kind = k;
  n.set = s;
  return n;
}

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  Node whole() {
    Node n = alternation(0);
    if (i_ < p_.size()) fail(i_, "')' without a '(' before it");
    return n;
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw Error(std::string("at byte ").append(std::to_string(at)).append(": ").append(what));
  }
  bool more() const { return i_ < p_.size(); }
  char peek() const { return p_[i_]; }

  Node alternation(int depth) {
    if (depth > kMaxDepth) fail(i_, std::string("groups nested deeper than ").append(std::to_string(kMaxDepth)));
    Node alt;
    alt.kind = Kind::Alt;
    alt.parts.push_back(sequence(depth));
    while (more() && peek() == '|') {
      ++i_;
      alt.parts.push_back(sequence(depth));
    }
    return alt.parts.size() == 1 ? std::move(alt.parts[0]) : alt;
  }

  Node sequence(int depth) {
    Node seq;
    seq.kind = Kind::Concat;
    while (more() && peek() != '|' && peek() != ')') seq.parts.push_back(quantified(depth));
    return seq;
  }

  Node quantified(int depth) {
    const size_t at = i_;
    Node a = atom(depth);
    uint32_t min = 0, max = 0;
    if (!quantifier(min, max)) return a;
    if (a.kind == Kind::Begin || a.kind == Kind::End || a.kind == Kind::WordBoundary || a.kind == Kind::NotWordBoundary)
      fail(at, "a quantifier after an assertion (^ $ \\b \\B)");
    if (more() && peek() == '?') ++i_;  // lazy: the same answer for a yes/no search
    uint32_t m2 = 0, x2 = 0;
    if (const size_t q = i_; quantifier(m2, x2)) fail(q, "a quantifier after a quantifier (group the first: (a*)*)");
    Node r;
    r.kind = Kind::Repeat;
    r.min = min;
    r.max = max;
    r.parts.push_back(std::move(a));
    return r;
  }

  // * + ? {n} {n,} {n,m} at the cursor: consumed and true, or false with the cursor unmoved.
  bool quantifier(uint32_t& min, uint32_t& max) {
    if (!more()) return false;
    const char c = peek();
    if (c == '*' || c == '+' || c == '?') {
      ++i_;
      min = c == '+' ? 1 : 0;
      max = c == '?' ? 1 : kUnbounded;
      return true;
    }
    if (c != '{') return false;
    const size_t at = i_++;
    min = number(at);
    max = min;
    if (more() && peek() == ',') {
      ++i_;
      max = more() && peek() == '}' ? kUnbounded : number(at);
    }
    if (!more() || peek() != '}') fail(at, "'{' that is not a repeat count {n}, {n,} or {n,m} (write \\{ for the byte)");
    ++i_;
    if (max < min) fail(at, "a repeat count {n,m} with m < n");
    return true;
  }

  uint32_t number(size_t at) {
    if (!more() || !std::isdigit((unsigned char)peek()))
      fail(at, "'{' that is not a repeat count {n}, {n,} or {n,m} (write \\{ for the byte)");
    uint64_t v = 0;
    while (more() && std::isdigit((unsigned char)peek())) {
      v = v * 10 + (uint64_t)(peek() - '0');
      if (v > LinearRegex::kMaxRepeat) fail(at, std::string("a repeat count over ").append(std::to_string(LinearRegex::kMaxRepeat)));
      ++i_;
    }
    return (uint32_t)v;
  }

  Node atom(int depth) {
    const size_t at = i_;
    const char c = p_[i_++];
    switch (c) {
      case '(': return group(at, depth);
      case '.': return leaf(Kind::Set, ~(byte_set('\n') | byte_set('\r')));
      case '^': return leaf(Kind::Begin);
      case '$': return leaf(Kind::End);
      case '[': return bracket(at);
      case '\\': return escape(at);
      case '*': case '+': case '?': fail(at, std::string("'") + c + "' with nothing before it to repeat");
      case '{': fail(at, "'{' that is not a repeat count (write \\{ for the byte)");
      default: return leaf(Kind::Set, byte_set((unsigned char)c));
    }
  }

  Node group(size_t at, int depth) {
    if (more() && peek() == '?') {
      if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
        i_ += 2;
      } else {
        fail(at, "lookaround ((?= (?! (?<= (?<!) and named groups are not supported: a linear-time matcher cannot have them");
      }
    }
    Node inner = alternation(depth + 1);
    if (!more() || peek() != ')') fail(at, "'(' without a ')' after it");
    ++i_;
    return inner;
  }

  // After a backslash outside a class.
  Node escape(size_t at) {
    if (!more()) fail(at, "a backslash at the end");
    const char e = peek();
    if (e == 'b' || e == 'B') {
      ++i_;
      return leaf(e == 'b' ? Kind::WordBoundary : Kind::NotWordBoundary);
    }
    Set s;
    if (class_escape(e, s)) {
      ++i_;
      return leaf(Kind::Set, s);
    }
    return leaf(Kind::Set, byte_set(escaped_byte(at)));
  }

  // The byte an escape stands for (\t \n \r \f \v \0 \xHH \uHHHH, or a non-alphanumeric byte
  // itself); the cursor is after the backslash. in_class: \b is backspace there.
  unsigned char escaped_byte(size_t at, bool in_class = false) {
    const char e = p_[i_++];
    switch (e) {
      case 't': return '\t';
      case 'n': return '\n';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case 'x': return (unsigned char)hex(at, 2);
      case 'u': return (unsigned char)hex(at, 4);
      case '0':
        if (more() && std::isdigit((unsigned char)peek())) fail(at, "an octal escape (\\0 followed by a digit)");
        return 0;
      default: break;
    }
    if (e == 'b' && in_class) return '\b';
    if (e >= '1' && e <= '9') fail(at, "back-references (\\1 ...) are not supported: a linear-time matcher cannot have them");
    if (std::isalnum((unsigned char)e)) fail(at, std::string("the unknown escape \\") + e);
    return (unsigned char)e;
  }

  unsigned hex(size_t at, int digits) {
    unsigned v = 0;
    for (int k = 0; k < digits; ++k, ++i_) {
      if (!more() || !std::isxdigit((unsigned char)peek())) fail(at, "an escape \\x needs 2 hex digits, \\u 4");
      const char h = (char)std::tolower((unsigned char)peek());
      v = v * 16 + (unsigned)(h <= '9' ? h - '0' : h - 'a' + 10);
    }
    if (v > 0xff) fail(at, "a \\u escape above \\u00FF (patterns match bytes)");
    return v;
  }

  Node bracket(size_t at) {
    const bool negate = more() && peek() == '^';
    if (negate) ++i_;
    Set s;
    while (more() && peek() != ']') {
      const size_t a = i_;
      int lo = class_atom(s);
      if (lo >= 0 && i_ + 1 < p_.size() && peek() == '-' && p_[i_ + 1] != ']') {
        ++i_;
        const int hi = class_atom(s);
        if (hi < 0) fail(a, "a range in [...] whose end is a class (\\d \\s \\w)");
        if (hi < lo) fail(a, "a range in [...] whose end comes before its start");
        s |= range_set(lo, hi);
      } else if (lo >= 0) {
        s.set((size_t)lo);
      }
    }
    if (!more()) fail(at, "'[' without a ']' after it");
    ++i_;
    return leaf(Kind::Set, negate ? ~s : s);
  }

  // One element of a class: its byte, or -1 when it was a class escape (added to s).
  int class_atom(Set& s) {
    const size_t at = i_;
    const char c = p_[i_++];
    if (c == '[' && more() && (peek() == ':' || peek() == '=' || peek() == '.'))
      fail(at, "POSIX bracket expressions ([:name:] [=x=] [.x.]) are not supported");
    if (c != '\\') return (unsigned char)c;
    if (!more()) fail(at, "a backslash at the end");
    Set cls;
    if (class_escape(peek(), cls)) {
      ++i_;
      s |= cls;
      return -1;
    }
    return escaped_byte(at, /*in_class=*/true);
  }

  std::string_view p_;
  size_t i_ = 0;
};

}  // namespace

Node parse(std::string_view pattern) { return Parser(pattern).whole(); }

}  // namespace sluice::regex_syntax
