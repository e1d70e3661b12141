#include "runtime/prefix_cache.h"

#include <algorithm>
#include <string>

#include "util/error.h"

namespace sluice {

struct PrefixCache::Node {
  std::vector<TokenId> label;                     // the edge from the parent
  std::map<TokenId, std::unique_ptr<Node>> kids;  // by the first token of their label
  Node* parent = nullptr;
  uint32_t depth = 0;                             // tokens from the root through label
  std::optional<PrefixEntry> entry;
  uint64_t charge = 0;                            // of entry
  uint64_t used = 0;                              // tick of the last lookup or insert
  uint64_t scope = 0;                             // of the tree (kept at its root)
};

PrefixCache::PrefixCache(uint64_t budget) { stats_.budget = budget; }
PrefixCache::~PrefixCache() = default;

namespace {

size_t common_run(std::span<const TokenId> a, std::span<const TokenId> b) {
  const size_t n = std::min(a.size(), b.size());
  return (size_t)(std::mismatch(a.begin(), a.begin() + (std::ptrdiff_t)n, b.begin()).first - a.begin());
}

}  // namespace

PrefixCache::Node* PrefixCache::root(uint64_t scope) const {
  const auto it = roots_.find(scope);
  return it == roots_.end() ? nullptr : it->second.get();
}

const PrefixEntry* PrefixCache::lookup(std::span<const TokenId> prompt, uint64_t scope) {
  ++stats_.lookups;
  Node* best = deepest(prompt, scope);
  if (!best) return nullptr;
  best->used = ++tick_;
  return &*best->entry;
}

const PrefixEntry* PrefixCache::peek(std::span<const TokenId> prompt, uint64_t scope) const {
  const Node* n = deepest(prompt, scope);
  return n ? &*n->entry : nullptr;
}

PrefixCache::Node* PrefixCache::deepest(std::span<const TokenId> prompt, uint64_t scope) const {
  Node* best = nullptr;
  Node* n = root(scope);
  if (!n) return nullptr;
  size_t at = 0;  // tokens of prompt matched through n
  while (true) {
    if (n->entry && (at < prompt.size() || !n->entry->logits.empty())) best = n;
    if (at == prompt.size()) break;
    const auto it = n->kids.find(prompt[at]);
    if (it == n->kids.end()) break;
    Node* kid = it->second.get();
    if (common_run(kid->label, prompt.subspan(at)) < kid->label.size()) break;
    at += kid->label.size();
    n = kid;
  }
  return best;
}

PrefixCache::Node* PrefixCache::find(std::span<const TokenId> prefix, uint64_t scope) const {
  Node* n = root(scope);
  if (!n) return nullptr;
  size_t at = 0;
  while (at < prefix.size()) {
    const auto it = n->kids.find(prefix[at]);
    if (it == n->kids.end()) return nullptr;
    Node* kid = it->second.get();
    if (kid->label.size() > prefix.size() - at || common_run(kid->label, prefix.subspan(at)) < kid->label.size())
      return nullptr;
    at += kid->label.size();
    n = kid;
  }
  return n;
}

bool PrefixCache::contains(std::span<const TokenId> prefix, bool with_logits, uint64_t scope) const {
  const Node* n = find(prefix, scope);
  return n && n->entry && (!with_logits || !n->entry->logits.empty());
}

bool PrefixCache::make_room(uint64_t charge) {
  if (charge > stats_.budget) {
    ++stats_.skipped;
    return false;
  }
  while (stats_.bytes + charge > stats_.budget && !holders_.empty()) {
    Node* victim = *std::min_element(holders_.begin(), holders_.end(),
                                     [](const Node* a, const Node* b) { return a->used < b->used; });
    erase_entry(victim);
    ++stats_.evicted;
  }
  return true;
}

void PrefixCache::insert(std::span<const TokenId> prefix, PrefixEntry e, uint64_t scope) {
  if (prefix.size() != e.pos())
    throw Error("prefix cache: an entry at position " + std::to_string(e.pos()) + " for a prefix of " +
                std::to_string(prefix.size()) + " tokens");
  const uint64_t charge = prefix_entry_charge(e.bytes(), e.blocks(), prefix.size());
  Node* held = find(prefix, scope);
  const uint64_t freed = held && held->entry ? held->charge : 0;
  if (stats_.bytes - freed + charge > stats_.budget)
    throw Error("prefix cache: an entry of " + std::to_string(charge) + " bytes does not fit the budget of " +
                std::to_string(stats_.budget) + " (" + std::to_string(stats_.bytes) + " held)");
  // Walk down, splitting the edge where the prefix leaves it and adding the rest as a leaf.
  std::unique_ptr<Node>& top = roots_[scope];
  if (!top) {
    top = std::make_unique<Node>();
    top->scope = scope;
  }
  Node* n = top.get();
  size_t at = 0;
  while (at < prefix.size()) {
    const auto it = n->kids.find(prefix[at]);
    if (it == n->kids.end()) {
      auto leaf = std::make_unique<Node>();
      leaf->label.assign(prefix.begin() + (std::ptrdiff_t)at, prefix.end());
      leaf->parent = n;
      leaf->depth = (uint32_t)prefix.size();
      Node* raw = leaf.get();
      n->kids.emplace(prefix[at], std::move(leaf));
      n = raw;
      at = prefix.size();
      break;
    }
    Node* kid = it->second.get();
    const size_t run = common_run(kid->label, prefix.subspan(at));
    if (run < kid->label.size()) {  // split kid at run: mid takes the shared part
      auto mid = std::make_unique<Node>();
      mid->label.assign(kid->label.begin(), kid->label.begin() + (std::ptrdiff_t)run);
      mid->parent = n;
      mid->depth = (uint32_t)(at + run);
      std::unique_ptr<Node> old = std::move(it->second);
      old->label.erase(old->label.begin(), old->label.begin() + (std::ptrdiff_t)run);
      old->parent = mid.get();
      const TokenId first = old->label.front();
      mid->kids.emplace(first, std::move(old));
      Node* raw = mid.get();
      it->second = std::move(mid);
      kid = raw;
    }
    at += run;
    n = kid;
  }
  if (n->entry) {
    stats_.bytes -= n->charge;
  } else {
    holders_.push_back(n);
  }
  n->entry = std::move(e);
  n->charge = charge;
  n->used = ++tick_;
  stats_.bytes += charge;
  ++stats_.inserted;
}

void PrefixCache::erase_entry(Node* n) {
  stats_.bytes -= n->charge;
  n->entry.reset();
  n->charge = 0;
  holders_.erase(std::find(holders_.begin(), holders_.end(), n));
  prune(n);
}

// Removes entry-less leaves and merges an entry-less node with its only child, up the path
// (a loop, not recursion: the path is as long as the entries along it).
void PrefixCache::prune(Node* n) {
  while (n->parent && !n->entry) {
    Node* parent = n->parent;
    if (n->kids.empty()) {
      const TokenId first = n->label.front();
      parent->kids.erase(first);  // destroys n
      n = parent;
      continue;
    }
    if (n->kids.size() == 1) {
      std::unique_ptr<Node> only = std::move(n->kids.begin()->second);
      n->kids.clear();
      only->label.insert(only->label.begin(), n->label.begin(), n->label.end());
      only->parent = parent;
      const TokenId first = only->label.front();
      parent->kids[first] = std::move(only);  // destroys n
    }
    return;
  }
  if (!n->parent && !n->entry && n->kids.empty()) roots_.erase(n->scope);  // a scope with nothing left
}

void PrefixCache::clear() {
  roots_.clear();
  holders_.clear();
  stats_.bytes = 0;
}

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s = stats_;
  s.entries = holders_.size();
  return s;
}

}  // namespace sluice
