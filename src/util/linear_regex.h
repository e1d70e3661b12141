// A subset of ECMAScript regular expressions matched in time linear in the text: the pattern
// becomes a Thompson NFA, and a search runs every thread of it at once over the text (no
// backtracking), so a search costs at most (text length + 1) x (program size) steps whatever the
// pattern. Used for `run --dump-filter` (docs/numerics.md), where std::regex, a backtracking
// matcher, ran for minutes on nested quantifiers such as (\w*)*(\w*)*z.
//
// The subset: literal bytes; '.'; classes [...] and [^...] with ranges and the escapes below;
// \d \D \s \S \w \W; \t \n \r \f \v \0 \xHH \uHHHH (up to 00FF); \ before any other
// non-alphanumeric byte for that byte; the assertions ^ $ \b \B (not multiline); groups (...)
// and (?:...); alternation |; quantifiers * + ? {n} {n,} {n,m} (counts up to 1000), greedy or
// lazy (the same for a yes/no search). Refused, naming the problem: back-references, lookaround,
// POSIX bracket classes, unknown escapes, a quantifier with nothing (or another quantifier)
// before it, and patterns whose program would pass kMaxProgram instructions.
#pragma once
#include <bitset>
#include <cstdint>
#include <string_view>
#include <vector>

namespace sluice {

class LinearRegex {
 public:
  static constexpr size_t kMaxProgram = 20000;  // NFA instructions (bounded repeats are copies)
  static constexpr uint32_t kMaxRepeat = 1000;  // the largest count in {n,m}

  // Throws Error naming the problem and its byte offset for a pattern outside the subset.
  explicit LinearRegex(std::string_view pattern);

  // True when the pattern matches somewhere in text, as std::regex_search answers.
  bool search(std::string_view text) const;

  enum class Op : uint8_t { Byte, Split, Jump, Begin, End, WordBoundary, NotWordBoundary, Match };
  struct Inst {
    Op op;
    uint32_t x = 0, y = 0;  // Byte: index of its set; Split: both targets; Jump: x
  };

 private:
  bool holds(Op assertion, std::string_view text, size_t pos) const;
  // Adds pc's epsilon closure at text position pos to `list` (the Byte instructions reached);
  // returns true when it reaches Match.
  bool add(std::vector<uint32_t>& list, std::vector<uint32_t>& mark, uint32_t gen, uint32_t pc, std::string_view text,
           size_t pos) const;

  std::vector<Inst> prog_;
  std::vector<std::bitset<256>> sets_;
};

}  // namespace sluice
