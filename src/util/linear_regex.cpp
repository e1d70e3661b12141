// util/linear_regex.h: the syntax tree compiled to a Thompson NFA program, and the search that
// runs all its threads at once (Pike's VM without captures).
#include "util/linear_regex.h"

#include <string>

#include "util/error.h"
#include "util/linear_regex_syntax.h"

namespace sluice {
namespace {

using regex_syntax::Kind;
using regex_syntax::Node;
using Op = LinearRegex::Op;
using Inst = LinearRegex::Inst;

class Compiler {
 public:
  Compiler(std::vector<Inst>& prog, std::vector<std::bitset<256>>& sets) : prog_(prog), sets_(sets) {}

  void node(const Node& n) {
    switch (n.kind) {
      case Kind::Empty: return;
      case Kind::Set:
        sets_.push_back(n.set);
        emit({Op::Byte, (uint32_t)sets_.size() - 1});
        return;
      case Kind::Begin: emit({Op::Begin}); return;
      case Kind::End: emit({Op::End}); return;
      case Kind::WordBoundary: emit({Op::WordBoundary}); return;
      case Kind::NotWordBoundary: emit({Op::NotWordBoundary}); return;
      case Kind::Concat:
        for (const Node& p : n.parts) node(p);
        return;
      case Kind::Alt: alternation(n); return;
      case Kind::Repeat: repeat(n); return;
    }
  }

 private:
  uint32_t emit(Inst i) {
    if (prog_.size() >= LinearRegex::kMaxProgram)
      throw Error(std::string("the pattern needs more than ")
                    .append(std::to_string(LinearRegex::kMaxProgram))
                    .append(" NFA instructions (a smaller repeat count would do)"));
    prog_.push_back(i);
    return (uint32_t)prog_.size() - 1;
  }
  uint32_t here() const { return (uint32_t)prog_.size(); }

  // split(L1, next split ...); L1: part; jump end; ... the last part without a split.
  void alternation(const Node& n) {
    std::vector<uint32_t> jumps;
    for (size_t k = 0; k < n.parts.size(); ++k) {
      const bool last = k + 1 == n.parts.size();
      const uint32_t split = last ? 0 : emit({Op::Split});
      if (!last) prog_[split].x = here();
      node(n.parts[k]);
      if (!last) {
        jumps.push_back(emit({Op::Jump}));
        prog_[split].y = here();
      }
    }
    for (const uint32_t j : jumps) prog_[j].x = here();
  }

  // min copies, then either a loop (max unbounded) or max - min optional copies that all skip
  // to the end.
  void repeat(const Node& n) {
    const Node& part = n.parts[0];
    for (uint32_t k = 0; k < n.min; ++k) node(part);
    if (n.max == regex_syntax::kUnbounded) {
      const uint32_t split = emit({Op::Split});
      prog_[split].x = here();
      node(part);
      emit({Op::Jump, split});
      prog_[split].y = here();
      return;
    }
    std::vector<uint32_t> splits;
    for (uint32_t k = n.min; k < n.max; ++k) {
      const uint32_t split = emit({Op::Split});
      prog_[split].x = here();
      splits.push_back(split);
      node(part);
    }
    for (const uint32_t s : splits) prog_[s].y = here();
  }

  std::vector<Inst>& prog_;
  std::vector<std::bitset<256>>& sets_;
};

bool is_word(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

}  // namespace

LinearRegex::LinearRegex(std::string_view pattern) {
  const Node tree = regex_syntax::parse(pattern);
  Compiler(prog_, sets_).node(tree);
  if (prog_.size() >= kMaxProgram)
    throw Error(std::string("the pattern needs more than ").append(std::to_string(kMaxProgram)).append(" NFA instructions"));
  prog_.push_back({Op::Match});
}

bool LinearRegex::holds(Op a, std::string_view text, size_t pos) const {
  const bool before = pos > 0 && is_word((unsigned char)text[pos - 1]);
  const bool after = pos < text.size() && is_word((unsigned char)text[pos]);
  switch (a) {
    case Op::Begin: return pos == 0;
    case Op::End: return pos == text.size();
    case Op::WordBoundary: return before != after;
    case Op::NotWordBoundary: return before == after;
    default: return false;
  }
}

bool LinearRegex::add(std::vector<uint32_t>& list, std::vector<uint32_t>& mark, uint32_t gen, uint32_t pc,
                      std::string_view text, size_t pos) const {
  std::vector<uint32_t> stack{pc};  // explicit: a long chain of jumps must not deepen the C++ stack
  while (!stack.empty()) {
    const uint32_t at = stack.back();
    stack.pop_back();
    if (mark[at] == gen) continue;
    mark[at] = gen;
    const Inst& i = prog_[at];
    switch (i.op) {
      case Op::Match: return true;
      case Op::Byte: list.push_back(at); break;
      case Op::Jump: stack.push_back(i.x); break;
      case Op::Split:
        stack.push_back(i.y);
        stack.push_back(i.x);
        break;
      default:
        if (holds(i.op, text, pos)) stack.push_back(at + 1);
        break;
    }
  }
  return false;
}

bool LinearRegex::search(std::string_view text) const {
  std::vector<uint32_t> now, next, mark(prog_.size(), 0);
  uint32_t gen = 1;
  for (size_t pos = 0;; ++pos) {
    // A match may start anywhere: a fresh thread at every position (std::regex_search).
    if (add(now, mark, gen, 0, text, pos)) return true;
    if (pos == text.size()) return false;
    const unsigned char c = (unsigned char)text[pos];
    ++gen;
    next.clear();
    for (const uint32_t at : now)
      if (sets_[prog_[at].x][c] && add(next, mark, gen, at + 1, text, pos + 1)) return true;
    std::swap(now, next);
  }
}

}  // namespace sluice
